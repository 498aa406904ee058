"""Adoption judged per length bucket: the claim holds only where every required bucket
meets it (pure, no I/O).

Attention's share of a request grows with its length, so a kernel may be worth adopting
for long documents and not for short ones; a pooled median hides that (the many short
requests decide it). A registration whose ``decision:`` names ``buckets`` (padded request
lengths, in tokens: the request source's length buckets) claims the minimum worthwhile
effect in *each* of them. Here each required bucket gets its own run of the sequential
sign test of ``gates.adoption`` on its own paired log ratios, looked at after each canary
step (the bucket's cumulative pairs then), with its own confidence sequence of the median
ratio at ``1 - alpha``.

Combination (:func:`combine`): ``adopted`` only where every required bucket adopted;
``not_worth_it`` where at least one required bucket was shown to gain less than the
minimum worthwhile effect (naming it); otherwise ``inconclusive``, naming the buckets not
assessed or not decided. A bucket with fewer than ``min_pairs`` pairs is *not assessed*
(it can never count as meeting the claim), and so is every bucket when the canary's
requests carry no length bucket.

Error rates. False adoption: adoption is an intersection-union test (Berger, "Multiparameter
hypothesis testing and acceptance sampling", Technometrics 24(4), 1982): it needs every
bucket's level-``alpha`` test to reject, so whichever bucket is not faster, the chance of
adopting is at most that bucket's ``alpha`` (no multiplicity correction is needed, and
under A/A in every bucket it is lower still). False "not worth it" (one of ``K`` required
buckets, each truly at the minimum worthwhile effect or better, shown below it) is at
most ``alpha`` per bucket and ``K * alpha`` across them (union bound): the conservative
side, production is left unchanged. Each bucket's interval covers its median at
``1 - alpha`` on its own, not jointly.

Power: a bucket sees only its share of the canary's pairs, so its power at the minimum
worthwhile effect is that of its own pair count (``gates.adoption_power.adoption_power``
on it), below the pooled plan's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gates.adoption import AdoptionInputError, AdoptionPlan, judge, sign_boundary

BucketStatus = Literal["adopt", "not_worth_it", "inconclusive", "continue", "not_assessed"]


class BucketAdoption(BaseModel):
    """One required bucket's adoption test. Ratios are candidate / baseline time (< 1:
    faster); the interval is the bucket's confidence sequence at its deciding look (its
    last look where none decided); an unbounded side is infinite."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    bucket: int = Field(description="padded request length, tokens")
    status: BucketStatus = Field(description="the bucket's own decision; 'not_assessed': "
                                 "too few pairs to judge (never counted as meeting the claim)")
    n_pairs: int
    looks: list[int] = Field(description="the bucket's cumulative pairs at each canary look")
    median_ratio: float | None = None
    ratio_lower: float | None = None
    ratio_upper: float | None = None
    p_value: float | None = Field(None, description="always-valid p of 'not faster'")
    decided_at: int | None = Field(None, description="the bucket's pairs at its deciding look")
    reason: str = ""


def first_decidable(alpha: float, rho: float, limit: int = 100_000) -> int | None:
    """The fewest pairs at which the sign test can decide at all (``k*(n) <= n``: every
    sign concordant reaches ``1/alpha``), None if no count up to ``limit`` can.

    Raises:
        ValueError: ``alpha`` outside (0, 1) or ``rho <= 0``.
    """
    if not 0.0 < alpha < 1.0 or not rho > 0:
        raise ValueError(f"need alpha in (0, 1) and rho > 0, got {alpha}, {rho}")
    n = np.arange(1, limit + 1)
    ok = sign_boundary(n, alpha, rho) <= n
    return int(n[ok.argmax()]) if ok.any() else None


def split_by_bucket(log_ratios: Sequence[Sequence[float]],
                    buckets: Sequence[Sequence[int]], required: Sequence[int]
                    ) -> dict[int, tuple[list[float], list[int]]]:
    """Per required bucket, its pairs in canary order and its cumulative pair count
    after each step that added to it.

    Args:
        log_ratios: per canary step, its compared requests' ``log(candidate / baseline)``.
        buckets: per step, each compared request's padded length (tokens), parallel to
            ``log_ratios``.
        required: the buckets judged; requests of other buckets are left out.

    Raises:
        AdoptionInputError: a step's buckets and log ratios differ in length.
    """
    if len(buckets) != len(log_ratios):
        raise AdoptionInputError(f"buckets are given for {len(buckets)} steps, log ratios "
                                 f"for {len(log_ratios)}: one bucket list per step")
    out: dict[int, tuple[list[float], list[int]]] = {int(b): ([], []) for b in required}
    for i, (ratios, lengths) in enumerate(zip(log_ratios, buckets, strict=True)):
        if len(ratios) != len(lengths):
            raise AdoptionInputError(f"step {i}: {len(ratios)} log ratios but {len(lengths)} "
                                     "buckets: one bucket per compared request")
        for r, b in zip(ratios, lengths, strict=True):
            if int(b) in out:
                out[int(b)][0].append(float(r))
        for pairs, looks in out.values():
            if pairs and (not looks or looks[-1] != len(pairs)):
                looks.append(len(pairs))
    return out


