"""Evaluate one candidate kernel on a split: validation, accuracy, model check, performance,
report and plots. A plain function (no Prefect), so flows and tests call it alike."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import jax

from evaluation.accuracy import evaluate_accuracy
from evaluation.case_processes import helper_for
from evaluation.cases import split_kind
from evaluation.coverage import Contract, split_by_contract
from evaluation.documents import assign_splits, load_documents
from evaluation.model import MiniLM
from evaluation.model_check import float64_attention, model_accuracy
from evaluation.performance import default_shapes, measure_performance
from evaluation.plots import write_plots
from evaluation.profiling import profile_runners
from evaluation.progress import progress_bar
from evaluation.reference_cache import INDEX_FILE as REFERENCE_INDEX_FILE
from evaluation.reference_cache import EntrySeal, ReferenceCache
from evaluation.report import (
    REPORT_FILENAME,
    EvaluationReport,
    ImplementationInfo,
    ValidationSummary,
    utc_now,
)
from evaluation.runners import LocalRunner, Runner
from evaluation.testset import MANIFEST_FILE, load_manifest, load_split
from evaluation.validation import validate_testset as run_validation
from kernels.api import AttentionFn, ConfigLike, default_backend
from kernels.interpreters import InterpreterPlan, takes_the_choice
from kernels.shapes import AttentionShape

logger = logging.getLogger(__name__)

def _attention_dtype(model) -> str:
    """The dtype ``model``'s attention runs in; float32 for a stand-in declaring none."""
    return getattr(getattr(model, "config", None), "attention_dtype", "float32")


def compile_workers(backend: str) -> int:
    """Threads that compile the test set's shapes at once: on an accelerator host all
    cores but one (compiling is host work; the device idles meanwhile); on a CPU none
    (interpret mode is not thread-safe: ``evaluation.case_processes`` uses a process)."""
    return 0 if backend == "cpu" else max(1, (os.cpu_count() or 2) - 1)


PROFILE_DIR = "profile"
"""Sub-folder of an evaluation's output with its ``jax.profiler`` trace."""

MODEL_DOCUMENTS_PER_SPLIT = 16
"""Documents of the split used for the model-level check when none are given."""


def _callable_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def as_runner(impl: Runner | AttentionFn | str, config: ConfigLike = None,
              model: MiniLM | None = None) -> Runner:
    """A :class:`evaluation.runners.Runner` for a registry name (bound with ``config``),
    a plain ``AttentionFn`` of this process, or a runner as given.

    Raises:
        ValueError: unknown implementation name or illegal block sizes.
    """
    if isinstance(impl, str):
        return LocalRunner.for_implementation(impl, config, model)
    if isinstance(impl, Runner):
        return impl
    return LocalRunner(_callable_name(impl), impl, model)


def _info(role: str, runner: Runner) -> ImplementationInfo:
    return ImplementationInfo(role=role, name=runner.name, **runner.describe())


VALIDATION_FILENAME = "testset_validation.json"


def validate_testset(testset_dir: Path, split: str, result_path: Path) -> ValidationSummary:
    """Run the test set's Great Expectations suite (``evaluation.validation``) and
    summarise it; the full outcome with GX's results is written to ``result_path``."""
    outcome = run_validation(testset_dir, split, result_path=result_path, raise_on_failure=False)
    return ValidationSummary(success=outcome.success, result_path=str(result_path),
                             reason=None if outcome.success else "; ".join(outcome.reasons()),
                             testset_digest=outcome.testset_digest,
                             split_digest=outcome.split_digest)


def split_documents(testset_dir: Path, split: str, count: int | None = None) -> list:
    """Documents for the model-level check of ``split``, from the source the test set was
    built from (its manifest's ``document_source``): for a confirmation split or draw,
    the documents its cases were made from (later draws use the following confirmation
    documents, which must stay unseen), the first ``count`` of them when given; otherwise
    the first ``count`` (default ``MODEL_DOCUMENTS_PER_SPLIT``) assigned to the split.

    Raises:
        ValueError: ``count`` below 1.
    """
    if count is not None and count < 1:
        raise ValueError(f"the model check needs at least one document, got count={count}")
    manifest = load_manifest(testset_dir)
    source = manifest.document_source
    docs = load_documents(None if source == "installed-distributions" else source)
    kind = split_kind(split)
    if kind == "confirmation":
        names = {d.name for d in manifest.split(split).documents}
        return [d for d in assign_splits(docs)[kind] if d.name in names][:count]
    return assign_splits(docs, per_split=count or MODEL_DOCUMENTS_PER_SPLIT)[kind]


