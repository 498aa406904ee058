"""`kernelgate keys`: the pipeline's signing key and the keys of people who approve."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

keys_app = typer.Typer(help="Signing keys: the pipeline's, and people's who approve.",
                       no_args_is_help=True)

KeyDir = Annotated[Path | None, typer.Option(
    help="the pipeline's key folder (default ~/.kernelgate/keys or KERNELGATE_KEY_DIR)")]


def check_name(name: str) -> str:
    """Return `name` if it is a safe family or key name (letters, digits, _ and -, ≤64).

    Raises:
        typer.BadParameter: otherwise.
    """
    if not NAME_PATTERN.match(name):
        raise typer.BadParameter(
            f"{name!r}: names are 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return name


StoreDir = Annotated[Path, typer.Option(
    help="local store whose families' signed logs record the key change")]


def _store(store_dir: Path):
    """The store's tracking, or None (said) when there is none to record in."""
    from lineage.store import tracking as tr

    if not os.environ.get("MLFLOW_TRACKING_URI") and not (store_dir / "mlflow.db").exists():
        typer.echo(f"no MLflow store at {store_dir}: the key change is in no family's log",
                   err=True)
        return None
    return tr.tracking_for(store_dir)


@contextlib.contextmanager
def _every_family_held(store_dir: Path) -> Iterator[object | None]:
    """The store's tracking (None: no store, said) while holding every family's place in
    line, as a rollout holds its own (the family lock on a store of files, the family's
    Prefect slot on a tracking server), families in name order. A key change waits for
    the rollouts in progress to end: a rollout that signs with a key retired or revoked
    under it would die halfway and leave its log with a gap."""
    tracking = _store(store_dir)
    if tracking is None:
        yield None
        return
    from flows.tasks import family_slot
    from lineage.aliases import key_changes
    from lineage.rollout import rollout

    with contextlib.ExitStack() as held:
        for family in key_changes.families(tracking):
            held.enter_context(rollout.family_lock(store_dir, family))
            held.enter_context(family_slot(family))
        yield tracking


def _pipeline_signing(folder: Path):
    """The pipeline's signing from the key folder, with the servers profile's log
    sequencer where one is configured (``flows.log_sequencer.server_sequencer``)."""
    from flows.log_sequencer import server_sequencer
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    return Signing(signer=keys.load_signer(folder / f"{keys.PIPELINE_KEY}.pem"),
                   trust=keys.folder_trust(folder), key_dir=folder,
                   sequencer=server_sequencer())


def _record(tracking, change, folder: Path) -> None:
    """Sign ``change`` into every family's log of the store (``lineage.aliases.key_changes``)."""
    from lineage.aliases import key_changes

    for family in key_changes.log_everywhere(tracking, change, _pipeline_signing(folder)):
        typer.echo(f"logged in {family}'s signed log: {change.describe()}")


Family = Annotated[str | None, typer.Option(
    help="the family whose approvers the entry names: the entry then carries your signature "
         "over it, which a family's first approvers need (trust on first use)")]


def person_signer(key: Path, option: str = "--key", key_dir: Path | None = None):
    """A person's signing key from ``key`` (a private PEM), for an approval, a loosening
    approval, an approvers entry or a re-anchoring; ``key_dir``: the pipeline's key folder
    whose keys are refused (None: ``~/.kernelgate/keys`` or ``KERNELGATE_KEY_DIR``).

    Raises:
        typer.BadParameter: not an Ed25519 private key (a ``.pub.json`` given by mistake
            included), or the pipeline's key (it signs records, never as a person).
    """
    from lineage.signing import keys

    try:
        signer = keys.load_signer(key)
    except keys.KeyFileError as err:
        raise typer.BadParameter(f"{err} (give your private key, the .pem that "
                                 "`kernelgate keys create --name NAME` wrote)",
                                 param_hint=option) from None
    folder = key_dir or keys.default_key_dir()
    pipeline = {keys.load_public_key(p).keyid for p in keys.pipeline_public_files(folder)}
    if signer.public_key.keyid in pipeline:
        raise typer.BadParameter(
            f"{key} is a pipeline key: it signs the pipeline's records and is never trusted "
            "as a person's (create yours with `kernelgate keys create --name NAME`)",
            param_hint=option)
    return signer


