"""Canary step analysis against the preregistered canary plan.

After each canary step (a fraction of traffic served by the candidate, the rest by
production) the step is judged on:

* latency — with the paired test (``signed_rank_abba``, ``gates.canary_latency``): the
  step's compared requests, each timed ABBA on both sides, give per-request log ratios
  (kept in the result: the raw samples, signed with the step); the look tests them with
  every earlier step's at the alpha the plan spends on this step. The effect size is
  the share of requests slower on the candidate. Tail latency: the p99 ratio of
  per-request latencies (``max_p99_ratio``). The whole canary is concluded by
  ``gates.canary_latency.conclude_canary``. With the legacy ``mannwhitneyu`` test (stored
  registrations only), a one-sided Mann-Whitney U test at the full alpha per step,
  breaching on ``p < alpha`` *and* ``median ratio >= min_slowdown_ratio``;
* output drift — per-request relative L2 difference between candidate and production
  embeddings; any value above ``max_output_drift`` (or non-finite) breaches;
* error and NaN counts against their limits;
* device-memory growth over the step (bytes) against ``max_memory_growth_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict
from scipy import stats

from gates import canary_latency, latency_judge
from gates.canary_plan import CanaryPlan, CanaryStep, smallest_p_value


class CanaryStepResult(BaseModel):
    """Outcome of one canary step; ``passed`` is False when ``breaches`` is non-empty."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    step: str
    traffic_fraction: float
    n_candidate: int  # latency samples: the requests both sides served successfully
    n_production: int
    served_by_candidate: int | None = None  # requests each side answered (not mirrored)
    served_by_production: int | None = None
    latency_test: str
    alpha: float
    u_statistic: float
    p_value: float
    common_language_effect: float  # P(candidate latency > production latency)
    median_latency_ratio: float  # median(candidate) / median(production)
    candidate_median_s: float
    production_median_s: float
    latency_slower: bool
    latency_assessed: bool = True
    latency_not_assessed_reason: str | None = None
    memory_not_assessed_reason: str | None = None
    output_drift_max: float
    output_drift_p99: float
    output_drift_nonfinite: int
    error_count: int
    nan_count: int
    # requests production failed; under the plan's exclude_production_failures they are
    # left out of the comparison (reported per length bucket: bucket -> count), else breach
    production_error_count: int = 0
    production_failed_buckets: dict[int, int] = {}
    memory_growth_bytes: int
    breaches: list[str]
    passed: bool
    # paired test: the raw ABBA timings ([n, 2] seconds a side), their log ratios, the look
    candidate_timings_s: list[list[float]] = []
    production_timings_s: list[list[float]] = []
    log_ratios: list[float] = []
    # per compared request (parallel to log_ratios): its padded length in tokens, the
    # request source's length bucket (gates.adoption_buckets); empty where none is recorded
    length_buckets: list[int] = []
    latency_look: latency_judge.LatencyLook | None = None
    p99_latency_ratio: float | None = None
    # the Pallas interpreter the candidate ran under (kernels.interpreters); None: native,
    # or a kernel that ignores the choice (interpreters.takes_the_choice)
    interpreter: str | None = None


PRODUCTION_FAILED = "production endpoint failed"
"""How a step's breach for requests production failed begins (the audit looks for it)."""

SHADOW_NOT_LOOKED = ("the paired latency test spends its alpha over the canary steps only; "
                     "it does not look at this stage")
"""The shadow stage's latency under the paired test: by design, not a gap in evidence."""

MIN_LATENCY_SAMPLES = 2
"""Fewer latencies than this on either side: the latency test is not run (reported
as not assessed, with the counts), never run on made-up data."""


def _latencies(values: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of latencies (seconds)")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and non-negative (seconds)")
    return arr


