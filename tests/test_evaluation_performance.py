"""Performance measurement: structure and invariants only, never timing thresholds."""

from __future__ import annotations

import math

import jax.numpy as jnp
import pytest

import kernels
from evaluation.performance import (
    PerformanceResult,
    default_shapes,
    measure_performance,
)
from kernels.shapes import AttentionShape

SHAPES = [
    AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2, head_dim=32),
    AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=2, num_kv_heads=2, head_dim=32,
               causal=True),
]
REPEATS = 7


@pytest.fixture(scope="module")
def perf() -> PerformanceResult:
    fns = {"candidate": kernels.get_attention_fn("xla"),
           "baseline": kernels.get_attention_fn("naive")}
    return measure_performance(fns, SHAPES, repeats=REPEATS, warmup=1)


def test_every_implementation_measured_on_every_shape(perf):
    assert [s.shape for s in perf.shapes] == SHAPES
    assert perf.device_platform == "cpu" and perf.repeats == REPEATS
    for s in perf.shapes:
        assert set(s.implementations) == {"candidate", "baseline"}
        for run in s.implementations.values():
            assert run.error is None
            assert len(run.latencies_s) == REPEATS
            assert all(t > 0 for t in run.latencies_s)
            assert run.compile_time_s > 0


def test_latency_percentiles_are_ordered_and_within_the_samples(perf):
    for s in perf.shapes:
        for run in s.implementations.values():
            assert min(run.latencies_s) <= run.p50_s <= run.p95_s <= run.p99_s <= max(run.latencies_s)


def test_flops_follow_the_flash_attention_convention(perf):
    # 4 * B * H * Sq * Skv * D, halved when causal
    assert perf.shapes[0].flops == 4 * 1 * 2 * 64 * 64 * 32
    assert perf.shapes[1].flops == 4 * 1 * 2 * 128 * 128 * 32 / 2
    for s in perf.shapes:
        for run in s.implementations.values():
            assert run.tflops > 0
            assert run.tflops == pytest.approx(s.flops / run.p50_s / 1e12)


def test_peak_memory_covers_the_inputs_and_output(perf):
    for s in perf.shapes:
        sh = s.shape
        qo_bytes = 2 * sh.batch * sh.q_len * sh.num_heads * sh.head_dim * 4  # q and output, f32
        kv_bytes = 2 * sh.batch * sh.kv_len * sh.num_kv_heads * sh.head_dim * 4
        for run in s.implementations.values():
            # CPU keeps no allocator statistics: the compiler's figure, labelled as such
            assert run.peak_bytes_source == "compiler_memory_analysis"
            assert run.peak_bytes >= qo_bytes + kv_bytes


def test_speedup_is_baseline_p50_over_implementation_p50(perf):
    for s in perf.shapes:
        base = s.implementations["baseline"].p50_s
        assert s.speedup_vs_baseline["baseline"] == pytest.approx(1.0)
        assert s.speedup_vs_baseline["candidate"] == pytest.approx(base / s.implementations["candidate"].p50_s)


def test_aggregate_metrics_are_geometric_means_max_and_sum(perf):
    m = perf.metrics("candidate")
    assert set(m) == {"latency.p50_s", "latency.p95_s", "latency.p99_s", "throughput.tflops",
                      "memory.peak_bytes", "compile.time_s"}
    runs = [s.implementations["candidate"] for s in perf.shapes]
    assert m["latency.p50_s"] == pytest.approx(math.sqrt(runs[0].p50_s * runs[1].p50_s))
    assert m["latency.p50_s"] <= m["latency.p95_s"] <= m["latency.p99_s"]
    assert m["memory.peak_bytes"] == max(r.peak_bytes for r in runs)
    assert m["compile.time_s"] == pytest.approx(sum(r.compile_time_s for r in runs))


def test_a_failing_candidate_has_no_speed_metrics_and_a_failing_baseline_drops_the_shape():
    def fails_causal(q, k, v, *, causal, **kw):
        if causal:
            raise NotImplementedError("causal unsupported")
        return kernels.attention(q, k, v, causal=causal, implementation="xla", **kw)

    naive = kernels.get_attention_fn("naive")
    res = measure_performance({"candidate": fails_causal, "baseline": naive}, SHAPES,
                              repeats=2, warmup=1)
    failed = res.shapes[1].implementations["candidate"]
    assert "NotImplementedError" in failed.error and failed.p50_s is None
    assert res.metrics("candidate") == {}
    assert res.metrics("baseline") != {}  # the baseline ran everywhere

    res = measure_performance({"candidate": naive, "baseline": fails_causal}, SHAPES,
                              repeats=2, warmup=1)
    # the baseline could not run the causal shape: both are compared on the first only
    assert res.metrics("candidate")["latency.p50_s"] == pytest.approx(
        res.shapes[0].implementations["candidate"].p50_s)


def test_bad_arguments_are_rejected():
    fns = {"baseline": kernels.get_attention_fn("naive")}
    with pytest.raises(ValueError, match="baseline"):
        measure_performance({"candidate": fns["baseline"]}, SHAPES)
    with pytest.raises(ValueError, match="repeats"):
        measure_performance(fns, SHAPES, repeats=0)
    with pytest.raises(ValueError, match="at least one shape"):
        measure_performance(fns, [])


def test_default_shapes_exist_per_platform_and_use_the_design_anchors_on_gpu():
    assert default_shapes("cpu") and default_shapes("unknown") == default_shapes("cpu")
    gpu = default_shapes("gpu")
    assert all(s.batch * s.q_len == 16384 and s.num_heads * s.head_dim == 2048 for s in gpu)
    assert all(jnp.dtype(s.dtype) == jnp.bfloat16 for s in gpu)
