"""Signing keys, kept outside the MLflow store.

A key is an Ed25519 private key in a PEM file (mode 0600) with its public half beside
it as ``<name>.pub.json`` (securesystemslib's key dict). The pipeline's key lives in a
key folder (default ``~/.kernelgate/keys``; ``KERNELGATE_KEY_DIR`` overrides it), which
is where ``kernelgate keys create --role pipeline`` writes and where ``make run`` creates
one on first use. Only ``pipeline.pem`` and its retired public keys are the *pipeline role*
(:func:`folder_trust`); a person's key (``keys create --name alice``) goes to
``<key folder>/approvers/`` and is trusted only as an approver, through a registration's
approval policy. Rotation keeps the retired public keys
(``pipeline-retired-<time>.pub.json``, the time also in ``retired.json``) so old
signatures still verify; revocation (``revoked.json``) has a position: a revoked key's
signatures made before it stay valid (by default: before the key was retired), later
ones never verify.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner, SSlibKey

from kernels.errors import KernelgateError
from lineage.signing.attestations import TrustPolicy

PIPELINE_KEY = "pipeline"
REVOKED_FILE = "revoked.json"
RETIRED_FILE = "retired.json"
APPROVER_DIR = "approvers"


class KeyFileError(KernelgateError, RuntimeError):
    """A key file is missing, unreadable or not an Ed25519 key (the message names it)."""


def default_key_dir() -> Path:
    """``KERNELGATE_KEY_DIR`` or ``~/.kernelgate/keys``."""
    return Path(os.environ.get("KERNELGATE_KEY_DIR", "~/.kernelgate/keys")).expanduser()


def public_path(private_path: Path) -> Path:
    """``name.pem`` -> ``name.pub.json``."""
    return private_path.with_suffix(".pub.json")


def create_key(path: Path, *, overwrite: bool = False) -> SSlibKey:
    """Create an Ed25519 key at ``path`` (PEM, 0600) and its public key beside it.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a signing key")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = SSlibKey.from_crypto(private.public_key())
    public_path(path).write_text(json.dumps({"keyid": public.keyid, **public.to_dict()}, indent=2))
    return public


def load_signer(path: Path) -> CryptoSigner:
    """The signer of the private key at ``path``.

    Raises:
        KeyFileError: missing, unreadable, or not Ed25519.
    """
    path = Path(path)
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise KeyFileError(f"signing key {path} unusable: {err}") from err
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path} is not an Ed25519 key")
    return CryptoSigner(private, SSlibKey.from_crypto(private.public_key()))


def load_public_key(path: Path) -> SSlibKey:
    """A public key from ``*.pub.json`` (or the public half of a private PEM).

    Raises:
        KeyFileError: missing or not a key.
    """
    path = Path(path)
    if path.suffix == ".pem":
        return load_signer(path).public_key
    try:
        data = json.loads(path.read_text())
        return SSlibKey.from_dict(data.pop("keyid"), data)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise KeyFileError(f"public key {path} unusable: {err}") from err


def ensure_pipeline_key(key_dir: Path | None = None) -> Path:
    """The pipeline's key in ``key_dir``, created on first use; returns its path."""
    path = Path(key_dir or default_key_dir()) / f"{PIPELINE_KEY}.pem"
    if not path.exists():
        create_key(path)
    return path


def rotate(key_dir: Path | None = None) -> tuple[str, str]:
    """Retire the pipeline key (its public key stays trusted: what it signed before now
    verifies) and create a new one; the retirement time is kept in ``retired.json`` (the
    default position of a later revocation). Returns ``(old keyid, new keyid)``. The
    caller re-attests the current aliases with the new key
    (``lineage.aliases.key_rotation.reattest``)."""
    key_dir = Path(key_dir or default_key_dir())
    current = ensure_pipeline_key(key_dir)
    old = load_signer(current).public_key.keyid
    now = datetime.now(UTC)
    retired = _read(key_dir / RETIRED_FILE, {})
    retired[old] = now.isoformat()
    (key_dir / RETIRED_FILE).write_text(json.dumps(retired, indent=2, sort_keys=True))
    public_path(current).rename(
        key_dir / f"{PIPELINE_KEY}-retired-{now.strftime('%Y%m%dT%H%M%S%f')}.pub.json")
    current.unlink()
    return old, create_key(current).keyid


