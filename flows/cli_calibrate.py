"""``kernelgate calibrate``: A/A runs of production through the exact canary path,
recorded as a signed calibration (``flows.calibrate``). Heavy imports stay inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli_keys import KeyDir, check_name
from flows.cli_store import existing_family, families, open_store


def calibrate(
        family: Annotated[str | None, typer.Option(
            help="kernel family (default: the store's only family; in a store with none "
            "yet, the family `rollout --implementation native` rolls out on this host)")] = None,
        runs: Annotated[int, typer.Option(min=1, max=100_000, help=(
            "A/A canaries to run; the record keeps the false-rollback rate's Wilson 95 % "
            "interval, and counts as within alpha when alpha is at or above its lower end "
            "(0 of 20: [0, 0.161]); more runs narrow it. The canary pools every fresh "
            "calibration of the device: one that exceeded is never dropped"))] = 20,
        store_dir: Annotated[Path, typer.Option(help="local store")] = Path(".kernelgate"),
        thresholds: Annotated[Path | None, typer.Option(
            exists=True, dir_okay=False, help="plan to size the runs by when production has "
            "no readable registration; with no production yet (a fresh store too), the "
            "native baseline is calibrated against itself at this file's sizes")] = None,
        key_dir: KeyDir = None) -> None:
    """Run production (none yet: the native baseline) against itself through the canary path RUNS times and record the A/A false-rollback rate and the latency noise as a signed calibration of this device; exit 1 when this device's fresh calibrations, pooled, do not vouch for the canary's judge."""
    from flows.calibrate import calibrate as run_calibration
    from flows.settings import RolloutSettings
    from flows.tasks import signing_for

    # a first calibration (a file to size it by) may open a fresh store and a new family
    tracking = open_store(store_dir, must_exist=thresholds is None, writes=True)
    if thresholds is not None and family is not None:
        fam = check_name(family)
    elif thresholds is not None and not families(tracking):
        fam = first_family()
    else:
        fam = existing_family(tracking, family)
    signing = signing_for(RolloutSettings(store_dir=store_dir, key_dir=key_dir))

    def progress(done: int, total: int, verdict: str) -> None:
        if done == total or done % max(1, total // 10) == 0:
            typer.echo(f"calibration: {done}/{total} A/A canaries (last: {verdict})", err=True)

    try:
        run_id, record, counted, pooled = run_calibration(
            tracking, fam, runs=runs, signing=signing, thresholds=thresholds, progress=progress)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    low, high = record.rate_95
    typer.echo(f"calibration run {run_id}: {record.false_rollbacks}/{record.runs} A/A canaries "
               f"rolled back (rate {record.false_rollback_rate:.3f}, 95% [{low:.3f}, {high:.3f}], "
               f"alpha {record.alpha:g}: {'within' if record.within_alpha else 'EXCEEDS'}); "
               f"{record.inconclusive} inconclusive; noise sd {record.noise_sd}; "
               f"device {record.facts['device_kind']}; requests "
               f"{str(record.facts.get('workload')).split('@')[0]}")
    # what a rollout's canary will find: every fresh calibration of this device pooled
    typer.echo(f"the canary on this device counts: {pooled}" if counted else
               f"the canary on this device counts none: {pooled}")
    raise typer.Exit(0 if counted else 1)


def first_family() -> str:
    """The family a store's first calibration is for when none is named: the one
    ``kernelgate rollout --implementation native`` rolls out on this host (xla on a CPU
    host, pallas_gpu on a GPU), the release-manager walkthrough's, said on stderr. The
    host's ``auto`` kernel is not it: on a CPU host that runs interpreted, whose canary
    latency is never assessed, so its rollouts need no calibration."""
    import kernels

    fam = kernels.native_flash_kernel("native", kernels.default_backend())
    typer.echo(f"calibrating family {fam}: the store has none yet, and {fam} is what "
               "`kernelgate rollout --implementation native` rolls out here (--family for "
               "another)", err=True)
    return fam