def judge_bucket(plan: AdoptionPlan, bucket: int, pairs: Sequence[float],
                 looks: Sequence[int], min_pairs: int) -> BucketAdoption:
    """One bucket's adoption test on its pairs (``looks``: its cumulative counts at the
    canary's looks; capped at ``plan.max_pairs``); ``not_assessed`` below ``min_pairs``.

    Raises:
        AdoptionInputError: a non-finite log ratio.
    """
    n = len(pairs)
    if n < min_pairs:
        median = float(math.exp(np.median(pairs))) if n else None
        return BucketAdoption(bucket=bucket, status="not_assessed", n_pairs=n,
                              looks=list(looks), median_ratio=median,
                              reason=f"{n} pairs, fewer than the {min_pairs} needed "
                                     "(min_pairs_per_bucket)")
    capped = sorted({min(int(t), plan.max_pairs) for t in looks})
    result = judge(plan, pairs, looks=capped)
    last = next((k for k in result.looks if k.n == result.decided_at), result.looks[-1])
    return BucketAdoption(bucket=bucket, status=result.decision, n_pairs=n, looks=capped,
                          median_ratio=last.median_ratio, ratio_lower=last.ratio_lower,
                          ratio_upper=last.ratio_upper, p_value=last.p_value,
                          decided_at=result.decided_at)


def _interval(b: BucketAdoption) -> str:
    if b.ratio_lower is None or b.ratio_upper is None:
        return "no interval"
    upper = "inf" if math.isinf(b.ratio_upper) else f"{b.ratio_upper:.3f}"
    return f"[{b.ratio_lower:.3f}, {upper}]"


_WORDS = {"adopt": "faster", "not_worth_it": "not worth it",
          "inconclusive": "undecided at max_pairs", "continue": "undecided"}


def bucket_words(b: BucketAdoption) -> str:
    """One bucket in a line: its length, status, median ratio, interval and pairs."""
    if b.status == "not_assessed":
        return f"{b.bucket} tokens: not assessed ({b.reason})"
    return (f"{b.bucket} tokens: {_WORDS[b.status]}, median ratio "
            f"{b.median_ratio:.3f} {_interval(b)} over {b.n_pairs} pairs")


def combine(per_bucket: Sequence[BucketAdoption]
            ) -> tuple[Literal["adopted", "not_worth_it", "inconclusive"], str]:
    """The claim from its required buckets' tests (see the module docstring): the
    outcome and the words naming the buckets that decided it (for ``not_worth_it``,
    those shown below the minimum worthwhile effect, then those not decided).

    Raises:
        ValueError: no bucket given.
    """
    if not per_bucket:
        raise ValueError("combine needs at least one required bucket")
    short = [b for b in per_bucket if b.status == "not_worth_it"]
    if short:
        open_ = [b for b in per_bucket if b.status not in ("not_worth_it", "adopt")]
        also = f"; not decided: {'; '.join(bucket_words(b) for b in open_)}" if open_ else ""
        return "not_worth_it", "; ".join(bucket_words(b) for b in short) + also
    if all(b.status == "adopt" for b in per_bucket):
        return "adopted", "; ".join(bucket_words(b) for b in per_bucket)
    open_ = [b for b in per_bucket if b.status != "adopt"]
    return "inconclusive", "; ".join(bucket_words(b) for b in open_)


def claim_power(plan: AdoptionPlan, pairs: dict[int, int], min_pairs: int, *,
                runs: int = 2000, seed: int = 0) -> tuple[float, dict[int, float]]:
    """The chance the per-bucket claim is adopted when every bucket's median ratio is
    exactly the minimum worthwhile one, under normal log-ratio noise of ``plan.noise_sd``:
    each bucket's simulated adoption rate over the pairs it is expected to get
    (``gates.adoption_power.adoption_power`` with ``max_pairs`` that count, capped at the
    plan's; 0 below ``min_pairs``: not assessed), and their product (the buckets' pairs
    are disjoint, so their tests are independent).

    Args:
        plan: the adoption test's plan.
        pairs: bucket (tokens) -> compared requests it is expected to get.
        min_pairs: fewer pairs: not assessed (``DecisionPlan.bucket_min_pairs``).

    Returns:
        ``(claim power, {bucket: its power})``.

    Raises:
        ValueError: no bucket, or a negative pair count.
    """
    from gates.adoption_power import adoption_power

    if not pairs or min(pairs.values()) < 0:
        raise ValueError(f"need at least one bucket and non-negative pair counts, got {pairs}")
    per = {b: 0.0 if n < max(min_pairs, 2) else adoption_power(
        plan.model_copy(update={"max_pairs": min(n, plan.max_pairs)}), runs=runs, seed=seed)
        for b, n in pairs.items()}
    return float(np.prod(list(per.values()))), per
