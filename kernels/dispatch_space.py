"""The space a dispatch policy divides: boxes over (dtype, causal, head_dim, q_len, kv_len,
batch), and the check that a policy's buckets cover its space exactly once.

A :class:`Region` is a box: a set of dtypes, a set of causal flags and a half-open integer
range ``[lo, hi)`` per size axis (``hi=None``: unbounded). A :class:`Bucket` is a named
region. A :class:`BucketGrid` declares a policy's buckets as data (the cuts of each axis);
:data:`DEFAULT_GRID` is the policy's default: one bucket per dtype and causal flag, cut at
head_dim 65 and 129 and at 1024 and 8192 tokens on q_len and kv_len. :func:`check_partition` refuses buckets that reach outside the space, overlap, or
leave a gap, naming the buckets and the cell concerned: the buckets' boundaries cut every
axis into elementary intervals, and each cell of that grid must lie in exactly one bucket
(a cell either lies in a box or misses it, since no box boundary crosses a cell).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from kernels.errors import KernelgateError
from kernels.shapes import DTYPES, AttentionShape, DType

SIZE_AXES = ("head_dim", "q_len", "kv_len", "batch")
"""The integer axes of a region, in the order a cell is named."""


class CoverageError(KernelgateError, ValueError):
    """A policy's buckets do not partition its space: one reaches outside it, two overlap,
    or a cell of the space has no bucket (the message names which)."""


class IntRange(BaseModel):
    """The integers ``lo <= x < hi`` (``hi=None``: no upper bound)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lo: PositiveInt = 1
    hi: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.hi is not None and self.hi <= self.lo:
            raise ValueError(f"an IntRange needs lo < hi, got [{self.lo}, {self.hi})")
        return self

    def __contains__(self, x: object) -> bool:
        return isinstance(x, int) and x >= self.lo and (self.hi is None or x < self.hi)

    def overlaps(self, other: IntRange) -> bool:
        """Whether the two ranges share an integer."""
        return ((other.hi is None or self.lo < other.hi)
                and (self.hi is None or other.lo < self.hi))

    def within(self, other: IntRange) -> bool:
        """Whether every integer of this range is in ``other``."""
        return self.lo >= other.lo and (other.hi is None or (self.hi is not None
                                                             and self.hi <= other.hi))

    @property
    def label(self) -> str:
        """``[64, 128)`` or ``[1, inf)``."""
        return f"[{self.lo}, {'inf' if self.hi is None else self.hi})"


