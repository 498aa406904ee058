"""Signing keys, kept outside the MLflow store.

A key is an Ed25519 private key in a PEM file (mode 0600) with its public half beside
it as ``<name>.pub.json`` (securesystemslib's key dict). The pipeline's key lives in a
key folder (default ``~/.kernelgate/keys``; ``KERNELGATE_KEY_DIR`` overrides it), which
is where ``kernelgate keys create`` writes and where ``make run`` creates one on first
use. Rotation keeps the retired public keys (``<name>-retired-<time>.pub.json``) so old
signatures still verify; revocation lists key ids in ``revoked.json``, and a revoked
key's signatures never verify again. People who approve sign with keys of their own.
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
from lineage.attestations import TrustPolicy

PIPELINE_KEY = "pipeline"
REVOKED_FILE = "revoked.json"


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
    """Retire the pipeline key (its public key stays trusted: old signatures verify) and
    create a new one. Returns ``(old keyid, new keyid)``."""
    key_dir = Path(key_dir or default_key_dir())
    current = ensure_pipeline_key(key_dir)
    old = load_signer(current).public_key.keyid
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    public_path(current).rename(key_dir / f"{PIPELINE_KEY}-retired-{stamp}.pub.json")
    current.unlink()
    return old, create_key(current).keyid


def revoke(keyid: str, key_dir: Path | None = None) -> None:
    """Add ``keyid`` to the folder's revocation list."""
    path = Path(key_dir or default_key_dir()) / REVOKED_FILE
    revoked = set(json.loads(path.read_text())) if path.exists() else set()
    path.write_text(json.dumps(sorted(revoked | {keyid}), indent=2))


def folder_trust(key_dir: Path | None = None) -> TrustPolicy:
    """Every public key in a key folder (current and retired), minus its revocations:
    what the pipeline itself trusts when it reads its own records back."""
    key_dir = Path(key_dir or default_key_dir())
    keys = {}
    for path in sorted(key_dir.glob("*.pub.json")):
        key = load_public_key(path)
        keys[key.keyid] = key
    revoked_file = key_dir / REVOKED_FILE
    revoked = set(json.loads(revoked_file.read_text())) if revoked_file.exists() else set()
    return TrustPolicy(public_keys=keys, revoked=revoked)


def trust_from_files(trusted: list[Path], revoked: list[Path] | None = None) -> TrustPolicy:
    """An auditor's trust: the public keys they pass, minus the ones they revoke.

    Raises:
        KeyFileError: a key file is unusable.
    """
    keys = {key.keyid: key for key in map(load_public_key, trusted)}
    return TrustPolicy(public_keys=keys, revoked={load_public_key(p).keyid for p in revoked or []})
