"""The measured GPU selection table behind ``implementation="auto"`` on a GPU.

``kernels/gpu_table.json`` is written by ``python -m kernels.autotune`` on a GPU: per
tuned shape, which of pallas_gpu and cuDNN was faster and pallas_gpu's best tiling.
This module only reads it; :func:`select_gpu_implementation` picks the entry of the
nearest measured shape. Data, not code: re-running the autotuner on another device or
JAX version rewrites the table and ``auto`` follows it.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernels.config import BlockSizes
from kernels.pallas_gpu import default_config
from kernels.shapes import AttentionShape

TABLE_SCHEMA_VERSION = 1
DEFAULT_TABLE_PATH = Path(__file__).with_name("gpu_table.json")
CUDNN_DTYPES = ("bfloat16", "float16")


class CandidateResult(BaseModel):
    """One pallas_gpu tiling timed on one shape."""

    config: dict[str, Any]
    tflops: float | None = None
    rel_diff_to_baseline: float | None = None
    error: str | None = None


class TableEntry(BaseModel):
    """The measured decision for one shape (``[batch, seq, num_heads, head_dim]``,
    q_len = kv_len = seq)."""

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


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime: float) -> SelectionTable:
    del mtime  # part of the cache key only: a rewritten table is re-read
    return SelectionTable.model_validate_json(Path(path).read_text())


def load_table(path: Path | str | None = None) -> SelectionTable | None:
    """The selection table at ``path`` (default ``kernels/gpu_table.json``), or None.

    Raises:
        pydantic.ValidationError: a malformed table.
        ValueError: an unknown schema version.
    """
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


def _distance(entry: TableEntry, shape: AttentionShape) -> float:
    # Weights order the match: masking pattern, then head_dim (tile shapes), then dtype
    # (bf16 and f16 run the same tensor-core path), then lengths and parallelism.
    return (8.0 * (entry.causal != shape.causal) + 2.0 * _log2_ratio(shape.head_dim, entry.head_dim)
            + 1.0 * (entry.dtype != shape.dtype) + _log2_ratio(shape.q_len, entry.seq)
            + 0.5 * _log2_ratio(shape.kv_len, entry.seq)
            + 0.25 * _log2_ratio(shape.batch * shape.num_heads, entry.batch * entry.num_heads))


def nearest_entry(shape: AttentionShape, table: SelectionTable | None) -> TableEntry | None:
    """The table entry closest to ``shape`` (None without a table or entries)."""
    if table is None or not table.entries:
        return None
    return min(table.entries, key=lambda e: _distance(e, shape))


def select_gpu_implementation(shape: AttentionShape, *, table_path: Path | str | None = None
                              ) -> tuple[str, BlockSizes | None, str]:
    """The faster of pallas_gpu and cudnn for a call, from the measured table.

    Returns:
        ``(name, config, reason)``: ``config`` is pallas_gpu's tiling when ``name ==
        "pallas_gpu"``, else ``None``. The nearest measured shape decides. Without a
        table the documented default applies: cudnn for bf16/f16 (the anchors measured
        it at 480-630 TFLOP/s against 316-430 for a Pallas Triton kernel on the H200),
        pallas_gpu with :func:`kernels.pallas_gpu.default_config` for float32, which
        cuDNN does not run.
    """
    table = load_table(table_path)
    entry = nearest_entry(shape, table)
    if entry is None:
        if shape.dtype in CUDNN_DTYPES:
            return "cudnn", None, "no measured GPU table; documented default cudnn for bf16/f16"
        return ("pallas_gpu", default_config(shape.head_dim),
                f"no measured GPU table; {shape.dtype} is not run by cuDNN, pallas_gpu default tiling")
    where = (f"nearest measured shape {entry.dtype} B{entry.batch} S{entry.seq} "
             f"H{entry.num_heads} D{entry.head_dim} causal={entry.causal} on "
             f"{table.device_kind} (jax {table.jax_version}, {table.created_at}): "
             + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in entry.tflops.items()))
    name = entry.best
    if shape.dtype not in CUDNN_DTYPES:
        name = "pallas_gpu"
        where += f"; cuDNN does not run {shape.dtype}"
    if name == "pallas_gpu":
        return name, BlockSizes(**entry.pallas_config), where
    return name, None, where


def select_pallas_config(shape: AttentionShape, *, table_path: Path | str | None = None
                         ) -> BlockSizes | None:
    """The tuned pallas_gpu tiling of the nearest measured shape (whichever
    implementation won there), or ``None`` when there is no table."""
    entry = nearest_entry(shape, load_table(table_path))
    return None if entry is None else BlockSizes(**entry.pallas_config)
