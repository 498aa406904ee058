"""Traffic: the recorded request stream, the shadow stage and the canary steps."""

from __future__ import annotations

from pydantic import BaseModel

from evaluation import recorded_traffic, serving
from evaluation.documents import assign_splits, load_documents
from flows.results import Evaluated, Gated, RolloutContext
from flows.tasks import run_logger, stage_task
from gates.canary import CanaryStepResult, analyse_canary_step
from gates.canary_plan import CanaryStep
from lineage import evidence, registered_model, registry, version_runners
from lineage.records import log_canary_step, log_shadow


class TrafficPlan(BaseModel):
    """The recorded stream cut into consecutive, disjoint segments: shadow first, then
    one per canary step of the registered plan."""

    shadow: recorded_traffic.RecordedTraffic
    canary: list[tuple[CanaryStep, recorded_traffic.RecordedTraffic]]


@stage_task(name="record-traffic")
def record_traffic(context: RolloutContext, gated: Gated) -> TrafficPlan:
    """Cut the request stream from held-out documents only and log it to the rollout
    run: one segment for shadow, one per step of the registered canary plan."""
    steps = gated.thresholds.canary.steps
    sizes = [context.settings.shadow_requests, *(s.requests for s in steps)]
    documents = assign_splits(load_documents(context.settings.documents_dir))["heldout"]
    traffic = recorded_traffic.record_traffic(documents, sum(sizes), seed=0)
    evidence.log_traffic(context.record,
                         traffic.write(context.record.work_dir / "traffic" / "requests-0.json"))
    shadow, *canary = recorded_traffic.split_traffic(traffic, sizes)
    return TrafficPlan(shadow=shadow, canary=list(zip(steps, canary, strict=True)))


def _progress(label: str):
    logger = run_logger()

    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            logger.info("%s: %d/%d requests", label, done, total)
    return report


def _judged(gated: Gated, evaluated: Evaluated, result: serving.TrafficResult,
            step: CanaryStep) -> CanaryStepResult:
    # Latency and memory in traffic are judged only where the candidate runs natively.
    report = evaluated.report
    reason = None if report.speed_assessed else report.speed_not_assessed_reason
    candidate_s, production_s = result.matched_latencies()
    return analyse_canary_step(
        step, candidate_s, production_s, result.drifts(),
        result.errors("candidate"), result.nan_count("candidate"), result.memory_start_bytes,
        result.memory_end_bytes, gated.thresholds.canary, latency_not_assessed_reason=reason,
        memory_not_assessed_reason=reason, production_error_count=result.errors("production"),
        served=(result.served_count("candidate"), result.served_count("production")))


def _endpoints(context: RolloutContext, alias: registered_model.Alias,
               version: str) -> tuple[serving.Endpoint, serving.Endpoint]:
    production = version_runners.endpoint(context.versions, "production")
    candidate = version_runners.endpoint(context.versions, alias, expect_version=version)
    return production, candidate


@stage_task(name="shadow")
def shadow(context: RolloutContext, gated: Gated, evaluated: Evaluated,
           traffic: recorded_traffic.RecordedTraffic) -> CanaryStepResult:
    """Shadow stage: production serves, the candidate (alias ``shadow``) is mirrored and
    judged with the canary plan's limits (drift, errors, NaN, latency where native)."""
    record, version = context.record, gated.version
    registry.assign_shadow(record.tracking, record.family, version,
                           signing=record.signing, owner_run_id=record.rollout_run_id)
    production, candidate = _endpoints(context, "shadow", version)
    serving.warm_up(traffic.requests, [production, candidate], context.model)  # compile first
    result = serving.replay_shadow(traffic.requests, production, candidate,
                                   progress=_progress("shadow"))
    # The candidate sees every shadow request (mirrored) but serves none of them.
    judged = _judged(gated, evaluated, result, CanaryStep(
        name="shadow", traffic_fraction=1.0, requests=len(traffic.requests)))
    run_id = log_shadow(record.tracking, record.family, version, result, judged,
                        decision_run_id=gated.run_id, signing=record.signing,
                        parent_run_id=record.rollout_run_id)
    registered_model.link_traffic_run(record.tracking, record.family, version, "shadow", run_id)
    run_logger().info("shadow: %s", serving.traffic_summary(result))
    return judged


@stage_task(name="canary-step")
def canary_step(context: RolloutContext, gated: Gated, evaluated: Evaluated, step: CanaryStep,
                traffic: recorded_traffic.RecordedTraffic) -> CanaryStepResult:
    """One canary step: ``step.traffic_fraction`` of the step's requests served by the
    candidate (alias ``canary``), then analysed against the preregistered plan."""
    record, version = context.record, gated.version
    production, candidate = _endpoints(context, "canary", version)
    serving.warm_up(traffic.requests, [production, candidate], context.model)
    result = serving.replay_canary_step(traffic.requests, step.traffic_fraction, production,
                                        candidate, salt=f"{record.rollout_run_id}:{step.name}",
                                        progress=_progress(step.name))
    judged = _judged(gated, evaluated, result, step)
    run_id = log_canary_step(record.tracking, record.family, judged, version=version,
                             decision_run_id=gated.run_id, signing=record.signing,
                             parent_run_id=record.rollout_run_id)
    registered_model.link_traffic_run(record.tracking, record.family, version, "canary", run_id)
    run_logger().info("%s: %s -> %s", step.name, serving.traffic_summary(result),
                          "pass" if judged.passed else f"breach: {judged.breaches}")
    return judged