def analyse_canary_step(
    step: CanaryStep,
    candidate_latencies_s: ArrayLike,
    production_latencies_s: ArrayLike,
    output_drift: ArrayLike,
    error_count: int,
    nan_count: int,
    memory_start_bytes: int,
    memory_end_bytes: int,
    plan: CanaryPlan,
    *,
    abba: tuple[ArrayLike, ArrayLike] | None = None,
    earlier: Sequence[CanaryStepResult] = (),
    latency_not_assessed_reason: str | None = None,
    memory_not_assessed_reason: str | None = None,
    production_error_count: int = 0,
    production_failed_buckets: dict[int, int] | None = None,
    served: tuple[int, int] | None = None,
    length_buckets: Sequence[int] | None = None,
) -> CanaryStepResult:
    """Judge one canary step against ``plan``.

    Args:
        step: the step being judged (name and traffic fraction are reported).
        candidate_latencies_s, production_latencies_s: 1-D float arrays of per-request
            latency in seconds (at least 2 each, finite, >= 0); the flows pass both sides'
            latencies on the same requests (``TrafficResult.matched_latencies``).
        output_drift: 1-D float array (possibly empty), per mirrored request,
            ``||candidate - production|| / ||production||`` of the embeddings; NaN/inf allowed
            (they breach).
        error_count, nan_count: requests that raised / returned non-finite outputs.
        memory_start_bytes, memory_end_bytes: device memory in use at the step's start and end.
        abba: the paired test's ``(candidate, production)`` ABBA timings, each
            ``[n, 2]`` seconds (``TrafficResult.abba_timings``); None where the step was
            timed once a side (latency not assessed).
        earlier: the results of the canary steps before this one (in order): their log
            ratios join this step's look.
        latency_not_assessed_reason: when given (e.g. the candidate runs interpreted, not
            natively), the latency test is still computed and reported but cannot breach;
            the reason is recorded, as for speed criteria at the gate.
        memory_not_assessed_reason: likewise for memory growth.
        production_error_count: requests production failed; without production's outputs
            nothing was compared on them, so any such request breaches unless the plan
            registered ``exclude_production_failures`` (then they are left out of the
            comparison and reported).
        production_failed_buckets: those requests per length bucket (tokens -> count),
            where the request source records one.
        served: ``(by candidate, by production)``, the requests each side answered
            (reported with the step, not judged).
        length_buckets: per ABBA row of ``abba`` (a compared request), its padded length
            in tokens (the request source's length bucket), kept as ``length_buckets``
            for the adoption test per bucket; None where the source records none.

    Raises:
        ValueError: malformed latencies or negative counts, or ``length_buckets`` not
            one per ABBA row.

    A step where fewer than ``MIN_LATENCY_SAMPLES`` requests reached either side has
    its latency reported as not assessed (with the counts); an empty ``output_drift``
    (no request reached the candidate) breaches nothing by itself.
    """
    cand = _latencies(candidate_latencies_s, "candidate_latencies_s")
    prod = _latencies(production_latencies_s, "production_latencies_s")
    drift = np.asarray(output_drift, dtype=np.float64).ravel()
    if min(error_count, nan_count, memory_start_bytes, memory_end_bytes,
           production_error_count) < 0:
        raise ValueError("counts and memory bytes must be non-negative")

    rows = 0 if abba is None else np.asarray(abba[0]).reshape(-1, 2).shape[0]
    if length_buckets is not None and len(length_buckets) != rows:
        raise ValueError(f"length_buckets has {len(length_buckets)} entries for {rows} ABBA "
                         "rows: one padded length per compared request")
    if plan.paired:
        lat = _paired(step, plan, abba, earlier, latency_not_assessed_reason,
                      None if length_buckets is None else [int(b) for b in length_buckets])
    else:
        lat = _legacy(cand, prod, plan, latency_not_assessed_reason)
    cand_med = float(np.median(cand)) if cand.size else math.nan
    prod_med = float(np.median(prod)) if prod.size else math.nan
    if lat.get("median_latency_ratio") is None:
        lat["median_latency_ratio"] = (cand_med / prod_med if prod_med > 0
                                       else (1.0 if cand_med == 0 else math.inf))
    breach = lat.pop("breach")
    latency_not_assessed_reason = lat["latency_not_assessed_reason"]
    latency_assessed = latency_not_assessed_reason is None

    finite = drift[np.isfinite(drift)]
    nonfinite = int(drift.size - finite.size)
    drift_max = float(finite.max()) if finite.size else math.nan
    drift_p99 = float(np.quantile(finite, 0.99)) if finite.size else math.nan
    growth = int(memory_end_bytes) - int(memory_start_bytes)

    checks = [
        (breach is not None and latency_assessed, breach or ""),
        (
            nonfinite > 0,
            f"output drift: {nonfinite} request(s) with non-finite drift",
        ),
        (
            finite.size > 0 and drift_max > plan.max_output_drift,
            f"output drift: max rel. L2 {drift_max:.3g} > {plan.max_output_drift:g}",
        ),
        (
            error_count > plan.max_error_count,
            f"errors: {error_count} > {plan.max_error_count}",
        ),
        (nan_count > plan.max_nan_count, f"NaN outputs: {nan_count} > {plan.max_nan_count}"),
        (
            production_error_count > 0 and not plan.exclude_production_failures,
            f"{PRODUCTION_FAILED} {production_error_count} request(s); nothing to compare",
        ),
        (
            growth > plan.max_memory_growth_bytes and memory_not_assessed_reason is None,
            f"memory: grew {growth} bytes > {plan.max_memory_growth_bytes}",
        ),
    ]
    breaches = [message for failed, message in checks if failed]
    return CanaryStepResult(
        step=step.name,
        traffic_fraction=step.traffic_fraction,
        n_candidate=int(cand.size),
        n_production=int(prod.size),
        served_by_candidate=None if served is None else int(served[0]),
        served_by_production=None if served is None else int(served[1]),
        latency_test=f"{plan.latency.test} ({plan.latency.alternative})",
        candidate_median_s=cand_med,
        production_median_s=prod_med,
        latency_assessed=latency_assessed,
        **lat,
        memory_not_assessed_reason=memory_not_assessed_reason,
        output_drift_max=drift_max,
        output_drift_p99=drift_p99,
        output_drift_nonfinite=nonfinite,
        error_count=error_count,
        nan_count=nan_count,
        production_error_count=production_error_count,
        production_failed_buckets={int(k): int(v) for k, v in
                                   (production_failed_buckets or {}).items()},
        memory_growth_bytes=growth,
        breaches=breaches,
        passed=not breaches,
        length_buckets=[int(b) for b in length_buckets or []] if lat.get("log_ratios") else [],
    )


