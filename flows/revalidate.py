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
from pydantic import BaseModel, Field

import kernels
from flows.judge import evaluate, gate
from flows.results import Built, Preregistered, RolloutContext
from flows.settings import RolloutSettings
from flows.tasks import end_state, prepare_testset, rollout_session, run_logger
from lineage import chain, registered_model, registry, tags, version_runners
from lineage import tracking as tr
from lineage.log_writer import append
from lineage.sources import StoreSource


class RevalidationOutcome(BaseModel):
    """What the nightly run found and did."""

    family: str
    version: str | None
    result: Literal["passed", "rolled_back", "nothing_in_production", "error"]
    reason: str
    loaded: str | None = Field(None, description=(
        "how the version ran: in this process (its code is this checkout's, by digest) or "
        "in its own process from its logged code snapshot; and any JAX drift"))
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
    with rollout_session(settings, stage="revalidation", family=family,
                         clear_stale_aliases=False) as ctx:
        version = None
        try:
            version = version_runners.production_version(ctx.record.tracking, family)
            outcome = _revalidate(ctx, version)
        except Exception as err:
            _finish(ctx, version, "error",
                    f"re-validation could not finish: {type(err).__name__}: {err}")
            raise
    return end_state(outcome.result, outcome.reason, outcome)


def _finish(ctx: RolloutContext, version: str | None, result: str, reason: str,
            loaded: str | None = None) -> RevalidationOutcome:
    record = ctx.record
    ctx.serving.close()
    now = registered_model.alias_version(record.tracking, record.family, "production")
    serving = (f"{record.family} v{now}" if now
               else f"{version_runners.NATIVE_BASELINE} (native baseline)")
    outcome = RevalidationOutcome(family=record.family, version=version, result=result,
                                  reason=reason, loaded=loaded, now_serving=serving,
                                  revalidation_run_id=record.rollout_run_id)
    tr.log_model_json(record.tracking, record.rollout_run_id, outcome, tags.REVALIDATION_ARTIFACT)
    run_tags = {tags.RESULT: result, tags.NOTE: reason}
    tr.set_tags(record.tracking, record.rollout_run_id, run_tags)
    append(record.tracking, record.rollout_run_id, "outcome",
           {"family": record.family, "version": version, "result": result,
            "reason": reason, "tags": run_tags}, record.signing)
    tr.end_run(record.tracking, record.rollout_run_id, "FAILED" if result == "error" else "FINISHED")
    try:
        create_markdown_artifact(
            f"# nightly re-validation of {record.family}: **{result}**\n\n* version: "
            f"v{version}\n* reason: {reason}\n* now serving: {serving}\n",
            key=f"revalidation-{record.family.replace('_', '-').lower()}")
    except Exception as err:  # noqa: BLE001 - the MLflow record above is the record
        run_logger().warning("could not write the Prefect summary artifact: %s", err)
    run_logger().info("revalidation %s: %s (%s); now serving %s", record.family, result,
                          reason, serving)
    return outcome


def _revalidate(ctx: RolloutContext, version: str | None) -> RevalidationOutcome:
    record = ctx.record
    if version is None:
        return _finish(ctx, None, "nothing_in_production",
                       "no production alias; the native baseline serves")
    evidence = chain.collect(StoreSource(record.tracking, record.family, record.signing.trust),
                             version)
    if evidence.registration is None:
        raise RuntimeError(f"v{version} has no usable registration to re-judge it by: "
                           f"{evidence.read_problems}")
    # What the version's rollout established, read back from its signed record.
    preregistered = Preregistered(registration=evidence.registration)
    built = Built(build_run_id=evidence.build_run_id, version=version)
    testset = prepare_testset(ctx)
    loaded = None
    try:
        runner = ctx.versions.runner(version)
        loaded = _how_loaded(runner)
        evaluated = evaluate(ctx, preregistered, built, testset, split="heldout",
                             compare_production=False)
        # Judged under the registered bytes themselves (no file in hand to compare).
        gated = gate(ctx, preregistered, built, evaluated, thresholds_path=None)
        passed, why = gated.passed, gated.decision.summary
    except Exception as err:  # noqa: BLE001 - a kernel that no longer runs fails re-validation
        passed, why = False, f"evaluation failed: {type(err).__name__}: {err}"
    if passed:
        return _finish(ctx, version, "passed", f"v{version} still meets its preregistered thresholds",
                       loaded)
    change = registry.rollback(record.tracking, record.family,
                               reason=f"nightly re-validation failed: {why}",
                               signing=record.signing, parent_run_id=record.rollout_run_id)
    target = (f"previous production v{change.version}" if change.version else
              f"the native baseline ({version_runners.NATIVE_BASELINE}); no earlier usable production")
    return _finish(ctx, version, "rolled_back",
                   f"v{version} failed re-validation ({why}); rolled back to {target}", loaded)


def _how_loaded(runner) -> str:
    if isinstance(runner, version_runners.VersionWorker):
        drift = runner.info.get("jax_drift")
        return (f"in its own process from its logged code (sha256 {runner.info['code_sha256'][:12]})"
                + (f"; {drift}" if drift else ""))
    return "in this process: its logged code is this checkout's code (same sha256)"
