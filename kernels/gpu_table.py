"""The measured GPU table's schema (``kernels/gpu_table.json``): its entries, its versions,
the conversion of an older table and the merging of two.

Schema version 3 stores, per entry, ``configs`` (implementation -> its fastest correct
config, in the fields of that kernel's own config type) and ``candidates``
(implementation -> every config tried), so a new tuned kernel needs no field of its own
here. Each entry names the device kind it was measured on. Older tables still read,
unchanged on disk: version 2 kept the first two tuned kernels' tilings in fields of their
own (``pallas_config``/``candidates`` for pallas_gpu, ``mosaic_config``/``mosaic_candidates``
for pallas_mosaic_gpu, optional: a table written before pallas_mosaic_gpu existed has
none) in the block-size shape every kernel shared then, which each kernel still reads
(``Kernel.config_from``); version 1 also had one device kind for the whole file (its
entries count as measured on the table's ``device_kind``). :func:`converted` rewrites an
older table as version 3 without re-measuring anything. Reading the file and choosing
from it: ``kernels.selection``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from kernels.config import KernelConfig
from kernels.registry import stored_config

TABLE_SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
_VERSION_2_FIELDS = {"pallas_config": ("pallas_gpu", "candidates"),
                     "mosaic_config": ("pallas_mosaic_gpu", "mosaic_candidates")}
"""Schema 1 and 2: the field of a tuned kernel's best tiling -> (the kernel, the field of
its candidates)."""


class CandidateResult(BaseModel):
    """One config of a tuned kernel timed on one shape (``error`` says why it has no
    figure: a failed compile, a wrong output, an unsupported call). ``config`` holds the
    kernel's config fields as stored."""

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
        None, description="the device kind it was measured on (schema 2 on); None "
                          "(schema 1): the table's device_kind")
    best: str = Field(description="registry name of the fastest correct implementation")
    tflops: dict[str, float] = Field(description="implementation -> TFLOP/s (best config)")
    configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="tuned kernel -> its fastest correct config (its config type's fields; "
                    "read with the kernel's Kernel.config_from)")
    candidates: dict[str, list[CandidateResult]] = Field(
        default_factory=dict, description="tuned kernel -> every config tried")

    @model_validator(mode="before")
    @classmethod
    def _from_older_schemas(cls, data: Any) -> Any:
        """Schema 1 and 2 entries: their per-kernel fields moved into ``configs`` and
        ``candidates`` (the configs keep their stored shape)."""
        if not isinstance(data, dict) or not (
                isinstance(data.get("candidates"), list)
                or {*_VERSION_2_FIELDS, "mosaic_candidates"} & set(data)):
            return data
        data = dict(data)
        configs = dict(data.get("configs") or {})
        old_candidates = data.pop("candidates", None)
        candidates: dict[str, Any] = {}
        for field, (name, candidates_field) in _VERSION_2_FIELDS.items():
            raw = data.pop(field, None)
            tried = old_candidates if candidates_field == "candidates" else data.pop(
                candidates_field, None)
            if raw is not None:
                configs.setdefault(name, raw)
            if tried:
                candidates[name] = tried
        return {**data, "configs": configs, "candidates": candidates}

    @model_validator(mode="after")
    def _best_is_measured(self) -> TableEntry:
        if self.best not in self.tflops:
            raise ValueError(f"best={self.best!r} has no TFLOP/s figure in {sorted(self.tflops)}")
        if self.best in self.candidates and self.best not in self.configs:
            raise ValueError(f"best={self.best!r} was tuned but has no config in configs")
        return self

    def config_of(self, name: str) -> KernelConfig | None:
        """The measured config of the tuned kernel ``name`` (its own config type), if any.

        Raises:
            ValueError: the stored fields are illegal for the kernel.
        """
        return stored_config(name, self.configs.get(name))


class SelectionTable(BaseModel):
    """``kernels/gpu_table.json``: versioned and measured, never hand-edited (a schema
    conversion is recorded in ``command`` and ``notes``)."""

    schema_version: int = TABLE_SCHEMA_VERSION
    jax_version: str
    device_kind: str
    created_at: str
    command: str
    tuning_data: str
    notes: list[str] = Field(default_factory=list,
                             description="what was done to the table besides measuring")
    entries: list[TableEntry]


def measured_on(entry: TableEntry, table: SelectionTable) -> str:
    """The device kind ``entry`` was measured on."""
    return entry.device_kind or table.device_kind


def _stored_shape(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` in the fields of ``name``'s own config type, or as it was when the kernel
    cannot read it (a candidate that failed for being illegal stays as tried)."""
    try:
        config = stored_config(name, raw)
    except ValueError:
        return raw
    return raw if config is None else config.fields_set()


def converted(table: SelectionTable, note: str) -> SelectionTable:
    """``table`` as schema version 3: every config and candidate in its kernel's own
    fields (:func:`kernels.registry.stored_config`), every figure and every other field
    unchanged (nothing is re-measured), ``note`` added to ``notes``. Deterministic: the
    same table gives the same result."""
    entries = [e.model_copy(update={
        "device_kind": measured_on(e, table),
        "configs": {n: _stored_shape(n, c) for n, c in e.configs.items()},
        "candidates": {n: [r.model_copy(update={"config": _stored_shape(n, r.config)})
                           for r in rs] for n, rs in e.candidates.items()}})
        for e in table.entries]
    return table.model_copy(update={"schema_version": TABLE_SCHEMA_VERSION,
                                    "entries": entries, "notes": [*table.notes, note]})


def _key(entry: TableEntry) -> tuple:
    return (entry.device_kind, entry.dtype, entry.batch, entry.seq, entry.num_heads, entry.head_dim, entry.causal)


def merge_tables(old: SelectionTable, new: SelectionTable) -> SelectionTable:
    """``old``'s entries with ``new``'s added (a re-measured shape replaces the old
    entry), so that a sweep too long for one run can be done in parts. Both must come
    from the same JAX version; entries of another device kind are kept side by side
    (each entry names its device kind, a version-1 table's the table's). An entry of an
    older schema keeps its configs as stored (each kernel reads them); :func:`converted`
    rewrites them.

    Raises:
        ValueError: the JAX version differs.
    """
    if old.jax_version != new.jax_version:
        raise ValueError(f"cannot merge a table from jax {new.jax_version} into one from "
                         f"jax {old.jax_version}; re-tune every shape instead")
    old = old.model_copy(update={"schema_version": TABLE_SCHEMA_VERSION, "entries": [
        e.model_copy(update={"device_kind": measured_on(e, old)}) for e in old.entries]})
    new = new.model_copy(update={"schema_version": TABLE_SCHEMA_VERSION, "entries": [
        e.model_copy(update={"device_kind": measured_on(e, new)}) for e in new.entries],
        "notes": [*old.notes, *(n for n in new.notes if n not in old.notes)]})
    fresh = {_key(e) for e in new.entries}
    data = old.tuning_data if old.tuning_data == new.tuning_data else \
        f"{old.tuning_data}; then {new.tuning_data}"
    return new.model_copy(update={
        "entries": [e for e in old.entries if _key(e) not in fresh] + new.entries,
        "command": f"{old.command} ; {new.command}", "tuning_data": data})
