"""Attention benchmark: every implementation, side by side, in one run on one device.

``python -m kernels.tools.bench --out bench.json`` builds, checks and times naive, xla, cudnn,
our two GPU kernels pallas_gpu (Triton lowering) and pallas_mosaic_gpu (Mosaic GPU,
FlashAttention-3 design), and tokamax's Mosaic GPU kernel where tokamax is importable,
over the benchmark grid: bf16 and f16, head_dim 64 and 128, causal and not, seq
1024..16384 with ``batch * seq = 16384`` and ``heads = 2048 / head_dim``. It reports
TFLOP/s (``4 * B * H * S^2 * D``, halved when causal), each row's ratio to cuDNN (both
timing passes) and fraction of the bf16 matrix-product ceiling measured in the same
run, the geometric mean of the ratio to cuDNN per implementation, overall and per
(dtype, head_dim, mask) group, memory, correctness against float64 and against naive,
and the longest causal context (B=1, H=16, D=128) naive and the flash kernels reach on
one device. Beside it, the serving table (``kernels.tools.bench_serving``): MiniLM's shapes
(12 heads x head_dim 32, float32 and bf16), microseconds per call; ``--serving-only``
runs just that. Every column is measured in the run; nothing is quoted.

Timing is ``kernels.timing`` (the method the autotuner uses too): compile and warm up
first; each repeat enqueues ``n`` calls back-to-back and blocks on the last; the median
over repeats is reported, and a second, identical pass shows the noise. Inputs are
random normal (``kernels.shapes.random_inputs``), never zeros.

Off-GPU (``--quick`` or no GPU) it runs tiny shapes, pallas_gpu in Pallas interpret
mode; those timings keep the code from rotting and are never quoted as performance.
pallas_mosaic_gpu has no CPU mode: its rows say why they were not run.

Kept in one module (over 350 lines) because it is one command: the grid, the checks,
the timing passes and the table it prints belong to one run and one report schema.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, Field

from kernels.api import attention, default_backend
from kernels.config import KernelConfig
from kernels.contract import validate
from kernels.reference import attention_reference, relative_error
from kernels.registry import IMPLEMENTATIONS as REGISTRY
from kernels.registry import ours
from kernels.selection import measured_config
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import DEFAULT_WARMUP_S, Timing, compile_and_warm, time_call
from kernels.tools import bench_serving

SCHEMA_VERSION = 1
EXTERNAL = ("tokamax",)
"""Columns that are not in the registry (tokamax's Mosaic GPU kernel, when importable)."""
BASELINES = ("naive", "cudnn")
"""The reference columns: naive's error is the correctness baseline (cuDNN's without
it), cuDNN's speed the ratio's denominator."""


def implementations() -> list[str]:
    """The benchmark's columns: every registered kernel native on a GPU or on every
    backend (registry order; ``Kernel.native_platforms``), then ``EXTERNAL``."""
    return [n for n, k in REGISTRY.items() if "gpu" in k.native_platforms] + list(EXTERNAL)


def compared() -> list[str]:
    """Columns whose ratio to cuDNN is summarised: our kernels (``Kernel.ours``), then
    ``EXTERNAL``."""
    return [*ours(), *EXTERNAL]


def _tuned(name: str) -> bool:
    return name in REGISTRY and REGISTRY[name].tuned
GPU_SEQS = (1024, 2048, 4096, 8192, 16384)
TOKENS = 16384
MODEL_WIDTH = 2048  # heads * head_dim


class BenchRow(BaseModel):
    """One (shape, implementation) measurement. TFLOP/s from the first timing pass;
    ``tflops_pass2`` is the same version timed again (noise)."""

    shape: AttentionShape
    implementation: str
    config: dict[str, Any] | None = None
    ok: bool = False
    error: str | None = None
    compile_s: float | None = None
    timing: Timing | None = None
    timing_pass2: Timing | None = None
    tflops: float | None = None
    tflops_pass2: float | None = None
    ratio_to_cudnn: float | None = None
    ratio_to_cudnn_pass2: float | None = Field(
        None, description="the same ratio from the second timing pass of both")
    fraction_of_matmul_ceiling: float | None = None
    temp_bytes: int | None = Field(None, description="compiler memory analysis: scratch")
    peak_bytes: int | None = Field(
        None, description="arguments + outputs + scratch of the compiled call, bytes")
    rel_error_vs_reference: float | None = Field(
        None, description="||out-ref||/||ref|| on sampled rows vs float64 NumPy")
    rel_error_vs_naive: float | None = None
    error_ratio_to_naive: float | None = Field(
        None, description="rel. error / the baseline's own (see error_baseline)")
    error_baseline: str | None = Field(
        None, description="whose error the ratio divides by: naive, else cudnn when naive "
                          "did not run, else the dtype's floor")
    correct: bool | None = None


class LongContextRow(BaseModel):
    """Causal B=1, H=16, D=128 bf16 at one sequence length."""

    implementation: str
    seq: int
    ok: bool
    median_s: float | None = None
    tflops: float | None = None
    temp_bytes: int | None = None
    device_peak_bytes_in_use: int | None = None
    error: str | None = None


class BenchReport(BaseModel):
    """The whole benchmark run (written as JSON by ``--out``)."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    command: str
    jax_version: str
    backend: str
    device_kind: str
    interpret_mode: bool = Field(description="pallas_gpu ran interpreted: not performance")
    matmul_ceiling_tflops: float
    matmul_shape: tuple[int, int, int]
    rows: list[BenchRow]
    long_context: list[LongContextRow]
    longest_causal_context: dict[str, int | None]
    geomean_ratio_pallas_to_cudnn: float | None = Field(
        description="pallas_gpu's geomean ratio to cuDNN (first pass; kept from schema 1)")
    geomean_ratio_by_group: dict[str, float] = Field(description="the same per group")
    geomean_ratio_to_cudnn: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="implementation -> {'pass1', 'pass2', 'mean'} geomean ratio to cuDNN "
                    "over the rows where both ran")
    geomean_ratio_to_cudnn_by_group: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="implementation -> (dtype, head_dim, mask) group -> geomean ratio, mean "
                    "of the two passes")
    correctness_tolerance: str
    serving: list[bench_serving.ServingRow] = Field(
        default_factory=list, description="the serving-shape table (kernels.tools.bench_serving)")


# --------------------------------------------------------------------------- timing


def matmul_ceiling(size: int, dtype: Any = jnp.bfloat16, repeats: int = 11,
                   warmup_s: float = DEFAULT_WARMUP_S) -> float:
    """Measured TFLOP/s of a ``size^3`` matrix product (random inputs) on the device."""
    ka, kb = jax.random.split(jax.random.key(7))
    a = jax.random.normal(ka, (size, size), dtype)
    b = jax.random.normal(kb, (size, size), dtype)
    compiled, *_ = compile_and_warm(lambda x, y: x @ y, (a, b))
    timing = time_call(compiled, (a, b), repeats=repeats, warmup_s=warmup_s)
    return 2.0 * size**3 / timing.median_s / 1e12


# --------------------------------------------------------------------------- implementations


def attention_fn(name: str, shape: AttentionShape, config: KernelConfig | None):
    """A jittable ``fn(q, k, v) -> out`` for one implementation, or raise
    ``NotImplementedError`` / ``ImportError`` when it cannot run here."""
    scale = 1.0 / math.sqrt(shape.head_dim)
    if name == "tokamax":
        if shape.kv_fill is not None:
            raise NotImplementedError("tokamax: the benchmark passes it no kv_lengths")
        import tokamax  # noqa: PLC0415 - optional, absent on most hosts

        # Pinned to its Mosaic GPU kernel: tokamax's default falls back to Triton or XLA
        # silently, and the column would then measure another kernel under its name.
        return functools.partial(tokamax.dot_product_attention, is_causal=shape.causal,
                                 scale=scale, implementation="mosaic")
    lengths = shape.kv_lengths()  # a shape with a fill: every row's padding masked
    spec, _, _ = validate(*shape.structs(), causal=shape.causal, scale=scale,
                          kv_lengths=lengths)
    # Each kernel's own check says where it runs (pallas_gpu: interpreted on a CPU).
    REGISTRY[name].check_supported(spec, default_backend(), config)
    return functools.partial(attention, causal=shape.causal, scale=scale,
                             implementation=name, config=config, kv_lengths=lengths)


# --------------------------------------------------------------------------- correctness


def _sampled(out, pairs, rows) -> np.ndarray:
    return np.stack([np.asarray(out[b, rows, h].astype(jnp.float32)) for b, h in pairs])


def sampled_reference(q, k, v, *, causal: bool, scale: float, pairs, rows,
                      kv_lengths=None) -> np.ndarray:
    """Float64 reference (``kernels.reference``) for query ``rows`` of the (batch,
    head) ``pairs``, each against every key (before ``kv_lengths[b]``, if given):
    ``[len(pairs), len(rows), head_dim]``. The benchmark grid is multi-head
    (num_kv_heads = num_heads), so head ``h`` of k/v belongs to query head ``h``."""
    out = []
    for b, h in pairs:
        lengths = None if kv_lengths is None else np.asarray(kv_lengths)[b:b + 1]
        ref = attention_reference(q[b:b + 1, :, h:h + 1], k[b:b + 1, :, h:h + 1],
                                  v[b:b + 1, :, h:h + 1], causal=causal, scale=scale, rows=rows,
                                  kv_lengths=lengths)
        out.append(ref[0, :, 0])
    return np.stack(out)


ERROR_RATIO_LIMIT = 2.0
ERROR_FLOOR = {"bfloat16": 1e-3, "float16": 2e-4, "float32": 1e-6}
TOLERANCE_TEXT = (f"finite, and rel. error vs float64 <= {ERROR_RATIO_LIMIT} x max(naive's "
                  f"own rel. error (cuDNN's when naive did not run), floor {ERROR_FLOOR})")


# --------------------------------------------------------------------------- the run


def grid(quick: bool, seqs: Sequence[int] | None = None,
         dtypes: Sequence[str] = ("bfloat16", "float16"),
         head_dims: Sequence[int] = (64, 128)) -> list[AttentionShape]:
    """Benchmark shapes. GPU: ``batch * seq = 16384``, ``heads = 2048 / head_dim``.
    Quick/CPU: ``batch = 2``, ``heads = 2``, seq 64/128 (correctness smoke only)."""
    shapes = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for seq in seqs or ((64, 128) if quick else GPU_SEQS):
                    batch = 2 if quick else max(1, TOKENS // seq)
                    heads = 2 if quick else MODEL_WIDTH // head_dim
                    shapes.append(AttentionShape(dtype=dtype, batch=batch, q_len=seq,
                                                 kv_len=seq, num_heads=heads,
                                                 num_kv_heads=heads, head_dim=head_dim,
                                                 causal=causal))
    return shapes


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"


def bench_shape(shape: AttentionShape, implementations: Sequence[str], *, seed: int,
                ceiling: float, repeats: int, target_repeat_s: float,
                warmup_s: float = DEFAULT_WARMUP_S, sample_pairs: int = 2,
                sample_rows: int = 128) -> list[BenchRow]:
    """Compile, check and time every implementation on one shape (fresh random inputs)."""
    q, k, v = random_inputs(shape, seed)
    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(shape.batch)), int(rng.integers(shape.num_heads)))
             for _ in range(sample_pairs)]
    rows = np.sort(rng.choice(shape.q_len, size=min(sample_rows, shape.q_len), replace=False))
    q_h, k_h, v_h = (np.asarray(x.astype(jnp.float32)) for x in (q, k, v))
    ref = sampled_reference(q_h, k_h, v_h, causal=shape.causal,
                            scale=1.0 / math.sqrt(shape.head_dim), pairs=pairs, rows=rows,
                            kv_lengths=shape.kv_lengths())
    del q_h, k_h, v_h
    naive_out = None
    results: list[BenchRow] = []
    for name in implementations:
        config = measured_config(shape, name) if _tuned(name) else None
        row = BenchRow(shape=shape, implementation=name,
                       config=config.fields_set() if config else None)
        try:
            fn = attention_fn(name, shape, config)
            compiled, row.compile_s, row.temp_bytes, row.peak_bytes = compile_and_warm(
                fn, (q, k, v))
            out = compiled(q, k, v)
            row.rel_error_vs_reference = relative_error(_sampled(out, pairs, rows), ref)
            if name == "naive":
                naive_out = out
            elif naive_out is not None:
                row.rel_error_vs_naive = relative_error(out.astype(jnp.float32),
                                                        naive_out.astype(jnp.float32))
            del out
            timing = functools.partial(time_call, compiled, (q, k, v), repeats=repeats,
                                       target_repeat_s=target_repeat_s, warmup_s=warmup_s)
            row.timing, row.timing_pass2 = timing(), timing()
            row.tflops = shape.flops() / row.timing.median_s / 1e12
            row.tflops_pass2 = shape.flops() / row.timing_pass2.median_s / 1e12
            row.fraction_of_matmul_ceiling = row.tflops / ceiling
            row.ok = True
        except (NotImplementedError, ImportError) as err:
            row.error = "unsupported: " + _short(err)
        except Exception as err:  # noqa: BLE001 - a failing kernel is a result, not a crash
            row.error = _short(err)
        results.append(row)
    ran = {r.implementation: r for r in results if r.ok}
    # Naive is the baseline; without it (a run with naive off) cuDNN's own error on the
    # same inputs is: a bf16 flash kernel is as far from float64 as its P rounding makes
    # it, about 2e-3, so the bare floor would reject every correct kernel.
    baseline = next((n for n in ("naive", "cudnn") if n in ran), None)
    base_err = ran[baseline].rel_error_vs_reference if baseline else None
    cudnn = ran.get("cudnn")
    for row in results:
        if not row.ok:
            continue
        floor = ERROR_FLOOR[shape.dtype]
        base = max(base_err if base_err is not None else floor, floor)
        row.error_baseline = baseline if base_err is not None and base_err > floor else "floor"
        row.error_ratio_to_naive = row.rel_error_vs_reference / base
        row.correct = bool(math.isfinite(row.rel_error_vs_reference)
                           and row.error_ratio_to_naive <= ERROR_RATIO_LIMIT)
        if cudnn is not None and row.tflops:
            row.ratio_to_cudnn = row.tflops / cudnn.tflops
            row.ratio_to_cudnn_pass2 = row.tflops_pass2 / cudnn.tflops_pass2
    return results


def long_context(implementations: Sequence[str], seqs: Sequence[int], *, heads: int,
                 head_dim: int, repeats: int, quick: bool = False) -> list[LongContextRow]:
    """Causal bf16 B=1 attention at doubling lengths until an implementation fails
    (out of memory or compile failure); the first failure ends that implementation."""
    results = []
    for name in implementations:
        for seq in seqs:
            shape = AttentionShape(dtype="bfloat16", batch=1, q_len=seq, kv_len=seq,
                                   num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
                                   causal=True)
            row = LongContextRow(implementation=name, seq=seq, ok=False)
            try:
                config = (measured_config(shape, name) if _tuned(name)
                          else None)
                fn = attention_fn(name, shape, config)
                q, k, v = random_inputs(shape, seed=seq)
                compiled, _, row.temp_bytes, _ = compile_and_warm(fn, (q, k, v))
                timing = time_call(compiled, (q, k, v), repeats=repeats, max_calls=3,
                                   warmup_s=0.0 if quick else DEFAULT_WARMUP_S)
                row.median_s = timing.median_s
                row.tflops = shape.flops() / timing.median_s / 1e12
                stats = jax.devices()[0].memory_stats() or {}
                row.device_peak_bytes_in_use = stats.get("peak_bytes_in_use")
                row.ok = True
                del q, k, v, compiled
            except Exception as err:  # noqa: BLE001 - OOM / compile failure is the finding
                row.error = _short(err)
            results.append(row)
            if not row.ok:
                break
    return results


def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _group(shape: AttentionShape) -> str:
    return f"{shape.dtype} d{shape.head_dim} {'causal' if shape.causal else 'full'}"


def summarize_ratios(rows: Sequence[BenchRow], implementation: str = "pallas_gpu",
                     *, pass_: int = 1) -> tuple[float | None, dict[str, float]]:
    """Geometric mean of TFLOP/s(implementation)/TFLOP/s(cudnn) from timing pass
    ``pass_`` (1 or 2), overall and per (dtype, head_dim, causal) group."""
    def ratio(r: BenchRow) -> float | None:
        return r.ratio_to_cudnn if pass_ == 1 else r.ratio_to_cudnn_pass2

    ratios = [r for r in rows if r.implementation == implementation and ratio(r)]
    groups: dict[str, list[float]] = {}
    for r in ratios:
        groups.setdefault(_group(r.shape), []).append(ratio(r))
    by_group = {k: g for k, v in groups.items() if (g := _geomean(v)) is not None}
    return _geomean([ratio(r) for r in ratios]), by_group


def summarize_all(rows: Sequence[BenchRow]
                  ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per implementation of :func:`compared`: the geomean ratio to cuDNN of pass 1, pass 2
    and their mean, and per group the mean of the two passes' geomeans."""
    overall: dict[str, dict[str, float]] = {}
    by_group: dict[str, dict[str, float]] = {}
    for name in compared():
        (g1, groups1), (g2, groups2) = (summarize_ratios(rows, name, pass_=p) for p in (1, 2))
        if g1 is None or g2 is None:
            continue
        overall[name] = {"pass1": g1, "pass2": g2, "mean": (g1 + g2) / 2}
        by_group[name] = {k: (groups1[k] + groups2[k]) / 2 for k in groups1 if k in groups2}
    return overall, by_group


_SHORT = {"pallas_gpu": "pal", "pallas_mosaic_gpu": "mos", "tokamax": "tok"}


def format_table(report: BenchReport) -> str:
    """Plain-text table: TFLOP/s per implementation; for our kernels and tokamax the
    ratio to cuDNN (``x/cudnn``) and the fraction of the matmul ceiling (``x/ceil``);
    the worst error ratio to naive, the pass-to-pass noise and correctness; then the
    geometric means and why any implementation did not run."""
    ran = {r.implementation for r in report.rows if r.ok}
    impls = [n for n in implementations() if n in ran]
    impls += sorted(ran - set(impls))  # a kernel registered for the run only
    summarised = [n for n in compared() if n in impls]
    head = f"{'shape':38s}" + "".join(f"{n[:10]:>11s}" for n in impls)
    head += "".join(f"{_SHORT.get(n, n[:3]) + '/cudnn':>10s}{_SHORT.get(n, n[:3]) + '/ceil':>9s}"
                    for n in summarised)
    head += f"{'err/nv':>7s}{'noise%':>7s}  ok"
    lines = [head] if report.rows else []
    by_shape: dict[str, dict[str, BenchRow]] = {}
    for r in report.rows:
        by_shape.setdefault(r.shape.label, {})[r.implementation] = r
    for label, cells in by_shape.items():
        line = f"{label:38s}"
        for n in impls:
            r = cells.get(n)
            line += f"{r.tflops:11.1f}" if r and r.ok else f"{'-':>11s}"
        for n in summarised:
            r = cells.get(n)
            ok = r is not None and r.ok
            line += f"{r.ratio_to_cudnn:10.3f}" if ok and r.ratio_to_cudnn else f"{'-':>10s}"
            line += f"{r.fraction_of_matmul_ceiling:9.3f}" if ok else f"{'-':>9s}"
        ran = [r for r in cells.values() if r.ok]
        worst = max((r.error_ratio_to_naive for r in ran if r.error_ratio_to_naive is not None),
                    default=None)
        noise = max((100 * abs(r.tflops_pass2 - r.tflops) / r.tflops for r in ran),
                    default=None)
        line += f"{worst:7.2f}" if worst is not None else f"{'-':>7s}"
        line += f"{noise:7.1f}" if noise is not None else f"{'-':>7s}"
        wrong = [n for n, r in cells.items() if r.ok and not r.correct]
        line += "  " + ("yes" if not wrong else "NO:" + ",".join(wrong))
        lines.append(line)
    lines.append(f"matmul ceiling ({report.matmul_shape[0]}^3, bf16 on GPU): "
                 f"{report.matmul_ceiling_tflops:.1f} TFLOP/s; device {report.device_kind}; "
                 f"jax {report.jax_version}" + ("; INTERPRET MODE, not performance"
                                               if report.interpret_mode else ""))
    for name, g in report.geomean_ratio_to_cudnn.items():
        lines.append(f"geomean TFLOP/s({name})/TFLOP/s(cudnn): {g['mean']:.3f} (pass 1 "
                     f"{g['pass1']:.3f}, pass 2 {g['pass2']:.3f})")
        for k, v in report.geomean_ratio_to_cudnn_by_group.get(name, {}).items():
            lines.append(f"  {k}: {v:.3f}")
    not_run: dict[str, str] = {}
    for r in report.rows:
        if not r.ok and r.implementation not in not_run:
            not_run[r.implementation] = r.error or "?"
    for name, why in not_run.items():
        lines.append(f"not run: {name}: {why}")
    if report.long_context:
        lines.append("longest causal context (B=1): " + ", ".join(
            f"{k}={v}" for k, v in report.longest_causal_context.items()))
    for r in report.long_context:
        lines.append(f"  {r.implementation:17s} S={r.seq:<7d} "
                     + (f"{r.median_s * 1e3:9.2f} ms {r.tflops:7.1f} TFLOP/s temp "
                        f"{(r.temp_bytes or 0) / 1e9:.2f} GB" if r.ok else f"FAIL {r.error}"))
    lines.append(bench_serving.format_serving(report.serving))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> BenchReport:
    """Run the benchmark described by parsed CLI ``args``; return the report."""
    backend = jax.default_backend()
    on_gpu = backend in ("gpu", "cuda")
    quick = args.quick or not on_gpu
    impls = [n for n in args.implementations if n in implementations()]
    ceiling = matmul_ceiling(256 if quick else 8192, jnp.float32 if quick else jnp.bfloat16,
                             warmup_s=0.0 if quick else DEFAULT_WARMUP_S)
    rows: list[BenchRow] = []
    shapes = [] if args.serving_only else grid(quick, args.seqs, args.dtypes, args.head_dims)
    for i, shape in enumerate(shapes):
        rows += bench_shape(shape, impls, seed=args.seed + i, ceiling=ceiling,
                            repeats=3 if quick else args.repeats,
                            target_repeat_s=0.0 if quick else args.target_repeat_s,
                            warmup_s=0.0 if quick else DEFAULT_WARMUP_S)
        print(f"[bench] {shape.label} done", file=sys.stderr, flush=True)
    long_seqs = [] if args.serving_only else args.long_seqs or (
        [128, 256] if quick else [16384 * 2**i for i in range(4)])
    flash = [n for n in (*ours(), *reversed(BASELINES)) if n in impls]
    longs = long_context(flash, long_seqs, heads=2 if quick else 16,
                         head_dim=32 if quick else 128, repeats=2 if quick else 3,
                         quick=quick)
    longest = {n: max((r.seq for r in longs if r.implementation == n and r.ok), default=None)
               for n in flash}
    geo, by_group = summarize_ratios(rows)
    overall, overall_by_group = summarize_all(rows)
    serving = [] if args.no_serving else bench_serving.bench_serving(
        bench_serving.serving_shapes(quick, args.serving_dtypes, args.serving_sizes),
        seed=args.seed, repeats=3 if quick else args.repeats,
        target_repeat_s=0.0 if quick else args.target_repeat_s,
        warmup_s=0.0 if quick else DEFAULT_WARMUP_S,
        progress=lambda s: print(f"[bench] serving {s.label} done", file=sys.stderr, flush=True))
    return BenchReport(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        command=" ".join(["python -m kernels.tools.bench", *sys.argv[1:]]),
        jax_version=jax.__version__, backend=backend,
        device_kind=jax.devices()[0].device_kind, interpret_mode=not on_gpu,
        matmul_ceiling_tflops=ceiling,
        matmul_shape=(256, 256, 256) if quick else (8192, 8192, 8192),
        rows=rows, long_context=longs, longest_causal_context=longest,
        geomean_ratio_pallas_to_cudnn=geo, geomean_ratio_by_group=by_group,
        geomean_ratio_to_cudnn=overall, geomean_ratio_to_cudnn_by_group=overall_by_group,
        correctness_tolerance=TOLERANCE_TEXT, serving=serving)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.tools.bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes (always the case without a GPU; not performance)")
    parser.add_argument("--implementations", nargs="+", default=implementations(),
                        choices=implementations())
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqs", nargs="+", type=int, default=None,
                        help="sequence lengths (default 1024..16384, batch*seq=16384)")
    parser.add_argument("--long-seqs", nargs="+", type=int, default=None,
                        help="causal lengths for the longest-context probe "
                             "(default 16384..131072)")
    parser.add_argument("--repeats", type=int, default=11, help="timed repeats per pass")
    parser.add_argument("--target-repeat-s", type=float, default=0.02,
                        help="seconds of back-to-back calls per repeat")
    parser.add_argument("--seed", type=int, default=0)
    serving = parser.add_mutually_exclusive_group()
    serving.add_argument("--serving-only", action="store_true",
                         help="only the serving-shape table (MiniLM: 12 heads x head_dim 32)")
    serving.add_argument("--no-serving", action="store_true",
                         help="skip the serving-shape table")
    parser.add_argument("--serving-dtypes", nargs="+", default=list(bench_serving.SERVING_DTYPES),
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--serving-sizes", nargs="+", type=bench_serving.parse_size, default=None,
                        metavar="BATCHxSEQ",
                        help="(batch, seq) of the serving table, e.g. 1x64 1x256 (batch-1: one "
                             "canary request; default: "
                             + " ".join(f"{b}x{s}" for b, s in bench_serving.SERVING_SIZES) + ")")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0 when every successful row (experiment columns of the
    serving table aside) is correct, else 1."""
    args = build_parser().parse_args(argv)
    report = run(args)
    print(format_table(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.model_dump_json(indent=1))
    serving_ok = all(r.correct for r in report.serving if r.ok and not r.experiment)
    return 0 if all(r.correct for r in report.rows if r.ok) and serving_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
