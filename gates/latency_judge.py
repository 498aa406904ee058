"""The canary's latency judge: paired, alpha-spending across steps, with preregistered power.

Measurement (``evaluation.serving``): every compared request is timed on both sides
back to back, in ABBA order (candidate, production, production, candidate; the mirror
image on the next request), so a linear drift of the host's speed within a request
cancels. A request's statistic is its log ratio
``r = log((c1 + c2) / (p1 + p2))`` (seconds over seconds: dimensionless).

Test: H0 "the candidate is not slower" (median ``r <= 0``) against H1 "slower"
(median ``r > 0``). Canary step ``k`` looks at the pairs of steps ``1..k`` together
with the one-sided Wilcoxon signed-rank test (``scipy.stats.wilcoxon``; exact below 50
pairs) at ``alpha_k``. The ``alpha_k`` are fixed by the plan before any data is seen
(alpha spending with Bonferroni weights, ``sum(alpha_k) = alpha``), so by the union
bound the chance that an identical kernel is rolled back at *any* step is at most
``alpha``, however the looks are correlated.

Power: at the last look, with ``n`` pairs, a true slowdown ratio ``rho`` and
per-request log-ratio noise ``sigma`` (normal), the signed-rank test's power is about
``Phi(sqrt(3 n / pi) * log(rho) / sigma - z(1 - alpha_K))`` (Lehmann, *Nonparametrics*,
1975: the signed-rank test's asymptotic relative efficiency to the t-test is ``3/pi``
at the normal). The plan states ``rho`` (``min_slowdown_ratio``), ``sigma``
(``noise_sd``, the most noise it is valid for) and the power; a plan whose sizes
cannot reach that power is refused when the thresholds are loaded. A canary that ends
without a rejection is *passed* only if it had the pairs the plan needs and its
measured noise (``1.4826 * MAD`` of ``r``, robust to outliers) was within the plan's;
otherwise it is *inconclusive* (too few samples, or too noisy), and the plan's policy
says what that does.

A/A calibration (Kohavi, Tang & Xu, *Trustworthy Online Controlled Experiments*, 2020,
ch. 19) checks the premise on the serving device: production against itself through
the same path must be rolled back at no more than ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict

_NORMAL = NormalDist()
"""The standard normal (stdlib: the power arithmetic is needed wherever a thresholds file
is loaded, the CLI's argument checks included, and ``scipy.stats`` takes seconds to
import; the signed-rank test itself imports it where it runs)."""

Verdict = Literal["fail", "pass", "inconclusive"]
MAD_TO_SD = 1.4826
"""``sd = 1.4826 * MAD`` for a normal distribution (the consistency constant)."""


def spend_alpha(alpha: float, weights: Sequence[float]) -> list[float]:
    """Split ``alpha`` over the looks in proportion to ``weights`` (e.g. the requests
    each step adds); the parts sum to ``alpha`` (Bonferroni alpha spending).

    Raises:
        ValueError: ``alpha`` outside (0, 1), no weights, or a weight that is not
            positive and finite.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"alpha-spending weights must be positive and finite, got {list(weights)}")
    return [float(alpha * x / w.sum()) for x in w]


def signed_rank_power(n_pairs: int, alpha: float, slowdown_ratio: float,
                      noise_sd: float) -> float:
    """Approximate power of the one-sided signed-rank test at level ``alpha`` with
    ``n_pairs`` pairs against a true slowdown ``slowdown_ratio`` (> 1) under normal
    log-ratio noise of standard deviation ``noise_sd`` (see the module docstring).
    0 when the exact test cannot reach ``alpha`` at all (``2**-n_pairs >= alpha``).

    Raises:
        ValueError: a non-positive ``noise_sd`` or a ``slowdown_ratio`` that is not > 1.
    """
    if noise_sd <= 0 or not math.isfinite(noise_sd):
        raise ValueError(f"noise_sd must be positive and finite, got {noise_sd}")
    if not slowdown_ratio > 1.0:
        raise ValueError(f"slowdown_ratio must be > 1, got {slowdown_ratio}")
    if n_pairs < 1 or 2.0 ** -n_pairs >= alpha:
        return 0.0
    effect = math.sqrt(3.0 * n_pairs / math.pi) * math.log(slowdown_ratio) / noise_sd
    return float(_NORMAL.cdf(effect - _NORMAL.inv_cdf(1.0 - alpha)))


