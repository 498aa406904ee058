"""Requests production fails during a canary: by default a breach (nothing was compared on
them); under a registered ``exclude_production_failures`` they are left out of the
comparison, counted per length bucket and named in the verdict, never charged to the
candidate. Seen on an H100: xla's 48 GiB score matrix for a 32k document."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evaluation.serving import ServedRequest, TrafficResult
from gates.canary import analyse_canary_step
from gates.canary_latency import conclude_canary
from gates.loosening import loosenings
from gates.thresholds import load_thresholds
from lineage.audit.canary_audit import _step

ROOT = Path(__file__).resolve().parents[1]
OOM = "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 48.02GiB"


def _thresholds(exclude: bool):
    loaded = load_thresholds(ROOT / "thresholds" / "local-dry-run.yaml")
    canary = loaded.canary.model_copy(update={"exclude_production_failures": exclude})
    return loaded.model_copy(update={"canary": canary})


def _steps(plan, rng, failed: int) -> list:
    """Every registered step of an identical kernel, ``failed`` production failures each
    (at 32k tokens), the compared requests all served by both sides."""
    results = []
    for step, n in zip(plan.steps, plan.pairs_per_step(), strict=True):
        base = rng.lognormal(np.log(0.02), 0.3, (n, 1)) * np.ones((1, 2))
        cand = base * np.exp(rng.normal(0, 0.02, (n, 2)))
        prod = base * np.exp(rng.normal(0, 0.02, (n, 2)))
        results.append(analyse_canary_step(
            step, cand[:, 0], prod[:, 0], np.zeros(n), 0, 0, 0, 0, plan, abba=(cand, prod),
            earlier=results, production_error_count=failed,
            production_failed_buckets={32768: failed} if failed else None))
        if not results[-1].passed:
            break
    return results


def test_by_default_a_production_failure_breaches_its_step():
    plan = _thresholds(exclude=False).canary
    results = _steps(plan, np.random.default_rng(0), failed=3)
    assert len(results) == 1 and not results[0].passed
    assert results[0].breaches == ["production endpoint failed 3 request(s); nothing to compare"]
    verdict = conclude_canary(plan, results)
    assert verdict.verdict == "fail" and "production endpoint failed" in verdict.reason


def test_registered_exclusion_judges_the_compared_requests_and_names_the_failures():
    plan = _thresholds(exclude=True).canary
    results = _steps(plan, np.random.default_rng(0), failed=3)
    assert len(results) == len(plan.steps) and all(r.passed for r in results)
    assert [r.production_error_count for r in results] == [3] * len(plan.steps)
    verdict = conclude_canary(plan, results)
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.production_error_count == 3 * len(plan.steps)
    assert (f"production failed {3 * len(plan.steps)} request(s) (by length bucket: 32768: "
            f"{3 * len(plan.steps)}), left out of the comparison") in verdict.reason


def test_no_failure_adds_nothing_to_the_verdict():
    plan = _thresholds(exclude=True).canary
    verdict = conclude_canary(plan, _steps(plan, np.random.default_rng(1), failed=0))
    assert verdict.verdict == "pass" and "production failed" not in verdict.reason


def test_a_candidate_failure_still_breaches_under_the_exclusion():
    plan = _thresholds(exclude=True).canary
    step, n = plan.steps[0], 20
    judged = analyse_canary_step(step, [0.02] * n, [0.02] * n, np.zeros(n), 1, 0, 0, 0, plan,
                                 earlier=[], production_error_count=2)
    assert not judged.passed and judged.breaches == [f"errors: 1 > {plan.max_error_count}"]


def test_turning_the_exclusion_on_is_a_loosening_and_off_is_not():
    strict, lenient = _thresholds(exclude=False), _thresholds(exclude=True)
    assert any("exclude_production_failures" in w for w in loosenings(strict, lenient))
    assert loosenings(lenient, strict) == []


def test_the_long_document_profile_registers_the_exclusion_and_minilms_do_not():
    assert load_thresholds(ROOT / "thresholds" / "adoption-longdoc.yaml").canary \
        .exclude_production_failures
    for profile in ("local-dry-run", "staging", "production", "bf16-long"):
        assert not load_thresholds(ROOT / "thresholds" / f"{profile}.yaml").canary \
            .exclude_production_failures, profile


def test_the_audit_refuses_a_step_that_hid_a_production_failure_its_plan_breaches_on():
    plan = _thresholds(exclude=False).canary
    honest = _steps(plan, np.random.default_rng(2), failed=2)[0]
    assert _step(plan, honest, []) is None
    hidden = honest.model_copy(update={"breaches": [], "passed": True})
    assert "does not exclude production failures" in _step(plan, hidden, [])
    lenient = _thresholds(exclude=True).canary
    excluded = _steps(lenient, np.random.default_rng(2), failed=2)[0]
    assert _step(lenient, excluded, []) is None


def _record(i: int, bucket: int, production_error: str | None) -> ServedRequest:
    return ServedRequest(request_id=f"d{i}", served_by="production", production_latency_s=0.1,
                         production_error=production_error, length_bucket=bucket)


def test_traffic_counts_production_failures_per_length_bucket():
    records = [_record(0, 4096, None), _record(1, 32768, OOM), _record(2, 32768, OOM),
               _record(3, 16384, OOM), _record(4, 32768, None)]
    result = TrafficResult(stage="canary@0.05", fraction=0.05, candidate="c", production="p",
                           records=records, memory_start_bytes=0, memory_end_bytes=0)
    assert result.failed_buckets("production") == {32768: 2, 16384: 1}
    assert result.failed_buckets("candidate") == {}
    assert result.errors("production") == 3
