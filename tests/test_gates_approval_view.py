"""What the approval form shows: the evidence of its own transition, ratios as ratios."""

from __future__ import annotations

import math
import re

import numpy as np

from gates.approval_view import approval_markdown, traffic_table
from gates.canary import analyse_canary_step
from gates.decision import decide
from tests.conftest_lineage import passing_metrics, thresholds_yaml
from tests.test_gates_canary import STEP, _clean_step, _latencies, _plan
from tests.test_gates_decision import _frozen, _report


def _decision(**kw):
    thresholds, registration = _frozen(thresholds_yaml(**kw.pop("yaml", {})))
    return decide(_report(**kw), thresholds, registration)


def _steps():
    rng = np.random.default_rng(3)
    prod = _latencies(rng, 300)
    ok = _clean_step(_latencies(rng, 100), prod, _plan(1.05), served=(100, 300))
    slow = _clean_step(_latencies(rng, 100, scale=1.3), prod, _plan(1.05))
    shadow = analyse_canary_step(STEP.model_copy(update={"name": "shadow", "traffic_fraction": 1.0}),
                                 _latencies(rng, 24), _latencies(rng, 24), np.full(24, 1e-6), 0, 0,
                                 1, 1, _plan(1.05), served=(0, 24))
    return shadow, ok, slow


def _table_rows(markdown: str, header_start: str) -> list[list[str]]:
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_gate_table_has_four_columns_and_change_criteria_as_ratios():
    decision = _decision()
    text = approval_markdown("shadow->canary", "3", decision)
    rows = _table_rows(text, "| criterion")
    assert len(rows) == len(decision.criteria)
    assert all(len(r) == 4 for r in rows)
    by_name = {r[0]: r for r in rows}
    speedup = next(c for c in decision.criteria if c.name == "speedup")
    observed, required = by_name["speedup"][2:]
    # the improvement ratio, not the raw latency, against the required ratio
    assert observed == f"{speedup.improvement:.3g}×"
    assert required.startswith("≥") and required.endswith("×")
    assert float(required.strip("≥ ×")) == round(speedup.threshold, 3)
    # the units are said once, in the header
    header = next(line for line in text.splitlines() if line.startswith("| criterion"))
    assert "ratio ×" in header


def test_shadow_to_canary_shows_gate_and_shadow_but_no_canary():
    shadow, ok, _ = _steps()
    text = approval_markdown("shadow->canary", "3", _decision(), traffic=[shadow, ok])
    assert "Held-out gate" in text and "| step" not in text
    # requests answered, not latency samples: the mirrored candidate answered none
    assert "0 served by the candidate / 24 by production" in text
    assert f"p = {shadow.p_value:.3g}" in text
    # one table, and it comes last (the Prefect UI renders nothing after a table)
    assert text.rstrip().splitlines()[-1].startswith("|")


def test_a_step_without_a_latency_test_says_so_not_nan():
    """A step that ran no latency test (NaN p-value and alpha, as a not-assessed shadow
    records them) reads "no latency test" in the sentence and the table, never "nan"."""
    shadow, ok, _ = _steps()
    untested = shadow.model_copy(update={"p_value": math.nan, "alpha": math.nan})
    text = approval_markdown("shadow->canary", "3", _decision(), traffic=[untested, ok])
    assert "no latency test" in text and "p = nan" not in text and "α nan" not in text
    table = traffic_table([untested.model_copy(update={
        "step": "canary-5pct", "latency_assessed": False,
        "latency_not_assessed_reason": "too few requests for the test's power"}), ok])
    assert "nan" not in table and "| n/a |" in table
    assert f"| {ok.p_value:.2g} ({ok.alpha:.2g}) |" in table  # a tested step keeps its p (α)
    assert "latency not assessed in canary-5pct: too few requests" in table
    # why latency was not assessed is said once, above the table
    assert table.index("latency not assessed in canary-5pct") < table.index("| step")
    assert table.count("too few requests") == 1