def _legacy(cand: np.ndarray, prod: np.ndarray, plan: CanaryPlan,
            reason: str | None) -> dict:
    """The legacy unpaired Mann-Whitney U at the full alpha (stored registrations only)."""
    test = plan.latency
    reachable = smallest_p_value(int(cand.size), int(prod.size))
    u = p = cles = math.nan
    if min(cand.size, prod.size) < MIN_LATENCY_SAMPLES:
        reason = reason or (
            f"too few requests for the latency test (candidate {cand.size}, production "
            f"{prod.size}; {MIN_LATENCY_SAMPLES} each needed)")
    elif reachable >= test.alpha:
        # With these sample sizes no ordering of the latencies gives p < alpha: a test
        # that cannot fire must not count as assessed.
        reason = reason or (
            f"the latency test cannot reach alpha={test.alpha:g} with {cand.size} candidate "
            f"and {prod.size} production requests (smallest possible p {reachable:.3g})")
    else:
        res = stats.mannwhitneyu(cand, prod, alternative=test.alternative, method="auto")
        u, p = float(res.statistic), float(res.pvalue)
        cles = u / (cand.size * prod.size)
    ratio = (float(np.median(cand) / np.median(prod)) if cand.size and prod.size
             and np.median(prod) > 0 else None)
    slower = bool(p < test.alpha and (ratio or 0.0) >= test.min_slowdown_ratio)
    return {"alpha": test.alpha, "u_statistic": u, "p_value": p, "common_language_effect": cles,
            "median_latency_ratio": ratio, "latency_slower": slower,
            "latency_not_assessed_reason": reason,
            "breach": (f"latency: candidate slower than production (Mann-Whitney U one-sided "
                       f"p={p:.3g} < alpha={test.alpha:g}, median ratio {ratio:.3f} >= "
                       f"{test.min_slowdown_ratio:g})") if slower else None}


def _paired(step: CanaryStep, plan: CanaryPlan, abba: tuple | None,
            earlier: Sequence[CanaryStepResult], reason: str | None,
            buckets: Sequence[int] | None) -> dict:
    """The paired look of a canary step (see ``gates.canary_latency``)."""
    names = [s.name for s in plan.looks()]
    out = {"alpha": math.nan, "u_statistic": math.nan, "p_value": math.nan,
           "common_language_effect": math.nan, "median_latency_ratio": None,
           "latency_slower": False, "breach": None}
    if abba is not None:
        c = np.asarray(abba[0], dtype=np.float64).reshape(-1, 2)
        p = np.asarray(abba[1], dtype=np.float64).reshape(-1, 2)
        r = latency_judge.abba_log_ratios(c, p) if len(c) else np.zeros(0)
        out.update(candidate_timings_s=c.tolist(), production_timings_s=p.tolist(),
                   log_ratios=r.tolist(),
                   p99_latency_ratio=canary_latency.p99_ratio(c, p) if len(c) else None)
    if reason is None and step.name not in names:
        reason = SHADOW_NOT_LOOKED
    reason = reason or plan.power_problem()
    if reason is None and abba is None:
        reason = "the step was not timed ABBA (no paired samples)"
    if reason is not None:
        return {**out, "latency_not_assessed_reason": reason}
    index = names.index(step.name)
    look = canary_latency.step_look(plan, index, out["log_ratios"],
                                    [e.log_ratios for e in earlier], buckets,
                                    [e.length_buckets for e in earlier])
    r = np.asarray(out["log_ratios"])
    out.update(alpha=look.alpha, p_value=look.p_value, latency_slower=look.slower,
               latency_look=look, latency_not_assessed_reason=None,
               common_language_effect=float(np.mean(r > 0)) if r.size else math.nan,
               median_latency_ratio=float(np.exp(np.median(r))) if r.size else None)
    if look.slower:
        out["breach"] = (f"latency: candidate slower than production (signed-rank one-sided "
                         f"p={look.p_value:.3g} < alpha_k={look.alpha:.3g} on the {look.n_pairs} "
                         f"paired requests so far, median ratio {look.median_ratio:.3f}, H0 "
                         f"ratio <= {plan.latency.tolerated_slowdown_ratio:g})")
    tail = canary_latency.tail_breach(plan, out["p99_latency_ratio"] or math.nan,
                                      len(r), "")
    if tail:
        out["breach"] = f"{out['breach']}; {tail}" if out["breach"] else tail
    return out
