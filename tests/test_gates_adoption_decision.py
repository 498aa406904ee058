"""Adoption in a rollout, at the function that decides (``conclude_adoption``: log ratios
in, an outcome out): one test per outcome, the adoption judge and the safety verdict each
both ways; the ``decision:`` section of the thresholds schema; a not-adopted outcome is
no rejection for the family's loosening rule; the audit names a doctored decision."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import yaml

from gates.adoption_decision import (
    AdoptionVerdict,
    DecisionPlan,
    adoption_markdown,
    conclude_adoption,
)
from gates.canary import CanaryStepResult
from gates.loosening import loosenings
from gates.thresholds import load_thresholds, parse_thresholds
from tests.flow_thresholds import FLOW_TEST

PLAN = DecisionPlan(against="production", minimum_worthwhile_ratio=0.9, alpha=0.05, power=0.8,
                    noise_sd=0.1, max_pairs=80, mixture_rho=20.0)


def _steps(median_log_ratio: float, sd: float = 0.08, seed: int = 0) -> list[list[float]]:
    """80 paired log ratios ``log(candidate / production)``, normal around the median,
    cut as local-dry-run's canary steps compare them (5, 25 and 50 pairs)."""
    r = median_log_ratio + sd * np.random.default_rng(seed).standard_normal(80)
    return [r[:5].tolist(), r[5:30].tolist(), r[30:].tolist()]


def test_a_candidate_clearly_faster_is_adopted_at_the_first_look_that_shows_it():
    verdict = conclude_adoption(PLAN, "pass", _steps(math.log(0.8)))
    assert verdict.outcome == "adopted", verdict.reason
    assert verdict.looks == [5, 30, 80] and verdict.decided_at in (30, 80)
    assert verdict.ratio_upper < 1.0 and verdict.p_value <= PLAN.alpha
    assert verdict.reason.startswith("adopted: faster than production (median ratio 0.")


@pytest.mark.parametrize("ratio", [1.0, 1.1, 0.97])
def test_a_candidate_not_faster_or_faster_by_too_little_is_not_worth_it(ratio):
    """Equal, slower, and a real speed-up of 3 % below the 10 % worth adopting: the
    adoption judge the other way."""
    verdict = conclude_adoption(PLAN, "pass", _steps(math.log(ratio)))
    assert verdict.outcome == "not_worth_it", verdict.reason
    assert verdict.ratio_lower > PLAN.minimum_worthwhile_ratio  # shown to gain less
    assert "not worth adopting over production" in verdict.reason
    assert "confidence sequence [" in verdict.reason


def test_an_unsafe_canary_is_unsafe_whatever_the_speed_up():
    """The safety verdict both ways: a failed canary is unsafe (adoption not judged) even
    for a candidate the adoption test would adopt; a passing one is judged."""
    fast = _steps(math.log(0.7))
    unsafe = conclude_adoption(PLAN, "fail", fast)
    assert (unsafe.outcome, unsafe.result) == ("unsafe", None)
    assert conclude_adoption(PLAN, "pass", fast).outcome == "adopted"


def test_max_pairs_reached_with_neither_bound_is_inconclusive_never_adopted():
    """A speed-up near the minimum worthwhile, under noise the plan was not sized for."""
    verdict = conclude_adoption(PLAN, "pass", _steps(math.log(0.9), sd=0.6, seed=3))
    assert verdict.outcome == "inconclusive", verdict.reason
    assert verdict.reason.startswith("adoption inconclusive: max_pairs 80 reached")
    assert verdict.decided_at == 80


def test_without_paired_samples_or_enough_pairs_it_is_inconclusive_saying_why():
    none = conclude_adoption(PLAN, "pass", [[], []], not_assessed_reason="ran interpreted")
    assert none.outcome == "inconclusive" and "ran interpreted" in none.reason
    short = conclude_adoption(PLAN, "pass", [[0.01, -0.02, 0.0]])
    assert short.outcome == "inconclusive" and "the canary ended after 3 pairs" in short.reason
    assert math.isinf(short.ratio_upper)
    # the record reads back as written, an unbounded side included
    assert AdoptionVerdict.model_validate_json(short.model_dump_json()) == short


