"""Traffic: the shadow stage and the canary steps over the recorded stream
(``flows.traffic_plan``), their verdicts and the adoption decision."""

from __future__ import annotations

from typing import NamedTuple

from evaluation import recorded_traffic, serving
from evaluation.longdoc import canary_source
from flows.results import Evaluated, Gated, RolloutContext
from flows.tasks import run_logger, stage_task
from gates.adoption_decision import AdoptionVerdict, conclude_adoption
from gates.canary import CanaryStepResult, analyse_canary_step
from gates.canary_latency import CanaryVerdict, conclude_canary
from gates.canary_plan import CanaryPlan, CanaryStep
from kernels import interpreters
from lineage.aliases import registered_model
from lineage.records import calibration
from lineage.records.adoption_record import log_adoption
from lineage.records.environment import collect_environment
from lineage.serving import version_runners
from lineage.store import tracking as tr


def _progress(label: str):
    logger = run_logger()

    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            logger.info("%s: %d/%d requests", label, done, total)
    return report


def judge_step(plan: CanaryPlan, result: serving.TrafficResult, step: CanaryStep,
               earlier: list[CanaryStepResult] | None, reason: str | None) -> CanaryStepResult:
    """A replayed step analysed against ``plan`` (the canary's and the calibration's one
    path): ABBA timings for the paired test where ``earlier`` is given (a canary step)
    and latency is assessed (``reason`` None), with the earlier steps' results."""
    candidate_s, production_s = result.matched_latencies()
    abba = result.abba_timings() if earlier is not None and reason is None else None
    return analyse_canary_step(
        step, candidate_s, production_s, result.drifts(),
        result.errors("candidate"), result.nan_count("candidate"), result.memory_start_bytes,
        result.memory_end_bytes, plan, latency_not_assessed_reason=reason,
        memory_not_assessed_reason=reason, production_error_count=result.errors("production"),
        production_failed_buckets=result.failed_buckets("production"),
        served=(result.served_count("candidate"), result.served_count("production")),
        abba=abba, earlier=earlier or [],
        length_buckets=result.abba_buckets() if abba is not None else None)


def _judged(gated: Gated, evaluated: Evaluated, result: serving.TrafficResult,
            step: CanaryStep, earlier: list[CanaryStepResult] | None = None) -> CanaryStepResult:
    # Latency and memory in traffic are judged only where the candidate runs natively.
    report = evaluated.report
    reason = None if report.speed_assessed else report.speed_not_assessed_reason
    judged = judge_step(gated.thresholds.canary, result, step, earlier, reason)
    return judged.model_copy(update={"interpreter": result.interpreter})


def _endpoints(context: RolloutContext, alias: registered_model.Alias,
               version: str) -> tuple[serving.Endpoint, serving.Endpoint]:
    production = version_runners.endpoint(context.versions, "production")
    candidate = version_runners.endpoint(context.versions, alias, expect_version=version)
    where = {e.name: ("a process of its own" if isinstance(e.runner, version_runners.VersionWorker)
                      else "this process") for e in (production, candidate)}
    if len(set(where.values())) > 1:  # a latency ratio then includes the placement
        run_logger().warning("%s: %s; the compared latencies include the placement", alias,
                             ", ".join(f"{name} runs in {w}" for name, w in where.items()))
    return production, candidate


def _warm_up(context: RolloutContext, evaluated: Evaluated,
             traffic: recorded_traffic.RecordedTraffic, production: serving.Endpoint,
             candidate: serving.Endpoint) -> None:
    """Compile before the compared latencies: both endpoints where the candidate's
    latency is judged; production alone where it is not (an interpreted candidate: its
    first request per length then includes compiling it, which nothing judges; warming
    it cost one more interpreted request per length)."""
    if evaluated.report.speed_assessed:
        serving.warm_up(traffic.requests, [production, candidate], context.model)
        return
    serving.warm_up(traffic.requests, [production], context.model)
    run_logger().info("warm-up: production only; %s's latency is not assessed (%s), so its "
                      "first request per length includes compiling it", candidate.name,
                      evaluated.report.speed_not_assessed_reason)


def _plan(gated: Gated) -> interpreters.InterpreterPlan:
    """The Pallas interpreter of each purpose the registered thresholds the gate judged by
    name (``serving_tpu_interpret_mode``), not the file read when the session opened."""
    return interpreters.InterpreterPlan.for_profile(gated.thresholds.serving_tpu_interpret_mode)


