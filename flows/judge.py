"""Build, evaluate and judge: the tasks that turn a candidate into a gate decision."""

from __future__ import annotations

from evaluation.evaluate import evaluate_candidate
from evaluation.performance import default_shapes
from evaluation.testset.draws import unspent_draw
from flows.dispatch_candidate import build_inputs
from flows.results import (
    Built,
    Confirmed,
    Evaluated,
    Gated,
    Prepared,
    Preregistered,
    RolloutContext,
)
from flows.tasks import run_logger, stage_task
from gates.decision import decide
from gates.thresholds import Thresholds
from kernels.build import build as build_kernel
from kernels.interpreters import InterpreterPlan
from kernels.shapes import AttentionShape
from lineage.records import registration
from lineage.records.chain import spent_confirmation_digests
from lineage.rollout import evidence
from lineage.signing.reference_seal import SignedReferences
from lineage.store import tags

REFERENCE_CACHE_DIR = "reference-cache"
"""Under the store folder: float64 references cached across evaluations (keyed by the
case's and the reference code's digests; every use is indexed and signed with its
evaluation, and ``kernelgate audit --recheck-reference`` recomputes a sample)."""

BUILD_SHAPE = AttentionShape(batch=1, q_len=256, kv_len=256, num_heads=4, num_kv_heads=2,
                             head_dim=128, dtype="bfloat16", causal=False)
"""The example problem a build is compiled and exported for (GQA, head_dim 128)."""


@stage_task(name="build")
def build(context: RolloutContext, preregistered: Preregistered | None = None) -> Built:
    """Compile and export the plan's kernel, log the build run, register a model version
    (its tiling recorded at the benchmark shapes ``preregistered`` bound; without a
    registration, the settings')."""
    record, settings = context.record, context.settings
    out = record.work_dir / "build"
    config, before_signing = build_inputs(record.implementation, settings.config,
                                          record.tracking)  # a dispatch build: its policy
    build = build_kernel(record.implementation, config, BUILD_SHAPE, output_dir=out)
    shapes = preregistered.perf_shapes(settings) if preregistered else settings.perf_shapes
    bench = shapes or default_shapes(record.backend)
    build_run_id, version, logged = evidence.log_build(record, build, out, context.model, bench,
                                                       before_signing)
    run_logger().info("built %s: build run %s, logged as an MLflow model (%d files, %.1f MB, "
                      "code sha256 %s) and registered as v%s", build.implementation,
                      build_run_id, logged.files, logged.size_bytes / 1e6,
                      logged.code_sha256[:12], version)
    return Built(build_run_id=build_run_id, version=version)


def registered_interpreters(frozen: Thresholds) -> InterpreterPlan:
    """The Pallas interpreter of each purpose (``kernels.interpreters``) the registered
    thresholds ``frozen`` name."""
    return InterpreterPlan.for_profile(frozen.serving_tpu_interpret_mode)


@stage_task(name="evaluate")
def evaluate(context: RolloutContext, preregistered: Preregistered, built: Built,
             testset: Prepared, *, split: str = "heldout", measure_speed: bool = True,
             compare_production: bool = True) -> Evaluated:
    """Evaluate the built version — the registered model, run by its own code
    (``lineage.serving.versions``) — on one split against naive (and production) and log the
    evidence to an evaluation run. Everything that can change the verdict comes from the
    registration (``preregistered``): the serving contract, the MiniLM document count and
    the Pallas interpreters of its thresholds; the perf shapes and repeats and the MiniLM
    check it bound. Never from the file or settings in hand.

    Raises:
        FileNotFoundError: no test set; ValueError: unknown split.
    """
    record, settings = context.record, context.settings
    pool = context.versions
    production_version = context.store.production_version() if compare_production else None
    production = pool.runner(production_version) if production_version else None
    candidate = pool.runner(built.version)
    out = record.work_dir / f"evaluation-{split}"
    registration_id = preregistered.registration.registration_id
    frozen = preregistered.thresholds
    with evidence.evaluation_run(record, build_run_id=built.build_run_id,
                                 registration_id=registration_id,
                                 split=split, implementation=candidate.name) as run_id:
        evidence.log_evaluation_inputs(record, run_id, testset_dir=testset.testset_dir,
                                       split=split, model=context.model)
        try:
            report = evaluate_candidate(
                candidate, testset_dir=testset.testset_dir, out_dir=out, split=split,
                production=production,
                model=context.model if preregistered.model_check(settings) else None,
                repeats=preregistered.perf_repeats(settings),
                perf_shapes=preregistered.perf_shapes(settings),
                measure_speed=measure_speed,
                reference_cache_dir=settings.store_dir / REFERENCE_CACHE_DIR,
                reference_seal=SignedReferences(record.signing),
                serving=frozen.serving, model_documents=frozen.model_check_documents,
                interpreters=registered_interpreters(frozen))
        finally:
            evidence.log_evaluation_files(record, run_id, out_dir=out,
                                          testset_dir=testset.testset_dir)
        evidence.log_evaluation_result(record, run_id, report, build_run_id=built.build_run_id,
                                       registration_id=registration_id,
                                       version=built.version,
                                       production_implementation=production and production.name)
    if report.interpreters:
        run_logger().info("evaluation %s: %s ran interpreted: the accuracy cases under %s, the "
                          "MiniLM check under %s (kernels.interpreters; registered "
                          "serving_tpu_interpret_mode)", split, candidate.name,
                          report.interpreters["accuracy"], report.interpreters["model_check"])
    return Evaluated(report=report, run_id=run_id, split=split,
                     judged_against=production_version)