def test_pairs_past_max_pairs_are_not_judged():
    plan = PLAN.model_copy(update={"max_pairs": 50})
    verdict = conclude_adoption(plan, "pass", _steps(math.log(1.0)))
    assert verdict.looks == [5, 30, 50] and verdict.result.looks[-1].n == 50


# --- the decision: section of the thresholds schema -------------------------------------

DECISION = {"against": "production", "minimum_worthwhile_ratio": 0.5, "alpha": 0.05,
            "power": 0.8, "noise_sd": 0.5, "max_pairs": 18, "mixture_rho": 0.25}
"""A section that fits the flow-test canary (6 + 12 compared requests)."""


def _flow(**decision) -> dict:
    data = yaml.safe_load(FLOW_TEST.read_text())
    if decision:
        data["decision"] = decision
    return data


def _parsed(data: dict):
    return parse_thresholds(yaml.safe_dump(data).encode())


def test_a_registration_without_decision_has_none_and_one_with_it_reads_it():
    assert load_thresholds(FLOW_TEST).decision is None
    plan = _parsed(_flow(**DECISION)).decision
    assert plan.metric == "canary_paired_latency_ratio" and plan.max_pairs == 18
    assert plan.adoption_plan().minimum_worthwhile_ratio == 0.5


@pytest.mark.parametrize(("change", "words"), [
    ({"max_pairs": 19}, "exceeds the 18 requests the canary's registered steps compare"),
    ({"mixture_rho": 25.0}, "can never reach the adoption test's bound"),
    ({"minimum_worthwhile_ratio": 0.99, "null_ratio": 0.95}, "must be below null_ratio"),
    ({"against": "baseline"}, "against"),
    ({"metric": "latency.p50_s"}, "metric"),
])
def test_a_decision_that_cannot_work_is_refused_naming_the_constraint(change, words):
    with pytest.raises(ValueError, match=words):
        _parsed(_flow(**(DECISION | change)))


def test_adding_removing_or_relaxing_the_decision_is_a_loosening():
    base, decided = _parsed(_flow()), _parsed(_flow(**DECISION))
    assert loosenings(decided, base) == ["decision set -> unset"]
    assert loosenings(base, decided) == ["decision unset -> set"]  # another test: a person says why
    relaxed = _parsed(_flow(**(DECISION | {"minimum_worthwhile_ratio": 0.6, "alpha": 0.1})))
    assert loosenings(decided, relaxed) == ["decision.minimum_worthwhile_ratio 0.5 -> 0.6",
                                            "decision.alpha 0.05 -> 0.1"]
    stricter = _parsed(_flow(**(DECISION | {"minimum_worthwhile_ratio": 0.4})))
    assert loosenings(decided, stricter) == []


# --- not adopted is no rejection; the audit re-derives the decision ---------------------

def test_a_not_adopted_outcome_is_no_rejection_for_the_loosening_rule():
    from lineage.records.registration import _rejects
    from lineage.signing.attestations import Attestation

    def outcome(result: str, inconclusive: bool = False) -> Attestation:
        return Attestation(kind="outcome", run_id="r", path="p", subjects={}, keyid="k",
                           envelope_sha256="0" * 64,
                           predicate={"result": result, "inconclusive": inconclusive})

    assert not _rejects(outcome("not_adopted"))
    assert _rejects(outcome("rolled_back")) and not _rejects(outcome("rolled_back", True))


def _results(steps: list[list[float]]) -> list[CanaryStepResult]:
    return [CanaryStepResult.model_construct(log_ratios=r, latency_not_assessed_reason=None)
            for r in steps]