def _read(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


def revocations(key_dir: Path | None = None) -> dict[str, datetime | None]:
    """keyid -> the revocation's position (signatures made at or after it do not verify;
    ``None``: none ever verifies). An old list-form ``revoked.json`` revokes from the start."""
    data = _read(Path(key_dir or default_key_dir()) / REVOKED_FILE, {})
    if isinstance(data, list):
        return dict.fromkeys(data)
    return {k: None if v.get("revoked_at") is None else datetime.fromisoformat(v["revoked_at"])
            for k, v in data.items()}


def revoke(keyid: str, key_dir: Path | None = None, *, at: datetime | None | str = "default"
           ) -> datetime | None:
    """Revoke ``keyid`` from a position: what it signed before ``at`` stays valid, what it
    signed at or after does not. ``at`` defaults to the key's retirement (``rotate``), or
    now for a key never retired; ``None`` revokes it from the start (every signature, so
    every alias move it signed, stops verifying). Returns the position."""
    key_dir = Path(key_dir or default_key_dir())
    if at == "default":
        retired = _read(key_dir / RETIRED_FILE, {}).get(keyid)
        at = datetime.fromisoformat(retired) if retired else datetime.now(UTC)
    if isinstance(at, datetime) and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    entries = {k: {"revoked_at": None if v is None else v.isoformat()}
               for k, v in revocations(key_dir).items()}
    entries[keyid] = {"revoked_at": None if at is None else at.isoformat(),
                      "recorded_at": datetime.now(UTC).isoformat()}
    (key_dir / REVOKED_FILE).write_text(json.dumps(entries, indent=2, sort_keys=True))
    return at


def pipeline_public_files(key_dir: Path | None = None) -> list[Path]:
    """The pipeline role's public keys in a key folder: ``pipeline.pub.json`` and the
    retired ones. Any other ``*.pub.json`` there (an approver's key written by an older
    ``keys create --name``) is not the pipeline's and is never trusted as it."""
    key_dir = Path(key_dir or default_key_dir())
    return sorted([*key_dir.glob(f"{PIPELINE_KEY}.pub.json"),
                   *key_dir.glob(f"{PIPELINE_KEY}-retired-*.pub.json")])


def approver_key_dir(key_dir: Path | None = None) -> Path:
    """Where ``keys create --name <person>`` writes a person's key: ``<key folder>/approvers``,
    never the pipeline role's own files (approver keys are trusted only through a
    registration's approval policy)."""
    return Path(key_dir or default_key_dir()) / APPROVER_DIR


def folder_trust(key_dir: Path | None = None) -> TrustPolicy:
    """The pipeline role of a key folder (current and retired pipeline keys) with its
    revocations and their positions: what the pipeline itself trusts when it reads its
    own records back, and the audit's default trust."""
    keys = {}
    for path in pipeline_public_files(key_dir):
        key = load_public_key(path)
        keys[key.keyid] = key
    positions = revocations(key_dir)
    return TrustPolicy(public_keys=keys, revoked={k for k, v in positions.items() if v is None},
                       revoked_at={k: v for k, v in positions.items() if v is not None})


def trust_from_files(trusted: list[Path], revoked: list[Path] | None = None) -> TrustPolicy:
    """An auditor's trust: the public keys they pass, minus the ones they revoke.

    Raises:
        KeyFileError: a key file is unusable.
    """
    keys = {key.keyid: key for key in map(load_public_key, trusted)}
    return TrustPolicy(public_keys=keys, revoked={load_public_key(p).keyid for p in revoked or []})
