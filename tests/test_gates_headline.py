"""No summary says every criterion passed while any was not assessed."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from gates.canary import analyse_canary_step
from gates.canary_plan import CanaryPlan, CanaryStep, LatencyTest
from gates.decision import decide
from gates.headline import ALL_PASSED, not_assessed, promotion_reason
from gates.preregistration import Registration
from gates.thresholds import parse_thresholds
from tests.conftest_lineage import StandInReport, baseline_metrics, passing_metrics, thresholds_yaml

AT = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _decision(**report):
    data = thresholds_yaml().encode()
    thresholds = parse_thresholds(data)
    registration = Registration(registration_id="r", family="f", profile=thresholds.profile,
                                thresholds_sha256=hashlib.sha256(data).hexdigest(),
                                thresholds_artifact="t.yaml", registered_at=AT)
    return decide(StandInReport(metrics=passing_metrics(), baseline_metrics=baseline_metrics(),
                                started_at=AT + timedelta(minutes=1), **report),
                  thresholds, registration)


def _step(latency_reason=None):
    plan = CanaryPlan(steps=[CanaryStep(name="canary-50pct", traffic_fraction=0.5,
                                        requests=40)],
                      max_error_count=0, max_nan_count=0, max_output_drift=1e-3,
                      latency=LatencyTest(test="mannwhitneyu", alpha=0.05),
                      max_memory_growth_bytes=1 << 30)
    lat = [1e-3 + 1e-5 * i for i in range(20)]
    return analyse_canary_step(plan.steps[0], lat, lat, [0.0] * 20, 0, 0, 1, 1, plan,
                               latency_not_assessed_reason=latency_reason)


def test_everything_assessed_reads_as_all_passed():
    decision = _decision()
    assert not not_assessed(decision, [_step()])
    assert promotion_reason(decision, [_step()]) == ALL_PASSED


def test_an_interpreted_candidate_never_reads_as_all_passed():
    decision = _decision(speed_assessed=False,
                         speed_not_assessed_reason="ran in TPU interpret mode on a cpu host")
    assert any(c.status == "not_assessed" for c in decision.criteria)
    reason = promotion_reason(decision, [_step("candidate runs interpreted")])
    assert "every" not in reason and ALL_PASSED not in reason
    assert "not assessed" in reason and "interpret mode" in reason
    assert "latency not assessed in canary-50pct" in reason


def test_canary_latency_alone_not_assessed_is_said():
    reason = promotion_reason(_decision(), [_step("too few requests")])
    assert reason != ALL_PASSED and "latency not assessed in canary-50pct" in reason


def test_the_shadow_under_the_paired_test_is_not_a_gap():
    """Under the paired test the shadow's latency is not looked at by design (the alpha
    is spent over the canary steps): not a gap the headline reports."""
    from pathlib import Path

    from gates.thresholds import load_thresholds

    plan = load_thresholds(Path(__file__).parents[1] / "thresholds" / "local-dry-run.yaml").canary
    lat = [1e-3 + 1e-5 * i for i in range(20)]
    shadow = analyse_canary_step(CanaryStep(name="shadow", traffic_fraction=1.0, requests=20),
                                 lat, lat, [0.0] * 20, 0, 0, 1, 1, plan)
    assert not shadow.latency_assessed
    assert not [w for w in not_assessed(_decision(), [shadow]) if "latency" in w]


def _interpreted_step(name: str):
    plan = CanaryPlan(steps=[CanaryStep(name=name, traffic_fraction=0.5, requests=40)],
                      max_error_count=0, max_nan_count=0, max_output_drift=1e-3,
                      latency=LatencyTest(test="mannwhitneyu", alpha=0.05),
                      max_memory_growth_bytes=1 << 30)
    lat = [1e-3 + 1e-5 * i for i in range(20)]
    why = "candidate runs interpreted"
    return analyse_canary_step(plan.steps[0], lat, lat, [0.0] * 20, 0, 0, 1, 1, plan,
                               latency_not_assessed_reason=why, memory_not_assessed_reason=why)


def test_the_headline_says_each_thing_once():
    """An interpreted candidate (make run on a CPU host): the title names what was not
    assessed once (latency and memory growth of the same stages in one item), the state
    message once (in its reason), and the CLI's gate line does not repeat the reason's
    list."""
    from lineage.rollout.rollout import RolloutOutcome

    decision = _decision(speed_assessed=False,
                         speed_not_assessed_reason="ran in TPU interpret mode on a cpu host")
    steps = [_interpreted_step("shadow"), _interpreted_step("canary-5pct")]
    from gates.headline import caveat

    short = caveat(decision, steps)
    assert short.count("not assessed in") == 1
    assert "latency and memory growth not assessed in shadow, canary-5pct" in short
    outcome = RolloutOutcome(family="f", version="1", result="promoted", stage="promotion",
                             reason=promotion_reason(decision, steps), not_assessed=short,
                             decision_summary=decision.summary, rollout_run_id="r",
                             tracking_uri="sqlite://", ui_command="ui")
    assert outcome.summary().count("shadow, canary-5pct") == 1, outcome.summary()
    markdown = outcome.markdown()
    title, *rest = markdown.splitlines()
    assert "latency and memory growth not assessed in shadow, canary-5pct" in title
    gate = next(line for line in rest if line.startswith("* gate: "))
    assert gate == f"* gate: {decision.summary.splitlines()[0]}"
    assert markdown.count("shadow, canary-5pct") == 2  # the headline, and the reason's why
