"""The measured GPU selection table behind ``implementation="auto"`` on a GPU.

``kernels/gpu_table.json`` is written by ``python -m kernels.tools.autotune`` on a GPU: per
tuned shape, which of pallas_gpu, pallas_mosaic_gpu and cuDNN was fastest (among the
candidates whose output agreed with cuDNN) and the best tiling of each Pallas kernel.
This module only reads it; :func:`select_gpu_implementation` picks the entry of the
nearest measured shape. Data, not code: re-running the autotuner on another device or
JAX version rewrites the table and ``auto`` follows it.

Schema version 2 keys the table by device kind: each entry names the device kind it was
measured on, and a GPU only ever picks from entries measured on its own kind (another
kind's entries are ignored, and the reason says so). A version-1 table (one device kind
for the whole file) still reads: its entries count as measured on the table's
``device_kind`` (``NVIDIA H200`` for the committed one). ``mosaic_config`` and
``mosaic_candidates`` (issue 14) are optional, so a table written before
pallas_mosaic_gpu existed reads unchanged (no pallas_mosaic_gpu entry: ``auto`` never
picks it from that table).

A pallas_gpu table tiling is applied only when it fits the device's shared memory for
the call's dtype and head_dim (``kernels.gpu_limits``): the nearest entry may have been
measured for another dtype or head_dim (issue 11: a bf16 head_dim-128 tiling applied to
a float32 head_dim-256 call overflowed). Otherwise the tiling is shrunk until it fits
(fewer stages, then smaller tiles), and the reason says so. (pallas_mosaic_gpu checks
its own tilings against shared memory and refuses what cannot fit.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from kernels.config import BlockSizes
from kernels.gpu_limits import (
    effective_config,
    fit_config,
    shared_memory_budget,
    shared_memory_bytes,
)
from kernels.pallas_gpu import default_config, fitted_config
from kernels.registry import IMPLEMENTATIONS, tuned
from kernels.shapes import AttentionShape

TABLE_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
DEFAULT_TABLE_PATH = Path(__file__).with_name("gpu_table.json")
CUDNN_DTYPES = ("bfloat16", "float16")
"""The dtypes of the documented default without a table (cuDNN's)."""
TABLE_FIELDS = {"pallas_gpu": "pallas_config", "pallas_mosaic_gpu": "mosaic_config"}
"""Where schema version 1 keeps the tiling of the first two tuned kernels; any other
kernel the registry declares ``tuned`` keeps its tiling in ``TableEntry.configs``."""


class CandidateResult(BaseModel):
    """One tiling of a Pallas kernel timed on one shape (``error`` says why it has no
    figure: a failed compile, a wrong output, an unsupported call)."""

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
    device_kind: str | None = Field(
        None, description="the device kind it was measured on (schema 2); None (schema 1): "
                          "the table's device_kind")
    best: str = Field(description="registry name of the fastest correct implementation")
    tflops: dict[str, float] = Field(description="implementation -> TFLOP/s (best tiling)")
    pallas_config: dict[str, Any]
    candidates: list[CandidateResult] = Field(default_factory=list)
    mosaic_config: dict[str, Any] | None = Field(
        None, description="pallas_mosaic_gpu's fastest correct tiling; None: not measured")
    mosaic_candidates: list[CandidateResult] = Field(default_factory=list)
    configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="tuned kernel -> its fastest correct tiling, for kernels other than "
                    "those of TABLE_FIELDS (optional: schema version 1 reads unchanged)")

    @model_validator(mode="after")
    def _best_is_measured(self) -> TableEntry:
        if self.best not in self.tflops:
            raise ValueError(f"best={self.best!r} has no TFLOP/s figure in {sorted(self.tflops)}")
        if self.best == "pallas_mosaic_gpu" and self.mosaic_config is None:
            raise ValueError("best='pallas_mosaic_gpu' needs its mosaic_config")
        return self

    def config_of(self, name: str) -> BlockSizes | None:
        """The measured tiling of the tuned kernel ``name``, if any."""
        field = TABLE_FIELDS.get(name)
        raw = getattr(self, field) if field is not None else self.configs.get(name)
        return None if raw is None else BlockSizes(**raw)


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
    if table.schema_version not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(f"{path}: schema_version {table.schema_version}, expected one of "
                         f"{READABLE_SCHEMA_VERSIONS}; re-run python -m kernels.tools.autotune")
    return table


def measured_on(entry: TableEntry, table: SelectionTable) -> str:
    """The device kind ``entry`` was measured on."""
    return entry.device_kind or table.device_kind


def current_device_kind() -> str | None:
    """This host's GPU device kind (e.g. ``NVIDIA H200``), None off-GPU (a GPU call
    planned on a CPU host, as the tests do, reads every entry)."""
    import jax

    device = jax.devices()[0]
    return device.device_kind if device.platform in ("gpu", "cuda", "rocm") else None


