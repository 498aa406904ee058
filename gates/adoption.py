"""Adoption as a preregistered claim: a sequential, anytime-valid superiority test.

"Not slower" (the latency judge) makes a kernel safe; adopting it needs evidence that it
is *faster by enough to be worth it* than the simplest credible alternative. This module
judges that claim on paired per-request log ratios ``r = log(candidate / baseline)``
(seconds over seconds), looking after every pair if the caller likes, with its error
rates holding at every look (anytime-valid), so a canary may stop as soon as the data
decide.

Effect. ``d = -r`` (positive: the candidate is faster). The preregistered minimum
worthwhile effect is a ratio ``m < 1`` (``minimum_worthwhile_ratio``; e.g. 0.95: the
candidate takes at most 95 % of the baseline's time), i.e. ``delta = -log(m)``. The test
is about the *median* of ``d`` (a paired request's typical effect): timing noise is
heavy-tailed (a page fault, a host hiccup), and a statistic of signs is exact whatever
the tails (no variance to estimate, no normality).

Test. For a value ``theta`` of the median, the signs ``B_i = 1{d_i > theta}`` are
Bernoulli with ``P(B_i = 1) <= 1/2`` whenever the true median is ``<= theta`` (pairs
independent given the arrivals). ``S_n = sum(B_i) - n/2`` then has 1/2-sub-Gaussian
increments (Hoeffding), and for every ``lambda >= 0`` ``exp(lambda S_n - lambda^2 n/8)``
is a non-negative supermartingale. Mixing ``lambda`` over a half-normal of precision
``rho`` (the preregistered mixture parameter) gives the one-sided normal-mixture
e-process (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Ann. Statist. 2021, one-sided
normal mixture), in closed form with ``V = n/4``::

    E_n(theta) = 2 sqrt(rho / (V + rho)) exp(S^2 / (2 (V + rho))) Phi(S / sqrt(V + rho))

By Ville's inequality ``P(sup_n E_n >= 1/alpha) <= alpha`` under the null, so
``p_n = min(1, 1 / max_{t<=n} E_t)`` is an always-valid p-value and the mixture
sequential probability ratio test (mSPRT) of Johari, Koomen, Pekelis & Walsh, "Always
Valid Inference: Continuous Monitoring of A/B Tests", Operations Research 70(3), 2022
(arXiv:1512.04922, 2015/2017) rejects when ``p_n <= alpha``; here with the signs as data
(the nonparametric form Howard et al. give for bounded observations). The same
boundary, read for every ``theta`` at once, is a confidence sequence for the median
effect: with ``k*(n)`` the fewest signs that reach ``1/alpha``, the lower bound is the
``k*(n)``-th largest ``d`` seen, the upper bound (the mirror test) the ``k*(n)``-th
smallest; both are kept as running intersections (valid, since the coverage holds at
every ``n`` simultaneously).

The pairs must be independent (or at least each sign a fair coin given the past under
the null): times to result in one queue are not (a slow batch delays every request
behind it), so the pairs fed here are compute times measured paired and order-balanced
(as the latency judge's ABBA pairs are), not queue-inclusive times.

Decision per look (first one reached ends the test):

* ``not_worth_it``: the upper bound of the median effect is below ``delta``: confident
  the candidate gains less than the minimum worthwhile effect (possibly faster, but not
  by enough). Error: ``P(not_worth_it | median >= delta) <= alpha``.
* ``adopt``: the lower bound is above ``theta0 = -log(null_ratio)`` (default
  ``null_ratio`` 1: H0 "not faster at all", rejected at ``alpha``) and the upper bound
  still reaches ``delta``. Error: ``P(adopt | median <= theta0) <= alpha`` (A/A false
  adoption), and the power is stated at the minimum worthwhile effect. The null cannot
  be "faster by less than the minimum worthwhile effect" *and* have power at that same
  effect (at the boundary of a one-sided null the rejection rate is alpha, not the
  power); ``null_ratio`` between ``minimum_worthwhile_ratio`` and 1 is the
  indifference-zone form of that stricter claim (Wald, *Sequential Analysis*, 1947).
* ``inconclusive``: ``max_pairs`` reached with neither; never silently promoted.

Power is sized by simulation (``gates.adoption_power``: ``adoption_power``,
``pairs_for_adoption_power``; the vectorised simulation there is checked against
:func:`judge`):
the signs' rate under the planted effect ``delta`` is ``Phi(delta / noise_sd)`` under
normal log-ratio noise of the preregistered ``noise_sd`` (the most noise the plan is
valid for, as in the latency judge), so the simulation needs no other assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernels.errors import KernelgateError

Decision = Literal["adopt", "not_worth_it", "inconclusive", "continue"]


class AdoptionInputError(KernelgateError, ValueError):
    """Log ratios the adoption test cannot judge (not finite, wrong shape)."""


class AdoptionPlan(BaseModel):
    """The preregistered inputs of the adoption test (frozen; checked on construction).

    Ratios are candidate time over baseline time (dimensionless; < 1 is faster).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(0.05, gt=0.0, lt=0.5,
                         description="false adoption (and false not-worth-it) at any look")
    minimum_worthwhile_ratio: float = Field(
        0.95, gt=0.0, lt=1.0, description="the smallest speed-up worth adopting, as a ratio")
    null_ratio: float = Field(
        1.0, gt=0.0, le=1.0,
        description="adoption's H0: median ratio >= this (1: not faster at all)")
    power: float = Field(0.8, gt=0.0, lt=1.0,
                         description="adoption rate wanted at the minimum worthwhile effect")
    noise_sd: float = Field(0.1, gt=0.0, allow_inf_nan=False,
                            description="sd of per-pair log ratios the power is sized for")
    max_pairs: int = Field(1000, ge=2, le=1_000_000,
                           description="pairs after which the test ends inconclusive")
    mixture_rho: float = Field(
        25.0, gt=0.0, allow_inf_nan=False,
        description="precision of the half-normal mixture over lambda, in pair units "
                    "(tightest near n = 4 rho pairs; see tuned_rho)")

    @model_validator(mode="after")
    def _indifference_zone(self) -> AdoptionPlan:
        if not self.minimum_worthwhile_ratio < self.null_ratio:
            raise ValueError(
                f"minimum_worthwhile_ratio ({self.minimum_worthwhile_ratio}) must be below "
                f"null_ratio ({self.null_ratio}): power at the minimum worthwhile effect needs "
                "an adoption null that is strictly less of a speed-up")
        return self

    @property
    def delta(self) -> float:
        """The minimum worthwhile effect as a log speed-up ``-log(m)`` (> 0)."""
        return -math.log(self.minimum_worthwhile_ratio)

    @property
    def theta0(self) -> float:
        """Adoption's null boundary as a log speed-up ``-log(null_ratio)`` (>= 0)."""
        return -math.log(self.null_ratio)


