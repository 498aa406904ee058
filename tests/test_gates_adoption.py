"""The adoption test both ways: A/A false adoption within alpha (normal and heavy-tailed
noise), a planted minimum worthwhile speed-up adopted at the preregistered power, a real
but tiny speed-up found not worth it, and inconclusive at max_pairs. Rates are checked
with exact binomial bounds (Clopper-Pearson, ``scipy.stats.binomtest``), so a test can
fail honestly: each asserts what the observed count makes plausible, not the count."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.stats import binomtest

from gates.adoption import AdoptionInputError, AdoptionPlan, judge, sign_boundary
from gates.adoption_power import (
    _first_decisions,
    adoption_power,
    pairs_for_adoption_power,
    simulate_decisions,
    tuned_rho,
)

RUNS = 1000
PLAN = AdoptionPlan(alpha=0.05, minimum_worthwhile_ratio=0.95, power=0.8, noise_sd=0.1,
                    max_pairs=300, mixture_rho=25.0)


def _rates(decisions: np.ndarray) -> dict[str, int]:
    return {k: int(np.sum(decisions == k)) for k in ("adopt", "not_worth_it", "inconclusive")}


def _aa_noise(kind: str, rng: np.random.Generator, shape) -> np.ndarray:
    """Zero-median A/A log ratios: normal; Student t with 2 degrees of freedom (infinite
    variance); and a mixture where 5 % of pairs hit a host hiccup of either sign, 10x the
    usual spread (a timing outlier lands on either side of a balanced pair)."""
    if kind == "normal":
        return 0.1 * rng.standard_normal(shape)
    if kind == "student_t2":
        return 0.05 * rng.standard_t(2, shape)
    spikes = rng.random(shape) < 0.05
    return np.where(spikes, 1.0 * rng.standard_normal(shape), 0.1 * rng.standard_normal(shape))


@pytest.mark.parametrize("kind", ["normal", "student_t2", "spikes"])
def test_aa_false_adoption_is_within_alpha(kind):
    rng = np.random.default_rng({"normal": 1, "student_t2": 2, "spikes": 3}[kind])
    d = _aa_noise(kind, rng, (RUNS, PLAN.max_pairs))
    adopted = _rates(simulate_decisions(PLAN, d))["adopt"]
    # the rate is at most alpha: its exact 99 % upper bound must lie at or below alpha
    upper = binomtest(adopted, RUNS).proportion_ci(0.98, method="exact").high
    assert upper <= PLAN.alpha, (kind, adopted, upper)
    # the adoption e-process alone, never stopped for futility (the futility stop above
    # ends most A/A runs early): crossing 1/alpha at any of the pairs is still rare
    adopt_at, _ = _first_decisions(PLAN, d)
    ever = int(np.sum(np.isfinite(adopt_at)))
    assert binomtest(ever, RUNS).proportion_ci(0.98, method="exact").high <= PLAN.alpha, ever


def test_a_planted_minimum_worthwhile_speed_up_is_adopted_at_the_preregistered_power():
    sized = PLAN.model_copy(update={"max_pairs": pairs_for_adoption_power(PLAN, seed=11)})
    rng = np.random.default_rng(12)  # a fresh draw, not the one that sized max_pairs
    d = sized.delta + sized.noise_sd * rng.standard_normal((RUNS, sized.max_pairs))
    adopted = _rates(simulate_decisions(sized, d))["adopt"]
    # honest failure: the power is below the preregistered one beyond doubt
    assert binomtest(adopted, RUNS, sized.power, alternative="less").pvalue > 0.01, adopted
    assert adoption_power(PLAN, seed=13) >= PLAN.power  # 300 pairs are more than needed


def test_a_real_but_tiny_speed_up_ends_not_worth_it():
    rng = np.random.default_rng(4)
    d = -math.log(0.995) + 0.1 * rng.standard_normal((RUNS, PLAN.max_pairs))  # 0.5 % faster
    rates = _rates(simulate_decisions(PLAN, d))
    low = binomtest(rates["not_worth_it"], RUNS).proportion_ci(0.98, method="exact").low
    assert low >= 0.9, rates


def test_a_worthwhile_kernel_is_rarely_found_not_worth_it():
    rng = np.random.default_rng(5)
    d = PLAN.delta + 0.1 * rng.standard_normal((RUNS, PLAN.max_pairs))
    nwi = _rates(simulate_decisions(PLAN, d))["not_worth_it"]
    assert binomtest(nwi, RUNS).proportion_ci(0.98, method="exact").high <= PLAN.alpha, nwi


def test_too_few_pairs_for_the_noise_end_inconclusive():
    plan = PLAN.model_copy(update={"max_pairs": 40})
    rng = np.random.default_rng(6)
    r = np.log(0.97) + 0.5 * rng.standard_normal(40)
    result = judge(plan, r)
    assert result.decision == "inconclusive" and result.decided_at == 40
    assert result.looks[-1].ratio_lower < 0.95 < result.looks[-1].ratio_upper


def test_judge_matches_the_vectorised_simulation_and_reports_each_look():
    rng = np.random.default_rng(7)
    for ratio in (0.9, 0.95, 0.995, 1.0):
        r = np.log(ratio) + 0.1 * rng.standard_normal(PLAN.max_pairs)
        result = judge(PLAN, r)
        expected = simulate_decisions(PLAN, -r[None, :])[0]
        assert result.decision == expected
        looks = result.looks
        assert [look.n for look in looks] == list(range(1, PLAN.max_pairs + 1))
        # the confidence sequence only narrows; p-values only fall
        assert all(b.ratio_lower >= a.ratio_lower and b.ratio_upper <= a.ratio_upper
                   and b.p_value <= a.p_value for a, b in zip(looks, looks[1:], strict=False))
        if result.decision == "adopt":
            look = looks[result.decided_at - 1]
            assert look.p_value <= PLAN.alpha and look.ratio_upper < 1.0
            assert look.e_value >= 1 / PLAN.alpha - 1e-9


def test_judge_at_chosen_looks_and_refuses_bad_input():
    rng = np.random.default_rng(8)
    r = np.log(0.9) + 0.05 * rng.standard_normal(120)
    result = judge(PLAN, r, looks=[20, 60, 120])
    assert [look.n for look in result.looks] == [20, 60, 120]
    assert result.decision == "adopt" and result.decided_at in (20, 60, 120)
    with pytest.raises(AdoptionInputError, match="finite"):
        judge(PLAN, [0.1, float("nan")])
    with pytest.raises(AdoptionInputError, match="looks must lie"):
        judge(PLAN, r, looks=[0, 5])
    with pytest.raises(AdoptionInputError, match="1-D"):
        judge(PLAN, np.zeros((2, 2)))


def test_the_plan_refuses_a_null_without_an_indifference_zone():
    with pytest.raises(ValidationError, match="must be below null_ratio"):
        AdoptionPlan(minimum_worthwhile_ratio=0.95, null_ratio=0.95)
    with pytest.raises(ValidationError):
        AdoptionPlan(alpha=0.7)
    plan = AdoptionPlan(minimum_worthwhile_ratio=0.95, null_ratio=0.99)
    assert plan.theta0 == pytest.approx(-math.log(0.99))
    with pytest.raises(ValueError, match="not reached within"):
        pairs_for_adoption_power(PLAN.model_copy(update={"noise_sd": 5.0}), cap=512)


def test_the_sign_boundary_is_the_fewest_signs_that_reach_one_over_alpha():
    from gates.adoption import _log_e

    n = np.arange(1, 400)
    k = sign_boundary(n, 0.05, 25.0)
    reach = _log_e(k - n / 2.0, n / 4.0, 25.0) >= math.log(20.0)
    before = _log_e(k - 1 - n / 2.0, n / 4.0, 25.0) >= math.log(20.0)
    assert np.all(reach[k <= n]) and not np.any(before)
    assert np.all(np.diff(k) >= 0) and np.all(k >= n / 2)
    assert 1.0 < tuned_rho(0.05, 100) < 100.0
