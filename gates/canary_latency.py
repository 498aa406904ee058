"""The canary's paired latency analysis: each step's look, and the whole-canary verdict.

A step's compared requests are timed ABBA (``evaluation.serving``); their per-request log
ratios (``gates.latency_judge.abba_log_ratios``) are kept with the step's result (the raw
samples, signed with it). Step ``k`` looks at the log ratios of steps ``1..k`` at the
alpha the plan spends on it (``CanaryPlan.step_alphas``) against H0 "the median request
is at most ``tolerated_slowdown_ratio`` slower". At the end of the canary
:func:`conclude_canary` applies the whole-canary verdict: a step's breach, the errors
and the p99 latency ratio over every step together, and the latency test's
``conclude`` (fail / pass / inconclusive).

Pure: no I/O; the audit re-derives both from the signed samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict

from gates import latency_judge
from gates.canary_plan import CanaryPlan

MIN_TAIL_PAIRS = 500
"""Fewer compared requests than this: a p99 rests on fewer than 5 requests, not a tail; the
tail ratio is reported but not judged."""

CanaryVerdictName = Literal["pass", "fail", "inconclusive"]


def request_latencies(timings_s: ArrayLike) -> np.ndarray:
    """Per-request latency (seconds) from ``[n, 2]`` ABBA timings: their mean."""
    t = np.asarray(timings_s, dtype=np.float64).reshape(-1, 2)
    return t.mean(axis=1)


def p99_ratio(candidate_s: ArrayLike, production_s: ArrayLike) -> float:
    """``p99(candidate) / p99(production)`` of per-request latencies (NaN when empty)."""
    c, p = request_latencies(candidate_s), request_latencies(production_s)
    if c.size == 0 or p.size == 0:
        return math.nan
    return float(np.quantile(c, 0.99) / np.quantile(p, 0.99))


def tail_breach(plan: CanaryPlan, ratio: float, n_pairs: int, where: str) -> str | None:
    """The breach message when ``ratio`` exceeds ``plan.max_p99_ratio`` on enough pairs."""
    limit = plan.max_p99_ratio
    if limit is None or n_pairs < MIN_TAIL_PAIRS or not ratio > limit:
        return None
    return f"tail latency{where}: p99 ratio {ratio:.3f} > {limit:g} ({n_pairs} requests)"


def step_look(plan: CanaryPlan, step_index: int, log_ratios: ArrayLike,
              earlier: Sequence[Sequence[float]], buckets: Sequence[int] | None = None,
              earlier_buckets: Sequence[Sequence[int]] = ()) -> latency_judge.LatencyLook:
    """Step ``step_index``'s look: its ``log_ratios`` with the ``earlier`` steps', at the
    alpha the plan spends on the step; ``median_ratio`` is the measured one (unshifted).
    Under ``latency.noise_within_buckets`` the look's ``noise_sd`` is measured about each
    length bucket's median (``buckets``, ``earlier_buckets``: one per log ratio)."""
    r = np.concatenate([np.asarray(x, dtype=np.float64) for x in (*earlier, log_ratios)]) \
        if (earlier or len(log_ratios)) else np.zeros(0)
    shift = math.log(plan.latency.tolerated_slowdown_ratio)
    found = latency_judge.look(plan.looks()[step_index].name, r - shift,
                               plan.step_alphas()[step_index])
    median = float(np.exp(np.median(r))) if r.size else math.nan
    update = {"median_ratio": median}
    if plan.latency.noise_within_buckets and buckets is not None:
        update["noise_sd"] = _noise(plan, r, [b for bs in (*earlier_buckets, buckets) for b in bs])
    return found.model_copy(update=update)


def _noise(plan: CanaryPlan, ratios: Sequence[float], buckets: Sequence[int]) -> float:
    """Under ``latency.noise_within_buckets``, with a bucket recorded for every ratio, the
    spread about each bucket's median; otherwise the pooled robust sd (which also holds
    the spread between the buckets' effects: a canary without its buckets is judged as
    before the switch)."""
    if plan.latency.noise_within_buckets and len(ratios) and len(buckets) == len(ratios):
        return latency_judge.within_bucket_sd(ratios, buckets)
    return latency_judge.robust_sd(ratios)


def noise_sd(plan: CanaryPlan, results: Sequence) -> float:
    """The canary's measured per-request log-ratio noise over ``results`` (its steps): the
    robust sd of every compared request's log ratio, or about each length bucket's median
    under ``latency.noise_within_buckets`` (:func:`_noise`)."""
    return _noise(plan, [x for r in results for x in r.log_ratios],
                  [b for r in results for b in r.length_buckets])


