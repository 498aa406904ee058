"""Canary step analysis on synthetic, seeded latencies: the legacy unpaired test (stored
registrations); the paired test is in tests/test_gates_canary_paired.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from gates.canary import analyse_canary_step
from gates.canary_plan import CanaryPlan, CanaryStep, LatencyTest

ALPHA = 0.05
STEP = CanaryStep(name="canary-25pct", traffic_fraction=0.25, requests=400)
N_CANDIDATE, N_PRODUCTION = 100, 300


def _plan(min_slowdown_ratio: float = 1.0) -> CanaryPlan:
    return CanaryPlan(
        steps=[STEP],
        max_error_count=0,
        max_nan_count=0,
        max_output_drift=1e-3,
        latency=LatencyTest(test="mannwhitneyu", alpha=ALPHA, min_slowdown_ratio=min_slowdown_ratio),
        max_memory_growth_bytes=1 << 20,
    )


def _latencies(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    # right-skewed like real request latencies: lognormal around 10 ms, 30% spread
    return scale * rng.lognormal(mean=np.log(0.010), sigma=0.3, size=n)


def _clean_step(cand, prod, plan, **overrides):
    kwargs = dict(
        output_drift=np.full(cand.size, 1e-6),
        error_count=0,
        nan_count=0,
        memory_start_bytes=10_000_000,
        memory_end_bytes=10_000_000,
    )
    kwargs.update(overrides)
    return analyse_canary_step(STEP, cand, prod, plan=plan, **kwargs)


def test_twenty_percent_slowdown_is_rejected():
    rng = np.random.default_rng(20)
    prod = _latencies(rng, N_PRODUCTION)
    cand = _latencies(rng, N_CANDIDATE, scale=1.2)
    result = _clean_step(cand, prod, _plan(min_slowdown_ratio=1.05))
    assert result.latency_slower and not result.passed
    assert result.p_value < ALPHA
    assert result.median_latency_ratio == pytest.approx(1.2, abs=0.1)
    assert result.common_language_effect > 0.6  # most candidate requests slower
    assert len(result.breaches) == 1 and "latency" in result.breaches[0]
    # the reported statistic is scipy's, computed independently here
    expected = stats.mannwhitneyu(cand, prod, alternative="greater")
    assert result.p_value == pytest.approx(expected.pvalue)


def test_twenty_percent_slowdown_has_power_across_seeds():
    rejected = 0
    for seed in range(50):
        rng = np.random.default_rng(10_000 + seed)
        prod, cand = _latencies(rng, N_PRODUCTION), _latencies(rng, N_CANDIDATE, scale=1.2)
        rejected += _clean_step(cand, prod, _plan()).latency_slower
    # sigma 0.3, 100 vs 300 requests, a log-shift of 0.18: power is far above 0.95
    assert rejected >= 48


def test_faster_candidate_is_not_flagged():
    rng = np.random.default_rng(3)
    prod, cand = _latencies(rng, N_PRODUCTION), _latencies(rng, N_CANDIDATE, scale=0.8)
    result = _clean_step(cand, prod, _plan())
    assert result.passed and result.p_value > 0.5  # one-sided: faster is never "slower"


def test_identical_distributions_accepted_at_the_preregistered_level():
    seeds = range(200)
    raw_rejections = plan_rejections = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        prod, cand = _latencies(rng, N_PRODUCTION), _latencies(rng, N_CANDIDATE)
        raw_rejections += _clean_step(cand, prod, _plan()).latency_slower
        plan_rejections += _clean_step(cand, prod, _plan(min_slowdown_ratio=1.05)).latency_slower
    # A level-alpha test rejects ~Binomial(200, alpha) times (mean 10). Slack: allow up to
    # the 99.9% quantile of that binomial, so a correct test fails this < 0.1% of seed sets.
    slack = int(stats.binom.ppf(0.999, len(seeds), ALPHA))
    assert raw_rejections <= slack, (raw_rejections, slack)
    assert raw_rejections >= 1  # the test is not trivially conservative
    # With the preregistered practical threshold the canary accepts in >= 1 - alpha.
    assert len(seeds) - plan_rejections >= (1 - ALPHA) * len(seeds)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"error_count": 1}, "errors: 1 > 0"),
        ({"nan_count": 2}, "NaN outputs: 2 > 0"),
        ({"memory_end_bytes": 10_000_000 + (1 << 20) + 1}, "memory: grew"),
        ({"output_drift": np.r_[np.full(99, 1e-6), 5e-3]}, "max rel. L2 0.005"),
        ({"output_drift": np.r_[np.full(99, 1e-6), np.nan]}, "non-finite drift"),
    ],
)
def test_each_limit_breaches_alone(overrides, needle):
    rng = np.random.default_rng(7)
    prod, cand = _latencies(rng, N_PRODUCTION), _latencies(rng, N_CANDIDATE, scale=0.9)
    result = _clean_step(cand, prod, _plan(), **overrides)
    assert not result.passed
    assert len(result.breaches) == 1 and needle in result.breaches[0]


def test_memory_growth_at_the_limit_passes():
    rng = np.random.default_rng(8)
    prod, cand = _latencies(rng, N_PRODUCTION), _latencies(rng, N_CANDIDATE, scale=0.9)
    result = _clean_step(cand, prod, _plan(), memory_end_bytes=10_000_000 + (1 << 20))
    assert result.passed and result.memory_growth_bytes == 1 << 20


@pytest.mark.parametrize(
    "bad",
    [
        np.array([0.01, np.nan, 0.02]),
        np.array([[0.01, 0.02]]),
        np.array([-1.0, 0.01]),
    ],
)
def test_malformed_latencies_raise(bad):
    with pytest.raises(ValueError, match="latencies"):
        _clean_step(bad, np.array([0.01, 0.02, 0.03]), _plan())


def test_latency_not_assessed_cannot_breach_but_is_reported():
    """An interpreted candidate is slow by construction: the shipped (paired) plan's
    latency breaches on its ABBA timings, but the preregistered rule for non-native
    kernels keeps it from breaching, with the reason recorded."""
    from gates.canary import analyse_canary_step
    from gates.thresholds import load_thresholds

    plan = load_thresholds(Path(__file__).parents[1] / "thresholds" / "local-dry-run.yaml").canary
    rng = np.random.default_rng(7)
    prod = rng.lognormal(np.log(0.01), 0.1, 60)
    cand = prod * 50.0
    kwargs = dict(output_drift=np.full(60, 1e-6), error_count=0, nan_count=0,
                  memory_start_bytes=0, memory_end_bytes=0, plan=plan)
    abba = (np.stack([cand, cand], axis=1), np.stack([prod, prod], axis=1))
    judged = analyse_canary_step(plan.steps[0], cand, prod, **kwargs, abba=abba)
    assert not judged.passed and judged.latency_slower
    assert "signed-rank" in judged.breaches[0]
    excused = analyse_canary_step(plan.steps[0], cand, prod, **kwargs,
                                  latency_not_assessed_reason="interpret mode")
    assert excused.passed and not excused.latency_slower
    assert not excused.latency_assessed and excused.latency_not_assessed_reason == "interpret mode"


def test_too_few_candidate_requests_leave_latency_unassessed_not_invented():
    """A 5% step can route 0 or 1 request to the candidate: no test is run on made-up
    data; the step says why latency was not judged and still checks the rest."""
    plan = _plan()
    one = _clean_step(np.array([5.0]), np.full(50, 0.01), plan)
    assert one.passed and not one.latency_assessed
    assert "too few" in one.latency_not_assessed_reason and one.n_candidate == 1
    assert np.isnan(one.p_value)
    from gates.canary import analyse_canary_step

    none = analyse_canary_step(plan.steps[0], [], np.full(50, 0.01), [], 0, 0, 0, 0, plan)
    assert none.passed and none.n_candidate == 0 and not none.latency_assessed
    errors = analyse_canary_step(plan.steps[0], [], np.full(50, 0.01), [], 3, 0, 0, 0, plan)
    assert not errors.passed and any("errors" in b for b in errors.breaches)
