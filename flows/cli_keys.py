"""`kernelgate keys`: the pipeline's signing key and the keys of people who approve."""

from __future__ import annotations

import json
import os
import re
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


@keys_app.command("create")
def keys_create(name: Annotated[str, typer.Option(help="key name; 'pipeline' is the pipeline's")] = "pipeline",
                key_dir: KeyDir = None) -> None:
    """Create an Ed25519 key (PEM, mode 0600) and its public key: the pipeline's in the key folder, a person's (any other name) in its approvers/ folder, with the approvers entry for a thresholds file."""
    from lineage import keys

    folder = key_dir or keys.default_key_dir()
    check_name(name)
    path = (folder if name == keys.PIPELINE_KEY else keys.approver_key_dir(folder)) / f"{name}.pem"
    try:
        public = keys.create_key(path)
    except FileExistsError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"wrote {path} and {keys.public_path(path)} (key id {public.keyid})")
    if name != keys.PIPELINE_KEY:
        entry = {"name": name, "keyid": public.keyid, "public_key": public.to_dict()}
        typer.echo("an approver's key, never a pipeline key: it counts only where a "
                   "registration's approval policy lists it. Approvers entry for a thresholds "
                   f"file's approval policy:\n  - {json.dumps(entry)}")


@keys_app.command("list")
def keys_list(key_dir: KeyDir = None) -> None:
    """List the pipeline role's public keys (and revocations with their positions), then the approver keys in approvers/."""
    from lineage import keys

    trust = keys.folder_trust(key_dir)
    for keyid in trust.public_keys:
        where = trust.revoked_at.get(keyid)
        state = ("  REVOKED" if keyid in trust.revoked
                 else f"  REVOKED from {where.isoformat()}" if where else "")
        typer.echo(f"pipeline {keyid}{state}")
    for path in sorted(keys.approver_key_dir(key_dir).glob("*.pub.json")):
        typer.echo(f"approver {keys.load_public_key(path).keyid} ({path.name})")


StoreDir = Annotated[Path, typer.Option(help="local store whose current aliases are re-attested")]


@keys_app.command("rotate")
def keys_rotate(key_dir: KeyDir = None, store_dir: StoreDir = Path(".kernelgate")) -> None:
    """Retire the pipeline key (what it signed still verifies), create a new one, and re-sign every family's current aliases with it (nothing moves)."""
    from flows.log_sequencer import server_sequencer
    from lineage import key_rotation, keys
    from lineage import tracking as tr
    from lineage.attestations import Signing

    old, new = keys.rotate(key_dir)
    typer.echo(f"retired {old}; new pipeline key {new}")
    if not os.environ.get("MLFLOW_TRACKING_URI") and not (store_dir / "mlflow.db").exists():
        typer.echo(f"no MLflow store at {store_dir}: nothing to re-attest", err=True)
        return
    tracking = tr.tracking_for(store_dir)
    folder = key_dir or keys.default_key_dir()
    signing = Signing(signer=keys.load_signer(folder / f"{keys.PIPELINE_KEY}.pem"),
                      trust=keys.folder_trust(folder), key_dir=folder,
                      sequencer=server_sequencer())
    for family in key_rotation.families(tracking):
        for line in key_rotation.reattest(tracking, family, signing,
                                          reason=f"key rotation: {old[:12]} -> {new[:12]}"):
            typer.echo(f"re-attested {family}: {line}")


@keys_app.command("revoke")
def keys_revoke(keyid: Annotated[str, typer.Argument(help="the key id to revoke")],
                key_dir: KeyDir = None,
                at: Annotated[str | None, typer.Option(
                    help="ISO time from which its signatures are void, or 'start' for all of "
                    "them (default: when the key was retired, else now)")] = None) -> None:
    """Revoke a key from a position: what it signed before stays valid, nothing later verifies."""
    from datetime import datetime

    from lineage import keys

    position = "default" if at is None else None if at == "start" else datetime.fromisoformat(at)
    when = keys.revoke(keyid, key_dir, at=position)
    typer.echo(f"revoked {keyid} " + (f"from {when.isoformat()}" if when else "from the start"))
