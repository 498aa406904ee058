"""`kernelgate keys`: the pipeline's signing key and the keys of people who approve."""

from __future__ import annotations

import json
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
    """Create an Ed25519 key (PEM, mode 0600) and its public key; print the approvers entry for a thresholds file."""
    from lineage import keys

    folder = key_dir or keys.default_key_dir()
    path = folder / f"{check_name(name)}.pem"
    try:
        public = keys.create_key(path)
    except FileExistsError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"wrote {path} and {keys.public_path(path)} (key id {public.keyid})")
    if name != "pipeline":
        entry = {"name": name, "keyid": public.keyid, "public_key": public.to_dict()}
        typer.echo("approvers entry for a thresholds file's approval policy:\n"
                   f"  - {json.dumps(entry)}")


@keys_app.command("list")
def keys_list(key_dir: KeyDir = None) -> None:
    """List the public keys in the key folder (and which are revoked)."""
    from lineage import keys

    trust = keys.folder_trust(key_dir)
    for keyid in trust.public_keys:
        typer.echo(f"{keyid}{'  REVOKED' if keyid in trust.revoked else ''}")


@keys_app.command("rotate")
def keys_rotate(key_dir: KeyDir = None) -> None:
    """Retire the pipeline key (old signatures still verify) and create a new one."""
    from lineage import keys

    old, new = keys.rotate(key_dir)
    typer.echo(f"retired {old}; new pipeline key {new}")


@keys_app.command("revoke")
def keys_revoke(keyid: Annotated[str, typer.Argument(help="the key id to revoke")],
                key_dir: KeyDir = None) -> None:
    """Revoke a key: its signatures never verify again for the pipeline."""
    from lineage import keys

    keys.revoke(keyid, key_dir)
    typer.echo(f"revoked {keyid}")