class AdoptionLook(BaseModel):
    """The test after ``n`` pairs. Ratios are candidate/baseline (< 1: faster).
    An unbounded side is infinite (``"Infinity"`` in JSON, read back as such)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    n: int
    median_ratio: float = Field(description="median of the n pairs' ratios")
    e_value: float = Field(description="adoption e-process at the null (>= 1/alpha adopts)")
    p_value: float = Field(description="always-valid p-value of adoption's null, min(1, 1/max e)")
    e_value_not_worth_it: float = Field(description="e-process of 'median >= minimum worthwhile'")
    ratio_lower: float = Field(description="confidence sequence of the median ratio: lower bound")
    ratio_upper: float = Field(description="upper bound (inf while no bound is reached)")
    decision: Decision


class AdoptionResult(BaseModel):
    """Every requested look and the verdict: the first look that decided, else
    ``inconclusive`` at ``max_pairs`` or ``continue`` while data are still coming."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    plan: AdoptionPlan
    looks: list[AdoptionLook]
    decision: Decision
    decided_at: int | None = Field(description="pairs at the deciding look, None if none")


def _log_e(s: np.ndarray, v: np.ndarray, rho: float) -> np.ndarray:
    """log of the one-sided normal-mixture e-process at centred count ``s``, variance ``v``."""
    # here, not at the top: the thresholds schema imports this module (the decision:
    # section), and the CLI's argument checks must not pay for scipy
    from scipy.special import log_ndtr

    w = v + rho
    return math.log(2.0) + 0.5 * np.log(rho / w) + s * s / (2.0 * w) + log_ndtr(s / np.sqrt(w))


