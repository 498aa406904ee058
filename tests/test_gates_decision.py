"""Gate decisions from a stand-in report (no MLflow: the registration is built in memory)."""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta

import pytest

from gates.decision import GateDecision, decide
from gates.preregistration import PreregistrationError, Registration
from gates.thresholds import parse_thresholds
from tests.conftest_lineage import StandInReport, baseline_metrics, passing_metrics, thresholds_yaml

REGISTERED_AT = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _frozen(text: str):
    data = text.encode()
    thresholds = parse_thresholds(data)
    registration = Registration(
        registration_id="reg-1",
        family="test",
        profile=thresholds.profile,
        thresholds_sha256=hashlib.sha256(data).hexdigest(),
        thresholds_artifact="thresholds/t.yaml",
        registered_at=REGISTERED_AT,
    )
    return thresholds, registration


def _report(metrics=None, **kw) -> StandInReport:
    return StandInReport(
        metrics=passing_metrics() if metrics is None else metrics,
        baseline_metrics=kw.pop("baseline", baseline_metrics()),
        started_at=kw.pop("started_at", REGISTERED_AT + timedelta(minutes=5)),
        **kw,
    )


def _status(decision: GateDecision) -> dict[str, str]:
    return {c.name: c.status for c in decision.criteria}


def test_passing_report_promotes_with_expected_ratios():
    thresholds, registration = _frozen(thresholds_yaml())
    decision = decide(_report(), thresholds, registration)
    assert decision.verdict == "promote" and decision.passed
    status = _status(decision)
    assert {status[n] for n in ("nan-free", "error-ratio", "cosine", "speedup", "memory")} == {
        "pass"
    }
    assert status["vs-production"] == "not_applicable"  # first rollout: nothing in production
    # the summary names it and why, so the next rollout's different count is explained
    assert ("- not applicable (no production version to compare against): vs-production"
            in decision.summary.splitlines()), decision.summary
    speedup = next(c for c in decision.criteria if c.name == "speedup")
    assert speedup.improvement == pytest.approx(2.0)  # 2 ms naive / 1 ms candidate
    assert speedup.threshold == pytest.approx(1.2)
    memory = next(c for c in decision.criteria if c.name == "memory")
    assert memory.improvement == pytest.approx(4.0)  # 1 GB / 250 MB
    assert memory.threshold == pytest.approx(1.0)  # max_regression 1.0 -> no regression at all
    assert decision.registration_id == "reg-1"


@pytest.mark.parametrize(
    ("metric", "value", "words"),
    [
        ("accuracy.hard.max_error_ratio_to_baseline", math.nan, "is NaN"),
        ("model.min_cosine_similarity", math.nan, "is NaN"),
        ("latency.p50_s", math.inf, "is infinite"),
        ("accuracy.all.nan_count", -math.inf, "is infinite"),
    ],
)
def test_non_finite_metric_fails_naming_it(metric, value, words):
    thresholds, registration = _frozen(thresholds_yaml())
    metrics = passing_metrics() | {metric: value}
    decision = decide(_report(metrics), thresholds, registration)
    assert decision.verdict == "reject"
    failed = decision.by_status("fail")
    assert len(failed) >= 1
    assert all(c.metric == metric for c in failed)
    assert metric in failed[0].reason and words in failed[0].reason
    assert metric in decision.summary
    # the decision survives a JSON round trip with its NaN/inf intact
    again = GateDecision.model_validate_json(decision.model_dump_json())
    assert again.verdict == "reject" and again.summary == decision.summary


def test_missing_candidate_or_baseline_metric_fails_naming_it():
    thresholds, registration = _frozen(thresholds_yaml())
    metrics = passing_metrics()
    del metrics["model.min_cosine_similarity"]
    decision = decide(_report(metrics), thresholds, registration)
    assert decision.verdict == "reject"
    (failed,) = decision.by_status("fail")
    assert failed.name == "cosine" and "'model.min_cosine_similarity' is missing" in failed.reason

    baseline = baseline_metrics()
    del baseline["latency.p50_s"]
    decision = decide(_report(baseline=baseline), thresholds, registration)
    (failed,) = decision.by_status("fail")
    assert (
        failed.name == "speedup" and "baseline metric 'latency.p50_s' is missing" in failed.reason
    )


def test_value_and_change_thresholds_reject_when_violated():
    thresholds, registration = _frozen(thresholds_yaml())
    # 1.8 ms vs 2 ms naive: improvement 1.11 < 1.2; error ratio 2.5 > 2
    metrics = passing_metrics() | {
        "latency.p50_s": 1.8e-3,
        "accuracy.hard.max_error_ratio_to_baseline": 2.5,
    }
    decision = decide(_report(metrics), thresholds, registration)
    assert decision.verdict == "reject"
    assert {c.name for c in decision.by_status("fail")} == {"speedup", "error-ratio"}
    speedup = next(c for c in decision.criteria if c.name == "speedup")
    assert speedup.improvement == pytest.approx(2.0 / 1.8)


