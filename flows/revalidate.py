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

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

import kernels
from flows import stages
from flows.rollout import evaluate, gate, open_rollout, prepare_testset
from flows.stages import RolloutContext, RolloutSettings
from gates.preregistration import load_registration
from lineage import registry, tags
from lineage import tracking as tr
from lineage.records import log_alias_change


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
        family = stages.NATIVE_FAMILY.get(kernels.default_backend(), "pallas_tpu")
    ctx = open_rollout(settings, stage="revalidation", family=family)
    try:
        return _revalidate(ctx, settings)
    except BaseException as err:
        _finish(ctx, None, "error", f"re-validation could not finish: {type(err).__name__}: {err}")
        raise


def _finish(ctx: RolloutContext, version: str | None, result: str, reason: str,
            drift: str | None = None) -> RevalidationOutcome:
    now = registry.alias_version(ctx.tracking, ctx.family, "production")
    serving = f"{ctx.family} v{now}" if now else f"{stages.NATIVE_BASELINE} (native baseline)"
    outcome = RevalidationOutcome(family=ctx.family, version=version, result=result,
                                  reason=reason, source_drift=drift, now_serving=serving,
                                  revalidation_run_id=ctx.rollout_run_id)
    tr.log_model_json(ctx.tracking, ctx.rollout_run_id, outcome, "revalidation/outcome.json")
    tr.set_tags(ctx.tracking, ctx.rollout_run_id, {"kernelgate.result": result,
                                                   "mlflow.note.content": reason})
    tr.end_run(ctx.tracking, ctx.rollout_run_id, "FAILED" if result == "error" else "FINISHED")
    try:
        create_markdown_artifact(
            f"# nightly re-validation of {ctx.family}: **{result}**\n\n* version: v{version}\n"
            f"* reason: {reason}\n* now serving: {serving}\n",
            key=f"revalidation-{ctx.family.replace('_', '-')}")
    except Exception as err:  # the MLflow record above is the record
        get_run_logger().warning("could not write the Prefect summary artifact: %s", err)
    get_run_logger().info("revalidation %s: %s (%s); now serving %s", ctx.family, result,
                          reason, serving)
    return outcome


def _revalidate(ctx: RolloutContext, settings: RolloutSettings) -> RevalidationOutcome:
    from evaluation.model import MiniLM

    version, implementation, config = stages.production_implementation(ctx)
    if version is None:
        return _finish(ctx, None, "nothing_in_production",
                       "no production alias; the native baseline serves")
    mv_tags = stages.version_tags(ctx, version)
    registration = load_registration(mv_tags[tags.REGISTRATION_ID], tracking=ctx.tracking)
    # Judge under the file that was preregistered, byte for byte (hash-checked by the gate).
    thresholds_path = ctx.work_dir / "registered-thresholds.yaml"
    thresholds_path.write_bytes(tr.read_verified_artifact(
        ctx.tracking, registration.registration_id, registration.thresholds_artifact))
    drift = stages.source_drift(ctx, version)
    build_run_id = mv_tags[tags.BUILD_RUN_ID]
    model = MiniLM.load()
    testset_dir = prepare_testset(settings, ctx.backend, model)
    try:
        report, evaluation_run_id = evaluate(
            ctx, settings, registration=registration, build_run_id=build_run_id,
            testset_dir=testset_dir, implementation=implementation, config=config,
            compare_production=False, model=model)
        decision, _, _ = gate(ctx, report, thresholds_path=thresholds_path,
                              registration=registration, build_run_id=build_run_id,
                              evaluation_run_id=evaluation_run_id)
        passed, why = decision.passed, decision.summary
    except Exception as err:  # a kernel that no longer runs fails re-validation
        passed, why = False, f"evaluation failed: {type(err).__name__}: {err}"
    if passed:
        return _finish(ctx, version, "passed",
                       f"v{version} still meets its preregistered thresholds", drift)
    target = _roll_back(ctx, f"nightly re-validation failed: {why}")
    return _finish(ctx, version, "rolled_back",
                   f"v{version} failed re-validation ({why}); rolled back to {target}", drift)


def _roll_back(ctx: RolloutContext, reason: str) -> str:
    """Restore the previous production, or retire the alias so the native baseline
    serves when no earlier version is usable. Returns what serves now."""
    change = registry.rollback(ctx.tracking, ctx.family, reason=reason, retire_if_unusable=True)
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)
    return (f"previous production v{change.version}" if change.version
            else f"the native baseline ({stages.NATIVE_BASELINE}); no earlier usable production")