def pairs_for_power(alpha: float, slowdown_ratio: float, noise_sd: float,
                    power: float) -> int:
    """The fewest pairs for which :func:`signed_rank_power` reaches ``power``.

    Raises:
        ValueError: ``power`` outside (0, 1), or the arguments of :func:`signed_rank_power`.
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    z = _NORMAL.inv_cdf(1.0 - alpha) + _NORMAL.inv_cdf(power)
    n = max(1, math.ceil(math.pi / 3.0 * (z * noise_sd / math.log(slowdown_ratio)) ** 2))
    while signed_rank_power(n, alpha, slowdown_ratio, noise_sd) < power:
        n += 1
    return n


def powered_noise_sd(n_pairs: int, alpha: float, slowdown_ratio: float, power: float) -> float:
    """The largest log-ratio noise sd at which ``n_pairs`` pairs at level ``alpha`` still
    reach ``power`` against ``slowdown_ratio`` (the inverse of :func:`signed_rank_power` in
    ``noise_sd``; 0 when the exact test cannot reach ``alpha`` with ``n_pairs``).

    Raises:
        ValueError: ``power`` outside (0, 1) or a ``slowdown_ratio`` that is not > 1.
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if not slowdown_ratio > 1.0:
        raise ValueError(f"slowdown_ratio must be > 1, got {slowdown_ratio}")
    if n_pairs < 1 or 2.0 ** -n_pairs >= alpha:
        return 0.0
    z = _NORMAL.inv_cdf(1.0 - alpha) + _NORMAL.inv_cdf(power)
    return float(math.sqrt(3.0 * n_pairs / math.pi) * math.log(slowdown_ratio) / z)


def abba_log_ratios(candidate_s: ArrayLike, production_s: ArrayLike) -> np.ndarray:
    """Per-request log ratios from ABBA timings.

    Args:
        candidate_s, production_s: ``[n_requests, 2]`` float seconds, the two timings
            of each side within one request (any order; their sum is what counts).

    Returns:
        ``[n_requests]`` float64 ``log(sum(candidate) / sum(production))``.

    Raises:
        ValueError: shapes differ or are not ``[n, 2]``, or a timing is not positive
            and finite.
    """
    c = np.asarray(candidate_s, dtype=np.float64)
    p = np.asarray(production_s, dtype=np.float64)
    if c.shape != p.shape or c.ndim != 2 or c.shape[1] != 2:
        raise ValueError(f"ABBA timings must both be [n, 2], got {c.shape} and {p.shape}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(p)) and np.all(c > 0)
            and np.all(p > 0)):
        raise ValueError("ABBA timings must be positive and finite (seconds)")
    return np.log(c.sum(axis=1) / p.sum(axis=1))


def robust_sd(log_ratios: ArrayLike) -> float:
    """``1.4826 * median(|r - median(r)|)``: the log ratios' spread, robust to the few
    outliers a shared host produces (NaN for fewer than 2 values)."""
    r = np.asarray(log_ratios, dtype=np.float64)
    if r.size < 2:
        return math.nan
    return float(MAD_TO_SD * np.median(np.abs(r - np.median(r))))


def within_bucket_sd(log_ratios: ArrayLike, buckets: Sequence[int]) -> float:
    """:func:`robust_sd` of the log ratios about their own length bucket's median: the
    noise about each bucket's effect, without the spread between the buckets' effects. A
    bucket with one ratio adds nothing (its residual is 0 by construction). NaN for fewer
    than 2 residuals.

    Raises:
        ValueError: not one bucket per log ratio.
    """
    r = np.asarray(log_ratios, dtype=np.float64)
    b = np.asarray(buckets)
    if r.shape != b.shape:
        raise ValueError(f"{b.size} buckets for {r.size} log ratios: one per compared request")
    residuals = [r[b == k] - np.median(r[b == k]) for k in np.unique(b) if np.sum(b == k) >= 2]
    return robust_sd(np.concatenate(residuals)) if residuals else math.nan


