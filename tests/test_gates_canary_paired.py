"""The paired canary analysis (signed_rank_abba): each step's look over the cumulative
pairs at its spent alpha, the whole-canary verdict, and the plan's power rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gates.canary import analyse_canary_step
from gates.canary_latency import another_look, conclude_canary
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
    assert [r.alpha for r in results] == pytest.approx(plan.step_alphas()[:len(plan.steps)])
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


def _sequential(plan: CanaryPlan, rng, *, shift: float = 0.0, sd: float = 0.05) -> list:
    """A canary as the rollout runs it: each look the plan may take while
    ``another_look`` says so, requests drawn with per-request log-ratio noise ``sd``."""
    results = []
    for step in plan.looks():
        if not another_look(plan, results):
            break
        n = int(step.traffic_fraction * step.requests)
        base = rng.lognormal(np.log(0.002), 0.3, (n, 1)) * np.ones((1, 2))
        # one draw per request and side: the request's log ratio has sd ``sd``
        cand = base * np.exp(shift + rng.normal(0, sd / np.sqrt(2), (n, 1)))
        prod = base * np.exp(rng.normal(0, sd / np.sqrt(2), (n, 1)))
        results.append(analyse_canary_step(step, cand[:, 0], prod[:, 0], np.zeros(n), 0, 0, 0,
                                           0, plan, abba=(cand, prod), earlier=results))
    return results


GPU_NOISE = 0.336
"""The robust sd of per-request log ratios the default rollout's canary measured on the
H200 (pallas_gpu against xla, MiniLM batch 1; BENCHMARKS): beyond the plan's noise_sd."""


def test_the_shipped_gpu_profiles_extend_their_canary_up_to_the_noise_seen_on_the_h200():
    for profile in ("local-dry-run", "bf16-long"):
        plan = _plan(profile)
        assert plan.extend is not None and plan.power_problem() is None
        assert plan.noise_ceiling() > GPU_NOISE * 1.5, profile
        names = [s.name for s in plan.looks()]
        assert names[:len(plan.steps)] == [s.name for s in plan.steps]
        assert names[len(plan.steps)] == "canary-50pct.more1" and len(set(names)) == len(names)
        # every look the plan may take has its alpha fixed now, and together they spend alpha
        assert len(plan.step_alphas()) == len(names)
        assert sum(plan.step_alphas()) == pytest.approx(plan.latency.alpha)


def test_without_the_extension_the_gpu_noise_is_inconclusive_as_it_was_on_the_h200():
    plan = _plan().model_copy(update={"extend": None})
    outcomes = [conclude_canary(plan, _sequential(plan, np.random.default_rng(seed),
                                                  sd=GPU_NOISE)) for seed in range(20)]
    assert sum(v.verdict == "inconclusive" for v in outcomes) >= 18
    assert all("too noisy" in v.reason for v in outcomes if v.verdict == "inconclusive")


def test_with_the_extension_an_identical_kernel_at_the_gpu_noise_passes_and_says_its_power():
    plan = _plan()
    verdicts, looks = [], []
    for seed in range(40):
        results = _sequential(plan, np.random.default_rng(100 + seed), sd=GPU_NOISE)
        looks.append(len(results))
        verdicts.append(conclude_canary(plan, results))
    passed = [v for v in verdicts if v.verdict == "pass"]
    assert len(passed) >= 36, [v.reason for v in verdicts if v.verdict != "pass"]
    assert all("at the measured noise" in v.reason for v in passed)
    # it took extra looks, and stopped as soon as the power was reached
    assert min(looks) > len(plan.steps) and max(looks) < len(plan.looks())
    for v in passed:
        assert v.n_pairs >= v.required_pairs


def test_with_the_extension_a_slowdown_at_the_minimum_is_still_caught_at_the_stated_power():
    plan = _plan()
    shift = np.log(plan.latency.min_slowdown_ratio)
    verdicts = [conclude_canary(plan, _sequential(plan, np.random.default_rng(300 + seed),
                                                  shift=shift, sd=GPU_NOISE)).verdict
                for seed in range(60)]
    assert verdicts.count("fail") / len(verdicts) >= plan.latency.power - 0.08, verdicts


def test_the_extension_stops_at_its_maximum_and_says_inconclusive_past_its_noise_ceiling():
    plan = _plan()
    unbreached = 0
    for seed in range(10):
        results = _sequential(plan, np.random.default_rng(70 + seed), sd=plan.noise_ceiling() * 3)
        verdict = conclude_canary(plan, results)
        if verdict.verdict == "fail":
            continue  # noise can breach by chance (at most alpha); not this test's subject
        unbreached += 1
        assert len(results) == len(plan.looks())
        assert verdict.verdict == "inconclusive" and "too noisy for its power" in verdict.reason
    assert unbreached >= 8


def test_no_extra_look_after_a_pass_or_a_breach():
    plan = _plan()
    quiet = _sequential(plan, np.random.default_rng(8), sd=0.05)
    assert len(quiet) == len(plan.steps) and conclude_canary(plan, quiet).verdict == "pass"
    slow = _sequential(plan, np.random.default_rng(9), shift=np.log(1.5), sd=0.05)
    assert not slow[-1].passed and not another_look(plan, slow)
    assert len(slow) <= len(plan.steps)


def test_an_extension_needs_the_paired_test_and_a_name_that_fits():
    base = dict(steps=[{"name": "s" * 60, "traffic_fraction": 0.5, "requests": 400}],
                max_error_count=0, max_nan_count=0, max_output_drift=1e-3,
                max_memory_growth_bytes=0)
    paired = {"test": "signed_rank_abba", "alpha": 0.05, "min_slowdown_ratio": 1.1,
              "power": 0.9, "noise_sd": 0.2, "inconclusive": "reject"}
    with pytest.raises(ValueError, match="too long"):
        CanaryPlan.model_validate({**base, "latency": paired,
                                   "extend": {"max_steps": 10, "requests": 100}})
    with pytest.raises(ValueError, match="paired latency test"):
        CanaryPlan.model_validate({**base, "latency": {"test": "mannwhitneyu", "alpha": 0.05},
                                   "extend": {"max_steps": 1, "requests": 100}})
    with pytest.raises(ValueError, match="compare no request"):
        CanaryPlan.model_validate({**base, "steps": [{"name": "s", "traffic_fraction": 0.5,
                                                      "requests": 400}],
                                   "latency": paired, "extend": {"max_steps": 1, "requests": 1}})
