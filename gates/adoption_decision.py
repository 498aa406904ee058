"""Adoption as a preregistered claim in a rollout: the thresholds' ``decision:`` section
and the verdict it gives on the canary's paired requests (pure, no I/O).

A registration with ``decision:`` claims more than "not slower": that the candidate is
worth adopting over the simplest credible alternative (``against: production``, which is
the native baseline while the family has no production: what the canary compares with).
Its primary metric is the canary's paired per-request latency ratio (each compared
request timed ABBA, ``log((c1 + c2) / (p1 + p2))``: ``gates.latency_judge``), judged by
the sequential, anytime-valid superiority test of ``gates.adoption`` at the canary's
looks (the cumulative pairs after each step taken). :func:`conclude_adoption` gives one
of four outcomes:

* ``unsafe``: the canary's safety verdict failed (the rollout rolls back as before;
  adoption is not judged);
* ``adopted``: the median speed-up is shown at ``alpha`` (the rollout goes on);
* ``not_worth_it``: the candidate is shown to gain less than the minimum worthwhile
  effect (its own end state: production unchanged, the version not adopted, no
  rejection of the kernel);
* ``inconclusive``: ``max_pairs`` reached with neither, or no paired samples (an
  interpreted candidate): never promoted, not a verdict on the kernel.

A section with ``buckets`` (padded request lengths, in tokens) claims the effect in each
of them: every declared bucket is judged by its own run of the test on its own pairs, and
the claim is adopted only where all of them adopt (``gates.adoption_buckets``; the
canary's requests must carry their bucket: ``canary.workload``).

The audit re-derives the verdict from the signed canary samples and the registered plan
(``lineage.audit.canary_audit``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gates.adoption import AdoptionInputError, AdoptionPlan, AdoptionResult, judge, sign_boundary
from gates.adoption_buckets import (
    BucketAdoption,
    combine,
    first_decidable,
    judge_bucket,
    split_by_bucket,
)
from gates.directions import Looser as L
from gates.directions import limit
from gates.schema_base import Finite, _Strict

AdoptionOutcome = Literal["adopted", "not_worth_it", "unsafe", "inconclusive"]

PRIMARY_METRIC = "canary_paired_latency_ratio"
"""The canary's per-request ``candidate / production`` latency ratio, timed ABBA."""