def test_canary_to_production_shows_each_step_and_the_confirmation():
    shadow, ok, slow = _steps()
    confirmation = _decision()
    text = approval_markdown("canary->production", "3", _decision(), traffic=[shadow, ok, slow],
                             confirmation=confirmation)
    rows = _table_rows(text, "| step")
    assert len(rows) == 2  # the canary steps, not the shadow
    # requests each side answered where recorded (``ok``), else the latency samples
    assert [row[1] for row in rows] == ["100 / 300", f"{slow.n_candidate} / {slow.n_production}"]
    for row, step in zip(rows, (ok, slow), strict=True):
        assert row[0] == f"{step.traffic_fraction:.0%}"
        assert row[2] == f"{step.median_latency_ratio:.3g}"
        p = "<0.001" if step.p_value < 1e-3 else f"{step.p_value:.2g}"
        assert row[3] == f"{p} ({step.alpha:.2g})"
    assert rows[0][-1] == "pass" and rows[1][-1] == "FAIL"
    # the failed step's breaches are above the table (the cells stay narrow: the Prefect
    # UI never wraps them, and at 1280 px the dialog gives the table 455 px)
    (failed,) = [line for line in text.splitlines() if line.startswith(f"- **{slow.step} failed")]
    assert "latency" in failed and text.index(failed) < text.index("| step")
    assert max(len(cell) for row in rows for cell in row) <= 13  # "0.033 (0.017)"
    assert "Confirmation split" in text and f"**{confirmation.verdict}" in text
    assert "Held-out gate" not in text
    assert text.index("Confirmation split") < text.index("| step")
    # the confirmation's criteria as rows, one each, with observed and required
    for c in confirmation.criteria:
        (row,) = [line for line in text.splitlines() if line.startswith(f"- {c.name}: ")]
        assert "required" in row


def test_rejection_reasons_and_not_assessed_note_appear_once():
    metrics = {k: v for k, v in passing_metrics().items() if not k.startswith("latency.")}
    reason = "pallas_tpu ran in TPU interpret mode on a CPU host"
    decision = _decision(metrics=metrics, speed_assessed=False, speed_not_assessed_reason=reason,
                         target_platform="tpu", device_platform="cpu",
                         yaml={"not_assessed_blocks": True})
    text = approval_markdown("candidate->shadow", "3", decision)
    assert len(re.findall(re.escape(reason), text)) == 1
    memory = next(c for c in decision.criteria if c.name == "memory")
    assert "latency" not in memory.reason and "memory" in memory.reason


def test_gate_heading_says_what_was_not_assessed_in_the_verdict_line():
    metrics = {k: v for k, v in passing_metrics().items() if not k.startswith("latency.")}
    decision = _decision(metrics=metrics, speed_assessed=False,
                         speed_not_assessed_reason="ran interpreted", target_platform="tpu",
                         device_platform="cpu")
    assert any(c.status == "not_assessed" for c in decision.criteria)
    heading = next(line for line in approval_markdown("shadow->canary", "3", decision).splitlines()
                   if line.startswith("### Held-out gate"))
    kinds = {c.kind for c in decision.criteria if c.status == "not_assessed"}
    assert "not assessed" in heading and all(k in heading for k in kinds)


def test_a_signed_only_policy_says_how_to_sign_before_the_evidence():
    from gates.approval_view import signed_only_note

    note = signed_only_note("0f3c-run", ["alice", "bob"])
    text = approval_markdown("canary->production", "4", _decision(), signed_only=note)
    assert "kernelgate approve 0f3c-run --key" in text and "alice, bob" in text
    assert "typed here is refused" in text
    assert text.index("kernelgate approve") < text.index("### ")  # above the evidence
    assert "nobody can approve" in signed_only_note("r", [])
    assert "kernelgate approve" not in approval_markdown("canary->production", "4", _decision())


def test_canary_to_production_shows_the_adoption_evidence_above_the_steps():
    """A registration with ``decision:``: the claim as preregistered and the measured
    effect, before the table (nothing renders after it); without one, no adoption text."""
    from gates.adoption_decision import adoption_markdown, conclude_adoption
    from tests.test_gates_adoption_decision import PLAN

    shadow, ok, _ = _steps()
    verdict = conclude_adoption(PLAN, "pass", _steps_of_ratio(0.8))
    evidence = adoption_markdown(PLAN, verdict)
    text = approval_markdown("canary->production", "3", _decision(), traffic=[shadow, ok],
                             confirmation=_decision(), adoption=evidence)
    assert evidence in text
    assert text.index("### Confirmation split") < text.index("### Adoption") < text.index("| step")
    assert "- claim: median paired request latency ratio" in text
    assert f"- measured: median ratio {verdict.median_ratio:.3f}" in text
    plain = approval_markdown("canary->production", "3", _decision(), traffic=[shadow, ok],
                              confirmation=_decision())
    assert "Adoption" not in plain and "claim" not in plain


def _steps_of_ratio(ratio: float) -> list[list[float]]:
    from tests.test_gates_adoption_decision import _steps as paired

    return paired(math.log(ratio))


def test_requests_production_failed_and_the_canary_left_out_are_said_above_the_table():
    _, ok, _ = _steps()
    excluded = ok.model_copy(update={"production_error_count": 47,
                                     "production_failed_buckets": {32768: 47}})
    table = traffic_table([excluded])
    note = ("production failed 47 in " + ok.step + " (32768 tokens: 47): left out of the "
            "comparison as registered (exclude_production_failures)")
    assert note in table and table.index(note) < table.index("| step")
    assert "production failed" not in traffic_table([ok])  # nothing failed: nothing said
