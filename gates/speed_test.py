"""A speed change criterion judged as a test on the interleaved per-repeat latencies.

The point-estimate rule compares the candidate's quantile metric with the reference's
(e.g. p99 over p99); on a 2-core CPU the "p99" of 10 calls is their maximum, so the
ratio of two maxima is mostly the host's noise and rejects an identical kernel often.

``paired_permutation`` instead tests, one-sided at the criterion's ``alpha``,

    H0: candidate quantile <= max_regression x reference quantile   (the criterion holds)
    H1: the candidate is slower than that                             (it is violated)

and fails only when H1 is shown. The statistic is the report's own estimate: the mean
over shapes of ``log(Q_q(candidate / max_regression) / Q_q(reference))``, i.e. the log
of the ratio of the two geometric-mean quantile metrics with the bound divided out.
``evaluation.performance`` interleaves the implementations' calls (same shape, same
repeat index: the same moment of the machine's noise), so the two calls of a pair are
exchangeable when the candidate is exactly ``max_regression`` times the reference (a
multiplicative shift). Under that H0 swapping the two members of any pair leaves the
data's distribution unchanged, and the randomization test over those swaps is exact:
``scipy.stats.permutation_test(permutation_type="samples")`` (paired swaps; its
Monte-Carlo p-value is the conservative ``(1 + #) / (1 + R)`` of Phipson & Smyth 2010),
with a fixed seed so one report always gets the same decision. A smaller slowdown
rejects less often, so an identical kernel fails with probability well below ``alpha``.
References: Fisher (1935) randomization test for paired data; Good, *Permutation,
Parametric and Bootstrap Tests of Hypotheses* (2005), ch. 3.

The test states its uncertainty honestly at any sample size: at 10 calls a shape the p99
is the maximum, whose null distribution is wide, so the test rarely shows a tail
regression (its power is stated in BENCHMARKS.md, "Gate speed criteria on a busy host")
but never rejects an identical kernel for a draw of the noise. The reason gives the
estimate and its one-sided ``1 - alpha`` lower confidence bound: the test inverted, the
smallest ratio ``r`` whose H0 "ratio <= r" the data do not reject (found by bisection
with the same swaps): a bound above ``max_regression`` goes with a failure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAIRED_PERMUTATION = "paired_permutation"
RESAMPLES = 9999
MIN_ALPHA = 1.0 / (RESAMPLES + 1)
"""The smallest level a registered paired test may have: below it no data could reject
(the Monte Carlo p-value is at least ``1 / (RESAMPLES + 1)``)."""
BOUND_STEPS = 14
"""Bisection steps of the confidence bound (0: no bound; simulations of many gates)."""
SEED = 20261205
SPEED_FAMILY_ALPHA = 0.05
"""The most a platform's tested criteria may spend together: an identical kernel passes
all of them in at least 19 of 20 rollouts (Bonferroni: the sum of their alphas)."""
QUANTILE_OF = {"latency.p50_s": 50.0, "latency.p95_s": 95.0, "latency.p99_s": 99.0}
"""The metrics a paired test can judge: quantiles of the per-repeat latencies."""


@dataclass(frozen=True)
class SpeedTest:
    """The outcome of one paired test (ratios are candidate / reference, >1 slower)."""

    estimate: float
    lower_bound: float | None
    p_value: float
    alpha: float
    max_ratio: float
    pairs: int
    shapes: int
    quantile: float
    can_reject: bool = True
    """False when even the most extreme data could not reach ``alpha`` with these pairs
    (:func:`smallest_p_value`): the test then judges nothing."""
    smallest_p: float = 0.0

    @property
    def rejected(self) -> bool:
        """True when the slowdown beyond ``max_ratio`` is shown at ``alpha``."""
        return self.p_value < self.alpha

    def words(self, metric: str, against: str) -> str:
        if not self.can_reject:
            return (f"{metric}: the paired permutation test cannot show a slowdown at alpha "
                    f"{self.alpha:g} with {self.pairs} pair{'s' if self.pairs != 1 else ''} "
                    f"over {self.shapes} shape{'s' if self.shapes != 1 else ''} (the "
                    f"smallest p-value it can reach is {self.smallest_p:.3g}): not judged "
                    f"(candidate/{against} ratio {self.estimate:.3g}x); more repeats or "
                    "shapes are needed")
        """The reason a decision shows: the test, the estimate, its bound, p and alpha."""
        bound = ("" if self.lower_bound is None else
                 f", one-sided {100 * (1 - self.alpha):.4g}% lower confidence bound "
                 f"{self.lower_bound:.3g}x")
        verdict = ("shown slower than allowed" if self.rejected
                   else "not shown slower than allowed")
        return (f"{metric}: paired permutation test (scipy.stats.permutation_test, "
                f"within-pair swaps of {self.pairs} interleaved calls over {self.shapes} "
                f"shape{'s' if self.shapes != 1 else ''}, p{self.quantile:g} per shape): candidate/{against} ratio "
                f"{self.estimate:.3g}x{bound}; H0 ratio <= {self.max_ratio:g}: "
                f"p = {self.p_value:.3g} {'<' if self.rejected else '>='} alpha "
                f"{self.alpha:g}: {verdict}")


def _arrays(samples: Sequence[Sequence[float]], side: str) -> list[np.ndarray]:
    out = [np.asarray(s, dtype=float) for s in samples]
    if not out or any(a.ndim != 1 or a.size == 0 for a in out):
        raise ValueError(f"{side}: per-shape latencies must be non-empty 1-D")
    if any(not np.all(np.isfinite(a)) or np.any(a <= 0) for a in out):
        raise ValueError(f"{side}: latencies must be finite and positive")
    return out


def _statistic_for(sizes: list[int], q: float):
    edges = np.cumsum([0, *sizes])

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
        logs = [np.log(np.percentile(x[..., a:b], q, axis=-1))
                - np.log(np.percentile(y[..., a:b], q, axis=-1))
                for a, b in zip(edges[:-1], edges[1:], strict=True)]
        return np.mean(logs, axis=0)

    return statistic


def _p_value(cand: np.ndarray, ref: np.ndarray, ratio: float, statistic,
             resamples: int) -> float:
    # here, not at the top: the thresholds schema imports this module's names, and
    # scipy.stats takes seconds to import, which the CLI's argument checks must not pay
    import scipy.stats

    result = scipy.stats.permutation_test(
        (cand / ratio, ref), statistic, permutation_type="samples", alternative="greater",
        n_resamples=resamples, vectorized=True, rng=np.random.default_rng(SEED))
    return float(result.pvalue)


def smallest_p_value(pairs: int, resamples: int | None = None) -> float:
    """The smallest p-value the paired test can report with ``pairs`` pairs: every
    within-pair swap enumerated when there are at most ``resamples`` of them (``2**pairs``:
    the observed assignment is one, so p >= ``2**-pairs``), else ``1 / (resamples + 1)``
    (the Monte Carlo p-value of ``scipy.stats.permutation_test``). A criterion whose
    ``alpha`` is at or below it can never fail: :func:`paired_quantile_test` then says so
    instead of testing."""
    resamples = RESAMPLES if resamples is None else resamples
    if pairs < 1:
        return 1.0
    return 2.0 ** -pairs if pairs < 64 and 2 ** pairs <= resamples else 1.0 / (resamples + 1)


def paired_quantile_test(candidate: Sequence[Sequence[float]],
                         reference: Sequence[Sequence[float]], *, quantile: float,
                         max_ratio: float, alpha: float, resamples: int | None = None,
                         bound_steps: int | None = None) -> SpeedTest:
    """Test whether the candidate's ``quantile`` latency exceeds ``max_ratio`` times the
    reference's (see the module docstring).

    Args:
        candidate, reference: per shape, the timed latencies in call order; call ``i`` of
            one shape is paired with call ``i`` of the other (the same repeat).
        quantile: percentile in [0, 100] (``np.percentile``, linear, as the report's).
        max_ratio: the criterion's ``max_regression`` (H0: ratio <= max_ratio).
        alpha: the criterion's one-sided level.
        resamples: swaps drawn (default ``RESAMPLES``).
        bound_steps: bisection steps inverting the test for the lower confidence bound
            (default ``BOUND_STEPS``; 0 leaves the bound out).

    Raises:
        ValueError: no shapes, shapes of different counts, unpaired lengths, or a latency
            that is not finite and positive.
    """
    cands, refs = _arrays(candidate, "candidate"), _arrays(reference, "reference")
    if len(cands) != len(refs) or any(a.size != b.size for a, b in zip(cands, refs,
                                                                        strict=True)):
        raise ValueError("candidate and reference need the same calls per shape (pairs)")
    if not (0 < alpha < 1 and max_ratio > 0):
        raise ValueError(f"need 0 < alpha < 1 and max_ratio > 0, got {alpha}, {max_ratio}")
    resamples = RESAMPLES if resamples is None else resamples
    steps = BOUND_STEPS if bound_steps is None else bound_steps
    statistic = _statistic_for([a.size for a in cands], quantile)
    cand, ref = np.concatenate(cands), np.concatenate(refs)
    estimate = float(np.exp(statistic(cand, ref)))
    floor = smallest_p_value(int(cand.size), resamples)
    if floor >= alpha:  # no data could reject: not a pass, and no bound to report
        return SpeedTest(estimate=estimate, lower_bound=None, p_value=1.0, alpha=alpha,
                         max_ratio=max_ratio, pairs=int(cand.size), shapes=len(cands),
                         quantile=quantile, can_reject=False, smallest_p=floor)
    p_value = _p_value(cand, ref, max_ratio, statistic, resamples)
    bound = _lower_bound(cand, ref, estimate, alpha, statistic, resamples, steps) if (
        steps > 0) else None
    return SpeedTest(estimate=estimate, lower_bound=bound, p_value=p_value, alpha=alpha,
                     max_ratio=max_ratio, pairs=int(cand.size), shapes=len(cands),
                     quantile=quantile, smallest_p=floor)


def _lower_bound(cand: np.ndarray, ref: np.ndarray, estimate: float, alpha: float,
                 statistic, resamples: int, steps: int = 14) -> float:
    """The smallest ratio the test at ``alpha`` does not reject (bisection on log ratio
    between a ratio it rejects and the estimate, which it never rejects)."""
    spread = float(np.log(np.max(cand) / np.min(cand)) + np.log(np.max(ref) / np.min(ref)))
    low, high = math.log(estimate) - spread - 1.0, math.log(estimate)
    if _p_value(cand, ref, math.exp(low), statistic, resamples) >= alpha:
        return math.exp(low)
    for _ in range(steps):
        mid = (low + high) / 2
        if _p_value(cand, ref, math.exp(mid), statistic, resamples) < alpha:
            low = mid
        else:
            high = mid
    return math.exp(high)


def paired_latencies(performance: object, against: str
                     ) -> tuple[list[list[float]], list[list[float]]] | str:
    """Per shape, the candidate's and the ``against`` role's timed latencies from a
    report's ``performance`` (duck-typed ``evaluation.performance.PerformanceResult``),
    over the shapes every implementation ran (those the report's metrics aggregate);
    or, when they cannot be paired, why not."""
    shapes = getattr(performance, "shapes", None)
    if not shapes:
        return "the report carries no per-repeat latencies to pair"
    cand, ref = [], []
    for shape in shapes:
        runs = shape.implementations
        if "candidate" not in runs or against not in runs or not all(
                r.ok for r in runs.values()):
            continue
        a, b = list(runs["candidate"].latencies_s), list(runs[against].latencies_s)
        if not a or len(a) != len(b):
            return (f"{shape.shape.label}: {len(a)} candidate and {len(b)} {against} "
                    "latencies cannot be paired")
        cand.append(a)
        ref.append(b)
    if not cand:
        return f"no benchmark shape on which the candidate and {against} both ran"
    return cand, ref
