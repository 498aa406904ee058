"""The measured GPU selection table behind ``implementation="auto"`` on a GPU.

``kernels/gpu_table.json`` is written by ``python -m kernels.tools.autotune`` on a GPU: per
tuned shape, which implementation was fastest (cuDNN and each kernel the registry declares
``tuned``, among the candidates whose output agreed with cuDNN) and each tuned kernel's
best config. This module only reads it; :func:`select_gpu_implementation` picks the entry
of the nearest measured shape. Data, not code: re-running the autotuner on another device
or JAX version rewrites the table and ``auto`` follows it.

The table's schema (version 3: ``{implementation: config}`` per entry; older versions
still read) is ``kernels.gpu_table``; each entry names the device kind it was measured on,
and a GPU only ever picks from entries measured on its own kind (another kind's entries
are ignored, and the reason says so). Every function here reads the file
(``kernels/gpu_table.json``, or ``table_path``) or a table handed over (``table``).

A measured tiling is applied through its kernel's ``fit_to_device``: the nearest entry may
have been measured for another dtype or head_dim, so pallas_gpu checks it against the
device's shared memory for the call's dtype and head_dim (``kernels.gpu_limits``) and
shrinks it until it fits (fewer stages, then smaller tiles), and the reason says so.
(pallas_mosaic_gpu checks its own tilings against shared memory and refuses what cannot
fit.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

from kernels.config import KernelConfig
from kernels.gpu_table import (
    READABLE_SCHEMA_VERSIONS,
    TABLE_SCHEMA_VERSION,
    CandidateResult,
    SelectionTable,
    TableEntry,
    converted,
    measured_on,
    merge_tables,
)
from kernels.registry import IMPLEMENTATIONS, tuned
from kernels.shapes import AttentionShape

__all__ = [
    "CUDNN_DTYPES", "DEFAULT_TABLE_PATH", "READABLE_SCHEMA_VERSIONS", "TABLE_SCHEMA_VERSION",
    "CandidateResult", "SelectionTable", "TableEntry", "converted", "current_device_kind",
    "fastest_over", "load_table", "measured_config", "measured_configs", "measured_on",
    "merge_tables", "nearest_entry", "select_gpu_implementation",
]
DEFAULT_TABLE_PATH = Path(__file__).with_name("gpu_table.json")
CUDNN_DTYPES = ("bfloat16", "float16")
"""The dtypes of the documented default without a table (cuDNN's)."""
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


def _table(table: SelectionTable | None, table_path: Path | str | None
           ) -> SelectionTable | None:
    """``table`` when one is handed over, else the file at ``table_path`` (default
    ``kernels/gpu_table.json``)."""
    return table if table is not None else load_table(table_path)


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


def select_gpu_implementation(shape: AttentionShape, *, table_path: Path | str | None = None,
                              device_kind: str | None = None,
                              table: SelectionTable | None = None
                              ) -> tuple[str, KernelConfig | None, str]:
    """The fastest implementation the measured table found for a call of ``shape``.

    Args:
        shape: the call.
        table_path: the table's file (default ``kernels/gpu_table.json``).
        device_kind: the GPU to pick for (default: this host's; off-GPU every entry).
        table: a table handed over instead of a file.

    Returns:
        ``(name, config, reason)``: ``config`` is the tuned kernel's measured config
        adapted to the call (``Kernel.fit_to_device``: pallas_gpu's always fits the
        device's shared memory for the call; ``None`` when none fits), or ``None`` for an
        untuned pick. The nearest measured shape decides; a pick whose kernel does not
        run the call's dtype (its declared capability) falls back to pallas_gpu. Without
        a table the documented default applies: cudnn for bf16/f16 (the anchors measured
        it at 480-630 TFLOP/s against 316-430 for a Pallas Triton kernel on the H200;
        pallas_mosaic_gpu is not preferred before it is measured), pallas_gpu with its
        default tiling fitted to the device for float32, which neither cuDNN nor
        pallas_mosaic_gpu runs.

    Raises:
        pydantic.ValidationError, ValueError: a malformed table (:func:`load_table`), or a
            stored config its kernel refuses.
    """
    table = _table(table, table_path)
    kind = device_kind if device_kind is not None else current_device_kind()
    entry = nearest_entry(shape, table, kind)
    if entry is None:
        why = "no measured GPU table" if table is None else (
            f"the measured table has no entry for {kind} (measured on "
            f"{sorted({measured_on(e, table) for e in table.entries})}; another device kind's "
            "figures are never used)")
        if shape.dtype in CUDNN_DTYPES:
            return "cudnn", None, f"{why}; documented default cudnn for bf16/f16"
        kernel = IMPLEMENTATIONS["pallas_gpu"]
        config, _ = kernel.fit_to_device(kernel.default_config(shape.head_dim), shape)
        return ("pallas_gpu", config, f"{why}; {shape.dtype} is not run by cuDNN, pallas_gpu "
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
    if config is not None:
        config, note = IMPLEMENTATIONS[name].fit_to_device(config, shape)
        where += f"; {note}" if note else ""
    return name, config, where


def measured_configs(shape: AttentionShape, *, table_path: Path | str | None = None,
                     table: SelectionTable | None = None) -> dict[str, KernelConfig]:
    """Per tuned kernel (``kernels.registry.tuned``), the config measured at the shape
    nearest ``shape`` on this device kind, adapted to the call (``Kernel.fit_to_device``;
    left out when nothing fits); empty without a table. ``auto`` uses it for whichever
    of them it falls back to.

    Raises:
        pydantic.ValidationError, ValueError: a malformed table, or a stored config its
            kernel refuses.
    """
    entry = nearest_entry(shape, _table(table, table_path), current_device_kind())
    if entry is None:
        return {}
    out = {}
    for name in tuned():
        config = entry.config_of(name)
        if config is not None:
            fitted, _ = IMPLEMENTATIONS[name].fit_to_device(config, shape)
            if fitted is not None:
                out[name] = fitted
    return out


def measured_config(shape: AttentionShape, implementation: str, *,
                    table_path: Path | str | None = None,
                    table: SelectionTable | None = None) -> KernelConfig | None:
    """The measured config of the tuned kernel ``implementation`` at the nearest measured
    shape (whichever implementation won there), adapted to the call, or ``None`` when
    there is no table, it has no measurement of that kernel, or nothing fits
    (:func:`measured_configs`)."""
    return measured_configs(shape, table_path=table_path, table=table).get(implementation)


def fastest_over(serves: Callable[[str, int, int], bool], *,
                 eligible: Callable[[str], bool] = lambda name: True,
                 table_path: Path | str | None = None,
                 device_kind: str | None = None,
                 table: SelectionTable | None = None) -> tuple[str, str] | None:
    """The implementation the table measured fastest over the shapes a registration
    serves: among this device kind's entries that ``serves(dtype, head_dim, seq)``
    accepts, the ``eligible`` one (a kernel that can run everything the contract serves:
    one refusing a served dtype would fail the gate's coverage criterion) with the
    highest geometric-mean TFLOP/s over the entries where every compared implementation
    was measured. Returns ``(name, why)``, or ``None``
    when no table or no entry inside the contract exists (the caller keeps its default).

    Raises:
        pydantic.ValidationError, ValueError: a malformed table (:func:`load_table`).
    """
    table = _table(table, table_path)
    if table is None:
        return None
    kind = device_kind if device_kind is not None else current_device_kind()
    inside = [e for e in table.entries if (kind is None or measured_on(e, table) == kind)
              and serves(e.dtype, e.head_dim, e.seq)]
    if not inside:
        return None
    names = {n for n in set.intersection(*(set(e.tflops) for e in inside)) if eligible(n)}
    if not names:
        return None
    geomean = {n: math.exp(sum(math.log(max(e.tflops[n], 1e-9)) for e in inside) / len(inside))
               for n in names}
    best = max(sorted(geomean), key=geomean.get)
    figures = ", ".join(f"{n} {geomean[n]:.0f}" for n in sorted(geomean, key=geomean.get,
                                                                     reverse=True))
    return best, (f"fastest by geometric-mean TFLOP/s over the {len(inside)} shapes of "
                  f"kernels/gpu_table.json inside the serving contract ({figures})")