def _print_entry(signer, name: str, family: str | None) -> None:
    """The approvers entry of ``signer``'s key for a thresholds file, with the person's
    proof of holding it for ``family`` where one is given (``lineage.records.roster``)."""
    from lineage.records.roster import approver_entry

    entry = (approver_entry(signer, check_name(family), name) if family else
             {"name": name, "keyid": signer.public_key.keyid,
              "public_key": signer.public_key.to_dict()})
    typer.echo("Approvers entry for a thresholds file's approval policy"
               + (f" (family {family}, with your signature: it can name the family's first "
                  "approver)" if family else "") + f":\n  - {json.dumps(entry)}")


@keys_app.command("entry")
def keys_entry(key: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="your private key (PEM)")],
               family: Annotated[str, typer.Option(help="the family whose approvers the entry names")],
               name: Annotated[str | None, typer.Option(help="your name (default: the key file's)")] = None,
               key_dir: KeyDir = None) -> None:
    """Print your approvers entry for a family's thresholds file, signed with your key: the proof a family's first approvers need (added alone, with no approval: trust on first use, said by every audit)."""
    _print_entry(person_signer(key, key_dir=key_dir), check_name(name or key.stem), family)


ROLES = ("approver", "pipeline")
"""What ``keys create --role`` makes: a person's key (``<key dir>/approvers/NAME.pem``) or
the pipeline's (``<key dir>/pipeline.pem``, the one name the pipeline role reads)."""


def key_to_create(role: str, name: str | None, family: str | None) -> str:
    """The key name ``keys create`` writes for ``role``, refused where the name reads as the
    other role: the role is asked for, never inferred from the name.

    Raises:
        typer.BadParameter: an unknown role; an approver's key without a name or with a
            name starting with 'pipeline' (the pipeline role's files); a pipeline key under
            another name than 'pipeline', or with ``--family``.
    """
    from lineage.signing import keys

    if role not in ROLES:
        raise typer.BadParameter(f"{role!r}: one of {list(ROLES)}", param_hint="--role")
    if role == "pipeline":
        if name not in (None, keys.PIPELINE_KEY):
            raise typer.BadParameter(
                f"{name!r}: the pipeline's key is always named '{keys.PIPELINE_KEY}' "
                f"({keys.PIPELINE_KEY}.pem; rotation keeps the retired ones): drop --name",
                param_hint="--name")
        if family is not None:
            raise typer.BadParameter("--family names an approver's family; the pipeline's "
                                     "key serves every family", param_hint="--family")
        return keys.PIPELINE_KEY
    if name is None:
        raise typer.BadParameter("an approver's key needs --name NAME (yours); `--role "
                                 "pipeline` creates the pipeline's key", param_hint="--name")
    check_name(name)
    if name.lower().startswith(keys.PIPELINE_KEY):
        raise typer.BadParameter(
            f"{name!r} reads as the pipeline's key, but an approver's key was asked for "
            f"(--role approver, the default): names starting with '{keys.PIPELINE_KEY}' are "
            "the pipeline role's; pass --role pipeline for the pipeline's key, or another "
            "name for a person's", param_hint="--name")
    return name


@keys_app.command("create")
def keys_create(name: Annotated[str | None, typer.Option(
                    help="your name, for an approver's key (not 'pipeline...')")] = None,
                role: Annotated[str, typer.Option(
                    help="approver (a person's key, in approvers/) or pipeline (the "
                         "pipeline's signing key, pipeline.pem)")] = "approver",
                key_dir: KeyDir = None, store_dir: StoreDir = Path(".kernelgate"),
                family: Family = None) -> None:
    """Create an Ed25519 key (PEM, mode 0600) and its public key: a person's (--role approver, the default; --name required) in the key folder's approvers/, with the approvers entry for a thresholds file (signed for --family), or the pipeline's (--role pipeline) in the key folder."""
    from lineage.signing import keys

    folder = key_dir or keys.default_key_dir()
    name = key_to_create(role, name, family)
    path = (folder if role == "pipeline" else keys.approver_key_dir(folder)) / f"{name}.pem"
    try:
        public = keys.create_key(path)
    except OSError as err:
        if isinstance(err, FileExistsError) and err.filename is None:  # the key exists
            raise typer.BadParameter(str(err)) from None
        # a key folder that is a file or under one, or where nothing can be written
        raise typer.BadParameter(f"cannot write a key under {folder}: {err.strerror} "
                                 f"({err.filename})", param_hint="--key-dir") from None
    made = "the pipeline key" if role == "pipeline" else f"an approver key for {name}"
    typer.echo(f"created {made}: wrote {path} and {keys.public_path(path)} "
               f"(key id {public.keyid})")
    if role != "pipeline":
        typer.echo("an approver's key, never a pipeline key: it counts only where a "
                   "registration's approval policy lists it.")
        _print_entry(keys.load_signer(path), name, family)
        tracking = _store(store_dir)
        if tracking is not None and (folder / f"{keys.PIPELINE_KEY}.pem").exists():
            from lineage.aliases.key_changes import KeyChange

            _record(tracking, KeyChange(action="approver_key", keyid=public.keyid, name=name),
                    folder)


