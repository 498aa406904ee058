"""Dispatch evidence measured in pieces and merged into one :class:`Evidence`.

The whole default grid (162 buckets, five candidates) takes about half an hour on an
H200, longer than one device call may run; so it is measured in slices (by dtype, causal
flag or a range of the grid's buckets: ``kernels.tools.dispatch_evidence --slice-*``),
each an :class:`EvidencePiece`: some buckets of the whole space, with the device, backend,
method and software they were measured with. :func:`merge_pieces` joins them into the
evidence of the whole space, and refuses pieces that cannot be one measurement: another
space, device, backend, method or software stack (the field, both values and both pieces
named), buckets that overlap (both pieces and buckets named) or a space left with a gap
(the cell named). The merged buckets are in a canonical order (dtype and causal flag in
the space's order, then the ranges' lower ends), the grid's own order, so the same pieces
in any order, or one run of the whole grid with the same measurements, give the same
evidence and fingerprint.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Self

from pydantic import Field, model_validator

from kernels.dispatch_measurements import BucketEvidence, Evidence, FrozenModel
from kernels.dispatch_space import SIZE_AXES, CoverageError, Region, check_partition
from kernels.errors import KernelgateError

SHARED = ("space", "device", "backend", "method", "software")
"""The fields every piece of one evidence must share."""


class PieceError(KernelgateError, ValueError):
    """Pieces that are not one measurement: another device, backend, method, software
    stack or space, overlapping buckets, or a space left with a gap (the message names
    the pieces, the field or buckets, and both values)."""


class EvidencePiece(FrozenModel):
    """Some buckets of ``space`` (each inside it, no two overlapping), measured on
    ``device`` by ``method`` with ``software`` (as :class:`Evidence`); ``label`` names the
    slice for people and error messages (e.g. ``bfloat16 full``)."""

    label: str
    space: Region
    device: str
    backend: str
    method: str
    software: dict[str, str] = Field(default_factory=dict)
    buckets: tuple[BucketEvidence, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _inside(self) -> Self:
        for b in self.buckets:
            if not b.bucket.within(self.space):
                raise ValueError(f"piece {self.label!r}: bucket {b.bucket.name!r} reaches "
                                 f"outside its space ({self.space.label})")
        for a, b in itertools.combinations(self.buckets, 2):
            if a.bucket.overlaps(b.bucket):
                raise ValueError(f"piece {self.label!r}: buckets {a.bucket.name!r} and "
                                 f"{b.bucket.name!r} overlap")
        return self


def _order(space: Region, evidence: BucketEvidence) -> tuple:
    """The grid's order: dtype and causal flag in the space's order, then the ranges."""
    b = evidence.bucket
    return (min(space.dtypes.index(d) for d in b.dtypes),
            min(space.causal.index(c) for c in b.causal),
            *(getattr(b, axis).lo for axis in SIZE_AXES))


def merge_pieces(pieces: Sequence[EvidencePiece]) -> Evidence:
    """The evidence of the pieces' whole space, its buckets in the grid's order.

    Raises:
        PieceError: no piece; two pieces differ in space, device, backend, method or
            software (the field and both values named); two buckets of different pieces
            overlap; the pieces leave a cell of the space without a bucket.
    """
    buckets = measured_buckets(pieces)
    first = pieces[0]
    try:
        check_partition(first.space, [b.bucket for b in buckets])
    except CoverageError as err:
        raise PieceError(f"the pieces {[p.label for p in pieces]} do not make the whole "
                         f"space: {err}") from None
    return Evidence(space=first.space, device=first.device, backend=first.backend,
                    method=first.method, software=first.software, buckets=tuple(buckets))


def measured_buckets(pieces: Sequence[EvidencePiece]) -> tuple[BucketEvidence, ...]:
    """The buckets the pieces measured, in the grid's order, when the pieces are one
    measurement; unlike :func:`merge_pieces` they may leave part of the space unmeasured
    (what a partial table shows, never a policy).

    Raises:
        PieceError: no piece; two pieces differ in space, device, backend, method or
            software; two buckets of different pieces overlap.
    """
    if not pieces:
        raise PieceError("no pieces to merge")
    first = pieces[0]
    for piece in pieces[1:]:
        for field in SHARED:
            mine, theirs = getattr(first, field), getattr(piece, field)
            if mine != theirs:
                shown = [x.label if isinstance(x, Region) else x for x in (mine, theirs)]
                raise PieceError(f"pieces {first.label!r} and {piece.label!r} differ in "
                                 f"{field}: {shown[0]!r} against {shown[1]!r}; they are not "
                                 "one measurement")
    for p, q in itertools.combinations(pieces, 2):
        for a, b in itertools.product(p.buckets, q.buckets):
            if a.bucket.overlaps(b.bucket):
                raise PieceError(f"pieces {p.label!r} and {q.label!r} both measure "
                                 f"{a.bucket.name!r}" + ("" if a.bucket == b.bucket else
                                                         f" / {b.bucket.name!r} (overlapping)"))
    return tuple(sorted((b for p in pieces for b in p.buckets),
                        key=lambda b: _order(first.space, b)))
