"""Performance of attention implementations on the current device.

All implementations (candidate, naive baseline, production) are measured on the same
random inputs (``kernels.shapes.random_inputs`` with one seed per shape), each in its
runner (``evaluation.runners``: this process, or a version's own process), and their
timed calls are interleaved (the order rotates every repeat) so that they share the
machine's noise. Each latency is taken inside the runner around a blocking call. Per benchmark shape and
implementation: compile time, a latency distribution (p50/p95/p99 over ``repeats``
calls after ``warmup`` calls, ``block_until_ready`` inside the timed region), TFLOP/s
at the median latency, and peak memory.

Peak memory. The compiler's figure (``Compiled.memory_analysis()``: its
``peak_memory_in_bytes`` where reported, else argument + output + temp - alias bytes)
exists on every backend. Where the device keeps allocator statistics
(``device.memory_stats()``, GPU/TPU) the measured ``peak_bytes_in_use`` is used
instead, but that counter is a process-wide high-water mark that cannot be reset: a
call's own peak is only visible when it raises the mark. So the first call of each
implementation runs in ascending order of the compiler's estimate, and the measured
figure (``peak - bytes_in_use_before + argument_bytes``) is used for a shape only
when every implementation raised the mark; otherwise the whole shape falls back to
the compiler's figure. ``peak_bytes_source`` says which, and one shape never mixes
sources, so candidate and baseline are compared like with like.

FLOPs are ``kernels.shapes.AttentionShape.flops`` (the FlashAttention-2 convention).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

import jax
import numpy as np
import scipy.stats
from pydantic import BaseModel, ConfigDict, Field

from evaluation.runners import LocalRunner, Runner
from kernels.api import AttentionFn
from kernels.shapes import AttentionShape

logger = logging.getLogger(__name__)

MemorySource = Literal["device_peak_bytes_in_use", "compiler_memory_analysis"]


def _shapes(dtype: str, sizes: Sequence[tuple[int, int, bool]], heads: int, head_dim: int):
    return tuple(AttentionShape(batch=b, q_len=s, kv_len=s, num_heads=heads, num_kv_heads=heads,
                            head_dim=head_dim, dtype=dtype, causal=c) for b, s, c in sizes)


DEFAULT_SHAPES: dict[str, tuple[AttentionShape, ...]] = {
    # 2 CPU cores: small, so the whole evaluation stays in minutes.
    "cpu": _shapes("float32", [(1, 256, False), (1, 512, False), (1, 1024, False),
                               (1, 1024, True)], heads=4, head_dim=64),
    # The anchor shapes of the design notes: batch*seq = 16384 tokens, 2048/head_dim heads.
    "gpu": _shapes("bfloat16", [(16, 1024, False), (4, 4096, False), (1, 16384, False),
                                (4, 4096, True), (1, 16384, True)], heads=16, head_dim=128),
    "tpu": _shapes("bfloat16", [(16, 1024, False), (4, 4096, False), (1, 16384, False),
                                (4, 4096, True), (1, 16384, True)], heads=16, head_dim=128),
}


def default_shapes(platform: str) -> list[AttentionShape]:
    """The default benchmark shapes of a platform (cpu/gpu/tpu; unknown -> cpu)."""
    return list(DEFAULT_SHAPES.get(platform, DEFAULT_SHAPES["cpu"]))


DEFAULT_REPEATS = {"cpu": 10, "gpu": 50, "tpu": 50}
DEFAULT_WARMUP = {"cpu": 2, "gpu": 5, "tpu": 5}


class ImplementationPerformance(BaseModel):
    """One implementation on one shape. Times in seconds, memory in bytes.

    Everything but ``role`` and ``error`` is ``None`` when the implementation failed to
    compile or run (``error`` says why, e.g. out of memory).
    """

    model_config = ConfigDict(extra="forbid")

    role: str
    compile_time_s: float | None = Field(None, description="lower + compile wall time (s)")
    latencies_s: list[float] = Field(default_factory=list, description="timed calls (s)")
    p50_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    tflops: float | None = Field(None, description="FLOPs / p50 latency / 1e12")
    peak_bytes: int | None = Field(None, description="peak memory of one call (bytes)")
    peak_bytes_source: MemorySource | None = None
    compiler_peak_bytes: int | None = Field(None, description="compiler's estimate (bytes)")
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.p50_s is not None


class ShapePerformance(BaseModel):
    """All implementations on one shape; ``speedup_vs_baseline[role]`` = baseline p50 / role p50."""

    model_config = ConfigDict(extra="forbid")

    shape: AttentionShape
    flops: float
    implementations: dict[str, ImplementationPerformance]
    speedup_vs_baseline: dict[str, float] = Field(default_factory=dict)


class PerformanceResult(BaseModel):
    """Every shape measured on one device in one process."""

    model_config = ConfigDict(extra="forbid")

    device_platform: str
    device_kind: str
    baseline: str = Field(description="role of the baseline among the implementations")
    repeats: int
    warmup: int
    seed: int
    shapes: list[ShapePerformance]

    def common_shapes(self, role: str) -> list[ShapePerformance] | None:
        """Shapes on which every implementation ran (the like-with-like set for the
        aggregate metrics). ``None`` when ``role`` itself failed on any shape: a
        candidate must run every benchmark shape. Shapes where another implementation
        failed (naive running out of memory at long context) are left out."""
        if any(not s.implementations[role].ok for s in self.shapes if role in s.implementations):
            return None
        return [s for s in self.shapes if all(i.ok for i in s.implementations.values())]

    def speedup(self, role: str) -> float | None:
        """Geometric mean over ``common_shapes`` of baseline p50 / ``role`` p50 (x);
        ``None`` when there is no common shape."""
        shapes = self.common_shapes(role)
        if not shapes:
            return None
        return _gmean([s.speedup_vs_baseline[role] for s in shapes])

    def metrics(self, role: str) -> dict[str, float]:
        """Flat speed metrics of ARCHITECTURE.md for ``role`` over ``common_shapes``:
        ``latency.p{50,95,99}_s`` and ``throughput.tflops`` (geometric means),
        ``memory.peak_bytes`` (max), ``compile.time_s`` (sum). Empty when ``role``
        failed on a shape or no shape is common to all implementations."""
        shapes = self.common_shapes(role)
        if not shapes:
            return {}
        runs = [s.implementations[role] for s in shapes]
        return {
            "latency.p50_s": _gmean([r.p50_s for r in runs]),
            "latency.p95_s": _gmean([r.p95_s for r in runs]),
            "latency.p99_s": _gmean([r.p99_s for r in runs]),
            "throughput.tflops": _gmean([r.tflops for r in runs]),
            "memory.peak_bytes": float(max(r.peak_bytes for r in runs)),
            "compile.time_s": float(sum(r.compile_time_s for r in runs)),
        }


def _gmean(values) -> float:
    return float(scipy.stats.gmean(values))


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _argument_bytes(shape: AttentionShape) -> int:
    itemsize = np.dtype(jax.numpy.dtype(shape.dtype)).itemsize
    return itemsize * (int(np.prod(shape.q_shape)) + 2 * int(np.prod(shape.kv_shape)))


def _measure_shape(runners: Mapping[str, Runner], shape: AttentionShape, *,
                   baseline: str, repeats: int, warmup: int, seed: int) -> ShapePerformance:
    results = {role: ImplementationPerformance(role=role) for role in runners}
    ready: dict[str, Runner] = {}
    for role, runner in runners.items():
        try:
            results[role].compile_time_s, results[role].compiler_peak_bytes = (
                runner.compile_for(shape, seed))
            ready[role] = runner
        except Exception as err:  # noqa: BLE001 - a failure is a result (e.g. OOM at compile)
            results[role].error = _error(err)
            logger.warning("%s failed to compile %s: %s", role, shape.label, err)

    # First call per implementation, in ascending order of the compiler's estimate (see
    # the module docstring), doubles as the first warm-up call.
    measured: dict[str, int] = {}
    for role in sorted(ready, key=lambda r: results[r].compiler_peak_bytes or 0):
        before = ready[role].memory_stats()
        try:
            ready[role].call_compiled(shape)
        except Exception as err:  # noqa: BLE001
            results[role].error = _error(err)
            del ready[role]
            continue
        after = ready[role].memory_stats()
        if (before and after and "peak_bytes_in_use" in after
                and after["peak_bytes_in_use"] > before["peak_bytes_in_use"]):
            measured[role] = int(after["peak_bytes_in_use"] - before["bytes_in_use"]
                                 + _argument_bytes(shape))
    use_device = bool(ready) and set(measured) == set(ready)
    for role in ready:
        r = results[role]
        r.peak_bytes = measured[role] if use_device else r.compiler_peak_bytes
        r.peak_bytes_source = ("device_peak_bytes_in_use" if use_device
                               else "compiler_memory_analysis")

    order = list(ready)
    for i in range(warmup - 1 + repeats):
        timed = i >= warmup - 1
        # Rotate the order so no implementation always runs right after another.
        for role in order[i % len(order):] + order[:i % len(order)]:
            if role not in ready:
                continue
            try:
                seconds = ready[role].call_compiled(shape)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory on a later call
                results[role].error = _error(err)
                results[role].latencies_s.clear()
                del ready[role]
                continue
            if timed:
                results[role].latencies_s.append(seconds)

    flops = shape.flops()
    for role in ready:
        r = results[role]
        r.p50_s, r.p95_s, r.p99_s = (float(x) for x in np.percentile(r.latencies_s, [50, 95, 99]))
        r.tflops = flops / r.p50_s / 1e12
    speedup = {role: results[baseline].p50_s / r.p50_s for role, r in results.items()
               if r.ok and baseline in results and results[baseline].ok}
    return ShapePerformance(shape=shape, flops=flops, implementations=results,
                            speedup_vs_baseline=speedup)


def measure_performance(implementations: Mapping[str, AttentionFn | Runner],
                        shapes: Sequence[AttentionShape] | None = None, *,
                        baseline: str = "baseline", repeats: int | None = None,
                        warmup: int | None = None, seed: int = 0,
                        progress=None) -> PerformanceResult:
    """Measure compile time, latency distribution, TFLOP/s and peak memory.

    Args:
        implementations: role -> ``Runner`` (``evaluation.runners``), or an
            ``AttentionFn`` run in this process (wrapped in ``jax.jit`` and compiled
            ahead of time, so it must be traceable); must contain ``baseline``.
        shapes: benchmark shapes; default ``DEFAULT_SHAPES`` of the device's platform.
        baseline: key of the naive baseline (speedups are relative to it).
        repeats: timed calls per implementation and shape (default per platform:
            cpu 10, gpu/tpu 50). warmup: untimed calls first (cpu 2, gpu/tpu 5).
        seed: seed of the random normal inputs (never zeros).
        progress: optional ``progress(done, total, label)`` called after each shape.

    Returns:
        ``PerformanceResult`` for ``jax.devices()[0]``; an implementation that fails to
        compile or run on a shape (e.g. out of memory) has ``error`` set there.

    Raises:
        ValueError: ``baseline`` missing, no shapes, or ``repeats``/``warmup`` < 1.
    """
    device = jax.devices()[0]
    platform = "gpu" if device.platform in ("cuda", "rocm") else device.platform
    shapes = list(shapes) if shapes is not None else default_shapes(platform)
    repeats = DEFAULT_REPEATS.get(platform, 10) if repeats is None else repeats
    warmup = DEFAULT_WARMUP.get(platform, 2) if warmup is None else warmup
    if baseline not in implementations:
        raise ValueError(f"implementations must include the baseline {baseline!r}; "
                         f"got {sorted(implementations)}")
    if not shapes:
        raise ValueError("measure_performance needs at least one shape")
    runners = {role: impl if isinstance(impl, Runner) else LocalRunner(role, impl)
               for role, impl in implementations.items()}
    if repeats < 1 or warmup < 1:
        raise ValueError(f"repeats and warmup must be >= 1, got {repeats} and {warmup}")
    out = []
    for i, shape in enumerate(shapes):
        out.append(_measure_shape(runners, shape, baseline=baseline, repeats=repeats,
                                  warmup=warmup, seed=seed + i))
        if progress is not None:
            progress(i + 1, len(shapes), shape.label)
    return PerformanceResult(device_platform=platform, device_kind=device.device_kind,
                             baseline=baseline, repeats=repeats, warmup=warmup, seed=seed,
                             shapes=out)
