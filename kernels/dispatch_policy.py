"""A dispatch policy: which kernel serves each bucket of attention calls, chosen from
measured evidence by a declared rule, frozen and fingerprinted.

No single kernel wins everywhere (on an H200, ``xla`` beats the flash kernels at MiniLM's
batch-1 shapes, ``pallas_mosaic_gpu`` beats cuDNN at 4k-16k tokens: BENCHMARKS.md). A
policy makes the per-shape choice a reviewable artifact instead of a lookup in code:

* :class:`Evidence`: per bucket (a box of calls, ``kernels.dispatch_space``), the shapes
  measured and, per candidate kernel, either its timing at every one of them (median and
  an order-statistic interval, seconds: ``kernels.timing.median_interval``) or the reason
  its own support check refused one (``Kernel.check_supported``);
* :func:`derive_policy`: a pure function of the evidence, the candidates and a
  :class:`Rule`; per bucket, among the kernels no other beats outright (geometric means
  over the bucket's shapes; "outright": another's interval lies wholly below), the first
  in the rule's priority, else the fastest; a bucket no candidate serves is kept, with no
  kernel and the reasons;
* :class:`DispatchPolicy`: the buckets (which partition the policy's space: validated),
  each with its choice, its regret against the bucket's fastest, every candidate's
  summary and the evidence it was derived from; its fingerprint is the sha256 of its
  canonical JSON (:meth:`DispatchPolicy.fingerprint`), so it moves with any measurement
  and not with a file's layout or key order;
* ``kernels.dispatch_audit``: the policy checked against its signed fingerprint and
  every bucket's choice derived again from the evidence the policy carries.

Interval of a bucket: the geometric means of the per-shape interval ends. If every
shape's interval holds its true median, that interval holds the geometric mean of the true
medians; so its coverage is at least ``1 - sum(1 - coverage_i)`` (Bonferroni).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from kernels.dispatch_space import Bucket, Region, check_partition
from kernels.shapes import AttentionShape

SCHEMA_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def canonical_json(self) -> bytes:
        """The model as canonical JSON (sorted keys, no whitespace, UTF-8)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False).encode()

    def fingerprint(self) -> str:
        """sha256 (hex) of :meth:`canonical_json`: a file's layout or key order does not
        move it; any value does."""
        return hashlib.sha256(self.canonical_json()).hexdigest()


class ShapeTiming(_Frozen):
    """One kernel at one shape: seconds per call, the median of ``repeats`` repeats and an
    interval for it holding the true median with probability ``coverage``."""

    shape: AttentionShape
    median_s: PositiveFloat
    low_s: PositiveFloat
    high_s: PositiveFloat
    coverage: float = Field(gt=0, le=1)
    repeats: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.low_s <= self.median_s <= self.high_s:
            raise ValueError(f"a timing needs low_s <= median_s <= high_s, got {self.low_s}, "
                             f"{self.median_s}, {self.high_s} at {self.shape.label}")
        return self


class KernelEvidence(_Frozen):
    """One candidate in one bucket: its timing at every shape measured there, or why its
    own support check refused the bucket (the first refusal met)."""

    kernel: str
    timings: tuple[ShapeTiming, ...] = ()
    refused: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if bool(self.timings) == (self.refused is not None):
            raise ValueError(f"{self.kernel}: evidence holds timings or a refusal, exactly one")
        return self