def sign_boundary(n: np.ndarray | Sequence[int] | int, alpha: float, rho: float) -> np.ndarray:
    """``k*(n)``: the fewest signs ``sum 1{d_i > theta}`` among ``n`` pairs at which the
    e-process reaches ``1/alpha`` (``n + 1`` where none does).

    Args:
        n: pair counts, int array of any shape (>= 1).
        alpha: level in (0, 1).
        rho: mixture precision (> 0).

    Returns:
        int64 array shaped like ``n``.
    """
    n = np.asarray(n, dtype=np.int64)
    v = n / 4.0
    target = -math.log(alpha)
    lo, hi = np.zeros(n.shape), np.maximum(n / 2.0, 1.0) + 1.0
    for _ in range(60):  # bisection on S (the e-process increases with S)
        mid = (lo + hi) / 2.0
        up = _log_e(mid, v, rho) >= target
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    k = np.ceil(n / 2.0 + hi - 1e-9).astype(np.int64)
    # the exact count: step down while the count below still reaches the target
    below = _log_e(k - 1 - n / 2.0, v, rho) >= target
    k = np.where(below, k - 1, k)
    return np.minimum(k, n + 1)


def _bounds(d: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running lower/upper confidence bounds of the median of ``d`` (``[runs, n]``) at
    every prefix: the ``k``-th largest and ``k``-th smallest of the prefix."""
    runs, n = d.shape
    lower = np.full((runs, n), -np.inf)
    upper = np.full((runs, n), np.inf)
    for t in range(n):
        kt = int(k[t])
        if kt > t + 1:
            continue
        prefix = d[:, : t + 1]
        lower[:, t] = np.partition(prefix, t + 1 - kt, axis=1)[:, t + 1 - kt]
        upper[:, t] = np.partition(prefix, kt - 1, axis=1)[:, kt - 1]
    return np.maximum.accumulate(lower, axis=1), np.minimum.accumulate(upper, axis=1)


def judge(plan: AdoptionPlan, log_ratios: Sequence[float] | np.ndarray,
          looks: Sequence[int] | None = None) -> AdoptionResult:
    """Run the adoption test on paired log ratios ``r = log(candidate / baseline)``.

    Args:
        plan: the preregistered inputs.
        log_ratios: float ``[n]`` in pair order (dimensionless); pairs past
            ``plan.max_pairs`` are ignored.
        looks: pair counts at which to report a look (default every pair); the decision
            is taken at the first *reported* look that reaches a bound (looking more
            often is allowed: the guarantees hold at every look).

    Returns:
        :class:`AdoptionResult`; its decision is ``continue`` when no bound was reached
        and fewer than ``max_pairs`` pairs have been seen.

    Raises:
        AdoptionInputError: a non-finite log ratio, not a 1-D sequence, or a look
            outside ``[1, n]``.
    """
    r = np.asarray(log_ratios, dtype=np.float64)
    if r.ndim != 1:
        raise AdoptionInputError(f"log_ratios must be 1-D, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise AdoptionInputError(f"log_ratios must be finite: {int(np.sum(~np.isfinite(r)))} "
                                 "are not (an errored request is the safety test's, not this)")
    r = r[: plan.max_pairs]
    n = r.size
    points = list(range(1, n + 1)) if looks is None else sorted(set(looks))
    if points and not 1 <= points[0] <= points[-1] <= n:
        raise AdoptionInputError(f"looks must lie in [1, {n}], got {points[0]}..{points[-1]}")
    d = -r
    k = sign_boundary(np.arange(1, n + 1), plan.alpha, plan.mixture_rho)
    lower, upper = (b[0] for b in _bounds(d[None, :], k)) if n else (np.empty(0),) * 2
    cum_above = np.cumsum(d > plan.theta0)
    cum_below = np.cumsum(d < plan.delta)
    steps = np.arange(1, n + 1)
    log_e = _log_e(cum_above - steps / 2.0, steps / 4.0, plan.mixture_rho)
    log_e_nwi = _log_e(cum_below - steps / 2.0, steps / 4.0, plan.mixture_rho)
    best = np.maximum.accumulate(log_e) if n else log_e
    out, decision, decided_at = [], "continue", None
    for t in points:
        i = t - 1
        verdict: Decision = "continue"
        if decision == "continue":
            if upper[i] < plan.delta:
                verdict = "not_worth_it"
            elif lower[i] > plan.theta0:
                verdict = "adopt"
            elif t >= plan.max_pairs:
                verdict = "inconclusive"
            if verdict != "continue":
                decision, decided_at = verdict, t
        out.append(AdoptionLook(
            n=t, median_ratio=float(np.exp(-np.median(d[:t]))),
            e_value=float(np.exp(min(log_e[i], 700.0))),
            p_value=float(min(1.0, np.exp(-best[i]))),
            e_value_not_worth_it=float(np.exp(min(log_e_nwi[i], 700.0))),
            ratio_lower=float(np.exp(-upper[i])), ratio_upper=float(np.exp(-lower[i])),
            decision=decision))
    return AdoptionResult(plan=plan, looks=out, decision=decision, decided_at=decided_at)
