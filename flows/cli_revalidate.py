"""``kernelgate revalidate``: the nightly job by hand: every family in production (or one),
each re-judged under the registration its version was promoted with
(``flows.revalidate``). Heavy imports stay inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli_args import StoreDir, check_known_family
from flows.cli_keys import KeyDir
from flows.cli_store import existing_family, open_store


def revalidate(family: Annotated[str | None, typer.Option(
                   help="one family (default: every family of the store that has a "
                        "production version)")] = None,
               store_dir: StoreDir = Path(".kernelgate"),
               testset_dir: Annotated[Path | None, typer.Option(
                   file_okay=False, help="where the registration's test set lies (default: "
                   "<store>/testsets/<its profile>)")] = None,
               key_dir: KeyDir = None) -> None:
    """Re-evaluate what `production` points at, each family under the registration its version was promoted with, running the version's own code; roll back on failure (the nightly job). Exit 0: every family passed (or none is in production); 2: a family was rolled back; 1: a family could not be re-judged."""
    check_known_family(family, store_dir)
    tracking = open_store(store_dir, must_exist=True, writes=True)
    from flows.revalidate import nightly_revalidation, revalidate_production
    from flows.settings import RolloutSettings

    settings = RolloutSettings(store_dir=store_dir, key_dir=key_dir, testset_dir=testset_dir)
    if family is None:
        state = nightly_revalidation(settings, return_state=True)
        outcome = state.result(raise_on_failure=False)
        if isinstance(outcome, BaseException):
            typer.echo(f"re-validation failed: {outcome}", err=True)
            raise typer.Exit(1)
        typer.echo(outcome.model_dump_json(indent=1))
        typer.echo(outcome.summary(), err=True)
        raise typer.Exit({"error": 1, "rolled_back": 2}.get(outcome.result, 0))
    state = revalidate_production(existing_family(tracking, family), settings,
                                  return_state=True)
    outcome = state.result(raise_on_failure=False)
    if isinstance(outcome, BaseException):
        typer.echo(f"re-validation of {family} failed: {outcome}", err=True)
        raise typer.Exit(1)
    typer.echo(outcome.model_dump_json(indent=1))
    raise typer.Exit(0 if outcome.result != "rolled_back" else 2)
