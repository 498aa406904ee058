"""The family's signed log on the command line: what ``kernelgate audit`` checks it against
(:func:`witnessing`) and ``kernelgate reanchor``. Registered on the ``kernelgate`` app by
``flows.cli``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli_args import check_store_dir
from flows.cli_keys import KeyDir, check_name

CheckpointFiles = Annotated[list[Path] | None, typer.Option(
    "--checkpoint", exists=True, dir_okay=False,
    help="a signed checkpoint of the family's log you kept; the log must reach it (repeatable)")]


def witnessing(key_dir: Path | None, files: list[Path] | None, bundle: Path | None):
    """What an audit checks the log against: the pipeline's checkpoint in the key folder,
    the auditor's files (and a bundle's checkpoints: then one is required), and the head
    remembered under the auditor's kernelgate home (``KERNELGATE_HOME``)."""
    from lineage.audit.bundle import CHECKPOINTS
    from lineage.log.checkpoints import Witnessing, kernelgate_home
    from lineage.signing.keys import default_key_dir

    carried = sorted((bundle / CHECKPOINTS).glob("*.json")) if bundle is not None else []
    return Witnessing(key_dir=key_dir or default_key_dir(), files=[*(files or []), *carried],
                      home=kernelgate_home(), require=bundle is not None)


def reanchor(family: Annotated[str, typer.Option(help="kernel family whose log is damaged")],
             key: Annotated[Path, typer.Option(exists=True, dir_okay=False,
                                               help="your private key (PEM): an approver's")],
             reason: Annotated[str, typer.Option(help="what was lost and how; shown by every audit after")],
             store_dir: Annotated[Path, typer.Option(help="local store")] = Path(".kernelgate"),
             key_dir: KeyDir = None,
             name: Annotated[str | None, typer.Option(
                 help="your name, where the family names no approver yet and your key becomes "
                      "its first (default: the key file's)")] = None) -> None:
    """Re-anchor a family's damaged signed log: an approver signs what is missing; every later audit shows it. Where the family never named an approver, the key becomes its first (trust on first use, said by every audit)."""
    check_store_dir(store_dir, writes=True)
    from flows.log_sequencer import server_sequencer
    from lineage.aliases.reanchor import ReanchorRefused
    from lineage.aliases.reanchor import reanchor as do_reanchor
    from lineage.signing import keys
    from lineage.signing.attestations import Signing
    from lineage.store import tracking as tr

    folder = key_dir or keys.default_key_dir()
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(folder)),
                      trust=keys.folder_trust(folder), key_dir=folder,
                      sequencer=server_sequencer())
    try:
        entry = do_reanchor(tr.tracking_for(store_dir), check_name(family), keys.load_signer(key),
                            reason, signing,
                            name=key.stem if name is None else check_name(name))
    except ReanchorRefused as err:
        typer.echo(f"refused: {err}", err=True)
        raise typer.Exit(2) from None
    p = entry.predicate
    typer.echo(f"re-anchored {family}'s log at entry {int(p['log']['seq'])}: entries "
               f"{p['missing']} given up, approved by {p['approver']}")
    if p.get("roster_founded"):
        typer.echo(f"{p['approver']} (key {p['approver_keyid'][:12]}) is {family}'s first "
                   "approver, named on first use: every audit says so")
