"""The paired canary analysis (signed_rank_abba): each step's look over the cumulative
pairs at its spent alpha, the whole-canary verdict, and the plan's power rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gates.canary import analyse_canary_step
from gates.canary_latency import conclude_canary
from gates.canary_plan import CanaryPlan
from gates.thresholds import load_thresholds, parse_thresholds

ROOT = Path(__file__).resolve().parents[1]


def _plan(profile: str = "local-dry-run") -> CanaryPlan:
    return load_thresholds(ROOT / "thresholds" / f"{profile}.yaml").canary


def _canary(plan: CanaryPlan, rng, *, shift: float = 0.0, sd: float = 0.05,
            errors: int = 0) -> list:
    results = []
    for step, n in zip(plan.steps, plan.pairs_per_step(), strict=True):
        base = rng.lognormal(np.log(0.02), 0.3, (n, 1)) * np.ones((1, 2))
        cand = base * np.exp(shift + rng.normal(0, sd / np.sqrt(2), (n, 2)))
        prod = base * np.exp(rng.normal(0, sd / np.sqrt(2), (n, 2)))
        results.append(analyse_canary_step(
            step, cand[:, 0], prod[:, 0], np.zeros(n), errors, 0, 0, 0, plan,
            abba=(cand, prod), earlier=results))
        if not results[-1].passed:
            break
    return results


def test_each_look_uses_the_cumulative_pairs_at_the_spent_alpha():
    plan = _plan()
    results = _canary(plan, np.random.default_rng(0))
    assert [r.latency_look.n_pairs for r in results] == list(np.cumsum(plan.pairs_per_step()))
    assert [r.alpha for r in results] == pytest.approx(plan.step_alphas())
    assert sum(plan.step_alphas()) == pytest.approx(plan.latency.alpha)
    assert all(len(r.log_ratios) == len(r.candidate_timings_s) for r in results)
    verdict = conclude_canary(plan, results)
    assert verdict.verdict == "pass" and verdict.latency_verdict == "pass", verdict


def test_a_planted_slowdown_fails_with_the_signed_rank_reason():
    plan = _plan()
    results = _canary(plan, np.random.default_rng(1), shift=np.log(1.3))
    assert not results[-1].passed and "signed-rank" in results[-1].breaches[0]
    assert conclude_canary(plan, results).verdict == "fail"


def test_too_noisy_is_inconclusive_and_the_policy_is_recorded():
    plan = _plan()
    results = _canary(plan, np.random.default_rng(2), sd=0.6)
    verdict = conclude_canary(plan, results)
    if verdict.verdict == "fail":  # noise can breach by chance; that is not this test
        pytest.skip("noise breached")
    assert verdict.verdict == "inconclusive" and "too noisy" in verdict.reason
    assert verdict.inconclusive_policy == "reject"


def test_errors_are_judged_over_the_whole_canary():
    plan = _plan().model_copy(update={"max_error_count": 1})
    results = _canary(plan, np.random.default_rng(3), errors=1)
    assert all(r.passed for r in results)  # one per step is within the per-step limit
    verdict = conclude_canary(plan, results)
    assert verdict.verdict == "fail" and "whole canary" in verdict.reason


def test_an_interpreted_candidate_is_not_assessed_with_its_reason():
    plan = _plan()
    step = plan.steps[0]
    judged = analyse_canary_step(step, [0.5] * 5, [0.01] * 5, np.zeros(5), 0, 0, 0, 0, plan,
                                 latency_not_assessed_reason="interpret mode", earlier=[])
    assert judged.passed and not judged.latency_assessed
    verdict = conclude_canary(plan, [judged])
    assert verdict.latency_verdict == "not_assessed" and "interpret mode" in verdict.reason


def _with_sizes(requests: int, blocks: bool) -> bytes:
    text = (ROOT / "thresholds" / "staging.yaml").read_text()
    text = text.replace("requests: 96}", f"requests: {requests}}}")
    return text.replace("not_assessed_blocks_promotion: true",
                        f"not_assessed_blocks_promotion: {str(blocks).lower()}").encode()


def test_the_power_rule_binds_only_where_latency_can_block():
    with pytest.raises(ValueError, match="cannot reach its power"):
        parse_thresholds(_with_sizes(20, blocks=True))
    loose = parse_thresholds(_with_sizes(20, blocks=False))  # loads; the canary says why
    problem = loose.canary.power_problem()
    assert problem and "serve more requests" in problem
    step = loose.canary.steps[0]
    n = loose.canary.pairs_per_step()[0]
    judged = analyse_canary_step(step, [0.01] * n, [0.01] * n, np.zeros(n), 0, 0, 0, 0,
                                 loose.canary, abba=(np.ones((n, 2)), np.ones((n, 2))))
    assert not judged.latency_assessed and judged.latency_not_assessed_reason == problem


def test_shipped_profiles_use_the_paired_test_and_local_never_pauses():
    for profile in ("local-dry-run", "staging", "production"):
        plan = _plan(profile)
        assert plan.paired and plan.power_problem() is None
    assert _plan().latency.inconclusive == "reject"


def test_legacy_plans_still_load_but_take_no_paired_fields():
    base = dict(steps=[{"name": "s", "traffic_fraction": 0.5, "requests": 100}],
                max_error_count=0, max_nan_count=0, max_output_drift=1e-3,
                max_memory_growth_bytes=0)
    legacy = CanaryPlan.model_validate({**base, "latency": {"test": "mannwhitneyu", "alpha": 0.05}})
    assert not legacy.paired and legacy.power_problem() is None
    with pytest.raises(ValueError, match="legacy"):
        CanaryPlan.model_validate({**base, "latency": {"test": "mannwhitneyu", "alpha": 0.05,
                                                       "power": 0.9}})
    with pytest.raises(ValueError, match="needs"):
        CanaryPlan.model_validate({**base, "latency": {"test": "signed_rank_abba",
                                                       "alpha": 0.05, "min_slowdown_ratio": 1.1}})
