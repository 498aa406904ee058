"""``kernelgate timeline``: where each rollout's time went, and how production moved.

Reads the MLflow store only (no Prefect): each rollout's stages with their wall times
(``lineage.records.timeline``), then each family's production moves as the signed alias
history tells them (``lineage.aliases.production_story``): promotions and rollbacks, manual ones
included, with their times and reasons. Heavy imports stay inside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_args import StoreDir, check_known_family
from flows.cli_keys import KeyDir
from flows.cli_store import existing_family, families, open_store


def timeline(family: Annotated[str | None, typer.Option(
                 help="one family (default: every family of the store)")] = None,
             store_dir: StoreDir = Path(".kernelgate"),
             json_out: Annotated[Path | None, typer.Option(
                 "--json", dir_okay=False, help="also write the timelines as JSON here")] = None,
             key_dir: KeyDir = None) -> None:
    """Where each rollout's time went (result, version, every stage's wall time, recorded by the flow into each stage's run), then each family's production moves from the signed alias history (promotions and rollbacks with times and reasons); every family unless --family."""
    check_known_family(family, store_dir)
    from lineage.aliases import production_story, registered_model
    from lineage.records.timeline import render, rollout_timelines
    from lineage.signing import keys

    tracking = open_store(store_dir, must_exist=True)
    chosen = [existing_family(tracking, family)] if family else families(tracking)
    timelines = [t for fam in chosen for t in rollout_timelines(tracking, fam)]
    typer.echo(render(timelines))
    trust = keys.folder_trust(key_dir or keys.default_key_dir())
    for fam in chosen:
        attested, problems = registered_model.store_alias_history(tracking, fam, trust)
        moves = production_story.production_moves(attested)
        count = f"{len(moves)} move{'' if len(moves) == 1 else 's'}"
        typer.echo(f"\nproduction of {fam} (signed alias history, {count}):")
        for move in moves:
            now = f"v{move.version}" if move.version else "nothing"
            before = f"v{move.previous_version}" if move.previous_version else "nothing"
            typer.echo(f"  {move.at:%Y-%m-%d %H:%M:%S} {move.action:<9} {before} -> {now}"
                       + (f": {move.reason}" if move.reason else ""))
        for problem in problems:
            typer.echo(f"  ! {problem}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([t.model_dump(mode="json") for t in timelines], indent=1))
        typer.echo(f"written {json_out}")