def _interpreted(gated: Gated, evaluated: Evaluated, purpose: str,
                 result: serving.TrafficResult) -> serving.TrafficResult:
    """``result`` with the Pallas interpreter the candidate ran under in ``purpose``
    (``kernels.interpreters``), said in the run log too; unchanged (None) where it ran
    natively or is a kernel that ignores the choice (``interpreters.takes_the_choice``)."""
    if not interpreters.takes_the_choice(evaluated.report.candidate):
        return result
    name = _plan(gated).for_purpose(purpose)
    run_logger().info("%s: %s ran interpreted under %s (kernels.interpreters; registered "
                      "serving_tpu_interpret_mode); the accuracy cases ran in tpu_interpret",
                      result.stage, result.candidate, name)
    return result.model_copy(update={"interpreter": name})


@stage_task(name="shadow")
def shadow(context: RolloutContext, gated: Gated, evaluated: Evaluated,
           traffic: recorded_traffic.RecordedTraffic | canary_source.LongdocStep,
           ) -> CanaryStepResult:
    """Shadow stage: production serves, the candidate (alias ``shadow``) is mirrored and
    judged with the canary plan's limits (drift, errors, NaN, latency where native), on
    the recorded MiniLM requests or, where the canary replays a workload, its documents."""
    store, version, run = context.store, gated.version, context.record.rollout_run_id
    store.assign_shadow(version, owner_run_id=run)
    with _plan(gated).scope("shadow"):
        if isinstance(traffic, canary_source.LongdocStep):
            result = canary_source.replay_shadow_documents(
                traffic.documents, *_longdoc_endpoints(context, "shadow", version, traffic),
                progress=_progress("shadow"))
            served = len(traffic.documents)
        else:
            production, candidate = _endpoints(context, "shadow", version)
            _warm_up(context, evaluated, traffic, production, candidate)
            result = serving.replay_shadow(traffic.requests, production, candidate,
                                           progress=_progress("shadow"))
            served = len(traffic.requests)
    result = _interpreted(gated, evaluated, "shadow", result)
    # The candidate sees every shadow request (mirrored) but serves none of them.
    judged = _judged(gated, evaluated, result, CanaryStep(
        name="shadow", traffic_fraction=1.0, requests=served))
    run_id = store.log_shadow(version, result, judged, decision_run_id=gated.run_id,
                              parent_run_id=run)
    store.link_traffic_run(version, "shadow", run_id)
    run_logger().info("shadow: %s", serving.traffic_summary(result))
    return judged


@stage_task(name="canary-step")
def canary_step(context: RolloutContext, gated: Gated, evaluated: Evaluated, step: CanaryStep,
                traffic: recorded_traffic.RecordedTraffic | canary_source.LongdocStep,
                earlier: list[CanaryStepResult]) -> CanaryStepResult:
    """One canary step: ``step.traffic_fraction`` of the step's requests served by the
    candidate (alias ``canary``), then analysed against the preregistered plan with the
    ``earlier`` canary steps' results (their paired samples join this step's look).

    A native candidate's compared requests are timed ABBA (twice a side) for the paired
    latency test; an interpreted one's once (its latency is not assessed, with the reason).
    Long documents as ``traffic`` (``canary.workload``) are replayed the same way, each
    compared request carrying its length bucket."""
    record, version = context.record, gated.version
    salt, abba = f"{record.rollout_run_id}:{step.name}", evaluated.report.speed_assessed
    if isinstance(traffic, canary_source.LongdocStep):
        with _plan(gated).scope("canary"):
            result = _longdoc_step(context, version, step, traffic, salt, abba)
    else:
        production, candidate = _endpoints(context, "canary", version)
        with _plan(gated).scope("canary"):
            _warm_up(context, evaluated, traffic, production, candidate)
            result = serving.replay_canary_step(
                traffic.requests, step.traffic_fraction, production, candidate, salt=salt,
                progress=_progress(step.name), abba=abba)
    result = _interpreted(gated, evaluated, "canary", result)
    judged = _judged(gated, evaluated, result, step, earlier)
    store = context.store
    run_id = store.log_canary_step(judged, version=version, decision_run_id=gated.run_id,
                                   parent_run_id=record.rollout_run_id)
    store.link_traffic_run(version, "canary", run_id)
    run_logger().info("%s: %s -> %s", step.name, serving.traffic_summary(result),
                          "pass" if judged.passed else f"breach: {judged.breaches}")
    return judged


def _longdoc_endpoints(context: RolloutContext, alias: str, version: str,
                       documents: canary_source.LongdocStep):
    """Production's and the candidate's (behind ``alias``) long-document endpoints, each
    compiled for every bucket of ``documents`` first (outside every compared latency)."""
    spec = documents.spec()
    production = version_runners.longdoc_endpoint(context.versions, "production", spec)
    candidate = version_runners.longdoc_endpoint(context.versions, alias, spec,
                                                 expect_version=version)
    canary_source.warm_up(documents.documents, [production, candidate])
    return production, candidate