def _log2_ratio(a: float, b: float) -> float:
    return abs(math.log2(max(a, 1) / max(b, 1)))


def _distance(entry: TableEntry, shape: AttentionShape) -> float:
    # Weights order the match: masking pattern, then head_dim (tile shapes), then dtype
    # (bf16 and f16 run the same tensor-core path), then lengths and parallelism.
    return (8.0 * (entry.causal != shape.causal) + 2.0 * _log2_ratio(shape.head_dim, entry.head_dim)
            + 1.0 * (entry.dtype != shape.dtype) + _log2_ratio(shape.q_len, entry.seq)
            + 0.5 * _log2_ratio(shape.kv_len, entry.seq)
            + 0.25 * _log2_ratio(shape.batch * shape.num_heads, entry.batch * entry.num_heads))


def nearest_entry(shape: AttentionShape, table: SelectionTable | None,
                  device_kind: str | None = None) -> TableEntry | None:
    """The table entry closest to ``shape`` among those measured on ``device_kind``
    (None: any kind); None without a table or such entries."""
    if table is None:
        return None
    entries = [e for e in table.entries
               if device_kind is None or measured_on(e, table) == device_kind]
    return min(entries, key=lambda e: _distance(e, shape)) if entries else None


def fitting_tiling(config: BlockSizes, shape: AttentionShape) -> tuple[BlockSizes | None, str]:
    """``config`` when it fits the device's shared memory for ``shape``'s dtype and
    head_dim, else the closest tiling that does (``None`` when none does), and a note
    saying what was changed and why ("" when nothing was)."""
    budget = shared_memory_budget()
    full = config.merged_over(default_config(shape.head_dim))
    fitted = fit_config(BlockSizes(), full, dtype=shape.dtype, head_dim=shape.head_dim,
                        budget=budget, q_len=shape.q_len, kv_len=shape.kv_len)
    if fitted == full:
        return config, ""
    need = shared_memory_bytes(effective_config(full, shape.q_len, shape.kv_len),
                               dtype=shape.dtype, head_dim=shape.head_dim)
    note = (f"table tiling {config.model_dump()} needs about {need} bytes of shared memory "
            f"for {shape.dtype} at head_dim {shape.head_dim}, over {budget.describe()}: ")
    if fitted is None:
        return None, note + "no tiling fits"
    return fitted, note + f"using {fitted.model_dump()}"


def select_gpu_implementation(shape: AttentionShape, *, table_path: Path | str | None = None,
                              device_kind: str | None = None
                              ) -> tuple[str, BlockSizes | None, str]:
    """The fastest of pallas_gpu, pallas_mosaic_gpu and cudnn for a call, from the
    measured table.

    Returns:
        ``(name, config, reason)``: ``config`` is the Pallas kernel's tiling when
        ``name`` is one of them (for pallas_gpu always one that fits the device's shared
        memory for the call, see :func:`fitting_tiling`; ``None`` when none fits), else
        ``None``. The nearest measured shape decides. Without a table the documented
        default applies: cudnn for bf16/f16 (the anchors measured it at 480-630 TFLOP/s
        against 316-430 for a Pallas Triton kernel on the H200; pallas_mosaic_gpu is not
        preferred before it is measured), pallas_gpu with its fitted default tiling
        (``kernels.pallas_gpu.fitted_config``) for float32, which neither cuDNN nor
        pallas_mosaic_gpu runs.
    """
    table = load_table(table_path)
    kind = device_kind if device_kind is not None else current_device_kind()
    entry = nearest_entry(shape, table, kind)
    if entry is None:
        why = "no measured GPU table" if table is None else (
            f"the measured table has no entry for {kind} (measured on "
            f"{sorted({measured_on(e, table) for e in table.entries})}; another device kind's "
            "figures are never used)")
        if shape.dtype in CUDNN_DTYPES:
            return "cudnn", None, f"{why}; documented default cudnn for bf16/f16"
        return ("pallas_gpu",
                fitted_config(shape.dtype, shape.head_dim, shape.q_len, shape.kv_len),
                f"{why}; {shape.dtype} is not run by cuDNN, pallas_gpu "
                "default tiling fitted to the device")
    where = (f"nearest measured shape {entry.dtype} B{entry.batch} S{entry.seq} "
             f"H{entry.num_heads} D{entry.head_dim} causal={entry.causal} on "
             f"{measured_on(entry, table)} (jax {table.jax_version}, {table.created_at}): "
             + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in entry.tflops.items()))
    name = entry.best
    kernel = IMPLEMENTATIONS.get(name)
    if kernel is None or shape.dtype not in kernel.capability.dtypes:
        name = "pallas_gpu"
        where += f"; {entry.best} does not run {shape.dtype} (its declared capability)"
    config = entry.config_of(name)
    if name == "pallas_gpu" and config is not None:
        config, note = fitting_tiling(config, shape)
        where += f"; {note}" if note else ""
    return name, config, where


