"""The evaluation report and ``evaluate_candidate``: JSON round trip, flat metric
dictionaries as named in ARCHITECTURE.md, speed metrics absent when not native, a
failed test-set validation stops the evaluation, and one run on a built test set."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import kernels
from evaluation import evaluate as evaluate_mod
from evaluation.evaluate import evaluate_candidate
from evaluation.report import REPORT_FILENAME, EvaluationReport, ValidationSummary
from kernels.shapes import AttentionShape
from tests.test_evaluation_accuracy import synthetic_cases, wrong_scale

SHAPES = [AttentionShape(batch=1, q_len=n, kv_len=n, num_heads=2, num_kv_heads=2, head_dim=32)
          for n in (64, 128)]
ACCURACY_STATS = ("max_rel_error", "median_rel_error", "max_error_ratio_to_baseline",
                  "max_abs_error", "nan_count", "inf_count", "n_cases")
SPEED_METRICS = {"latency.p50_s", "latency.p95_s", "latency.p99_s", "throughput.tflops",
                 "memory.peak_bytes", "compile.time_s"}


def _patch_testset(mp: pytest.MonkeyPatch) -> list:
    """Replace loading and GX validation (tested with the builder below) by a small
    synthetic split: one case per category plus a GQA case."""
    cases = [c for c in synthetic_cases(seed=3) if c.spec.case_id in ("ord-0", "hard-1",
                                                                      "hard-2", "adv-0")]
    mp.setattr(evaluate_mod, "validate_testset", lambda d, s, p: ValidationSummary(
        success=True, result_path=str(p), testset_digest="t" * 64, split_digest="s" * 64))
    mp.setattr(evaluate_mod, "load_split", lambda d, s: cases)
    return cases


@pytest.fixture
def synthetic_testset(monkeypatch):
    return _patch_testset(monkeypatch)


def _evaluate(tmp_path, candidate="xla", **kw) -> EvaluationReport:
    return evaluate_candidate(candidate, testset_dir=tmp_path / "testset", out_dir=tmp_path / "out",
                              perf_shapes=SHAPES, repeats=3, warmup=1, progress=False, **kw)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report")


@pytest.fixture(scope="module")
def report(report_dir) -> EvaluationReport:
    with pytest.MonkeyPatch.context() as mp:
        _patch_testset(mp)
        return _evaluate(report_dir, production="naive")


def test_flat_metrics_carry_the_architecture_names(report):
    expected = {f"accuracy.{c}.{s}" for c in ("ordinary", "hard", "adversarial", "all")
                for s in ACCURACY_STATS} | SPEED_METRICS | {"coverage.refused_cases"}
    assert set(report.metrics) == expected
    assert set(report.baseline_metrics) == expected
    assert set(report.production_metrics) == expected
    assert all(isinstance(v, float) and math.isfinite(v) for v in report.metrics.values())
    assert report.speed_assessed and report.speed_not_assessed_reason is None
    # the gate's schema accepts exactly the names an evaluation emits
    from gates.thresholds import KNOWN_METRICS

    assert set(report.metrics) <= KNOWN_METRICS


def test_baseline_metrics_are_the_naive_kernels_own(report):
    # production is naive too here: its numbers must equal the baseline's accuracy
    # naive's ratio to itself is 1 where its error is above the rounding floor, below 1
    # where rounding alone explains it (float32 cases here)
    rows = report.accuracy["baseline"].cases
    assert report.baseline_metrics["accuracy.all.max_error_ratio_to_baseline"] == max(
        r.baseline_rel_error / r.error_floor for r in rows)
    assert all(r.error_ratio_to_baseline <= 1.0 for r in rows)
    assert report.production_metrics["accuracy.all.max_rel_error"] == \
        report.baseline_metrics["accuracy.all.max_rel_error"]
    assert report.metrics["accuracy.all.max_error_ratio_to_baseline"] <= 2.0
    assert report.candidate.implementation == "xla" and report.baseline.implementation == "naive"


def test_report_describes_the_run(report):
    assert report.status == "completed" and report.validation.success
    assert report.split == "heldout" and report.testset_digest == "t" * 64
    assert report.device_platform == "cpu" and report.target_platform == "cpu"
    assert report.started_at.utcoffset().total_seconds() == 0
    assert report.started_at <= report.finished_at
    assert report.candidate.resolution["name"] == "xla" and report.candidate.native
    # each role's float32 matmul precision, as the registry declares it
    assert report.candidate.float32_matmul_precision == "highest"
    assert report.baseline.float32_matmul_precision == "highest"
    assert report.candidate.runtime_fallbacks == {}  # no compile ran out of a resource
    assert len(report.accuracy["candidate"].cases) == 4
    assert {Path(p).name for p in report.plots} == {
        "error_by_category.png", "latency_distribution.png", "speedup_vs_seq_len.png"}
    for p in report.plots:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_json_round_trip(report, report_dir, tmp_path):
    path = report_dir / "out" / REPORT_FILENAME
    assert path.is_file()  # written by evaluate_candidate
    assert EvaluationReport.read(path) == report
    report = report.model_copy(deep=True)
    # non-finite values (a failed case) survive the round trip
    report.accuracy["candidate"].cases[0].rel_error = math.inf
    report.metrics["accuracy.all.max_rel_error"] = math.inf
    copy = EvaluationReport.read(report.write(tmp_path / "copy.json"))
    assert copy.accuracy["candidate"].cases[0].rel_error == math.inf
    assert copy.metrics["accuracy.all.max_rel_error"] == math.inf
    assert json.loads((tmp_path / "copy.json").read_text())["schema_version"] == 1


def test_read_rejects_another_schema_version(report, tmp_path):
    data = json.loads(report.model_dump_json())
    data["schema_version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema_version"):
        EvaluationReport.read(tmp_path / "v2.json")


def test_speed_metrics_absent_when_candidate_is_not_native(tmp_path, synthetic_testset, monkeypatch):
    # Pretend XLA were a TPU-only kernel interpreted on this CPU host.
    tpu_only = type("TpuOnlyXla", (type(kernels.IMPLEMENTATIONS["xla"]),),
                    {"native_platforms": ("tpu",)})()
    monkeypatch.setitem(kernels.IMPLEMENTATIONS, "xla", tpu_only)
    report = _evaluate(tmp_path)
    assert not report.speed_assessed
    assert "not native on cpu" in report.speed_not_assessed_reason
    assert report.target_platform == "tpu" and report.device_platform == "cpu"
    assert not SPEED_METRICS & set(report.metrics)  # absent, not NaN
    assert "accuracy.all.max_rel_error" in report.metrics
    assert set(report.baseline_metrics) >= SPEED_METRICS
    # the native baseline is still timed, for information; the interpreted candidate,
    # whose timings would judge nothing, is not
    assert all(s.implementations["baseline"].p50_s > 0 for s in report.performance.shapes)
    assert all("candidate" not in s.implementations for s in report.performance.shapes)


def test_an_interpreted_production_is_not_timed_either(tmp_path, synthetic_testset,
                                                       monkeypatch):
    """Production served by a kernel that runs interpreted here (a second ``make run``:
    ``pallas_tpu`` against ``pallas_tpu``): its speed metrics judge nothing (dropped from
    its metrics), so it is not timed; the native candidate and baseline are."""
    tpu_only = type("TpuOnlyXla", (type(kernels.IMPLEMENTATIONS["xla"]),),
                    {"native_platforms": ("tpu",)})()
    monkeypatch.setitem(kernels.IMPLEMENTATIONS, "tpu_only_xla", tpu_only)
    report = _evaluate(tmp_path, candidate="naive", production="tpu_only_xla")
    assert report.speed_assessed
    assert all("production" not in s.implementations for s in report.performance.shapes)
    assert all(s.implementations["candidate"].p50_s > 0 for s in report.performance.shapes)
    assert not SPEED_METRICS & set(report.production_metrics)
    assert "accuracy.all.max_rel_error" in report.production_metrics


def test_wrong_callable_candidate_is_flagged_in_the_report(tmp_path, synthetic_testset):
    report = _evaluate(tmp_path, candidate=wrong_scale)
    assert report.candidate.implementation is None and report.candidate.name == "wrong_scale"
    assert report.candidate.float32_matmul_precision is None  # a plain callable declares none
    assert report.metrics["accuracy.all.max_error_ratio_to_baseline"] > 1e3


def test_model_level_metrics_when_a_model_is_given(tmp_path, synthetic_testset):
    class ToyModel:
        """Embeds a text as attention over fixed random inputs (one row per text)."""
        weights_sha256 = "w" * 64

        def embed(self, texts, attention_fn=None):
            c = synthetic_cases(seed=5)[0]
            out = attention_fn(c.q, c.k, c.v, causal=False, scale=None, q_lengths=None,
                               kv_lengths=None)
            return np.asarray(out, np.float64).reshape(len(c.q), -1)[: len(texts)]

    report = _evaluate(tmp_path, model=ToyModel(), documents=["first", "second"])
    assert report.model_accuracy["candidate"].n_documents == 2
    assert report.metrics["model.min_cosine_similarity"] > 0.9999
    assert "model.mean_cosine_similarity" in report.baseline_metrics


# --- on a test set built by evaluation.testset --------------------------------------------

@pytest.fixture(scope="module")
def built_testset(tmp_path_factory):
    pytest.importorskip("evaluation.testset")
    model_mod = pytest.importorskip("evaluation.model")
    try:
        model = model_mod.MiniLM.load()
    except (FileNotFoundError, ImportError) as err:
        pytest.skip(f"MiniLM weights unavailable: {err}")
    from tests.shared_builds import ci_testset

    return ci_testset(tmp_path_factory), model  # read-only: the evaluations write elsewhere


def test_evaluate_on_a_built_heldout_split(built_testset, tmp_path):
    directory, model = built_testset
    report = evaluate_candidate("naive", testset_dir=directory, out_dir=tmp_path,
                                perf_shapes=SHAPES[:1], repeats=2, warmup=1, progress=False,
                                model=model, documents=["A short sentence.", "Another one."])
    manifest = json.loads((directory / "manifest.json").read_text())
    assert report.status == "completed"
    assert report.testset_digest == manifest["digest"]
    assert report.split_digest == manifest["splits"]["heldout"]["digest"]
    assert Path(report.validation.result_path).is_file()
    n = {c: sum(s["category"] == c for s in manifest["splits"]["heldout"]["cases"])
         for c in ("ordinary", "hard", "adversarial")}
    for cat, count in n.items():
        assert report.metrics[f"accuracy.{cat}.n_cases"] == count > 0
    # the candidate is the baseline itself: identical outputs on every case
    assert report.metrics["accuracy.all.max_error_ratio_to_baseline"] <= 1.0
    assert report.metrics["accuracy.all.nan_count"] == 0
    assert report.metrics["model.min_cosine_similarity"] > 0.9999


def test_failed_validation_stops_the_evaluation(built_testset, tmp_path):
    directory, _ = built_testset
    broken = tmp_path / "broken"
    broken.mkdir()
    manifest = json.loads((directory / "manifest.json").read_text())
    arrays = manifest["splits"]["heldout"]["arrays_file"]
    (broken / "manifest.json").write_text((directory / "manifest.json").read_text())
    with np.load(directory / arrays) as npz:
        data = {k: npz[k] for k in npz.files}
    key = next(k for k in data if k.endswith("/q") and data[k].dtype == np.float32)
    data[key] = data[key].copy()
    data[key].flat[0] = np.nan
    np.savez(broken / arrays, **data)

    report = evaluate_candidate("xla", testset_dir=broken, out_dir=tmp_path / "out",
                                perf_shapes=SHAPES[:1], repeats=2, warmup=1, progress=False)
    assert report.status == "validation_failed" and not report.validation.success
    assert "validation" in report.failure_reason and report.validation.reason
    assert report.metrics == {} and report.accuracy == {} and report.performance is None
    assert EvaluationReport.read(tmp_path / "out" / REPORT_FILENAME).status == "validation_failed"
    assert Path(report.validation.result_path).is_file()


def test_unknown_split_or_implementation_is_rejected(tmp_path, synthetic_testset):
    with pytest.raises(ValueError, match="split"):
        _evaluate(tmp_path, split="train")
    with pytest.raises(ValueError, match="unknown implementation"):
        _evaluate(tmp_path, candidate="flash9000")


def test_native_evaluation_leaves_a_profiler_trace_and_its_reference_index(report, report_dir):
    """On native hardware (xla on this CPU) the evaluation records a
    jax.profiler trace in which each in-process kernel is found by name, and the index
    of the float64 references it used (one per case, computed here, none reused)."""
    from evaluation.reference_cache import INDEX_FILE, ReferenceIndex

    trace = report.profile
    assert trace is not None and Path(trace.path).is_file()
    assert Path(trace.path).is_relative_to(report_dir / "out")
    assert trace.names_found == {"candidate": True, "baseline": True, "production": True}
    index = ReferenceIndex.model_validate_json((report_dir / "out" / INDEX_FILE).read_text())
    assert [e.case_id for e in index.entries] == [r.case_id for r in report.accuracy["candidate"].cases]
    assert report.reference.method == index.method == "numpy-float64"
    assert report.reference.cases == 4 and report.reference.cache_hits == 0


def test_each_phase_runs_under_the_plan_s_interpreter_and_the_report_says_so(
        synthetic_testset, tmp_path):
    """The accuracy cases always run in TPU interpret mode; the MiniLM check under the
    plan's interpreter (the registration's ``serving_tpu_interpret_mode``); the report
    records both for an interpreted candidate, nothing for a native one."""
    from evaluation.runners import LocalRunner
    from kernels import interpreters
    from kernels.interpreters import InterpreterPlan

    seen: list[tuple[str, str]] = []
    naive = kernels.get_attention_fn("naive")

    def spy(q, k, v, **kw):
        seen.append(("accuracy", interpreters.current()))
        return naive(q, k, v, **kw)

    class Model:  # a stand-in encoder: records the interpreter its embeddings ran under
        weights_sha256 = "w" * 64

        def embed(self, texts, attention_fn=None):
            if attention_fn is spy:
                seen.append(("model_check", interpreters.current()))
            return np.ones((len(texts), 384), np.float32)

    def runner(native: bool) -> LocalRunner:
        return LocalRunner("spy", spy, Model(), {
            "implementation": None, "config": None, "resolution": None, "native": native,
            "target_platform": "cpu" if native else "tpu"})

    for plan, model_check in ((InterpreterPlan.for_profile(False), "generic_interpret"),
                              (None, "tpu_interpret")):
        seen.clear()
        report = _evaluate(tmp_path, runner(False), model=Model(), documents=["a", "b"],
                           measure_speed=False, interpreters=plan)
        assert {s for p, s in seen if p == "accuracy"} == {"tpu_interpret"}
        assert {s for p, s in seen if p == "model_check"} == {model_check}
        expected = {"accuracy": "tpu_interpret", "model_check": model_check}
        assert report.interpreters == expected
        assert EvaluationReport.read(tmp_path / "out" / REPORT_FILENAME).interpreters == expected
    native = _evaluate(tmp_path, runner(True), model=Model(), documents=["a"],
                       measure_speed=False, interpreters=InterpreterPlan.for_profile(False))
    assert native.interpreters is None


def test_a_kernel_that_ignores_the_interpreter_choice_records_none(synthetic_testset, tmp_path,
                                                                   monkeypatch):
    """pallas_gpu interpreted on a CPU runs Pallas' generic lowering in every phase, its
    accuracy cases included (``kernels.pallas_gpu``): the report must not say its accuracy
    cases ran in TPU interpret mode (it said ``{"accuracy": "tpu_interpret", ...}``)."""
    from evaluation.runners import LocalRunner
    from kernels.interpreters import InterpreterPlan

    monkeypatch.setenv("KERNELGATE_CASE_PROCESSES", "1")  # the stand-in stays in this process
    naive = kernels.get_attention_fn("naive")
    candidate = LocalRunner("pallas_gpu", naive, None, {
        "implementation": "pallas_gpu", "config": None, "resolution": None, "native": False,
        "target_platform": "gpu"})
    for plan in (None, InterpreterPlan.for_profile(False)):
        report = _evaluate(tmp_path, candidate, measure_speed=False, interpreters=plan)
        assert report.interpreters is None
