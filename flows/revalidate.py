"""Nightly re-validation of what ``production`` points at (scheduled in prefect.yaml).

Re-evaluates the production version on the held-out split under the thresholds it
was preregistered with (read back from MLflow, hash-checked); on failure — a failed
criterion, or a kernel that no longer runs at all — rolls back to the previous
production version, or to the platform's native baseline when there is none (or
the previous one is no longer usable), and says which. Catches library drift: a
jax/jaxlib upgrade that breaks a kernel that once passed.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

import kernels
from flows.judge import evaluate, gate
from flows.settings import RolloutSettings, RolloutState
from flows.tasks import open_rollout, prepare_testset, run_logger
from lineage import chain, registry, tags, versions
from lineage import tracking as tr


class RevalidationOutcome(BaseModel):
    """What the nightly run found and did."""

    family: str
    version: str | None
    result: Literal["passed", "rolled_back", "nothing_in_production", "error"]
    reason: str
    source_drift: str | None = None
    now_serving: str
    revalidation_run_id: str


@flow(name="kernelgate-revalidate-production")
def revalidate_production(family: str = "auto", settings: RolloutSettings | None = None
                          ) -> RevalidationOutcome:
    """Re-evaluate ``production`` of ``family`` (``auto``: the family of this backend's
    native flash kernel) under its preregistered thresholds; roll back on failure."""
    settings = settings or RolloutSettings()
    if family == "auto":
        family = kernels.native_flash_kernel("auto", kernels.default_backend())
    state = open_rollout(settings, stage="revalidation", family=family)
    try:
        return _revalidate(state)
    except BaseException as err:
        _finish(state, "error", f"re-validation could not finish: {type(err).__name__}: {err}")
        raise


def _finish(state: RolloutState, result: str, reason: str,
            drift: str | None = None) -> RevalidationOutcome:
    record = state.record
    now = registry.alias_version(record.tracking, record.family, "production")
    serving = (f"{record.family} v{now}" if now
               else f"{versions.NATIVE_BASELINE} (native baseline)")
    outcome = RevalidationOutcome(family=record.family, version=state.version, result=result,
                                  reason=reason, source_drift=drift, now_serving=serving,
                                  revalidation_run_id=record.rollout_run_id)
    tr.log_model_json(record.tracking, record.rollout_run_id, outcome, tags.REVALIDATION_ARTIFACT)
    tr.set_tags(record.tracking, record.rollout_run_id, {tags.RESULT: result, tags.NOTE: reason})
    tr.end_run(record.tracking, record.rollout_run_id, "FAILED" if result == "error" else "FINISHED")
    try:
        create_markdown_artifact(
            f"# nightly re-validation of {record.family}: **{result}**\n\n* version: "
            f"v{state.version}\n* reason: {reason}\n* now serving: {serving}\n",
            key=f"revalidation-{record.family.replace('_', '-').lower()}")
    except Exception as err:  # noqa: BLE001 - the MLflow record above is the record
        run_logger().warning("could not write the Prefect summary artifact: %s", err)
    run_logger().info("revalidation %s: %s (%s); now serving %s", record.family, result,
                          reason, serving)
    return outcome


def _revalidate(state: RolloutState) -> RevalidationOutcome:
    record = state.record
    version, implementation, config = versions.production_kernel(record.tracking, record.family)
    if version is None:
        return _finish(state, "nothing_in_production",
                       "no production alias; the native baseline serves")
    state.version = version
    evidence = chain.collect(record.tracking, record.family, version)
    if evidence.registration is None:
        raise RuntimeError(f"v{version} has no usable registration to re-judge it by: "
                           f"{evidence.read_problems}")
    state.registration, state.build_run_id = evidence.registration, evidence.build_run_id
    drift = versions.source_drift(record.tracking, record.family, version)
    prepare_testset(state)
    try:
        evaluate(state, split="heldout", compare_production=False,
                 implementation=implementation, config=config)
        # Judged under the registered bytes themselves (no file in hand to compare).
        decision = gate(state, thresholds_path=None)
        passed, why = decision.passed, decision.summary
    except Exception as err:  # noqa: BLE001 - a kernel that no longer runs fails re-validation
        passed, why = False, f"evaluation failed: {type(err).__name__}: {err}"
    if passed:
        return _finish(state, "passed", f"v{version} still meets its preregistered thresholds",
                       drift)
    change = registry.rollback(record.tracking, record.family,
                               reason=f"nightly re-validation failed: {why}",
                               retire_if_unusable=True, parent_run_id=record.rollout_run_id)
    target = (f"previous production v{change.version}" if change.version else
              f"the native baseline ({versions.NATIVE_BASELINE}); no earlier usable production")
    return _finish(state, "rolled_back",
                   f"v{version} failed re-validation ({why}); rolled back to {target}", drift)
