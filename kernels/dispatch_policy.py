"""A dispatch policy: which kernel serves each bucket of attention calls, chosen from
measured evidence by a declared rule, frozen and fingerprinted.

No single kernel wins everywhere (on an H200, ``xla`` beats the flash kernels at MiniLM's
batch-1 shapes, ``pallas_mosaic_gpu`` beats cuDNN at 4k-16k tokens: BENCHMARKS.md). A
policy makes the per-shape choice a reviewable artifact instead of a lookup in code:

* :class:`Evidence` (``kernels.dispatch_measurements``, re-exported here): per bucket (a
  box of calls, ``kernels.dispatch_space``), the shapes
  measured and, per candidate kernel, either its timing at every one of them (median and
  an order-statistic interval, seconds: ``kernels.timing.median_interval``) or the reason
  its own support check refused one (``Kernel.check_supported``);
* :func:`derive_policy`: a pure function of the evidence, the candidates, their declared
  capabilities and a :class:`Rule`; per bucket, among the kernels no other beats outright
  (geometric means over the bucket's shapes; "outright": another's interval lies wholly
  below), the first in the rule's priority, else the fastest; a bucket no candidate
  serves is kept, with no kernel and the reasons;
* the ranking of each bucket: the rule applied again to the kernels left, so a call the
  chosen kernel refuses (its declared capability does not reach every call of the
  bucket: ``kernels.dispatch_coverage``, recorded per candidate) goes to the next kernel
  of the ranking that accepts it. A winner at the measured shapes is kept rather than
  dropped for a narrower capability (``fa3`` serves head_dim 128 of the 65-128 bucket);
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

import math
from collections.abc import Mapping, Sequence
from typing import Literal, Self

from pydantic import Field, model_validator

from kernels.dispatch_coverage import capability_gap
from kernels.dispatch_measurements import (
    BucketEvidence,
    Evidence,
    FrozenModel,
    KernelEvidence,
    ShapeTiming,
)
from kernels.dispatch_space import Bucket, Region, check_partition
from kernels.kernel import Capability
from kernels.registry import IMPLEMENTATIONS
from kernels.shapes import AttentionShape

__all__ = ["SCHEMA_VERSION", "BucketChoice", "BucketEvidence", "DeclaredCapability",
           "DispatchPolicy", "Evidence", "KernelEvidence", "KernelSummary", "Rule",
           "ShapeTiming", "derive_policy"]

ROUTING_NAMES = frozenset({"dispatch", "auto", "native"})
"""Names that are not one kernel (a policy, ``auto``'s order, the native choice): never a
policy's candidate."""
SCHEMA_VERSION = 2
"""2: candidates' declared capabilities, each bucket's ranking and each summary's gap."""


class Rule(FrozenModel):
    """How a bucket's kernel is chosen from its candidates' summaries (geometric means
    over the bucket's shapes): among the kernels no other beats outright (no other's
    interval lies wholly below its own; the fastest median is always among them), the
    first in ``priority``; kernels it does not list come after, fastest median first. So
    with no priority the fastest is chosen, and a preferred kernel (``xla``, say, which
    needs no tuning) wins only where the measurements cannot tell it from the fastest."""

    name: Literal["fastest-within-interval"] = "fastest-within-interval"
    priority: tuple[str, ...] = ()


class KernelSummary(FrozenModel):
    """One candidate in one bucket, summarised: geometric means over the bucket's shapes
    (seconds) and its ratio to the bucket's fastest median, or why it cannot serve; and
    why its declared capability does not reach every call of the bucket (``uncovered``;
    ``None``: it does)."""

    kernel: str
    median_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    ratio_to_best: float | None = None
    refused: str | None = None
    uncovered: str | None = None


class DeclaredCapability(FrozenModel):
    """A candidate's declared capability (``Kernel.capability``) as the policy used it."""

    kernel: str
    capability: Capability


class BucketChoice(FrozenModel):
    """One bucket's choice: ``kernel`` (``None``: no candidate serves it, ``why`` says
    why), the bucket's fastest kernel (``best``), the regret of the choice against it
    (``regret``: median ratio minus one; ``regret_s``: seconds per call, geometric means),
    every candidate's summary and the evidence the choice was derived from. ``ranking``:
    the kernels serving the bucket in the rule's order (``kernel`` first); a call a kernel
    refuses goes to the next one that accepts it."""

    kernel: str | None
    why: str
    ranking: tuple[str, ...] = ()
    best: str | None = None
    regret: float | None = None
    regret_s: float | None = None
    summaries: tuple[KernelSummary, ...]
    evidence: BucketEvidence

    @model_validator(mode="after")
    def _ranked(self) -> Self:
        if (self.ranking[:1] or (None,))[0] != self.kernel:
            raise ValueError(f"a bucket's ranking starts with its kernel ({self.kernel}), got "
                             f"{list(self.ranking)}")
        return self

    @property
    def bucket(self) -> Bucket:
        """The bucket chosen for."""
        return self.evidence.bucket


class DispatchPolicy(FrozenModel):
    """Bucket -> kernel over ``space`` (validated: the buckets partition it), derived by
    ``rule`` from evidence measured on ``device``; see the module docstring."""

    schema_version: Literal[2] = SCHEMA_VERSION
    space: Region
    device: str
    backend: str
    method: str
    software: dict[str, str] = Field(default_factory=dict)
    evidence_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    candidates: tuple[str, ...] = Field(min_length=1)
    capabilities: tuple[DeclaredCapability, ...]
    rule: Rule
    buckets: tuple[BucketChoice, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _partition(self) -> Self:
        check_partition(self.space, [b.bucket for b in self.buckets])
        routing_back = sorted(set(self.candidates) & ROUTING_NAMES)
        if routing_back:  # they resolve through a policy themselves: a call would loop
            raise ValueError(f"a policy's candidates are kernels, not {routing_back} "
                             f"(names that route through a policy or an order)")
        if tuple(c.kernel for c in self.capabilities) != self.candidates:
            raise ValueError("a policy records one declared capability per candidate, in "
                             "the candidates' order")
        return self

    def capability_map(self) -> dict[str, Capability]:
        """Candidate -> the declared capability the policy was derived with."""
        return {c.kernel: c.capability for c in self.capabilities}

    def evidence(self) -> Evidence:
        """The evidence the policy says it was derived from (its buckets' evidence)."""
        return Evidence(space=self.space, device=self.device, backend=self.backend,
                        method=self.method, software=self.software,
                        buckets=tuple(b.evidence for b in self.buckets))

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
        """The kernels some bucket may serve a call by (its choice, then the rest of its
        ranking), in first-use order."""
        return tuple(dict.fromkeys(k for b in self.buckets for k in b.ranking))


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


def _pick(serving: Sequence[KernelSummary], rule: Rule
          ) -> tuple[KernelSummary, list[KernelSummary]]:
    """The rule's choice among ``serving`` and the kernels tied with the fastest."""
    tied = [s for s in serving if not any(o.high_s < s.low_s for o in serving)]
    rank = {name: i for i, name in enumerate(rule.priority)}
    return min(tied, key=lambda s: (rank.get(s.kernel, len(rank)), s.median_s, s.kernel)), tied


def _ranking(serving: Sequence[KernelSummary], rule: Rule) -> tuple[str, ...]:
    """``serving`` in the rule's order: its choice, then its choice among the rest..."""
    left, out = list(serving), []
    while left:
        chosen, _ = _pick(left, rule)
        out.append(chosen.kernel)
        left.remove(chosen)
    return tuple(out)


def _fallback_note(chosen: KernelSummary, ranking: Sequence[str],
                   summaries: Sequence[KernelSummary]) -> str:
    if chosen.uncovered is None:
        return ""
    gaps = {s.kernel: s.uncovered for s in summaries}
    reach = next((k for k in ranking if gaps[k] is None), None)
    return (f"; {chosen.kernel} {chosen.uncovered}: a call it refuses goes to the next of "
            f"{list(ranking[1:])} that accepts it" + (
                f" ({reach} reaches every call)" if reach is not None else
                " (none reaches every call: a call all of them refuse has no kernel)"))


def _choose(bucket: BucketEvidence, candidates: Sequence[str], rule: Rule,
            capabilities: dict[str, Capability]) -> BucketChoice:
    measured = {k.kernel: k for k in bucket.kernels}
    summaries = [_summary(measured.get(name), name).model_copy(
        update={"uncovered": capability_gap(capabilities[name], bucket.bucket)})
        for name in candidates]
    serving = [s for s in summaries if s.refused is None]
    if not serving:
        why = "no candidate serves it: " + "; ".join(f"{s.kernel}: {s.refused}"
                                                     for s in summaries)
        return BucketChoice(kernel=None, why=why, summaries=tuple(summaries), evidence=bucket)
    best = min(serving, key=lambda s: (s.median_s, s.kernel))
    summaries = [s.model_copy(update={"ratio_to_best": s.median_s / best.median_s})
                 if s.refused is None else s for s in summaries]
    serving = [s for s in summaries if s.refused is None]
    chosen, tied = _pick(serving, rule)
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
    ranking = _ranking(serving, rule)
    return BucketChoice(kernel=chosen.kernel, why=why + _fallback_note(chosen, ranking, summaries),
                        ranking=ranking, best=best.kernel,
                        regret=chosen.median_s / best.median_s - 1,
                        regret_s=chosen.median_s - best.median_s,
                        summaries=tuple(summaries), evidence=bucket)


def derive_policy(evidence: Evidence, candidates: Sequence[str], rule: Rule,
                  capabilities: Mapping[str, Capability] | None = None) -> DispatchPolicy:
    """The policy ``rule`` derives from ``evidence`` for ``candidates`` (registry names;
    a candidate without evidence in a bucket cannot serve it: "not measured"; evidence of
    a kernel that is no candidate is kept in the record and never chosen), with each
    candidate's declared capability (``capabilities``; ``None``: the registry's
    ``Kernel.capability`` of each), recorded in the policy. Pure given ``capabilities``:
    the same arguments give the same policy, fingerprint included.

    Raises:
        ValueError: no candidates, a candidate named twice, a priority naming a kernel
            that is no candidate, or a candidate without a declared capability (not
            given, and not registered).
    """
    candidates = tuple(candidates)
    declared = _declared(candidates, rule, capabilities)
    return DispatchPolicy(space=evidence.space, device=evidence.device,
                          backend=evidence.backend, method=evidence.method,
                          software=evidence.software,
                          evidence_sha256=evidence.fingerprint(), candidates=candidates,
                          capabilities=tuple(DeclaredCapability(kernel=n, capability=c)
                                             for n, c in declared.items()),
                          rule=rule, buckets=tuple(_choose(b, candidates, rule, declared)
                                                   for b in evidence.buckets))


def choose_buckets(buckets: Sequence[BucketEvidence], candidates: Sequence[str], rule: Rule,
                   capabilities: Mapping[str, Capability] | None = None
                   ) -> tuple[BucketChoice, ...]:
    """Each bucket's choice as :func:`derive_policy` makes it, for buckets that need not
    make a whole space (a partial measurement's table); no policy, so nothing to serve.

    Raises:
        ValueError: as :func:`derive_policy`.
    """
    candidates = tuple(candidates)
    declared = _declared(candidates, rule, capabilities)
    return tuple(_choose(b, candidates, rule, declared) for b in buckets)


def _declared(candidates: tuple[str, ...], rule: Rule,
              capabilities: Mapping[str, Capability] | None) -> dict[str, Capability]:
    """Each candidate's declared capability, after checking the candidates and the rule."""
    if not candidates or len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct registry names, got {candidates}")
    strangers = [k for k in rule.priority if k not in candidates]
    if strangers:
        raise ValueError(f"the rule's priority names {strangers}, which are not among the "
                         f"candidates {list(candidates)}")
    if capabilities is None:
        capabilities = {n: IMPLEMENTATIONS[n].capability for n in candidates
                        if n in IMPLEMENTATIONS}
    unknown = [n for n in candidates if n not in capabilities]
    if unknown:
        raise ValueError(f"candidates {unknown} have no declared capability (not registered "
                         "and not given)")
    return {n: capabilities[n] for n in candidates}