def _judge(context: RolloutContext, preregistered: Preregistered, built: Built,
           evaluated: Evaluated, *, kinds=None) -> Gated:
    store = context.store
    source = store.source(stages=("preregistration",))
    thresholds = registration.thresholds_for_gate(source, preregistered.registration,
                                                  context.plan.thresholds_sha256,
                                                  evaluated.report.started_at)
    decision = decide(evaluated.report, thresholds, preregistered.registration, kinds=kinds)
    decision_run_id = store.log_decision(decision, build_run_id=built.build_run_id,
                                         evaluation_run_id=evaluated.run_id, version=built.version,
                                         parent_run_id=context.record.rollout_run_id)
    return Gated(version=built.version, decision=decision, run_id=decision_run_id,
                 thresholds=thresholds)


@stage_task(name="gate")
def gate(context: RolloutContext, preregistered: Preregistered, built: Built,
         evaluated: Evaluated) -> Gated:
    """Judge the held-out report against the registered thresholds, read back from the
    store and checked against their signed digest and the session's plan, and log the
    decision.

    Raises:
        PreregistrationError: the registered bytes were altered, are not the plan's, or
            the evaluation started before the registration.
    """
    gated = _judge(context, preregistered, built, evaluated)
    store = context.store
    # linked now, not only on promotion: a rejected version's description links its chain.
    # Only a version's first gate links: a re-validation gates production again, and its
    # links stay the ones the promotion signed (the audit compares them).
    if tags.DECISION_RUN_ID not in store.version_tags(built.version):
        store.link_gate(built.version, decision_run_id=gated.run_id,
                        evaluation_run_id=evaluated.run_id,
                        registration_id=preregistered.registration.registration_id)
    run_logger().info("gate: %s — %s", gated.decision.verdict, gated.decision.summary)
    return gated


@stage_task(name="confirm")
def confirm(context: RolloutContext, preregistered: Preregistered, built: Built,
            testset: Prepared) -> Confirmed:
    """Judge the candidate once on a confirmation split this family has not spent, kept
    back until now: accuracy criteria only (speed was judged on held-out data and in
    canary), under the same registration; the decision is linked from the version.

    Raises:
        ConfirmationExhausted: the family has spent every confirmation draw.
    """
    store = context.store
    # every run of the family: the stage tag is not signed (a re-tagged evaluation would
    # hide a spent split; the registry's wall refuses a reused one either way)
    spent = spent_confirmation_digests(store.source())
    split = unspent_draw(testset.testset_dir, spent,  # drawn as built, whatever the contract
                         model=context.model.with_attention_dtype("float32"))
    run_logger().info("confirmation split %s (%d spent by %s before)", split, len(spent),
                      store.family)
    evaluated = evaluate(context, preregistered, built, testset, split=split,
                         measure_speed=False, compare_production=False)
    judged = _judge(context, preregistered, built, evaluated, kinds={"accuracy"})
    store.link_confirmation(built.version, judged.run_id)
    run_logger().info("confirmation split: %s — %s", judged.decision.verdict,
                      judged.decision.summary)
    return Confirmed(decision=judged.decision, run_id=judged.run_id, evaluation=evaluated)
