"""Speed change criteria judged by a paired test: right both ways on a busy host.

The evaluations are simulated (``tests.busy_host_sim``: interleaved like
``evaluation.performance``, heavy-tailed noise shared by the calls of a repeat) and
judged by the real ``gates.decision.decide`` under a shipped profile's CPU criteria.
The simulations draw 999 swaps per test (a valid Monte-Carlo p-value still: Phipson &
Smyth) and leave out the confidence bound, which only the reason shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gates import speed_test
from gates.approval_view import criterion_cells
from gates.decision import decide
from gates.loosening import loosenings
from gates.speed_test import paired_latencies, paired_quantile_test
from gates.thresholds import parse_thresholds
from tests.busy_host_sim import (
    A_A_DRAWS,
    POWER_DRAWS,
    ROOT,
    BusyHost,
    as_report,
    draw,
    frozen,
    legacy,
    rejections,
)

SHIPPED = sorted((ROOT / "thresholds").glob("*.yaml"))


@pytest.fixture
def fast_tests(monkeypatch):
    monkeypatch.setattr(speed_test, "RESAMPLES", 999)
    monkeypatch.setattr(speed_test, "BOUND_STEPS", 0)


def test_the_point_estimate_rule_rejects_an_identical_kernel_far_more_than_1_in_20():
    # The measured failure, reproduced: max of 10 calls over max of 10 calls.
    data = legacy((ROOT / "thresholds" / "staging.yaml").read_bytes())
    rate, failed = rejections(data, 1.0, A_A_DRAWS, seed=1)
    assert rate > 0.15, (rate, failed)
    assert failed.get("p99-vs-production", 0) > 0.15


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_profile_tests_its_regression_bounds_within_the_family_alpha(path):
    thresholds = parse_thresholds(path.read_bytes())
    for platform, criteria in thresholds.platforms.items():
        tested = [c for c in criteria.change if c.test == "paired_permutation"]
        regressions = [c for c in criteria.change
                       if c.kind == "speed" and c.max_regression is not None]
        assert tested == regressions, (path.name, platform)
        assert sum(c.alpha for c in tested) <= speed_test.SPEED_FAMILY_ALPHA


@pytest.mark.usefixtures("fast_tests")
def test_an_identical_kernel_passes_the_shipped_speed_criteria_at_least_19_in_20():
    data = (ROOT / "thresholds" / "staging.yaml").read_bytes()
    rate, failed = rejections(data, 1.0, A_A_DRAWS, seed=1)  # the same draws as above
    assert rate <= 0.05, (rate, failed)


@pytest.mark.usefixtures("fast_tests")
def test_a_first_call_penalty_the_rotation_spreads_does_not_make_it_reject_an_identical_kernel():
    # The first call of each repeat 50 % slower: no pair shares it, so pairs are no
    # longer exchangeable one by one; the test grows conservative, not liberal.
    data = (ROOT / "thresholds" / "staging.yaml").read_bytes()
    rate, failed = rejections(data, 1.0, 300, seed=7, host=BusyHost(first_call_penalty=0.5))
    assert rate <= 0.05, (rate, failed)


@pytest.mark.usefixtures("fast_tests")
def test_a_one_and_a_half_times_slower_kernel_is_rejected_with_the_stated_power():
    data = (ROOT / "thresholds" / "staging.yaml").read_bytes()
    rate, failed = rejections(data, 1.5, POWER_DRAWS, seed=2)
    assert rate >= 0.95, (rate, failed)  # stated power: BENCHMARKS.md
    assert failed["p50-vs-production"] >= 0.95


@pytest.mark.parametrize(("q", "bound"), [(50, 1.1), (99, 1.2)])
def test_the_test_holds_its_level_at_the_bound_itself(q, bound):
    rng = np.random.default_rng(3)
    draws, alpha = 300, 0.05
    rejected = sum(paired_quantile_test(
        (d := draw(rng, slowdown=bound))["candidate"], d["production"], quantile=q,
        max_ratio=bound, alpha=alpha, resamples=999, bound_steps=0).rejected
        for _ in range(draws))
    assert rejected / draws <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / draws)


def test_the_reason_states_the_test_the_estimate_and_its_bound():
    data = (ROOT / "thresholds" / "staging.yaml").read_bytes()
    thresholds, registration = frozen(data)
    report = as_report(draw(np.random.default_rng(4), slowdown=1.5))
    decision = decide(report, thresholds, registration, kinds={"speed"})
    p50 = next(c for c in decision.criteria if c.name == "p50-vs-production")
    assert p50.status == "fail" and p50.test == "paired_permutation"
    assert p50.alpha == 0.016 and p50.p_value < p50.alpha
    assert 1.1 < p50.confidence_bound < 1 / p50.improvement
    for words in ("paired permutation test", "scipy.stats.permutation_test",
                  "40 interleaved calls over 4 shapes", "candidate/production ratio",
                  "lower confidence bound", "H0 ratio <= 1.1", "alpha 0.016"):
        assert words in p50.reason
    again = decide(report, thresholds, registration, kinds={"speed"})  # the audit's re-derivation
    assert [c.model_dump() for c in again.criteria] == [c.model_dump() for c in decision.criteria]


def test_a_report_without_per_repeat_latencies_fails_the_tested_criterion_saying_so():
    thresholds, registration = frozen((ROOT / "thresholds" / "staging.yaml").read_bytes())
    report = as_report(draw(np.random.default_rng(5)))
    report.performance = None
    decision = decide(report, thresholds, registration, kinds={"speed"})
    p99 = next(c for c in decision.criteria if c.name == "p99-vs-production")
    assert p99.status == "fail" and "no per-repeat latencies" in p99.reason


def _criterion(**extra) -> str:
    fields = ", ".join(f"{k}: {v}" for k, v in extra.items())
    return f"{{name: p99, metric: latency.p99_s, kind: speed, against: production, {fields}}}"


def _with_cpu_criterion(line: str) -> bytes:
    text = (ROOT / "thresholds" / "staging.yaml").read_text()
    old = [x for x in text.splitlines() if "name: p99-vs-production" in x][-1]  # cpu's
    head, _, tail = text.rpartition(old)
    return f"{head}      - {line}{tail}".encode()


@pytest.mark.parametrize(("extra", "words"), [
    (dict(better="lower", max_regression=1.2, test="paired_permutation"), "needs an alpha"),
    (dict(better="lower", max_regression=1.2, alpha=0.01), "the point estimate has none"),
    (dict(better="lower", min_improvement=1.2, test="paired_permutation", alpha=0.01),
     "needs a max_regression bound"),
    (dict(better="lower", max_regression=1.2, test="paired_permutation", alpha=0.04),
     "add up to"),
])
def test_the_schema_refuses_a_test_it_cannot_honour(extra, words):
    with pytest.raises(ValueError, match=words):
        parse_thresholds(_with_cpu_criterion(_criterion(**extra)))


def test_without_a_test_a_criterion_keeps_its_point_estimate_meaning():
    thresholds = parse_thresholds(legacy((ROOT / "thresholds" / "staging.yaml").read_bytes()))
    assert {c.judged_by for p in thresholds.platforms.values() for c in p.change} == {
        "point_estimate"}


def test_opting_in_lowering_alpha_or_going_back_are_each_reported_as_a_change():
    shipped = (ROOT / "thresholds" / "staging.yaml").read_bytes()
    new, old = parse_thresholds(shipped), parse_thresholds(legacy(shipped))
    assert "cpu/p99-vs-production: test point_estimate -> paired_permutation" in loosenings(old, new)
    assert "cpu/p99-vs-production: test paired_permutation -> point_estimate" in loosenings(new, old)
    lower = parse_thresholds(shipped.replace(b"max_regression: 1.2, test: paired_permutation, "
                                             b"alpha: 0.016", b"max_regression: 1.2, test: "
                                             b"paired_permutation, alpha: 0.001"))
    assert any("alpha 0.016 -> 0.001" in x for x in loosenings(new, lower))
    assert not [x for x in loosenings(lower, new) if "alpha" in x]


def test_the_approval_form_shows_a_tested_criterion_by_its_test():
    thresholds, registration = frozen((ROOT / "thresholds" / "staging.yaml").read_bytes())
    decision = decide(as_report(draw(np.random.default_rng(6))), thresholds, registration,
                      kinds={"speed"})
    p99 = next(c for c in decision.criteria if c.name == "p99-vs-production")
    observed, required = criterion_cells(p99)
    assert f"p = {p99.p_value:.3g}" in observed
    assert required == "not shown < 0.833× at α 0.016 (paired_permutation)"


def test_unpaired_or_missing_latencies_are_named_not_compared():
    one = SimpleNamespace(label="S256")
    run = SimpleNamespace

    def perf(candidate, production, ok=True):
        return SimpleNamespace(shapes=[SimpleNamespace(shape=one, implementations={
            "candidate": run(ok=True, latencies_s=candidate),
            "production": run(ok=ok, latencies_s=production)})])

    assert "cannot be paired" in paired_latencies(perf([1.0, 2.0], [1.0]), "production")
    assert "both ran" in paired_latencies(perf([1.0], [1.0], ok=False), "production")
    assert paired_latencies(perf([1.0], [2.0]), "production") == ([[1.0]], [[2.0]])
    with pytest.raises(ValueError, match="finite and positive"):
        paired_quantile_test([[1.0, 0.0]], [[1.0, 1.0]], quantile=50, max_ratio=1.1,
                             alpha=0.05)


@pytest.mark.parametrize(("shapes", "repeats"), [(4, 1), (1, 5), (2, 2), (1, 1)])
def test_a_test_too_small_to_fail_is_inconclusive_never_a_pass(shapes, repeats):
    # A 3x slower candidate at sizes where no data could reach alpha 0.016 (2**-pairs >=
    # alpha): a paired test that cannot fail must block promotion and say why, not pass.
    thresholds, registration = frozen((ROOT / "thresholds" / "staging.yaml").read_bytes())
    report = as_report(draw(np.random.default_rng(8), slowdown=3.0, shapes=shapes,
                            repeats=repeats))
    decision = decide(report, thresholds, registration, kinds={"speed"})
    tested = [c for c in decision.criteria if c.test == "paired_permutation"]
    assert tested and decision.verdict == "reject"
    for c in tested:
        assert c.status == "inconclusive", (c.name, c.status, c.reason)
        assert "cannot show a slowdown at alpha 0.016" in c.reason
        assert c.confidence_bound is None
    assert speed_test.smallest_p_value(shapes * repeats) >= 0.016


def test_the_smallest_p_value_is_the_exact_tests_below_the_resamples_and_monte_carlos_above():
    assert speed_test.smallest_p_value(5, 9999) == 2 ** -5  # 32 swaps, all enumerated
    assert speed_test.smallest_p_value(40, 9999) == 1 / 10000
    with pytest.raises(ValueError, match="greater than or equal to 0.0001"):
        parse_thresholds(_with_cpu_criterion(_criterion(
            better="lower", max_regression=1.2, test="paired_permutation", alpha=1e-6)))


def test_latencies_that_cannot_be_tested_fail_the_criterion_with_the_reason():
    thresholds, registration = frozen((ROOT / "thresholds" / "staging.yaml").read_bytes())
    samples = draw(np.random.default_rng(9))
    samples["candidate"][0][3] = 0.0
    decision = decide(as_report(samples), thresholds, registration, kinds={"speed"})
    p50 = next(c for c in decision.criteria if c.name == "p50-vs-production")
    assert p50.status == "fail" and "finite and positive" in p50.reason