def test_regression_against_production():
    thresholds, registration = _frozen(thresholds_yaml())
    production = passing_metrics() | {"latency.p50_s": 0.8e-3}
    # candidate 1.0 ms vs production 0.8 ms: 1.25x slower > max_regression 1.1
    decision = decide(_report(production_metrics=production), thresholds, registration)
    assert decision.verdict == "reject"
    (failed,) = decision.by_status("fail")
    assert failed.name == "vs-production"
    assert failed.improvement == pytest.approx(0.8)
    assert failed.threshold == pytest.approx(1 / 1.1)
    # 0.95 ms production: candidate 1.05x slower, inside the 10% allowance
    production["latency.p50_s"] = 0.95e-3
    assert decide(_report(production_metrics=production), thresholds, registration).passed


@pytest.mark.parametrize(("blocks", "verdict"), [(False, "promote"), (True, "reject")])
def test_not_assessed_speed_blocks_only_where_the_profile_says(blocks, verdict):
    thresholds, registration = _frozen(thresholds_yaml(not_assessed_blocks=blocks))
    metrics = {k: v for k, v in passing_metrics().items() if not k.startswith("latency.")}
    reason = "pallas_tpu ran in TPU interpret mode on a CPU host"
    report = _report(
        metrics,
        speed_assessed=False,
        speed_not_assessed_reason=reason,
        target_platform="tpu",
        device_platform="cpu",
    )
    decision = decide(report, thresholds, registration)
    assert decision.verdict == verdict
    not_assessed = {c.name for c in decision.by_status("not_assessed")}
    assert not_assessed == {"speedup", "vs-production", "memory"}
    assert all(reason in c.reason for c in decision.by_status("not_assessed"))
    assert decision.not_assessed_note is not None and reason in decision.not_assessed_note
    assert ("does NOT block" in decision.not_assessed_note) is (not blocks)
    assert decision.not_assessed_note in decision.summary
    assert {c.status for c in decision.criteria if c.kind == "accuracy"} == {"pass"}


def test_too_few_cases_is_inconclusive_and_blocks():
    thresholds, registration = _frozen(thresholds_yaml(min_cases=2))
    metrics = passing_metrics() | {"accuracy.hard.n_cases": 1.0}
    decision = decide(_report(metrics), thresholds, registration)
    assert decision.verdict == "reject"
    (inconclusive,) = decision.by_status("inconclusive")
    assert inconclusive.name == "error-ratio" and "accuracy.hard.n_cases" in inconclusive.reason


def test_edited_thresholds_are_refused():
    text = thresholds_yaml()
    _, registration = _frozen(text)
    edited = parse_thresholds(text.replace("value: 2.0}", "value: 20.0}").encode())
    with pytest.raises(PreregistrationError, match="changed after preregistration"):
        decide(_report(), edited, registration)


def test_evaluation_started_before_registration_is_refused():
    thresholds, registration = _frozen(thresholds_yaml())
    early = _report(started_at=REGISTERED_AT - timedelta(seconds=1))
    with pytest.raises(PreregistrationError, match="before registration"):
        decide(early, thresholds, registration)


def test_bad_platform_and_naive_time_are_value_errors():
    thresholds, registration = _frozen(thresholds_yaml())
    with pytest.raises(ValueError, match="target_platform"):
        decide(_report(target_platform="fpga"), thresholds, registration)
    with pytest.raises(ValueError, match="timezone"):
        decide(_report(started_at=datetime(2026, 1, 2)), thresholds, registration)


def test_accuracy_scope_judges_only_accuracy_criteria_and_records_it():
    """The confirmation split is judged on accuracy alone: without speed metrics the
    full gate rejects (missing metrics fail), the accuracy-scoped one does not, and a
    broken accuracy metric still fails it."""
    thresholds, registration = _frozen(thresholds_yaml())
    accuracy_only = {k: v for k, v in passing_metrics().items()
                     if not k.startswith(("latency.", "memory.", "throughput.", "compile."))}
    report = _report(accuracy_only)
    assert decide(report, thresholds, registration).verdict == "reject"
    scoped = decide(report, thresholds, registration, kinds={"accuracy"})
    assert scoped.verdict == "promote" and scoped.scope == ["accuracy"]
    assert {c.kind for c in scoped.criteria} == {"accuracy"}
    broken = decide(_report({**accuracy_only, "accuracy.all.nan_count": 3.0}), thresholds,
                    registration, kinds={"accuracy"})
    assert broken.verdict == "reject"