def measured_configs(shape: AttentionShape, *, table_path: Path | str | None = None
                     ) -> dict[str, BlockSizes]:
    """Per Pallas kernel, the tiling measured at the shape nearest ``shape`` (empty
    without a table; pallas_gpu's fitted to the device for ``shape``, and left out when
    nothing fits); ``auto`` uses it for whichever of them it falls back to."""
    table = load_table(table_path)
    entry = nearest_entry(shape, table, current_device_kind())
    if entry is None:
        return {}
    out = {name: cfg for name in tuned() if (cfg := entry.config_of(name)) is not None}
    if "pallas_gpu" in out:
        fitted = fitting_tiling(out["pallas_gpu"], shape)[0]
        if fitted is None:
            del out["pallas_gpu"]
        else:
            out["pallas_gpu"] = fitted
    return out


def select_pallas_config(shape: AttentionShape, *, table_path: Path | str | None = None,
                         implementation: str = "pallas_gpu") -> BlockSizes | None:
    """The tuned tiling of ``implementation`` ("pallas_gpu" or "pallas_mosaic_gpu") at
    the nearest measured shape (whichever implementation won there; pallas_gpu's fitted
    to the device's shared memory for ``shape``), or ``None`` when there is no table,
    it has no measurement of that kernel, or nothing fits."""
    return measured_configs(shape, table_path=table_path).get(implementation)


def _key(entry: TableEntry) -> tuple:
    return (entry.device_kind, entry.dtype, entry.batch, entry.seq, entry.num_heads, entry.head_dim, entry.causal)


def merge_tables(old: SelectionTable, new: SelectionTable) -> SelectionTable:
    """``old``'s entries with ``new``'s added (a re-measured shape replaces the old
    entry), so that a sweep too long for one run can be done in parts. Both must come
    from the same JAX version; entries of another device kind are kept side by side
    (schema 2: each entry names its device kind, a version-1 table's the table's).

    Raises:
        ValueError: the JAX version differs.
    """
    if old.jax_version != new.jax_version:
        raise ValueError(f"cannot merge a table from jax {new.jax_version} into one from "
                         f"jax {old.jax_version}; re-tune every shape instead")
    old = old.model_copy(update={"schema_version": TABLE_SCHEMA_VERSION, "entries": [
        e.model_copy(update={"device_kind": measured_on(e, old)}) for e in old.entries]})
    new = new.model_copy(update={"schema_version": TABLE_SCHEMA_VERSION, "entries": [
        e.model_copy(update={"device_kind": measured_on(e, new)}) for e in new.entries]})
    fresh = {_key(e) for e in new.entries}
    data = old.tuning_data if old.tuning_data == new.tuning_data else \
        f"{old.tuning_data}; then {new.tuning_data}"
    return new.model_copy(update={
        "entries": [e for e in old.entries if _key(e) not in fresh] + new.entries,
        "command": f"{old.command} ; {new.command}", "tuning_data": data})


def fastest_over(serves: Callable[[str, int, int], bool], *,
                 table_path: Path | str | None = None,
                 device_kind: str | None = None) -> tuple[str, str] | None:
    """The implementation the table measured fastest over the shapes a registration
    serves: among this device kind's entries that ``serves(dtype, head_dim, seq)``
    accepts, the one with the highest geometric-mean TFLOP/s over the entries where
    every compared implementation was measured. Returns ``(name, why)``, or ``None``
    when no table or no entry inside the contract exists (the caller keeps its default).

    Raises:
        pydantic.ValidationError, ValueError: a malformed table (:func:`load_table`).
    """
    table = load_table(table_path)
    if table is None:
        return None
    kind = device_kind if device_kind is not None else current_device_kind()
    inside = [e for e in table.entries if (kind is None or measured_on(e, table) == kind)
              and serves(e.dtype, e.head_dim, e.seq)]
    if not inside:
        return None
    names = set.intersection(*(set(e.tflops) for e in inside))
    if not names:
        return None
    geomean = {n: math.exp(sum(math.log(max(e.tflops[n], 1e-9)) for e in inside) / len(inside))
               for n in names}
    best = max(sorted(geomean), key=geomean.get)
    figures = ", ".join(f"{n} {geomean[n]:.0f}" for n in sorted(geomean, key=geomean.get,
                                                                     reverse=True))
    return best, (f"fastest by geometric-mean TFLOP/s over the {len(inside)} shapes of "
                  f"kernels/gpu_table.json inside the serving contract ({figures})")
