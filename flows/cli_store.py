"""Opening the store for a command: checked reachable within seconds, naming it, before
any work; the family named on the command line checked to exist there. Shared by every
``kernelgate`` command that reads or writes a store (``flows.cli``, ``flows.cli_calibrate``).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows.cli_args import check_store_dir
from flows.cli_keys import check_name


def open_store(store_dir: Path, *, must_exist: bool, writes: bool = False):
    """The store, checked reachable within seconds (naming it) before any work; a store
    path that is a file, or (``writes``) a folder this process cannot write in, refused
    naming it (``flows.cli_args.check_store_dir``)."""
    check_store_dir(store_dir, writes=writes)
    fail_fast_if_down()
    from lineage.store import tracking as tr
    if not os.environ.get("MLFLOW_TRACKING_URI") and must_exist and not (store_dir / "mlflow.db").exists():
        raise typer.BadParameter(f"no MLflow store at {store_dir.resolve()} (run a rollout first, or pass --store-dir / set MLFLOW_TRACKING_URI)",
                                 param_hint="--store-dir")
    tracking = tr.tracking_for(store_dir)
    try:
        tr.check_reachable(tracking)
    except tr.StoreUnreachable as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    return tracking


def fail_fast_if_down() -> None:
    """A tracking server (``MLFLOW_TRACKING_URI``) that does not answer: say so, naming it, within seconds (before JAX or MLflow is imported), and exit 1."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(("http://", "https://")):
        return
    from lineage.store.store import StoreUnreachable, Tracking, check_reachable
    try:
        check_reachable(Tracking(tracking_uri=uri))
    except StoreUnreachable as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


def families(tracking) -> list[str]:
    """The family names of the store's experiments (``kernelgate-<family>``)."""
    return sorted(e.name.removeprefix("kernelgate-")
                  for e in tracking.client().search_experiments(max_results=1000)
                  if e.name.startswith("kernelgate-"))


def existing_family(tracking, family: str | None) -> str:
    """``family``, refused naming the store's families when it has no experiment there.

    Without ``family``: the store's only family when it has one (a store of
    ``pallas_mosaic_gpu`` rollouts on a host whose native kernel is ``pallas_gpu`` is
    audited without ``--family``, H200 2026-12-01), else this host's native flash kernel.

    Raises:
        typer.BadParameter: an invalid or unknown family.
    """
    import kernels

    known = families(tracking)
    if family is None and len(known) == 1:
        family = known[0]
    family = check_name(family or kernels.native_flash_kernel("auto", kernels.default_backend()))
    if family not in known:
        raise typer.BadParameter(f"no family {family!r} in this store; families: {known or 'none'}",
                                 param_hint="--family")
    return family


def add_ownership_findings(tracking, family: str, result) -> None:
    """On the servers profile (an ``http(s)`` tracking URI), add to the audit ``result``
    (a ``lineage.audit.audit_report.AuditReport``) who owns ``family`` besides the pipeline
    (``flows.stack_accounts.audit_ownership``: problems naming the owner, or a warning
    that only the auditing account was read). A local store has no accounts: nothing."""
    if not tracking.tracking_uri.startswith(("http://", "https://")):
        return
    from flows.stack_accounts import audit_ownership

    problems, warnings = audit_ownership(tracking.tracking_uri, family)
    result.problems += problems
    result.warnings += warnings
