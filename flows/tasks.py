"""Tasks both flows use: opening and closing a rollout's record, preregistration, the
test set and model, and the failure guard. Each task calls plain functions of the
packages below; the flows order them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

import kernels
from evaluation.model import MiniLM
from evaluation.testset import ensure_testset
from flows.settings import RolloutSettings, RolloutState
from lineage import registration, registry, rollout, tags
from lineage import tracking as tr
from lineage.rollout import Result, RolloutOutcome

# Arguments include models and clients that do not hash; results are logged to MLflow.
stage_task = task(cache_policy=NO_CACHE, persist_result=False)


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run (lines show in the UI), the
    ``flows`` logger when a task's function is called directly."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")


@stage_task(name="open")
def open_rollout(settings: RolloutSettings, *, stage: str = "rollout", family: str | None = None,
                 clear_stale_aliases: bool = False) -> RolloutState:
    """Start the parent MLflow run; a new rollout first clears ``shadow``/``canary``
    aliases left by rollouts that died (their lease over).

    Raises:
        ValueError: unknown implementation or bad family name.
    """
    backend = kernels.default_backend()
    implementation = kernels.native_flash_kernel(settings.implementation, backend)
    tracking = tr.tracking_for(settings.store_dir)
    record = rollout.open_rollout(tracking, family=family or settings.family or implementation,
                                  implementation=implementation, backend=backend,
                                  work_root=settings.store_dir / "runs", stage=stage)
    if clear_stale_aliases:
        for alias in registry.clear_stale_aliases(tracking, record.family,
                                                  lease_s=settings.stale_alias_after_s,
                                                  cleared_by_run_id=record.rollout_run_id):
            run_logger().warning("cleared the stale %s alias of %s", alias, record.family)
    return RolloutState(settings=settings, record=record)


@stage_task(name="preregister")
def preregister(state: RolloutState) -> None:
    """Freeze the thresholds file in MLflow before anything is evaluated.

    Raises:
        ValueError: the file does not parse against the thresholds schema.
    """
    record = state.record
    state.registration = registration.preregister(
        state.settings.thresholds, tracking=record.tracking, family=record.family,
        parent_run_id=record.rollout_run_id)
    rollout.link(record, {tags.REGISTRATION_ID: state.registration.registration_id})


@stage_task(name="prepare-testset")
def prepare_testset(state: RolloutState) -> None:
    """Load the serving model and the test set (built, deterministically, when missing)."""
    settings = state.settings
    state.model = MiniLM.load()
    profile = settings.testset_profile_for(state.record.backend)
    folder = settings.testset_dir or settings.store_dir / "testsets" / profile
    state.testset_dir = ensure_testset(folder, profile=profile,
                                       documents_dir=settings.documents_dir, model=state.model)


def finish(state: RolloutState, result: Result, stage: str, reason: str) -> RolloutOutcome:
    """Close the rollout's record with its outcome, and show it in the Prefect UI."""
    decision = state.decision
    outcome = rollout.close_rollout(
        state.record, result=result, stage=stage, reason=reason, version=state.version,
        decision_summary=decision.summary if decision else None,
        not_assessed_note=decision.not_assessed_note if decision else None)
    logger = run_logger()
    try:
        create_markdown_artifact(outcome.markdown(),
                                 key=f"rollout-{state.record.family.replace('_', '-').lower()}",
                                 description=f"kernelgate rollout of {state.record.family}")
    except Exception as err:  # noqa: BLE001 - the MLflow record is complete; this is a courtesy
        logger.warning("could not write the Prefect summary artifact: %s", err)
    logger.info("rollout %s: %s at %s — %s", outcome.family, outcome.result, outcome.stage,
                outcome.reason)
    return outcome


@contextlib.contextmanager
def closed_on_failure(state: RolloutState) -> Iterator[None]:
    """Any exception closes the rollout's record before it propagates: production is
    untouched, no alias is left on the unfinished version, the parent run ends FAILED
    (or, after a completed promotion, records that only bookkeeping failed)."""
    try:
        yield
    except BaseException as err:
        reason = f"{type(err).__name__}: {err}"
        record = state.record
        if state.promoted:
            rollout.close_rollout(record, result="promoted", stage="promotion",
                                  version=state.version,
                                  reason=f"promoted; a step after the promotion failed: {reason}")
            raise
        try:
            if state.version is not None:
                registry.reject(record.tracking, record.family, state.version,
                                f"rollout failed: {reason}", parent_run_id=record.rollout_run_id)
        finally:
            rollout.close_rollout(record, result="failed", stage="error", reason=reason,
                                  version=state.version)
        raise
