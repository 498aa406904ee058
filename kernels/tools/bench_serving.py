"""The serving workload's shapes: MiniLM attention, microseconds per call, every implementation.

Why. The canary serves all-MiniLM-L6-v2: 12 heads x head_dim 32,
sequences up to 512 tokens, float32 (and bf16), and the attention call carries
``kv_lengths`` (padding). Flash attention's usual win (long sequences, head_dim 64-128)
is not there: on the H200 pallas_gpu took 421 us at 16 x 512 against XLA's 358 us at
HIGHEST, and the canary rolled it back. This table measures those shapes for every
implementation in the registry, beside the long-sequence table of ``kernels.tools.bench``.

Columns: ``naive``, ``xla`` (float32 at HIGHEST, the serving baseline), ``cudnn`` (bf16
only), ``pallas_gpu`` (the table's tiling for the shape, fitted to the device), and
``pallas_mosaic_gpu`` when the registry has it. Informational columns, never part of the
exit code: ``xla_default`` (float32 at JAX's default precision: TF32 on a GPU, what the
serving baseline used before it was pinned to HIGHEST) and, for float32, ``pallas_gpu[tf32x3]`` and
``pallas_gpu[bf16x6]``: the same kernel with the float32 products emulated on tensor
cores (``kernels.pallas_gpu.FLOAT32_PRECISIONS``), timed and scored against float64 so
that the choice of the float32 path is made on measurements. (Interpreted on a CPU,
``tf32x3`` runs as IEEE float32: XLA:CPU has no TF32.)

Inputs are fresh random normal q/k/v; ``kv_lengths`` are all full (the work of an
unpadded bucket, through the masked code path the model uses). Errors are
``||out - ref|| / ||ref||`` against float64 on sampled query rows of two (batch, head)
pairs, and a row is correct when finite and within ``ERROR_RATIO_LIMIT`` x max(naive's
error, ``kernels.reference.rounding_floor``). Timing is ``kernels.timing`` (median over
repeats; a second pass shows the noise). ``quick`` (always so without a GPU): 2 heads and
tiny sizes, pallas_gpu interpreted; those timings are not performance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, Field

from kernels.api import attention, default_backend
from kernels.contract import validate
from kernels.pallas_gpu import pallas_gpu_attention
from kernels.reference import attention_reference, relative_error, rounding_floor
from kernels.registry import IMPLEMENTATIONS as REGISTRY
from kernels.selection import measured_config
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import DEFAULT_WARMUP_S, Timing, time_call

MINILM_HEADS = 12
MINILM_HEAD_DIM = 32
SERVING_SIZES: tuple[tuple[int, int], ...] = ((8, 128), (16, 512), (4, 1024))
"""(batch, seq) of the serving table: the shapes measured on the H200 (MiniLM buckets)."""
QUICK_SIZES: tuple[tuple[int, int], ...] = ((2, 32), (1, 64))
SERVING_DTYPES = ("float32", "bfloat16")
EXPERIMENT_COLUMNS = ("xla_default", "pallas_gpu[tf32x3]", "pallas_gpu[bf16x6]")
ERROR_RATIO_LIMIT = 2.0


class ServingRow(BaseModel):
    """One (serving shape, column) measurement; times in microseconds per call."""

    shape: AttentionShape
    implementation: str = Field(description="registry name or experiment column")
    experiment: bool = Field(description="informational column, not part of the verdict")
    float32_precision: str | None = Field(None, description="how float32 products run")
    config: dict[str, Any] | None = None
    ok: bool = False
    error: str | None = None
    us_per_call: float | None = None
    us_per_call_pass2: float | None = None
    timing: Timing | None = None
    rel_error_vs_reference: float | None = None
    error_ratio_to_naive: float | None = Field(
        None, description="rel. error / max(naive's rel. error, rounding floor)")
    correct: bool | None = None


def columns() -> list[str]:
    """Every registered kernel native on a GPU or on every backend (registry order;
    ``Kernel.native_platforms``), then the experiment columns."""
    return [n for n, k in REGISTRY.items() if "gpu" in k.native_platforms] + list(
        EXPERIMENT_COLUMNS)


def parse_size(text: str) -> tuple[int, int]:
    """``"BATCHxSEQ"`` (e.g. ``"1x128"``) as ``(batch, seq)``, both positive ints.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not two positive integers joined by ``x``.
    """
    import argparse

    batch, sep, seq = text.lower().partition("x")
    if not (sep and batch.isdigit() and seq.isdigit() and int(batch) > 0 and int(seq) > 0):
        raise argparse.ArgumentTypeError(
            f"a serving size is BATCHxSEQ with two positive integers (e.g. 1x128), got {text!r}")
    return int(batch), int(seq)


def serving_shapes(quick: bool, dtypes: Sequence[str] = SERVING_DTYPES,
                   sizes: Sequence[tuple[int, int]] | None = None) -> list[AttentionShape]:
    """MiniLM attention shapes (non-causal, q_len = kv_len = seq): 12 heads x head_dim 32
    for each (batch, seq) of ``sizes`` (default :data:`SERVING_SIZES`; quick: 2 heads,
    :data:`QUICK_SIZES`)."""
    heads = 2 if quick else MINILM_HEADS
    return [AttentionShape(batch=b, q_len=s, kv_len=s, num_heads=heads, num_kv_heads=heads,
                           head_dim=MINILM_HEAD_DIM, dtype=dtype, causal=False)
            for dtype in dtypes for b, s in (sizes or (QUICK_SIZES if quick else SERVING_SIZES))]


def _pallas_config(shape: AttentionShape):
    kernel = REGISTRY["pallas_gpu"]
    return measured_config(shape, "pallas_gpu") or kernel.fitted_config(
        shape.dtype, shape.head_dim, shape.q_len, shape.kv_len)


def column_fn(column: str, shape: AttentionShape) -> tuple[Callable, Any, str | None]:
    """``(fn(q, k, v, kv_lengths) -> out, config, float32 precision)`` for one column.

    Raises:
        NotImplementedError: the column does not run this shape here (the reason says why).
    """
    scale = 1.0 / math.sqrt(shape.head_dim)
    spec, _, _ = validate(*shape.structs(), causal=shape.causal, scale=scale)
    backend = default_backend()
    if column in REGISTRY:
        impl = REGISTRY[column]
        # A tuned kernel runs the table's tiling for the shape, else its own default
        # (pallas_gpu's fitted to the device); each kernel's check says where it runs
        # (pallas_gpu: interpreted on a CPU).
        impl.check_supported(spec, backend)
        config = ((measured_config(shape, column)
                   or impl.resolve_config(spec, None)) if impl.tuned else None)
        fn = functools.partial(attention, causal=shape.causal, scale=scale,
                               implementation=column, config=config)
        return (lambda q, k, v, kl: fn(q, k, v, kv_lengths=kl)), config, \
            impl.float32_matmul_precision
    if shape.dtype != "float32":
        raise NotImplementedError(f"{column} is a float32 experiment")
    if column == "xla_default":
        def xla_default(q, k, v, kl):
            full = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
            return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=shape.causal,
                                                query_seq_lengths=full, key_value_seq_lengths=kl,
                                                implementation="xla")
        return xla_default, None, f"JAX default ({jax.config.jax_default_matmul_precision})"
    precision = column[column.index("[") + 1:-1]
    config = _pallas_config(shape)
    fn = functools.partial(pallas_gpu_attention, causal=shape.causal, scale=scale,
                           q_lengths=None, config=config, float32_precision=precision)
    return (lambda q, k, v, kl: fn(q, k, v, kv_lengths=kl)), config, precision


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"


def bench_serving_shape(shape: AttentionShape, names: Sequence[str], *, seed: int,
                        repeats: int, target_repeat_s: float, warmup_s: float,
                        sample_rows: int = 64) -> list[ServingRow]:
    """Check and time every column on one serving shape (same random inputs for all)."""
    q, k, v = random_inputs(shape, seed)
    kv_lengths = jnp.full((shape.batch,), shape.kv_len, jnp.int32)
    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(shape.batch)), int(rng.integers(shape.num_heads)))
             for _ in range(2)]
    rows_idx = np.sort(rng.choice(shape.q_len, size=min(sample_rows, shape.q_len),
                                  replace=False))
    host = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref = np.stack([attention_reference(*(x[b:b + 1, :, h:h + 1] for x in host),
                                        causal=shape.causal, rows=rows_idx)[0, :, 0]
                    for b, h in pairs])
    results = []
    for name in names:
        row = ServingRow(shape=shape, implementation=name, experiment=name not in REGISTRY)
        try:
            fn, config, row.float32_precision = column_fn(name, shape)
            row.config = config.fields_set() if config is not None else None
            jitted = jax.jit(fn)
            out = jax.block_until_ready(jitted(q, k, v, kv_lengths))
            got = np.stack([np.asarray(out[b, rows_idx, h].astype(jnp.float32))
                            for b, h in pairs])
            row.rel_error_vs_reference = relative_error(got, ref)
            timed = functools.partial(time_call, jitted, (q, k, v, kv_lengths),
                                      repeats=repeats, target_repeat_s=target_repeat_s,
                                      warmup_s=warmup_s)
            row.timing = timed()
            row.us_per_call = row.timing.median_s * 1e6
            row.us_per_call_pass2 = timed().median_s * 1e6
            row.ok = True
        except (NotImplementedError, ImportError) as err:
            row.error = "unsupported: " + _short(err)
        except Exception as err:  # noqa: BLE001 - a failing kernel is a result
            row.error = _short(err)
        results.append(row)
    naive = next((r.rel_error_vs_reference for r in results
                  if r.implementation == "naive" and r.ok), None)
    floor = rounding_floor(shape.dtype, shape.kv_len)
    for row in results:
        if row.ok:
            row.error_ratio_to_naive = row.rel_error_vs_reference / max(naive or floor, floor)
            row.correct = bool(math.isfinite(row.rel_error_vs_reference)
                               and row.error_ratio_to_naive <= ERROR_RATIO_LIMIT)
    return results


def bench_serving(shapes: Sequence[AttentionShape], names: Sequence[str] | None = None, *,
                  seed: int = 0, repeats: int = 11, target_repeat_s: float = 0.02,
                  warmup_s: float = DEFAULT_WARMUP_S, progress=None) -> list[ServingRow]:
    """:func:`bench_serving_shape` over ``shapes`` (default columns: :func:`columns`)."""
    names = list(names or columns())
    rows: list[ServingRow] = []
    for i, shape in enumerate(shapes):
        rows += bench_serving_shape(shape, names, seed=seed + 100 + i, repeats=repeats,
                                    target_repeat_s=target_repeat_s, warmup_s=warmup_s)
        if progress is not None:
            progress(shape)
    return rows


def format_serving(rows: Sequence[ServingRow]) -> str:
    """Plain-text table: microseconds per call per column, pallas_gpu / xla, errors."""
    if not rows:
        return ""
    names = [n for n in dict.fromkeys(r.implementation for r in rows)
             if any(r.implementation == n and r.ok for r in rows)]
    head = f"{'serving shape (us per call)':34s}" + "".join(f"{n:>19s}" for n in names)
    lines = ["", head + f"{'pallas/xla':>11s}  pallas err (naive)  all correct"]
    by_shape: dict[str, dict[str, ServingRow]] = {}
    for r in rows:
        by_shape.setdefault(r.shape.label, {})[r.implementation] = r
    for label, cells in by_shape.items():
        line = f"{label:34s}"
        for n in names:
            r = cells.get(n)
            line += f"{r.us_per_call:19.1f}" if r and r.ok else f"{'-':>19s}"
        pal, xla, naive = cells.get("pallas_gpu"), cells.get("xla"), cells.get("naive")
        ratio = (f"{pal.us_per_call / xla.us_per_call:11.2f}"
                 if pal and xla and pal.ok and xla.ok else f"{'-':>11s}")
        err = (f"{pal.rel_error_vs_reference:.1e} ({naive.rel_error_vs_reference:.1e})"
               if pal and naive and pal.ok and naive.ok else "-")
        verdict = all(r.correct for r in cells.values() if r.ok and not r.experiment)
        lines.append(line + ratio + f"  {err:18s}  {'yes' if verdict else 'NO'}")
    lines.append("pallas/xla < 1: pallas_gpu is faster than the serving baseline at equal "
                 "precision. Experiment columns (xla_default, pallas_gpu[...]) are "
                 "informational; their errors are in the JSON.")
    for r in rows:
        if r.experiment and r.ok:
            lines.append(f"  {r.shape.label} {r.implementation}: {r.us_per_call:.1f} us, "
                         f"rel. error {r.rel_error_vs_reference:.1e} "
                         f"({r.error_ratio_to_naive:.2f} x max(naive, floor))")
    return "\n".join(lines)
