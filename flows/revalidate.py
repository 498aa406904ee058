"""Nightly re-validation of what ``production`` points at (scheduled in prefect.yaml).

Re-evaluates the production version on the held-out split under the thresholds it
was preregistered with (read back from MLflow, hash-checked); on failure rolls back
to the previous production version, or to the platform's native baseline when
there is none, and says which. Catches library drift: a jax/jaxlib upgrade that
breaks a kernel that once passed.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

from flows import stages
from flows.rollout import evaluate, gate, open_rollout, prepare_testset
from flows.stages import RolloutSettings
from gates.preregistration import load_registration
from kernels import BlockSizes
from lineage import registry, tags
from lineage import tracking as tr
from lineage.records import log_alias_change


class RevalidationOutcome(BaseModel):
    """What the nightly run found and did."""

    family: str
    version: str | None
    result: str  # "passed", "rolled_back", "nothing_in_production"
    reason: str
    now_serving: str
    revalidation_run_id: str


@flow(name="kernelgate-revalidate-production")
def revalidate_production(family: str = "auto", settings: RolloutSettings | None = None
                          ) -> RevalidationOutcome:
    """Re-evaluate ``production`` of ``family`` (``auto``: the native flash kernel's
    family on this backend) under its preregistered thresholds; roll back on failure."""
    from evaluation.model import MiniLM

    logger = get_run_logger()
    settings = settings or RolloutSettings()
    if family != "auto":
        settings = settings.model_copy(update={"implementation": family})
    ctx = open_rollout(settings, stage="revalidation")
    client = ctx.tracking.client()
    version, implementation = stages.production_implementation(ctx)

    def finish(result: str, reason: str) -> RevalidationOutcome:
        now = registry.alias_version(ctx.tracking, ctx.family, "production")
        serving = (f"{ctx.family} v{now}" if now else
                   f"{stages.NATIVE_BASELINE.get(ctx.backend, 'xla')} (native baseline)")
        outcome = RevalidationOutcome(family=ctx.family, version=version, result=result,
                                      reason=reason, now_serving=serving,
                                      revalidation_run_id=ctx.rollout_run_id)
        tr.log_model_json(ctx.tracking, ctx.rollout_run_id, outcome, "revalidation/outcome.json")
        tr.set_tags(ctx.tracking, ctx.rollout_run_id, {"kernelgate.result": result,
                                                       "mlflow.note.content": reason})
        tr.end_run(ctx.tracking, ctx.rollout_run_id)
        create_markdown_artifact(
            f"# nightly re-validation of {ctx.family}: **{result}**\n\n* version: v{version}\n"
            f"* reason: {reason}\n* now serving: {serving}\n",
            key=f"revalidation-{ctx.family.replace('_', '-')}")
        logger.info("revalidation %s: %s (%s); now serving %s", ctx.family, result, reason, serving)
        return outcome

    if version is None:
        return finish("nothing_in_production", "no production alias; nothing to re-validate")
    mv = client.get_model_version(registry.registered_model_name(ctx.family), version)
    registration = load_registration(mv.tags[tags.REGISTRATION_ID], tracking=ctx.tracking)
    # Judge under the file that was preregistered, byte for byte (hash-checked by the gate).
    thresholds_path = ctx.work_dir / "registered-thresholds.yaml"
    thresholds_path.write_bytes(tr.read_verified_artifact(
        ctx.tracking, registration.registration_id, registration.thresholds_artifact))
    raw_config = mv.tags.get(stages.CONFIG_TAG, "null")
    config = None if raw_config == "null" else BlockSizes.model_validate_json(raw_config)
    model = MiniLM.load()
    testset_dir = prepare_testset(settings, ctx.backend, model)
    report, evaluation_run_id = evaluate(ctx, settings, registration=registration,
                                         build_run_id=mv.run_id, testset_dir=testset_dir,
                                         implementation=implementation, config=config,
                                         compare_production=False, model=model)
    decision, _, _ = gate(ctx, report, thresholds_path=thresholds_path, registration=registration,
                          build_run_id=mv.run_id, evaluation_run_id=evaluation_run_id)
    if decision.passed:
        return finish("passed", f"v{version} still meets its preregistered thresholds")
    change = registry.rollback(ctx.tracking, ctx.family,
                               reason=f"nightly re-validation failed: {decision.summary}")
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)
    target = (f"previous production v{change.version}" if change.version
              else "the platform's native baseline (no earlier production)")
    return finish("rolled_back", f"v{version} failed re-validation ({decision.summary}); "
                                 f"rolled back to {target}")