class LatencyLook(BaseModel):
    """One look of the test: the pairs of every step so far, at this step's alpha."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    step: str
    n_pairs: int
    alpha: float
    p_value: float
    median_ratio: float
    noise_sd: float
    slower: bool


def look(step: str, log_ratios: ArrayLike, alpha: float) -> LatencyLook:
    """Test the cumulative ``log_ratios`` (1-D, float) at ``alpha``.

    ``slower`` is True when the one-sided signed-rank p-value is below ``alpha``; with
    no pairs, or only zero differences, ``p = 1``.

    Raises:
        ValueError: ``log_ratios`` not 1-D or not finite.
    """
    r = np.asarray(log_ratios, dtype=np.float64)
    if r.ndim != 1 or not np.all(np.isfinite(r)):
        raise ValueError("log ratios must be a finite 1-D array")
    from scipy import stats  # here: seconds to import, needed only where a look is taken

    nonzero = r[r != 0.0]
    p = 1.0 if nonzero.size == 0 else float(
        stats.wilcoxon(nonzero, alternative="greater").pvalue)
    median = float(np.exp(np.median(r))) if r.size else math.nan
    return LatencyLook(step=step, n_pairs=int(r.size), alpha=alpha, p_value=p,
                       median_ratio=median, noise_sd=robust_sd(r), slower=p < alpha)


def conclude(looks: Sequence[LatencyLook], *, required_pairs: int,
             noise_sd: float) -> tuple[Verdict, str]:
    """The canary's latency verdict from its looks (in step order).

    ``fail`` at the first look that found the candidate slower; otherwise ``pass``
    when the last look had at least ``required_pairs`` pairs and measured noise at most
    ``noise_sd``; otherwise ``inconclusive``, saying which premise failed.

    Raises:
        ValueError: no looks.
    """
    if not looks:
        raise ValueError("no latency looks to conclude from")
    for item in looks:
        if item.slower:
            return "fail", (f"latency: candidate slower at {item.step} (signed-rank p="
                            f"{item.p_value:.3g} < alpha_k={item.alpha:.3g}, median ratio "
                            f"{item.median_ratio:.3f}, {item.n_pairs} pairs)")
    last = looks[-1]
    if last.n_pairs < required_pairs:
        return "inconclusive", (f"latency: {last.n_pairs} pairs, the plan needs "
                                f"{required_pairs} for its power: too few samples")
    if not last.noise_sd <= noise_sd:
        return "inconclusive", (f"latency: measured noise sd {last.noise_sd:.3g} exceeds the "
                                f"plan's {noise_sd:.3g}: too noisy for its power")
    return "pass", (f"latency: not slower ({last.n_pairs} pairs, median ratio "
                    f"{last.median_ratio:.3f}, noise sd {last.noise_sd:.3g})")


def measured_power(item: LatencyLook, slowdown_ratio: float) -> float:
    """The power ``item``'s test had against ``slowdown_ratio`` at the noise it measured
    (:func:`signed_rank_power` with the look's pairs, alpha and robust sd; 1 where every
    log ratio was equal, 0 with fewer than 2 pairs)."""
    if math.isnan(item.noise_sd) or item.n_pairs < 2:
        return 0.0
    if item.noise_sd <= 0.0:
        return 1.0 if 2.0 ** -item.n_pairs < item.alpha else 0.0
    return signed_rank_power(item.n_pairs, item.alpha, slowdown_ratio, item.noise_sd)


def conclude_powered(looks: Sequence[LatencyLook], *, power: float,
                     slowdown_ratio: float) -> tuple[Verdict, str]:
    """The latency verdict of a sequential plan (one with an extension) from its looks.

    ``fail`` at the first look that found the candidate slower; otherwise ``pass`` when the
    last look's power at its *measured* noise (:func:`measured_power`) reaches ``power``;
    otherwise ``inconclusive``, saying how far it fell short and the pairs the measured
    noise needs. With this rule the stated power holds for the noise the canary had, not
    only for the noise the plan was sized for.

    Raises:
        ValueError: no looks.
    """
    if not looks:
        raise ValueError("no latency looks to conclude from")
    for item in looks:
        if item.slower:
            return "fail", (f"latency: candidate slower at {item.step} (signed-rank p="
                            f"{item.p_value:.3g} < alpha_k={item.alpha:.3g}, median ratio "
                            f"{item.median_ratio:.3f}, {item.n_pairs} pairs)")
    last = looks[-1]
    reached = measured_power(last, slowdown_ratio)
    if reached >= power:
        return "pass", (f"latency: not slower ({last.n_pairs} pairs, median ratio "
                        f"{last.median_ratio:.3f}, noise sd {last.noise_sd:.3g}: power "
                        f"{reached:.3f} at the measured noise)")
    needs = (f"; at that noise the last look needs "
             f"{pairs_for_power(last.alpha, slowdown_ratio, last.noise_sd, power)} pairs"
             if last.noise_sd > 0 and not math.isnan(last.noise_sd) else "")
    return "inconclusive", (f"latency: {last.n_pairs} pairs at measured noise sd "
                            f"{last.noise_sd:.3g} give power {reached:.3f} < {power:g}{needs}: "
                            "too noisy for its power")
