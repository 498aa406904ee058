"""Build, evaluate and judge: the tasks that turn a candidate into a gate decision."""

from __future__ import annotations

import kernels
from evaluation.evaluate import evaluate_candidate
from evaluation.report import EvaluationReport
from evaluation.testset.draws import unspent_draw
from flows.settings import RolloutState
from flows.tasks import encoder, run_logger, stage_task
from gates.decision import GateDecision, decide
from kernels.shapes import AttentionShape
from lineage import evidence, registered_model, registration, version_runners
from lineage.chain import spent_confirmation_digests
from lineage.records import log_decision
from lineage.sources import StoreSource

REFERENCE_CACHE_DIR = "reference-cache"
"""Under the store folder: float64 references cached across evaluations (keyed by the
case's and the reference code's digests; every use is indexed and signed with its
evaluation, and ``kernelgate audit --recheck-reference`` recomputes a sample)."""

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
    state.build_run_id, state.version, logged = evidence.log_build(record, build, out,
                                                                   encoder(state))
    run_logger().info("built %s: build run %s, logged as an MLflow model (%d files, %.1f MB, "
                      "code sha256 %s) and registered as v%s", build.implementation,
                      state.build_run_id, logged.files, logged.size_bytes / 1e6,
                      logged.code_sha256[:12], state.version)
    return state.version


@stage_task(name="evaluate")
def evaluate(state: RolloutState, *, split: str = "heldout", measure_speed: bool = True,
             compare_production: bool = True) -> tuple[EvaluationReport, str]:
    """Evaluate ``state.version`` — the registered model, run by its own code
    (``lineage.versions``) — on one split against naive (and production) and log the
    evidence to an evaluation run; returns ``(report, evaluation run id)`` and, for the
    held-out split, keeps them in ``state``.

    Raises:
        FileNotFoundError: no test set; ValueError: unknown split.
    """
    record, settings = state.record, state.settings
    pool = state.versions
    production_version = (version_runners.production_version(record.tracking, record.family)
                          if compare_production else None)
    production = pool.runner(production_version) if production_version else None
    candidate = pool.runner(state.version)
    out = record.work_dir / f"evaluation-{split}"
    with evidence.evaluation_run(record, build_run_id=state.build_run_id,
                                 registration_id=state.registration.registration_id,
                                 split=split, implementation=candidate.name) as run_id:
        evidence.log_evaluation_inputs(record, run_id, testset_dir=state.testset_dir, split=split,
                                       model=state.model)
        try:
            report = evaluate_candidate(
                candidate, testset_dir=state.testset_dir, out_dir=out, split=split,
                production=production, model=state.model if settings.model_check else None,
                repeats=settings.perf_repeats, perf_shapes=settings.perf_shapes,
                measure_speed=measure_speed,
                reference_cache_dir=settings.store_dir / REFERENCE_CACHE_DIR)
        finally:
            evidence.log_evaluation_files(record, run_id, out_dir=out, testset_dir=state.testset_dir)
        evidence.log_evaluation_result(record, run_id, report, build_run_id=state.build_run_id,
                                       registration_id=state.registration.registration_id,
                                       version=state.version,
                                       production_implementation=production and production.name)
    if split == "heldout":
        state.report, state.evaluation_run_id = report, run_id
        state.judged_against = production_version
    return report, run_id


def _judge(state: RolloutState, report: EvaluationReport, evaluation_run_id: str, *,
           thresholds_path, kinds=None) -> tuple[GateDecision, str]:
    record = state.record
    source = StoreSource(record.tracking, record.family, record.signing.trust,
                         stages=("preregistration",))
    thresholds = registration.thresholds_for_gate(source, state.registration, thresholds_path,
                                                  report.started_at)
    state.thresholds = thresholds
    decision = decide(report, thresholds, state.registration, kinds=kinds)
    decision_run_id = log_decision(record.tracking, record.family, decision,
                                   build_run_id=state.build_run_id,
                                   evaluation_run_id=evaluation_run_id, version=state.version,
                                   signing=record.signing, parent_run_id=record.rollout_run_id)
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
    """Judge the candidate once on a confirmation split this family has not spent, kept
    back until now: accuracy criteria only (speed was judged on held-out data and in
    canary), under the same registration; the decision is linked from the version.

    Raises:
        ConfirmationExhausted: the family has spent every confirmation draw.
    """
    record = state.record
    spent = spent_confirmation_digests(StoreSource(record.tracking, record.family,
                                                   record.signing.trust, stages=("evaluation",)))
    split = unspent_draw(state.testset_dir, spent, model=state.model)
    run_logger().info("confirmation split %s (%d spent by %s before)", split, len(spent),
                      record.family)
    report, run_id = evaluate(state, split=split, measure_speed=False, compare_production=False)
    decision, decision_run_id = _judge(state, report, run_id,
                                       thresholds_path=state.settings.thresholds,
                                       kinds={"accuracy"})
    registered_model.link_confirmation(state.record.tracking, state.record.family,
                                       state.version, decision_run_id)
    run_logger().info("confirmation split: %s — %s", decision.verdict, decision.summary)
    return decision