def evaluate_candidate(
    candidate: Runner | AttentionFn | str,
    *,
    testset_dir: str | Path,
    out_dir: str | Path,
    split: str = "heldout",
    baseline: Runner | AttentionFn | str = "naive",
    production: Runner | AttentionFn | str | None = None,
    config: ConfigLike = None,
    production_config: ConfigLike = None,
    model=None,
    documents: Sequence | None = None,
    perf_shapes: Sequence[AttentionShape] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    error_threshold: float | None = None,
    progress: bool = True,
    measure_speed: bool = True,
    reference_cache_dir: str | Path | None = None,
    reference_seal: EntrySeal | None = None,
    profile: bool | None = None,
    serving: Contract | None = None,
    model_documents: int | None = None,
    interpreters: InterpreterPlan | None = None,
) -> EvaluationReport:
    """Evaluate a candidate attention kernel on one split of a test set.

    Steps: validate the split (Great Expectations; a failure stops here and the report
    says why); accuracy of candidate, baseline and production per case and category
    against float64; model-level cosine similarity (when ``model`` is given);
    performance on this device; report JSON and plots under ``out_dir``.

    Args:
        candidate: a registry name (bound with ``config``), an ``AttentionFn`` of this
            process, or a ``Runner`` (e.g. a registered version in its own process).
        testset_dir: folder written by ``evaluation.testset.build_testset``.
        out_dir: where ``evaluation_report.json`` and the PNGs go.
        split: ``tuning``, ``heldout``, ``confirmation`` or a confirmation draw
            ``confirmation-<k>`` (``evaluation.testset.draws``).
        baseline: the naive baseline (registry name or ``AttentionFn``).
        production: the current production implementation, if any.
        config: block sizes for a named candidate.
        production_config: block sizes production was registered with (named production).
        model: an ``evaluation.model.MiniLM`` for the model-level check (skipped if None);
            local runners embed with it, a version's runner with its own encoder.
        documents: texts or ``Document``s for it; default: ``split_documents(testset_dir,
            split, model_documents)``.
        model_documents: how many documents the model check embeds when ``documents``
            is not given (the registration's ``model_check_documents``); ``None``: the
            first ``MODEL_DOCUMENTS_PER_SPLIT`` assigned to the split, every document of
            a confirmation draw.
        perf_shapes, repeats, warmup: performance settings (defaults per platform,
            see ``evaluation.performance``).
        error_threshold: optional line on the error plot.
        progress: show tqdm progress bars.
        measure_speed: time the implementations; ``False`` (e.g. the confirmation split,
            speed judged on held-out) leaves speed not assessed, saying so.
        reference_cache_dir: where float64 references are cached between evaluations
            (``evaluation.reference_cache``; ``None``: computed, not kept). Either way the
            index of what was used is written to ``out_dir/reference_cache.json``.
        reference_seal: signs each reference computed and checks each one read from the
            cache (a cached array whose seal does not open is recomputed; the pipeline
            passes ``lineage.signing.reference_seal.SignedReferences``); None: used as read.
        profile: record a ``jax.profiler`` trace of the in-process implementations at
            the first benchmark shape into ``out_dir/profile`` (``evaluation.profiling``);
            default: when the candidate's speed is assessed (native hardware).
        serving: the registration's serving contract (``evaluation.coverage``): cases
            outside it are not drawn (listed in ``report.not_drawn``), the model check
            runs its attention in ``serving.model_dtype``, and cases the candidate
            refuses inside it are ``report.refused`` (metric ``coverage.refused_cases``).
            ``None``: every case, float32 model.
        interpreters: the Pallas interpreter of the accuracy cases (always TPU interpret
            mode) and of the model check, for a kernel interpreted here
            (``kernels.interpreters``; the registration's ``serving_tpu_interpret_mode``);
            recorded in ``report.interpreters``. ``None``: TPU interpret mode for both.

    Returns:
        The ``EvaluationReport`` (also written to ``out_dir/evaluation_report.json``).
        Speed metrics are left out of ``metrics`` when the candidate is not native here.

    Raises:
        ValueError: unknown implementation name or split.
        FileNotFoundError: ``testset_dir`` has no test set.
    """
    split_kind(split)
    started_at = utc_now()
    out_dir = Path(out_dir)
    testset_dir = Path(testset_dir)
    backend = default_backend()
    device = jax.devices()[0]

    if model is not None and serving is not None:
        model = model.with_attention_dtype(serving.model_dtype)
    runners = {"candidate": as_runner(candidate, config, model),
               "baseline": as_runner(baseline, None, model)}
    if production is not None:
        runners["production"] = as_runner(production, production_config, model)
    infos = {role: _info(role, runner) for role, runner in runners.items()}
    cand_info = infos["candidate"]

    validation = validate_testset(testset_dir, split, out_dir / VALIDATION_FILENAME)
    report = EvaluationReport(
        candidate=cand_info, baseline=infos["baseline"], production=infos.get("production"),
        split=split, testset_dir=str(testset_dir),
        testset_digest=validation.testset_digest, split_digest=validation.split_digest,
        manifest_path=str(testset_dir / MANIFEST_FILE),
        started_at=started_at, target_platform=cand_info.target_platform,
        device_platform=backend, device_kind=device.device_kind,
        device_count=jax.device_count(), jax_version=jax.__version__, validation=validation,
    )
    if not validation.success:
        report.status = "validation_failed"
        report.failure_reason = f"test set failed validation: {validation.reason}"
        report.finished_at = utc_now()
        report.write(out_dir / REPORT_FILENAME)
        logger.error("evaluation stopped: %s", report.failure_reason)
        return report

    cases, report.not_drawn = split_by_contract(load_split(testset_dir, split), serving)
    report.serving = serving.describe() if serving is not None else None
    if not cases:
        raise ValueError(f"no case of split {split!r} is inside the serving contract "
                         f"({report.serving}); {len(report.not_drawn)} cases left out")
    bar = (lambda n, desc: progress_bar(n, desc)) if progress else (lambda n, desc: None)
    reference = ReferenceCache(reference_cache_dir, seal=reference_seal)
    plan = interpreters or InterpreterPlan()
    if takes_the_choice(cand_info):
        report.interpreters = {"accuracy": plan.accuracy, "model_check": plan.model_check}
    with plan.scope("accuracy"):
        report.accuracy = evaluate_accuracy(
            cases, runners, baseline="baseline", reference=reference,
            compile_workers=compile_workers(backend), helper=helper_for(runners, backend),
            progress=bar(len(cases), f"accuracy {split}"))
    reference.write_index(out_dir / REFERENCE_INDEX_FILE)
    report.reference = reference.summary()

    if model is not None:
        if documents is None:
            documents = split_documents(testset_dir, split, model_documents)
        texts = [d if isinstance(d, str) else d.text for d in documents]
        ref = model.embed(texts, attention_fn=float64_attention)
        with plan.scope("model_check"):
            report.model_accuracy = {
                role: model_accuracy(texts, lambda t, r=runner: r.embed(t)[0], name=role,
                                     reference_embeddings=ref, dtype=_attention_dtype(model),
                                     weights_sha256=model.weights_sha256)
                for role, runner in runners.items()}

    native = {role: infos[role].native if role in infos else False
              for role in ("candidate", "baseline", "production")}
    perf = None
    if not measure_speed:
        report.speed_assessed = False
        report.speed_not_assessed_reason = "speed not measured in this evaluation (accuracy only)"
        native = dict.fromkeys(native, False)
    elif not cand_info.native:
        report.speed_assessed = False
        report.speed_not_assessed_reason = (
            f"{cand_info.name} is not native on {backend} (it runs interpreted; native on "
            f"{cand_info.target_platform})")
    else:
        report.speed_assessed = True
    if measure_speed:
        # An interpreted kernel is not timed: its timings judge nothing (an interpreted
        # candidate's speed criteria are not assessed, an interpreted production's speed
        # metrics are dropped below) and cost minutes on a CPU host (BENCHMARKS.md). The
        # native roles are timed, the baseline always (the reference).
        timed = {role: r for role, r in runners.items() if native[role] or role == "baseline"}
        shapes = list(perf_shapes) if perf_shapes is not None else default_shapes(backend)
        perf = measure_performance(timed, shapes, baseline="baseline", repeats=repeats,
                                   warmup=warmup, progress=bar(len(shapes), "performance"))
        report.performance = perf
        if native["candidate"] and perf.common_shapes("candidate") is None:
            failed = [s.shape.label for s in perf.shapes if not s.implementations["candidate"].ok]
            report.speed_assessed = False
            report.speed_not_assessed_reason = f"candidate failed on benchmark shapes {failed}"

    if profile if profile is not None else (measure_speed and report.speed_assessed):
        report.profile = profile_runners(runners, (perf_shapes or default_shapes(backend))[0],
                                         out_dir / PROFILE_DIR)

    report.refused = refusals(report, "candidate")

    def flat(role: str, speed: bool) -> dict[str, float]:
        out = report.accuracy[role].metrics()
        if role in report.model_accuracy:
            out.update(report.model_accuracy[role].metrics())
        out["coverage.refused_cases"] = float(len(refusals(report, role)))
        if speed and perf is not None:
            out.update(perf.metrics(role))
        return out

    for role, runner in runners.items():  # fallbacks happen during the calls above
        infos[role].runtime_fallbacks = dict(runner.describe().get("runtime_fallbacks", {}))

    report.metrics = flat("candidate", report.speed_assessed)
    report.baseline_metrics = flat("baseline", native["baseline"])
    report.production_metrics = (flat("production", native["production"])
                                 if "production" in runners else None)
    report.plots = [str(p) for p in write_plots(report.accuracy, perf, out_dir,
                                                threshold=error_threshold)]
    report.finished_at = utc_now()
    report.write(out_dir / REPORT_FILENAME)
    return report


def refusals(report: EvaluationReport, role: str) -> dict[str, str]:
    """case_id -> why, for each case ``role`` refused inside the contract; the MiniLM
    check as ``model:minilm`` when it refused the model's calls."""
    out = report.accuracy[role].refused() if role in report.accuracy else {}
    check = report.model_accuracy.get(role)
    if check is not None and check.refused:
        out["model:minilm"] = check.refused
    return out
