"""GPU autotuning and the measured selection table behind ``auto`` on a GPU.

``python -m kernels.autotune --out kernels/gpu_table.json`` times, per shape, every
candidate tiling (block_q, block_kv, num_warps, num_stages) of ``pallas_gpu`` and the
cuDNN kernel, keeps only candidates whose output matches cuDNN/XLA, and writes a
versioned table (schema version, JAX version, device kind, date, per shape: the faster
implementation, its TFLOP/s and the pallas_gpu config).

Tuning data: random normal inputs with the shapes and dtypes of the benchmark grid
(``kernels.bench.grid``). No held-out or confirmation test-set case is read here, so
tuning cannot leak into the gate's evidence.

:func:`select_gpu_implementation` reads the table (nearest measured shape) and is what
``kernels.api`` calls for ``implementation="auto"`` on a GPU and what the build reads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
from pydantic import BaseModel, Field

from kernels.pallas_gpu import GpuFlashConfig, default_config

TABLE_SCHEMA_VERSION = 1
DEFAULT_TABLE_PATH = Path(__file__).with_name("gpu_table.json")
CUDNN_DTYPES = ("bfloat16", "float16")
AGREEMENT_LIMIT = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
"""Max ||candidate - cudnn|| / ||cudnn|| for a candidate to count as correct (both
are flash kernels with float32 softmax; bf16 rounding of P dominates the difference)."""


class CandidateResult(BaseModel):
    """One pallas_gpu tiling timed on one shape."""

    config: dict[str, Any]
    tflops: float | None = None
    rel_diff_to_baseline: float | None = None
    error: str | None = None


class TableEntry(BaseModel):
    """The measured decision for one shape (``[batch, seq, num_heads, head_dim]``)."""

    dtype: str
    batch: int
    seq: int
    num_heads: int
    head_dim: int
    causal: bool
    best: Literal["pallas_gpu", "cudnn"]
    tflops: dict[str, float] = Field(description="implementation -> TFLOP/s (best tiling)")
    pallas_config: dict[str, Any]
    candidates: list[CandidateResult] = Field(default_factory=list)


class SelectionTable(BaseModel):
    """``kernels/gpu_table.json``: versioned and measured, never hand-edited."""

    schema_version: int = TABLE_SCHEMA_VERSION
    jax_version: str
    device_kind: str
    created_at: str
    command: str
    tuning_data: str
    entries: list[TableEntry]


# --------------------------------------------------------------------------- selection


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime: float) -> SelectionTable | None:
    del mtime  # part of the cache key only: a rewritten table is re-read
    return SelectionTable.model_validate_json(Path(path).read_text())


def load_table(path: Path | str | None = None) -> SelectionTable | None:
    """The selection table at ``path`` (default ``kernels/gpu_table.json``), or None
    if there is none. Raises ``pydantic.ValidationError`` for a malformed table and
    ``ValueError`` for an unknown schema version."""
    path = Path(path or DEFAULT_TABLE_PATH)
    if not path.exists():
        return None
    table = _load_cached(str(path), path.stat().st_mtime)
    if table.schema_version != TABLE_SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {table.schema_version}, expected "
                         f"{TABLE_SCHEMA_VERSION}; re-run python -m kernels.autotune")
    return table


def _log2_ratio(a: float, b: float) -> float:
    return abs(math.log2(max(a, 1) / max(b, 1)))


def _distance(entry: TableEntry, q_shape, kv_shape, dtype: str, causal: bool) -> float:
    # Weights order the match: masking pattern, then head_dim (tile shapes), then dtype
    # (bf16 and f16 run the same tensor-core path), then lengths and parallelism.
    batch, q_len, num_heads, head_dim = q_shape
    return (8.0 * (entry.causal != causal) + 2.0 * _log2_ratio(head_dim, entry.head_dim)
            + 1.0 * (entry.dtype != dtype) + _log2_ratio(q_len, entry.seq)
            + 0.5 * _log2_ratio(kv_shape[1], entry.seq)
            + 0.25 * _log2_ratio(batch * num_heads, entry.batch * entry.num_heads))


def _nearest(table: SelectionTable | None, q_shape, kv_shape, dtype: str, causal: bool):
    if table is None or not table.entries:
        return None
    return min(table.entries, key=lambda e: _distance(e, q_shape, kv_shape, dtype, causal))


def select_gpu_implementation(q_shape: Sequence[int], kv_shape: Sequence[int], dtype: Any,
                              causal: bool, *, table_path: Path | str | None = None,
                              ) -> tuple[str, dict[str, Any] | None, str]:
    """The faster of pallas_gpu and cudnn for a call, from the measured table.

    Args:
      q_shape: ``(batch, q_len, num_heads, head_dim)``; kv_shape: ``(batch, kv_len,
        num_kv_heads, head_dim)``; dtype: input dtype; causal: top-left causal mask.
      table_path: the table (default ``kernels/gpu_table.json``).

    Returns:
      ``(name, config, reason)``: ``config`` is the pallas_gpu tiling (a dict for
      ``kernels.config.BlockSizes``) when ``name == "pallas_gpu"``, else ``None``.
      The nearest measured shape decides. Without a table (or entries) the documented
      default applies: cudnn for bf16/f16 (the anchors measured it at 480-630 TFLOP/s
      against 316-430 for a Pallas Triton kernel on the H200), pallas_gpu with
      :func:`kernels.pallas_gpu.default_config` for float32, which cuDNN does not run.
    """
    q_shape, kv_shape = tuple(q_shape), tuple(kv_shape)
    dtype = jnp.dtype(dtype).name
    head_dim = q_shape[-1]
    table = load_table(table_path)
    entry = _nearest(table, q_shape, kv_shape, dtype, causal)
    if entry is None:
        if dtype in CUDNN_DTYPES:
            return "cudnn", None, "no measured GPU table; documented default cudnn for bf16/f16"
        return ("pallas_gpu", default_config(head_dim).model_dump(),
                f"no measured GPU table; {dtype} is not run by cuDNN, pallas_gpu default tiling")
    where = (f"nearest measured shape {entry.dtype} B{entry.batch} S{entry.seq} "
             f"H{entry.num_heads} D{entry.head_dim} causal={entry.causal} on "
             f"{table.device_kind} (jax {table.jax_version}, {table.created_at}): "
             + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in entry.tflops.items()))
    name = entry.best
    if dtype not in CUDNN_DTYPES:
        name = "pallas_gpu"
        where += f"; cuDNN does not run {dtype}"
    if name == "pallas_gpu":
        return name, dict(entry.pallas_config), where
    return name, None, where


def select_pallas_config(q_shape: Sequence[int], kv_shape: Sequence[int], dtype: Any,
                         causal: bool, *, table_path: Path | str | None = None,
                         ) -> dict[str, Any] | None:
    """The tuned pallas_gpu tiling of the nearest measured shape (whichever
    implementation won there), or ``None`` when there is no table."""
    entry = _nearest(load_table(table_path), tuple(q_shape), tuple(kv_shape),
                     jnp.dtype(dtype).name, causal)
    return None if entry is None else dict(entry.pallas_config)


# --------------------------------------------------------------------------- tuning


def candidate_configs(head_dim: int, quick: bool = False) -> list[GpuFlashConfig]:
    """Tilings to try (FlashAttention-2 style: 64/128-row query tiles, 32..128-row key
    tiles, 4 or 8 warps, 2..4 pipeline stages), the default first."""
    if quick:
        return [GpuFlashConfig(block_q=16, block_kv=16), GpuFlashConfig(block_q=32, block_kv=16)]
    # Pruned with the first H200 sweep (NOTES-gpu.md): 64-row tiles with 4 warps lead
    # at head_dim 64, 128x128 with 8 warps and 3 stages at 128; the rest bracket them.
    if head_dim <= 64:
        grid = [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 128, 4, 3),
                (128, 64, 8, 3), (64, 32, 4, 4), (128, 64, 4, 3)]
    elif head_dim <= 128:
        grid = [(128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3),
                (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 2)]
    else:
        grid = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 3)]
    configs = [default_config(head_dim)]
    for bq, bkv, warps, stages in grid:
        cfg = GpuFlashConfig(block_q=bq, block_kv=bkv, num_warps=warps, num_stages=stages)
        if cfg not in configs:
            configs.append(cfg)
    return configs


def tune_shape(shape, *, quick: bool, seed: int, repeats: int,
               target_repeat_s: float) -> TableEntry:
    """Time cudnn and every candidate tiling of pallas_gpu on one ``BenchShape``."""
    from kernels import bench  # noqa: PLC0415 - shares the timing method

    q, k, v = bench._inputs(shape, seed)
    flops = shape.flops()
    tflops: dict[str, float] = {}
    baseline = None
    for name in ("cudnn", "xla"):
        try:
            fn = bench.attention_fn(name, shape, None)
            compiled, *_ = bench.compile_and_warm(fn, (q, k, v))
            baseline = compiled(q, k, v).astype(jnp.float32)
            if name == "cudnn":
                timing = bench.time_call(compiled, (q, k, v), repeats=repeats,
                                         target_repeat_s=target_repeat_s,
                                         warmup_s=0.0 if quick else 0.1)
                tflops["cudnn"] = flops / timing.median_s / 1e12
            break
        except (NotImplementedError, ImportError):
            continue
    results = []
    for cfg in candidate_configs(shape.head_dim, quick):
        result = CandidateResult(config=cfg.model_dump())
        try:
            fn = bench.attention_fn("pallas_gpu", shape, cfg.model_dump())
            compiled, *_ = bench.compile_and_warm(fn, (q, k, v))
            out = compiled(q, k, v).astype(jnp.float32)
            result.rel_diff_to_baseline = float(jnp.linalg.norm(out - baseline)
                                                / jnp.linalg.norm(baseline))
            if not result.rel_diff_to_baseline <= AGREEMENT_LIMIT[shape.dtype]:
                raise ValueError(f"output differs from baseline by "
                                 f"{result.rel_diff_to_baseline:.2e}")
            timing = bench.time_call(compiled, (q, k, v), repeats=repeats,
                                     target_repeat_s=target_repeat_s,
                                     warmup_s=0.0 if quick else 0.1)
            result.tflops = flops / timing.median_s / 1e12
        except Exception as err:  # noqa: BLE001 - a failing tiling is a tuning result
            result.error = bench._short(err)
        results.append(result)
    good = [r for r in results if r.tflops]
    if not good:
        raise RuntimeError(f"no pallas_gpu tiling ran correctly for {shape.label()}: "
                           + "; ".join(str(r.error) for r in results))
    best = max(good, key=lambda r: r.tflops)
    tflops["pallas_gpu"] = best.tflops
    winner = "cudnn" if tflops.get("cudnn", 0.0) > best.tflops else "pallas_gpu"
    return TableEntry(dtype=shape.dtype, batch=shape.batch, seq=shape.seq,
                      num_heads=shape.num_heads, head_dim=shape.head_dim,
                      causal=shape.causal, best=winner, tflops=tflops,
                      pallas_config=best.config, candidates=results)


def autotune(shapes, *, quick: bool, repeats: int, target_repeat_s: float,
             command: str) -> SelectionTable:
    """Tune every shape; return the table (not yet written)."""
    entries = []
    for i, shape in enumerate(shapes):
        entry = tune_shape(shape, quick=quick, seed=1000 + i, repeats=repeats,
                           target_repeat_s=target_repeat_s)
        print(f"[autotune] {shape.label()}: best {entry.best} "
              + " ".join(f"{k}={v:.1f}" for k, v in entry.tflops.items())
              + f" config={entry.pallas_config}", file=sys.stderr, flush=True)
        entries.append(entry)
    return SelectionTable(
        jax_version=jax.__version__, device_kind=jax.devices()[0].device_kind,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), command=command,
        tuning_data=("random normal q/k/v with the benchmark grid's shapes and dtypes "
                     "(kernels.bench.grid); no held-out or confirmation data"),
        entries=entries)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: tune and write the table (atomically: a temp file, then rename)."""
    from kernels.bench import grid  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m kernels.autotune",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_TABLE_PATH)
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, two tilings (always so without a GPU)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqs", nargs="+", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-repeat-s", type=float, default=0.01)
    args = parser.parse_args(argv)
    quick = args.quick or jax.default_backend() not in ("gpu", "cuda")
    shapes = grid(quick, args.seqs, args.dtypes, args.head_dims)
    table = autotune(shapes, quick=quick, repeats=3 if quick else args.repeats,
                     target_repeat_s=0.0 if quick else args.target_repeat_s,
                     command=" ".join(["python -m kernels.autotune", *sys.argv[1:]]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(table.model_dump(mode="json"), indent=1))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(table.entries)} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