class CanaryVerdict(BaseModel):
    """The whole canary's verdict (after its last step, or the step that stopped it)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    verdict: CanaryVerdictName
    reason: str
    latency_verdict: Literal["pass", "fail", "inconclusive", "not_assessed"]
    latency_reason: str
    n_pairs: int
    required_pairs: int | None
    noise_sd: float | None
    p99_ratio: float
    error_count: int
    breaches: list[str]
    # requests production failed over every step, left out of the comparison where the
    # plan registered exclude_production_failures (a failure otherwise breaches its step)
    production_error_count: int = 0
    inconclusive_policy: Literal["reject", "pause"] | None = None
    calibration_run_id: str | None = None


def _required_pairs(plan: CanaryPlan, noise_sd: float, n_looks: int) -> int | None:
    """The pairs the verdict says the power needs: at the plan's ``noise_sd`` without an
    extension; with one, at the measured noise and the alpha of the last look taken."""
    if not plan.paired:
        return None
    if plan.extend is None or not noise_sd > 0:
        return plan.required_pairs()
    alpha = plan.step_alphas()[min(max(n_looks, 1), len(plan.looks())) - 1]
    return latency_judge.pairs_for_power(alpha, plan.detectable_ratio, noise_sd,
                                         plan.latency.power)


def another_look(plan: CanaryPlan, results: Sequence) -> bool:
    """Whether the canary takes its next look after ``results`` (the steps so far, in order):
    every registered step is taken (unless one breached: the flow stops there); an
    extension's extra look only while the verdict so far is *inconclusive* (no breach, the
    latency test assessed but short of its power at the measured noise) and the plan has
    one left."""
    if len(results) < len(plan.steps):
        return all(r.passed for r in results)
    if plan.extend is None or len(results) >= len(plan.looks()):
        return False
    if not all(r.passed for r in results) or not all(r.latency_assessed for r in results):
        return False
    return conclude_canary(plan, results).verdict == "inconclusive"


def _production_failures(results: Sequence, failed: int) -> str:
    by_bucket: dict[int, int] = {}
    for r in results:
        for bucket, n in r.production_failed_buckets.items():
            by_bucket[bucket] = by_bucket.get(bucket, 0) + n
    where = (" (by length bucket: " + ", ".join(f"{b}: {n}" for b, n in sorted(by_bucket.items()))
             + ")" if by_bucket else "")
    return (f"production failed {failed} request(s){where}, left out of the comparison as "
            "registered (exclude_production_failures)")


def conclude_canary(plan: CanaryPlan, results: Sequence) -> CanaryVerdict:
    """The whole-canary verdict from the canary steps' results (``CanaryStepResult``, in
    step order; the shadow stage is not one of them).

    ``fail``: a step breached, the errors over every step exceed ``max_error_count``, the
    p99 ratio over every compared request exceeds ``max_p99_ratio``, or the latency test
    rejected. ``inconclusive``: none of those, but the latency test (where assessed) ends
    with too few pairs or too much noise (with an extension: short of its power at the
    measured noise after the looks taken). Otherwise ``pass``.

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no canary steps to conclude from")
    breaches = [f"{r.step}: {b}" for r in results for b in r.breaches]
    errors = sum(r.error_count for r in results)
    if errors > plan.max_error_count:
        breaches.append(f"errors over the whole canary: {errors} > {plan.max_error_count}")
    cand = [t for r in results for t in r.candidate_timings_s]
    prod = [t for r in results for t in r.production_timings_s]
    ratio = p99_ratio(cand, prod)
    assessed = all(r.latency_assessed for r in results)
    if assessed and (tail := tail_breach(plan, ratio, len(cand), " over the whole canary")):
        breaches.append(tail)
    n_pairs = sum(len(r.log_ratios) for r in results)
    sd = noise_sd(plan, results)
    required = _required_pairs(plan, sd, len(results))
    if not plan.paired:
        lat, why = "pass", "latency: judged per step (legacy mannwhitneyu test)"
    elif not assessed:
        reason = next(r.latency_not_assessed_reason for r in results if not r.latency_assessed)
        lat, why = "not_assessed", f"latency not assessed: {reason}"
    else:
        looks = [r.latency_look for r in results]
        lat, why = (latency_judge.conclude(looks, required_pairs=required,
                                           noise_sd=plan.latency.noise_sd)
                    if plan.extend is None else
                    latency_judge.conclude_powered(looks, power=plan.latency.power,
                                                   slowdown_ratio=plan.detectable_ratio))
        if plan.latency.noise_within_buckets and sum(len(r.length_buckets) for r in results) == n_pairs:
            why += " (noise measured about each length bucket's median, as registered)"
    if breaches:
        verdict, reason = "fail", "; ".join(breaches)
    elif lat == "fail":
        verdict, reason = "fail", why
    elif lat == "inconclusive":
        verdict, reason = "inconclusive", f"inconclusive: {why}"
    else:
        verdict, reason = "pass", why
    failed = sum(r.production_error_count for r in results)
    if failed and not breaches:  # never left out of what the verdict says
        reason += f"; {_production_failures(results, failed)}"
    return CanaryVerdict(verdict=verdict, reason=reason, latency_verdict=lat,
                         latency_reason=why, n_pairs=n_pairs, required_pairs=required,
                         noise_sd=None if math.isnan(sd) else sd, p99_ratio=ratio,
                         error_count=errors, breaches=breaches, production_error_count=failed,
                         inconclusive_policy=plan.latency.inconclusive)