@keys_app.command("list")
def keys_list(key_dir: KeyDir = None) -> None:
    """List the pipeline role's public keys (and revocations with their positions), then the approver keys in approvers/."""
    from lineage.signing import keys

    trust = keys.folder_trust(key_dir)
    for keyid in trust.public_keys:
        where = trust.revoked_at.get(keyid)
        state = ("  REVOKED" if keyid in trust.revoked
                 else f"  REVOKED from {where.isoformat()}" if where else "")
        typer.echo(f"pipeline {keyid}{state}")
    approvers = sorted(keys.approver_key_dir(key_dir).glob("*.pub.json"))
    for path in approvers:
        typer.echo(f"approver {keys.load_public_key(path).keyid} ({path.name})")
    if not trust.public_keys and not approvers:
        where = key_dir if key_dir is not None else keys.default_key_dir()
        typer.echo(f"no keys in {where}: the first rollout creates the pipeline key there; "
                   "`kernelgate keys create --name NAME --family F` makes an approver's")


@keys_app.command("rotate")
def keys_rotate(key_dir: KeyDir = None, store_dir: StoreDir = Path(".kernelgate")) -> None:
    """Retire the pipeline key (what it signed still verifies), create a new one, and re-sign every family's current aliases with it (nothing moves)."""
    from lineage.aliases import key_rotation
    from lineage.aliases.key_changes import KeyChange
    from lineage.signing import keys

    with _every_family_held(store_dir) as tracking:
        old, new = keys.rotate(key_dir)
        typer.echo(f"retired {old}; new pipeline key {new}")
        if tracking is None:
            return
        folder = key_dir or keys.default_key_dir()
        # the rotation first (signed by the new key), then the aliases re-attested after it
        _record(tracking, KeyChange(action="rotate", keyid=old, new_keyid=new), folder)
        signing = _pipeline_signing(folder)
        for family in key_rotation.families(tracking):
            for line in key_rotation.reattest(tracking, family, signing,
                                              reason=f"key rotation: {old[:12]} -> {new[:12]}"):
                typer.echo(f"re-attested {family}: {line}")


@keys_app.command("revoke")
def keys_revoke(keyid: Annotated[str, typer.Argument(help="the key id to revoke")],
                key_dir: KeyDir = None,
                at: Annotated[str | None, typer.Option(
                    help="ISO time from which its signatures are void, or 'start' for all of "
                    "them (default: when the key was retired, else now)")] = None,
                store_dir: StoreDir = Path(".kernelgate")) -> None:
    """Revoke a key from a position: what it signed before stays valid, nothing later verifies; the revocation is signed into every family's log."""
    from datetime import datetime

    from lineage.aliases.key_changes import KeyChange
    from lineage.signing import keys

    if not re.fullmatch(r"[0-9a-f]{64}", keyid):  # a typo must not look like a revocation
        raise typer.BadParameter(f"{keyid!r} is not a key id: 64 hex digits, as `kernelgate "
                                 "keys list` and an approvers entry show them",
                                 param_hint="KEYID")
    folder = key_dir or keys.default_key_dir()
    current = folder / f"{keys.PIPELINE_KEY}.pem"
    if current.exists() and keys.load_signer(current).public_key.keyid == keyid:
        raise typer.BadParameter(
            f"{keyid} is the current pipeline key: run `kernelgate keys rotate` first (the "
            "revocation is signed into each family's log by a key that stays valid)")
    try:
        position = ("default" if at is None else None if at == "start"
                    else datetime.fromisoformat(at))
    except ValueError:
        raise typer.BadParameter(f"{at!r}: an ISO time (2026-12-04T10:00:00) or 'start'",
                                 param_hint="--at") from None
    with _every_family_held(store_dir) as tracking:
        when = keys.revoke(keyid, key_dir, at=position)
        typer.echo(f"revoked {keyid} " + (f"from {when.isoformat()}" if when else "from the start"))
        if tracking is not None and current.exists():
            _record(tracking, KeyChange(action="revoke", keyid=keyid,
                                        revoked_from=when.isoformat() if when else None), folder)