class BucketEvidence(_Frozen):
    """What was measured in one bucket: its shapes (each inside it) and each candidate's
    evidence (a kernel's timings cover exactly these shapes)."""

    bucket: Bucket
    shapes: tuple[AttentionShape, ...] = Field(min_length=1)
    kernels: tuple[KernelEvidence, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        outside = [s.label for s in self.shapes if not self.bucket.contains_shape(s)]
        if outside:
            raise ValueError(f"bucket {self.bucket.name!r} holds shapes outside it: {outside}")
        names = [k.kernel for k in self.kernels]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket {self.bucket.name!r} lists a kernel twice: {names}")
        for k in self.kernels:
            if k.timings and [t.shape for t in k.timings] != list(self.shapes):
                raise ValueError(f"bucket {self.bucket.name!r}: {k.kernel}'s timings are not "
                                 "at the bucket's shapes, in order")
        return self


class Evidence(_Frozen):
    """Measurements for a policy: per bucket (the buckets partition ``space``), on one
    device, by one method (both in words, e.g. ``NVIDIA H200`` and the timing method)."""

    space: Region = Region()
    device: str
    backend: str
    method: str
    buckets: tuple[BucketEvidence, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _partition(self) -> Self:
        check_partition(self.space, [b.bucket for b in self.buckets])
        return self


class Rule(_Frozen):
    """How a bucket's kernel is chosen from its candidates' summaries (geometric means
    over the bucket's shapes): among the kernels no other beats outright (no other's
    interval lies wholly below its own; the fastest median is always among them), the
    first in ``priority``; kernels it does not list come after, fastest median first. So
    with no priority the fastest is chosen, and a preferred kernel (``xla``, say, which
    needs no tuning) wins only where the measurements cannot tell it from the fastest."""

    name: Literal["fastest-within-interval"] = "fastest-within-interval"
    priority: tuple[str, ...] = ()


class KernelSummary(_Frozen):
    """One candidate in one bucket, summarised: geometric means over the bucket's shapes
    (seconds) and its ratio to the bucket's fastest median, or why it cannot serve."""

    kernel: str
    median_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    ratio_to_best: float | None = None
    refused: str | None = None


class BucketChoice(_Frozen):
    """One bucket's choice: ``kernel`` (``None``: no candidate serves it, ``why`` says
    why), the bucket's fastest kernel (``best``), the regret of the choice against it
    (``regret``: median ratio minus one; ``regret_s``: seconds per call, geometric means),
    every candidate's summary and the evidence the choice was derived from."""

    kernel: str | None
    why: str
    best: str | None = None
    regret: float | None = None
    regret_s: float | None = None
    summaries: tuple[KernelSummary, ...]
    evidence: BucketEvidence

    @property
    def bucket(self) -> Bucket:
        """The bucket chosen for."""
        return self.evidence.bucket


class DispatchPolicy(_Frozen):
    """Bucket -> kernel over ``space`` (validated: the buckets partition it), derived by
    ``rule`` from evidence measured on ``device``; see the module docstring."""

    schema_version: Literal[1] = SCHEMA_VERSION
    space: Region
    device: str
    backend: str
    method: str
    evidence_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    candidates: tuple[str, ...] = Field(min_length=1)
    rule: Rule
    buckets: tuple[BucketChoice, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _partition(self) -> Self:
        check_partition(self.space, [b.bucket for b in self.buckets])
        return self

    def evidence(self) -> Evidence:
        """The evidence the policy says it was derived from (its buckets' evidence)."""
        return Evidence(space=self.space, device=self.device, backend=self.backend,
                        method=self.method, buckets=tuple(b.evidence for b in self.buckets))

    def choice_for(self, shape: AttentionShape) -> BucketChoice:
        """The bucket ``shape`` lies in.

        Raises:
            NotImplementedError: ``shape`` lies outside the policy's space.
        """
        for choice in self.buckets:
            if choice.bucket.contains_shape(shape):
                return choice
        raise NotImplementedError(f"the dispatch policy's space ({self.space.label}) does "
                                  f"not hold {shape.label}")

    def kernels(self) -> tuple[str, ...]:
        """The kernels some bucket chose, in first-use order."""
        return tuple(dict.fromkeys(b.kernel for b in self.buckets if b.kernel is not None))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _summary(evidence: KernelEvidence | None, name: str) -> KernelSummary:
    if evidence is None:
        return KernelSummary(kernel=name, refused="not measured in this bucket")
    if evidence.refused is not None:
        return KernelSummary(kernel=name, refused=evidence.refused)
    t = evidence.timings
    return KernelSummary(kernel=name, median_s=_geomean([x.median_s for x in t]),
                         low_s=_geomean([x.low_s for x in t]),
                         high_s=_geomean([x.high_s for x in t]))


def _choose(bucket: BucketEvidence, candidates: Sequence[str], rule: Rule) -> BucketChoice:
    measured = {k.kernel: k for k in bucket.kernels}
    summaries = [_summary(measured.get(name), name) for name in candidates]
    serving = [s for s in summaries if s.refused is None]
    if not serving:
        why = "no candidate serves it: " + "; ".join(f"{s.kernel}: {s.refused}"
                                                     for s in summaries)
        return BucketChoice(kernel=None, why=why, summaries=tuple(summaries), evidence=bucket)
    best = min(serving, key=lambda s: (s.median_s, s.kernel))
    summaries = [s.model_copy(update={"ratio_to_best": s.median_s / best.median_s})
                 if s.refused is None else s for s in summaries]
    serving = [s for s in summaries if s.refused is None]
    tied = [s for s in serving if not any(o.high_s < s.low_s for o in serving)]
    rank = {name: i for i, name in enumerate(rule.priority)}
    chosen = min(tied, key=lambda s: (rank.get(s.kernel, len(rank)), s.median_s, s.kernel))
    if chosen.kernel == best.kernel:
        why = f"{chosen.kernel}: the fastest ({chosen.median_s:.3g} s per call, geometric mean)"
        if len(tied) > 1:
            why += (f"; tied within the intervals with "
                    f"{[s.kernel for s in tied if s is not chosen]}, none of them earlier in "
                    f"the priority {list(rule.priority)}")
    else:
        why = (f"{chosen.kernel}: its interval overlaps the fastest's ({best.kernel}, "
               f"{chosen.median_s / best.median_s:.3f}x its median) and it comes first in the "
               f"priority {list(rule.priority)} among the tied {[s.kernel for s in tied]}")
    return BucketChoice(kernel=chosen.kernel, why=why, best=best.kernel,
                        regret=chosen.median_s / best.median_s - 1,
                        regret_s=chosen.median_s - best.median_s,
                        summaries=tuple(summaries), evidence=bucket)


def derive_policy(evidence: Evidence, candidates: Sequence[str], rule: Rule) -> DispatchPolicy:
    """The policy ``rule`` derives from ``evidence`` for ``candidates`` (registry names;
    a candidate without evidence in a bucket cannot serve it: "not measured"; evidence of
    a kernel that is no candidate is kept in the record and never chosen). Pure: the same
    arguments give the same policy, fingerprint included.

    Raises:
        ValueError: no candidates, a candidate named twice, or a priority naming a kernel
            that is no candidate.
    """
    candidates = tuple(candidates)
    if not candidates or len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct registry names, got {candidates}")
    strangers = [k for k in rule.priority if k not in candidates]
    if strangers:
        raise ValueError(f"the rule's priority names {strangers}, which are not among the "
                         f"candidates {list(candidates)}")
    return DispatchPolicy(space=evidence.space, device=evidence.device,
                          backend=evidence.backend, method=evidence.method,
                          evidence_sha256=evidence.fingerprint(), candidates=candidates,
                          rule=rule,
                          buckets=tuple(_choose(b, candidates, rule) for b in evidence.buckets))
