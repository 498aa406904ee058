"""Build, evaluate and judge: the tasks that turn a candidate into a gate decision."""

from __future__ import annotations

import kernels
from evaluation.evaluate import evaluate_candidate
from evaluation.report import EvaluationReport
from flows.settings import RolloutState
from flows.tasks import run_logger, stage_task
from gates.decision import GateDecision, decide
from kernels.shapes import AttentionShape
from lineage import evidence, registration, registry, versions
from lineage.records import log_decision

BUILD_SHAPE = AttentionShape(batch=1, q_len=256, kv_len=256, num_heads=4, num_kv_heads=2,
                             head_dim=128, dtype="bfloat16", causal=False)
"""The example problem a build is compiled and exported for (GQA, head_dim 128)."""


@stage_task(name="build")
def build(state: RolloutState) -> str:
    """Compile and export the candidate, log the build run, register a model version.

    Returns the version.
    """
    record = state.record
    out = record.work_dir / "build"
    build = kernels.build(record.implementation, state.settings.config, BUILD_SHAPE,
                          output_dir=out)
    state.build_run_id = evidence.log_build(record, build, out)
    state.version = registry.register_build(record.tracking, record.family, state.build_run_id,
                                            implementation=build.implementation,
                                            config=build.config)
    run_logger().info("built %s: build run %s, registered as v%s", build.implementation,
                          state.build_run_id, state.version)
    return state.version


@stage_task(name="evaluate")
def evaluate(state: RolloutState, *, split: str = "heldout", measure_speed: bool = True,
             compare_production: bool = True, implementation: str | None = None,
             config: kernels.BlockSizes | None = None) -> tuple[EvaluationReport, str]:
    """Evaluate the build on one split against naive (and production) and log the
    evidence to an evaluation run; returns ``(report, evaluation run id)`` and, for the
    held-out split, keeps them in ``state``.

    Raises:
        FileNotFoundError: no test set; ValueError: unknown implementation or split.
    """
    record, settings = state.record, state.settings
    if implementation is None:  # the candidate of this rollout
        implementation, config = record.implementation, settings.config
    _, production, production_config = (versions.production_kernel(record.tracking, record.family)
                                        if compare_production else (None, None, None))
    out = record.work_dir / f"evaluation-{split}"
    with evidence.evaluation_run(record, build_run_id=state.build_run_id,
                                 registration_id=state.registration.registration_id,
                                 split=split, implementation=implementation) as run_id:
        evidence.log_evaluation_inputs(record, run_id, testset_dir=state.testset_dir, split=split,
                                       model=state.model)
        try:
            report = evaluate_candidate(
                implementation, testset_dir=state.testset_dir, out_dir=out, split=split,
                production=production, config=config, production_config=production_config,
                model=state.model if settings.model_check else None,
                repeats=settings.perf_repeats, perf_shapes=settings.perf_shapes,
                measure_speed=measure_speed)
        finally:
            evidence.log_evaluation_files(record, run_id, out_dir=out, testset_dir=state.testset_dir)
        evidence.log_evaluation_result(record, run_id, report, production_implementation=production)
    if split == "heldout":
        state.report, state.evaluation_run_id = report, run_id
    return report, run_id


def _judge(state: RolloutState, report: EvaluationReport, evaluation_run_id: str, *,
           thresholds_path, kinds=None) -> tuple[GateDecision, str]:
    record = state.record
    thresholds = registration.thresholds_for_gate(state.registration, thresholds_path,
                                                  report.started_at, tracking=record.tracking)
    state.thresholds = thresholds
    decision = decide(report, thresholds, state.registration, kinds=kinds)
    decision_run_id = log_decision(record.tracking, record.family, decision,
                                   build_run_id=state.build_run_id,
                                   evaluation_run_id=evaluation_run_id,
                                   parent_run_id=record.rollout_run_id)
    return decision, decision_run_id


@stage_task(name="gate")
def gate(state: RolloutState, *, thresholds_path=None) -> GateDecision:
    """Judge the held-out report against the preregistered thresholds and log the decision.

    Raises:
        PreregistrationError: the thresholds file changed since registration, or the
            evaluation started before it.
    """
    state.decision, state.decision_run_id = _judge(state, state.report, state.evaluation_run_id,
                                                   thresholds_path=thresholds_path)
    run_logger().info("gate: %s — %s", state.decision.verdict, state.decision.summary)
    return state.decision


@stage_task(name="confirm")
def confirm(state: RolloutState) -> GateDecision:
    """Judge the candidate once on the ``confirmation`` split, kept back until now:
    accuracy criteria only (speed was judged on held-out data and in canary), under the
    same registration; the decision is linked from the version."""
    report, run_id = evaluate(state, split="confirmation", measure_speed=False,
                              compare_production=False)
    decision, decision_run_id = _judge(state, report, run_id,
                                       thresholds_path=state.settings.thresholds,
                                       kinds={"accuracy"})
    registry.link_confirmation(state.record.tracking, state.record.family, state.version,
                               decision_run_id)
    run_logger().info("confirmation split: %s — %s", decision.verdict, decision.summary)
    return decision