class DecisionPlan(_Strict):
    """The ``decision:`` section: what a rollout adopts over, by which metric, and the
    adoption test's preregistered inputs (``gates.adoption.AdoptionPlan``). Ratios are
    candidate time over baseline time (< 1: faster)."""

    against: Literal["production"] = limit(
        L.ANY_CHANGE, description="the alternative adopted over: production, or the native "
        "baseline while the family has none (what the canary compares with)")
    metric: Literal["canary_paired_latency_ratio"] = limit(
        L.ANY_CHANGE, default=PRIMARY_METRIC,
        description="the canary's paired per-request latency ratio (ABBA)")
    minimum_worthwhile_ratio: Finite = limit(
        L.HIGHER, gt=0, lt=1, description="the smallest speed-up worth adopting, as a median "
        "ratio (0.9: at most 90 % of the alternative's time); nearer 1 adopts smaller gains")
    null_ratio: Finite = limit(
        L.HIGHER, default=1.0, gt=0, le=1, description="adoption's H0: median ratio >= this "
        "(1: not faster at all); between minimum_worthwhile_ratio and 1: an indifference zone")
    alpha: Finite = limit(L.HIGHER, gt=0, lt=0.5,
                          description="false adoption (and false not-worth-it) at any look")
    power: Finite = limit(L.LOWER, gt=0, lt=1,
                          description="adoption rate wanted at the minimum worthwhile effect")
    noise_sd: Finite = limit(L.LOWER, gt=0, le=5, description="per-request log-ratio sd the "
                             "power is sized for (gates.adoption_power)")
    max_pairs: int = limit(L.HIGHER, ge=2, le=1_000_000, description="compared requests after "
                           "which the test ends inconclusive; at most the canary's registered "
                           "steps compare, so a passing canary always reaches it")
    mixture_rho: Finite = limit(L.ANY_CHANGE, default=25.0, gt=0,
                                description="the e-process's mixture precision, in pairs "
                                "(gates.adoption_power.tuned_rho)")
    buckets: list[int] = limit(
        L.FEWER, default_factory=list,
        description="padded request lengths (tokens) where the minimum worthwhile effect must "
        "hold, each judged on its own pairs (gates.adoption_buckets); empty: one pooled test "
        "over every compared request")
    min_pairs_per_bucket: int | None = limit(
        L.LOWER, default=None, ge=1, compare="bucket_min_pairs",
        description="pairs a required bucket needs to be judged; fewer: not assessed, so the "
        "claim is not adopted; unset: the fewest at which the test can decide at all")

    @model_validator(mode="after")
    def _valid_test(self) -> DecisionPlan:
        self.adoption_plan()  # the indifference zone: ValueError naming both ratios
        need = int(sign_boundary(self.max_pairs, self.alpha, self.mixture_rho))
        if need > self.max_pairs:
            raise ValueError(
                f"decision: {self.max_pairs} pairs can never reach the adoption test's bound "
                f"at alpha {self.alpha:g} with mixture_rho {self.mixture_rho:g} (it needs "
                f"{need} concordant signs): raise max_pairs or pick mixture_rho for that "
                "count (gates.adoption_power.tuned_rho)")
        if self.buckets and (any(b < 1 for b in self.buckets)
                             or any(a >= b for a, b in pairwise(self.buckets))):
            raise ValueError(f"decision.buckets must be positive token counts, strictly "
                             f"increasing, got {self.buckets}")
        least = (first_decidable(self.alpha, self.mixture_rho, min(self.max_pairs, 100_000))
                 if self.min_pairs_per_bucket is not None else None)
        if self.min_pairs_per_bucket is not None and (least is None
                                                      or self.min_pairs_per_bucket < least):
            raise ValueError(
                f"decision.min_pairs_per_bucket ({self.min_pairs_per_bucket}) is below the "
                f"{least} pairs at which the adoption test can first decide (alpha "
                f"{self.alpha:g}, mixture_rho {self.mixture_rho:g}): such a bucket could "
                "never be adopted; raise it to at least that")
        return self

    @property
    def bucket_min_pairs(self) -> int:
        """Pairs a required bucket needs (``min_pairs_per_bucket``, else the fewest at
        which the test can decide: ``gates.adoption_buckets.first_decidable``); 0 where no
        bucket is declared (nothing to need: declaring buckets never reads as looser)."""
        if not self.buckets:
            return 0
        if self.min_pairs_per_bucket is not None:
            return self.min_pairs_per_bucket
        least = first_decidable(self.alpha, self.mixture_rho, min(self.max_pairs, 100_000))
        return least or self.max_pairs

    def adoption_plan(self) -> AdoptionPlan:
        """The adoption test's plan (``gates.adoption.AdoptionPlan``).

        Raises:
            ValueError: ``minimum_worthwhile_ratio`` is not below ``null_ratio``.
        """
        return AdoptionPlan(alpha=self.alpha, minimum_worthwhile_ratio=self.minimum_worthwhile_ratio,
                            null_ratio=self.null_ratio, power=self.power, noise_sd=self.noise_sd,
                            max_pairs=self.max_pairs, mixture_rho=self.mixture_rho)