class Region(BaseModel):
    """A box of attention calls: dtypes x causal flags x a range of each size axis
    (head_dim, q_len, kv_len, batch; sizes in elements)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtypes: tuple[DType, ...] = Field(DTYPES, min_length=1)
    causal: tuple[bool, ...] = Field((False, True), min_length=1)
    head_dim: IntRange = IntRange()
    q_len: IntRange = IntRange()
    kv_len: IntRange = IntRange()
    batch: IntRange = IntRange()

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        for name in ("dtypes", "causal"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice: {values}")
        return self

    def contains(self, *, dtype: str, causal: bool, head_dim: int, q_len: int, kv_len: int,
                 batch: int) -> bool:
        """Whether the call lies in this box (``dtype`` by name)."""
        return (dtype in self.dtypes and causal in self.causal and head_dim in self.head_dim
                and q_len in self.q_len and kv_len in self.kv_len and batch in self.batch)

    def contains_shape(self, shape: AttentionShape) -> bool:
        """Whether ``shape`` lies in this box."""
        return self.contains(dtype=shape.dtype, causal=shape.causal, head_dim=shape.head_dim,
                             q_len=shape.q_len, kv_len=shape.kv_len, batch=shape.batch)

    def overlaps(self, other: Region) -> bool:
        """Whether some call lies in both boxes."""
        return (bool(set(self.dtypes) & set(other.dtypes))
                and bool(set(self.causal) & set(other.causal))
                and all(getattr(self, a).overlaps(getattr(other, a)) for a in SIZE_AXES))

    def within(self, other: Region) -> bool:
        """Whether every call of this box lies in ``other``."""
        return (set(self.dtypes) <= set(other.dtypes) and set(self.causal) <= set(other.causal)
                and all(getattr(self, a).within(getattr(other, a)) for a in SIZE_AXES))

    @property
    def label(self) -> str:
        """The box in one line: ``bfloat16 causal head_dim [64, 128) q_len [1, inf) ...``."""
        causal = "/".join("causal" if c else "full" for c in self.causal)
        return " ".join([",".join(self.dtypes), causal,
                         *(f"{a} {getattr(self, a).label}" for a in SIZE_AXES)])


class Bucket(Region):
    """A named region of a policy (the name is for people and error messages)."""

    name: str = Field(min_length=1)


def _cuts(space: Region, regions: Sequence[Region], axis: str) -> list[IntRange]:
    """``axis`` of ``space`` cut at every boundary of ``regions`` inside it."""
    whole = getattr(space, axis)
    points = {whole.lo} | {p for r in regions for p in (getattr(r, axis).lo, getattr(r, axis).hi)
                           if p is not None and p in whole}
    ordered = sorted(points)
    ends: list[int | None] = [*ordered[1:], whole.hi]
    return [IntRange(lo=lo, hi=hi) for lo, hi in zip(ordered, ends, strict=True)]


def _cell_label(dtype: str, causal: bool, ranges: Sequence[IntRange]) -> str:
    return " ".join([dtype, "causal" if causal else "full",
                     *(f"{a} {r.label}" for a, r in zip(SIZE_AXES, ranges, strict=True))])


def check_partition(space: Region, buckets: Sequence[Bucket]) -> None:
    """Refuse ``buckets`` unless they cover ``space`` exactly once.

    Raises:
        CoverageError: a bucket reaches outside the space (named, with the space); two
            buckets overlap (both named, with the box they share); a cell of the space lies
            in no bucket (the cell named); two buckets share a name.
    """
    names = [b.name for b in buckets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CoverageError(f"bucket names must be distinct; {twice} appear twice")
    for b in buckets:
        if not b.within(space):
            raise CoverageError(f"bucket {b.name!r} ({b.label}) reaches outside the policy's "
                                f"space ({space.label})")
    for a, b in itertools.combinations(buckets, 2):
        if a.overlaps(b):
            shared = _intersection(a, b)
            raise CoverageError(f"buckets {a.name!r} and {b.name!r} overlap: both cover "
                                f"{shared}; a call must have one bucket")
    cuts = [_cuts(space, buckets, axis) for axis in SIZE_AXES]
    for dtype, causal in itertools.product(space.dtypes, space.causal):
        for ranges in itertools.product(*cuts):
            point = dict(zip(SIZE_AXES, (r.lo for r in ranges), strict=True))
            if not any(b.contains(dtype=dtype, causal=causal, **point) for b in buckets):
                raise CoverageError(f"no bucket covers {_cell_label(dtype, causal, ranges)} "
                                    f"(a gap in the policy's space {space.label})")


def _intersection(a: Region, b: Region) -> str:
    parts: list[Any] = [",".join(d for d in a.dtypes if d in b.dtypes),
                        "/".join("causal" if c else "full" for c in a.causal if c in b.causal)]
    for axis in SIZE_AXES:
        ra, rb = getattr(a, axis), getattr(b, axis)
        his = [h for h in (ra.hi, rb.hi) if h is not None]
        parts.append(f"{axis} {IntRange(lo=max(ra.lo, rb.lo), hi=min(his) if his else None).label}")
    return " ".join(parts)


def _ranges(whole: IntRange, cuts: Sequence[int]) -> tuple[IntRange, ...]:
    points = [whole.lo, *cuts]
    return tuple(IntRange(lo=lo, hi=hi)
                 for lo, hi in zip(points, [*cuts, whole.hi], strict=True))


class BucketGrid(BaseModel):
    """A policy's buckets as data: ``space`` cut on each size axis at the given points
    (a cut ``c`` ends one range before ``c`` and starts the next at ``c``), one bucket per
    dtype, causal flag and combination of ranges. ``seq_cuts`` cut q_len and kv_len alike;
    ``split_kv_len=False`` leaves kv_len whole (a workload whose calls have kv_len =
    q_len). The buckets partition ``space`` by construction.

    Raises (on construction, ``ValueError`` naming the axis):
        a cut list not strictly increasing, or a cut outside its axis's range in the space
        (each must lie strictly above the range's ``lo`` and below its ``hi``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    space: Region = Region()
    head_dim_cuts: tuple[PositiveInt, ...] = (65, 129)
    seq_cuts: tuple[PositiveInt, ...] = (1024, 8192)
    batch_cuts: tuple[PositiveInt, ...] = ()
    split_kv_len: bool = True

    @model_validator(mode="after")
    def _cuts_inside(self) -> Self:
        for axis, field in self._axes():
            cuts, whole = getattr(self, field), getattr(self.space, axis)
            if list(cuts) != sorted(set(cuts)):
                raise ValueError(f"{field} must be strictly increasing, got {cuts}")
            outside = [c for c in cuts if not (c > whole.lo and c in whole)]
            if outside:
                raise ValueError(f"{field} {outside} lie outside the space's {axis} "
                                 f"{whole.label} (a cut must split it)")
        return self

    def _axes(self) -> list[tuple[str, str]]:
        """(axis, the field cutting it) for every axis this grid cuts."""
        kv = [("kv_len", "seq_cuts")] if self.split_kv_len else []
        return [("head_dim", "head_dim_cuts"), ("q_len", "seq_cuts"), *kv,
                ("batch", "batch_cuts")]

    def axis_ranges(self) -> dict[str, tuple[IntRange, ...]]:
        """Each size axis -> its ranges, in order (an uncut axis: the space's range)."""
        cut = dict(self._axes())
        return {axis: _ranges(getattr(self.space, axis), getattr(self, cut[axis]) if axis in cut
                              else ()) for axis in SIZE_AXES}

    def buckets(self) -> tuple[Bucket, ...]:
        """Every bucket, named ``bfloat16 causal d[65, 129) q[1, 1024) kv[1, 1024)
        b[1, inf)``: dtype, causal flag, then the size axes' ranges, in that order."""
        ranges = self.axis_ranges()
        out = []
        for dtype, causal, *sizes in itertools.product(
                self.space.dtypes, self.space.causal, *(ranges[a] for a in SIZE_AXES)):
            label = " ".join(f"{tag}{r.label}" for tag, r in
                             zip(("d", "q", "kv", "b"), sizes, strict=True))
            out.append(Bucket(name=f"{dtype} {'causal' if causal else 'full'} {label}",
                              dtypes=(dtype,), causal=(causal,),
                              **dict(zip(SIZE_AXES, sizes, strict=True))))
        return tuple(out)


DEFAULT_GRID = BucketGrid()
"""The default buckets of a dispatch policy: every dtype and causal flag apart (kernels
differ by both: cuDNN and FlashAttention-3 run no float32, causal masks halve the work);
head_dim cut at 65 and 129, so 64, 128 and 256 each have a bucket; q_len and kv_len cut at
1024 and 8192, so short calls (MiniLM's batch-1 shapes, where ``xla`` was fastest on an
H200), mid-length and long documents (where the flash kernels lead: BENCHMARKS.md) are
chosen for apart. Not yet measured at these cuts: the H200 evidence decides each bucket."""