def _longdoc_step(context: RolloutContext, version: str, step: CanaryStep,
                  documents: canary_source.LongdocStep, salt: str,
                  abba: bool) -> serving.TrafficResult:
    """A canary step over the workload's documents: the paired replay."""
    return canary_source.replay_step(
        documents.documents, step.traffic_fraction,
        *_longdoc_endpoints(context, "canary", version, documents), salt=salt, abba=abba)


def _latency_can_block(gated: Gated, evaluated: Evaluated) -> bool:
    return gated.thresholds.canary.paired and evaluated.report.speed_assessed


@stage_task(name="canary-calibration")
def canary_calibration(context: RolloutContext, gated: Gated,
                       evaluated: Evaluated) -> tuple[str | None, str]:
    """The A/A calibration the canary rests on: ``(run id or None, what it is or why none
    counts)``. Needed where the plan sets ``max_calibration_age_days`` and the latency
    can block (a native candidate); the flow rolls back when that one is missing."""
    days = gated.thresholds.canary.latency.max_calibration_age_days
    if not days or not _latency_can_block(gated, evaluated):
        return None, "no calibration required"
    source = context.store.source(stages=("calibration",))
    facts = calibration.device_facts(collect_environment(), workload=calibration.request_source(
        gated.thresholds.canary.workload))
    run_id, about = calibration.fresh_calibration(source, facts, days)
    run_logger().info("canary calibration: %s", about)
    return run_id, about if run_id else f"no fresh calibration of this device: {about}"


@stage_task(name="canary-verdict")
def canary_verdict(context: RolloutContext, gated: Gated, steps: list[CanaryStepResult],
                   calibration_run_id: str | None) -> CanaryVerdict:
    """The whole canary's verdict (``gates.canary_latency.conclude_canary``), citing the
    calibration used, logged to the rollout run (``canary/verdict.json``)."""
    verdict = conclude_canary(gated.thresholds.canary, steps).model_copy(
        update={"calibration_run_id": calibration_run_id})
    record = context.record
    tr.log_model_json(record.tracking, record.rollout_run_id, verdict, "canary/verdict.json")
    run_logger().info("canary verdict: %s (%s)", verdict.verdict, verdict.reason)
    return verdict


def adoption_verdict(context: RolloutContext, gated: Gated, steps: list[CanaryStepResult],
                     safety: CanaryVerdict) -> AdoptionVerdict | None:
    """The adoption decision of a registration with ``decision:`` (the
    ``adoption-verdict`` stage); None without one, and then no stage runs or is recorded:
    such a rollout's record is what it was before the section existed."""
    if gated.thresholds.decision is None:
        return None
    return _adoption_stage(context, gated, steps, safety)


@stage_task(name="adoption-verdict")
def _adoption_stage(context: RolloutContext, gated: Gated, steps: list[CanaryStepResult],
                    safety: CanaryVerdict) -> AdoptionVerdict:
    """``gates.adoption_decision.conclude_adoption`` on the canary steps' paired log
    ratios (looked at after each step), logged to the rollout run
    (``adoption/decision.json``, signed with the outcome as the canary verdict is)."""
    plan = gated.thresholds.decision
    reason = next((s.latency_not_assessed_reason for s in steps if not s.log_ratios), None)
    verdict = conclude_adoption(plan, safety.verdict, [s.log_ratios for s in steps],
                                buckets=[s.length_buckets for s in steps],
                                not_assessed_reason=reason)
    record = context.record
    log_adoption(record.tracking, record.rollout_run_id, verdict, plan.minimum_worthwhile_ratio)
    run_logger().info("adoption: %s (%s)", verdict.outcome, verdict.reason)
    return verdict


class Stop(NamedTuple):
    """Why the canary stops the candidate, and whether for want of evidence."""

    reason: str
    inconclusive: bool


def settle(gated: Gated, verdict: CanaryVerdict) -> Stop | None:
    """Why the whole-canary verdict stops the candidate, or None to go on. An
    inconclusive canary under ``inconclusive: pause`` goes on to the
    ``canary->production`` approval (a Prefect pause for a person) where one is
    required; with no person to ask it stops, and the reason says so. A stop for an
    inconclusive verdict says so (``Stop.inconclusive``): noise, not a finding."""
    if verdict.verdict == "pass":
        return None
    if verdict.verdict == "fail":
        return Stop(verdict.reason, inconclusive=False)
    if verdict.inconclusive_policy == "pause":
        if gated.thresholds.approval.requires_person("canary->production"):
            return None
        return Stop(f"{verdict.reason} (policy pause, but no person to ask: rejected)", True)
    return Stop(f"{verdict.reason} (policy: reject)", inconclusive=True)