def test_the_audit_re_derives_the_decision_and_names_a_doctored_one(monkeypatch):
    from lineage.audit import canary_audit

    steps = _steps(math.log(1.0))
    signed = conclude_adoption(PLAN, "pass", steps)
    assert signed.outcome == "not_worth_it"
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: ("run", signed))
    [(name, run, ok, detail)] = canary_audit.adoption(None, PLAN, "pass", _results(steps), "3",
                                                      promoted=False)
    assert (name, run, ok) == ("adoption decision", "run", True), detail
    doctored = signed.model_copy(update={"outcome": "adopted"})
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: ("run", doctored))
    [(_, _, ok, detail)] = canary_audit.adoption(None, PLAN, "pass", _results(steps), "3",
                                                 promoted=True)
    assert not ok
    assert detail.startswith("re-derived from the signed canary samples and the registered "
                             "plan: not_worth_it at ")
    assert "signed: adopted at " in detail
    # a promoted version under a decision: with no signed adoption decision is a problem
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: None)
    [(_, _, ok, detail)] = canary_audit.adoption(None, PLAN, "pass", _results(steps), "3",
                                                 promoted=True)
    assert not ok and "no rollout signed an adoption decision" in detail
    # a plan doctored after the fact (another minimum worthwhile) is named the same way
    other = PLAN.model_copy(update={"minimum_worthwhile_ratio": 0.99, "null_ratio": 1.0})
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: ("run", signed))
    [(_, _, ok, _)] = canary_audit.adoption(None, copy.deepcopy(other), "pass",
                                            _results(steps), "3", promoted=False)
    assert not ok


# --- what the approval form and the version page show ----------------------------------

def _lines(markdown: str) -> dict[str, str]:
    """The evidence block's list rows by their label (``claim``, ``measured``)."""
    return dict(line[2:].split(": ", 1) for line in markdown.splitlines()
                if line.startswith("- "))


def test_the_evidence_says_the_claim_as_preregistered_and_the_measured_effect():
    verdict = conclude_adoption(PLAN, "pass", _steps(math.log(0.8)))
    text = adoption_markdown(PLAN, verdict)
    heading, *_ = text.splitlines()
    assert heading == "### Adoption (preregistered `decision:`): **adopted**"
    rows = _lines(text)
    assert rows["claim"] == ("median paired request latency ratio (candidate / production) "
                             "≤ 0.9, i.e. ≥ 10 % faster; α 0.05, power 0.8")
    n = verdict.decided_at
    assert rows["measured"] == (f"median ratio {verdict.median_ratio:.3f} over {n} pairs, "
                                f"95 % confidence sequence [{verdict.ratio_lower:.3f}, "
                                f"{verdict.ratio_upper:.3f}], always-valid p {verdict.p_value:.2g}")


def test_the_evidence_names_each_outcome_in_its_heading():
    not_worth = conclude_adoption(PLAN, "pass", _steps(math.log(1.0)))
    assert adoption_markdown(PLAN, not_worth).splitlines()[0].endswith("**not worth adopting**")
    short = conclude_adoption(PLAN, "pass", [[0.01, -0.02, 0.0]])
    text = adoption_markdown(PLAN, short, heading="")
    assert text.splitlines()[0] == "Adoption (preregistered `decision:`): **inconclusive**"
    assert ", inf]" in _lines(text)["measured"]  # an unbounded side, said so


def test_a_decision_not_judged_says_why_in_place_of_the_effect():
    unsafe = conclude_adoption(PLAN, "fail", _steps(math.log(0.7)))
    rows = _lines(adoption_markdown(PLAN, unsafe))
    assert rows["measured"] == f"not judged ({unsafe.reason})"
    assert unsafe.reason.startswith("unsafe: the canary's safety verdict failed")
    none = conclude_adoption(PLAN, "pass", [[]], not_assessed_reason="ran interpreted")
    assert "ran interpreted" in _lines(adoption_markdown(PLAN, none))["measured"]