class AdoptionVerdict(BaseModel):
    """The adoption decision of one rollout (``adoption/decision.json`` on its run).

    ``looks``: the cumulative pairs judged at each canary look; ``result``: the test's
    every look (the effect as a median ratio with its confidence sequence), None where
    it was not run (unsafe, or no paired samples)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    outcome: AdoptionOutcome
    reason: str
    against: str
    metric: str
    n_pairs: int
    looks: list[int]
    median_ratio: float | None = None
    ratio_lower: float | None = None
    ratio_upper: float | None = None
    p_value: float | None = None
    decided_at: int | None = None
    result: AdoptionResult | None = None
    buckets: list[BucketAdoption] = Field(
        default_factory=list, description="per required bucket (a registration with "
        "decision.buckets): its own test; the pooled fields above are then unset")


def _figures(plan: DecisionPlan, result: AdoptionResult) -> str:
    last = next((look for look in result.looks if look.n == result.decided_at),
                result.looks[-1])
    upper = "inf" if math.isinf(last.ratio_upper) else f"{last.ratio_upper:.3f}"
    return (f"median ratio {last.median_ratio:.3f} over {last.n} pairs, confidence sequence "
            f"[{last.ratio_lower:.3f}, {upper}] at alpha {plan.alpha:g}, always-valid p "
            f"{last.p_value:.3g}; worthwhile below {plan.minimum_worthwhile_ratio:g}")


def conclude_adoption(plan: DecisionPlan, safety: str,
                      log_ratios: Sequence[Sequence[float]], *,
                      buckets: Sequence[Sequence[int]] | None = None,
                      not_assessed_reason: str | None = None) -> AdoptionVerdict:
    """The adoption verdict after the canary.

    Args:
        plan: the registration's ``decision:`` section.
        safety: the whole canary's verdict (``pass``, ``fail``, ``inconclusive``:
            ``gates.canary_latency.CanaryVerdict.verdict``); ``fail`` is ``unsafe``.
        log_ratios: per canary step taken, in order, its compared requests'
            ``log(candidate / production)`` (dimensionless; ``CanaryStepResult.log_ratios``).
            The test looks at the cumulative pairs after each step (capped at
            ``max_pairs``; pairs past it are not judged).
        buckets: per step, each compared request's padded length in tokens, parallel to
            ``log_ratios`` (``CanaryStepResult.length_buckets``); read only where the plan
            declares ``buckets``: each declared bucket is then judged on its own pairs
            (``gates.adoption_buckets``), and a step with pairs but no buckets leaves
            every declared bucket short of them (not assessed, so not adopted).
        not_assessed_reason: why the steps carry no paired samples (an interpreted
            candidate), said in an ``inconclusive`` verdict.

    Returns:
        :class:`AdoptionVerdict`.

    Raises:
        gates.adoption.AdoptionInputError: a non-finite log ratio, or a step whose
            buckets and log ratios differ in length.
    """
    about = dict(against=plan.against, metric=plan.metric)
    counts = np.cumsum([len(r) for r in log_ratios]).tolist() if log_ratios else []
    looks = sorted({min(int(c), plan.max_pairs) for c in counts if c > 0})
    pairs = [float(x) for r in log_ratios for x in r]
    if safety == "fail":
        return AdoptionVerdict(outcome="unsafe", reason="unsafe: the canary's safety verdict "
                               "failed; adoption not judged", n_pairs=len(pairs), looks=looks,
                               **about)
    if not looks:
        why = not_assessed_reason or "the canary compared no request"
        return AdoptionVerdict(outcome="inconclusive", reason=f"adoption inconclusive: no paired "
                               f"samples ({why})", n_pairs=0, looks=[], **about)
    if plan.buckets:
        return _per_bucket(plan, log_ratios, buckets, looks, about)
    result = judge(plan.adoption_plan(), pairs, looks=looks)
    figures = _figures(plan, result)
    if result.decision == "adopt":
        outcome, reason = "adopted", f"adopted: faster than {plan.against} ({figures})"
    elif result.decision == "not_worth_it":
        outcome, reason = "not_worth_it", (f"not worth adopting over {plan.against}: the speed-up "
                                           f"is below the minimum worthwhile ({figures})")
    elif result.decision == "inconclusive":
        outcome, reason = "inconclusive", (f"adoption inconclusive: max_pairs {plan.max_pairs} "
                                           f"reached with neither bound ({figures})")
    else:
        outcome, reason = "inconclusive", (f"adoption inconclusive: the canary ended after "
                                           f"{len(pairs)} pairs, before the test decided or "
                                           f"reached max_pairs {plan.max_pairs} ({figures})")
    last = next((look for look in result.looks if look.n == result.decided_at),
                result.looks[-1])
    return AdoptionVerdict(outcome=outcome, reason=reason, n_pairs=len(pairs), looks=looks,
                           median_ratio=last.median_ratio, ratio_lower=last.ratio_lower,
                           ratio_upper=last.ratio_upper, p_value=last.p_value,
                           decided_at=result.decided_at, result=result, **about)


def _per_bucket(plan: DecisionPlan, log_ratios: Sequence[Sequence[float]],
                buckets: Sequence[Sequence[int]] | None, looks: list[int],
                about: dict) -> AdoptionVerdict:
    """The verdict of a plan with ``buckets``: each declared bucket judged on its own."""
    n_pairs = sum(len(r) for r in log_ratios)
    steps = list(buckets) if buckets is not None else [[] for _ in log_ratios]
    if len(steps) != len(log_ratios):
        raise AdoptionInputError(f"buckets are given for {len(steps)} steps, log ratios for "
                                 f"{len(log_ratios)}: one bucket list per step")
    # a step whose requests carry no bucket adds to no bucket (its source records none)
    bare = {i for i, (r, b) in enumerate(zip(log_ratios, steps, strict=True)) if r and not b}
    unbucketed = sum(len(log_ratios[i]) for i in bare)
    ratios = [[] if i in bare else r for i, r in enumerate(log_ratios)]
    split = split_by_bucket(ratios, steps, plan.buckets)
    per = [judge_bucket(plan.adoption_plan(), b, *split[b], plan.bucket_min_pairs)
           for b in plan.buckets]
    outcome, named = combine(per)
    carried = (f"; {unbucketed} compared requests carry no length bucket (their request "
               "source records none)" if unbucketed else "")
    reason = {"adopted": f"adopted: faster than {plan.against} in every required bucket "
                         f"({named})",
              "not_worth_it": f"not worth adopting over {plan.against}: the speed-up is below "
                              f"the minimum worthwhile {plan.minimum_worthwhile_ratio:g} in "
                              f"bucket(s) {named}",
              "inconclusive": f"adoption inconclusive: not every required bucket was shown "
                              f"faster ({named}{carried})"}[outcome]
    return AdoptionVerdict(outcome=outcome, reason=reason, n_pairs=n_pairs, looks=looks,
                           buckets=per, **about)


_STATUS = {"adopt": "meets it", "not_worth_it": "below it", "inconclusive": "undecided",
           "continue": "undecided"}


def _bucket_lines(plan: DecisionPlan, buckets: Sequence[BucketAdoption]) -> str:
    """The per-bucket effect as a nested markdown list, one item per required bucket (a
    list, not a table: the approval form shows the canary's table after this, and the
    Prefect UI renders nothing after a first table)."""
    level = f"{100 * (1 - plan.alpha):g} %"
    rows = ["- measured, per bucket (each its own test; the claim holds only where every "
            "bucket meets the minimum worthwhile effect):"]
    for b in buckets:
        if b.status == "not_assessed":
            median = "" if b.median_ratio is None else f", median ratio {b.median_ratio:.3f}"
            rows.append(f"  - {b.bucket} tokens: **not assessed** ({b.reason}{median})")
            continue
        upper = "inf" if math.isinf(b.ratio_upper) else f"{b.ratio_upper:.3f}"
        rows.append(f"  - {b.bucket} tokens: **{_STATUS[b.status]}**: median ratio "
                    f"{b.median_ratio:.3f} over {b.decided_at or b.looks[-1]} of {b.n_pairs} "
                    f"pairs, {level} confidence sequence [{b.ratio_lower:.3f}, {upper}], "
                    f"always-valid p {b.p_value:.2g}")
    return "\n".join(rows)


_SAID = {"adopted": "adopted", "not_worth_it": "not worth adopting",
         "inconclusive": "inconclusive", "unsafe": "unsafe"}


def adoption_markdown(plan: DecisionPlan, verdict: AdoptionVerdict, *,
                      heading: str = "### ") -> str:
    """The adoption evidence for people (the ``canary->production`` approval form, the
    version's page): a heading with the outcome, then the claim as preregistered
    (metric, minimum worthwhile effect, alpha, power) and the measured effect (median
    ratio, its confidence sequence at ``1 - alpha``, the always-valid p), or why it was
    not judged. ``heading``: the markdown put before the heading's text."""
    m = plan.minimum_worthwhile_ratio
    null = "" if plan.null_ratio == 1 else f"; H0 ratio ≥ {plan.null_ratio:g}"
    claim = (f"- claim: median paired request latency ratio (candidate / {plan.against}) "
             f"≤ {m:g}, i.e. ≥ {100 * (1 - m):g} % faster; α {plan.alpha:g}, "
             f"power {plan.power:g}{null}")
    if plan.buckets:
        claim += f"; in every bucket of {', '.join(map(str, plan.buckets))} tokens"
    result = verdict.result
    if verdict.buckets:
        measured = _bucket_lines(plan, verdict.buckets)
    elif result is None or verdict.median_ratio is None:
        measured = f"- measured: not judged ({verdict.reason})"
    else:
        n = verdict.decided_at if verdict.decided_at is not None else result.looks[-1].n
        upper = "inf" if math.isinf(verdict.ratio_upper) else f"{verdict.ratio_upper:.3f}"
        measured = (f"- measured: median ratio {verdict.median_ratio:.3f} over {n} pairs, "
                    f"{100 * (1 - plan.alpha):g} % confidence sequence "
                    f"[{verdict.ratio_lower:.3f}, {upper}], always-valid p {verdict.p_value:.2g}")
    title = f"{heading}Adoption (preregistered `decision:`): **{_SAID[verdict.outcome]}**"
    return "\n".join([title, "", claim, measured])
