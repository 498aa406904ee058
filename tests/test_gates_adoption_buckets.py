"""Adoption judged per declared length bucket: A/A false adoption within alpha, a
speed-up everywhere adopted, a speed-up in one required bucket only not adopted (naming
the other), a bucket short of pairs not assessed (never passed), the schema's
``buckets`` and ``min_pairs_per_bucket`` and their loosening directions, and the
per-bucket table people see."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gates.adoption import AdoptionInputError, judge
from gates.adoption_buckets import BucketAdoption, combine, first_decidable, split_by_bucket
from gates.adoption_decision import (
    AdoptionVerdict,
    DecisionPlan,
    adoption_markdown,
    conclude_adoption,
)
from gates.adoption_power import tuned_rho
from gates.loosening import loosenings
from tests.test_gates_adoption_decision import DECISION, _flow, _parsed

ROOT = Path(__file__).resolve().parents[1]
PLAN = DecisionPlan(against="production", minimum_worthwhile_ratio=0.9, alpha=0.05,
                    power=0.8, noise_sd=0.1, max_pairs=200, mixture_rho=20.0,
                    buckets=[128, 256])
STEPS = (20, 60, 120)
"""Compared requests per canary step."""


def _traffic(ratio: dict[int, float], sd: float = 0.08, seed: int = 0,
             mix: dict[int, float] | None = None) -> tuple[list[list[float]], list[list[int]]]:
    """Per step, log ratios ``log(candidate / production)`` normal around
    ``log(ratio[bucket])`` and each request's bucket, drawn from ``mix`` (default even)."""
    rng = np.random.default_rng(seed)
    mix = mix or {b: 1 / len(ratio) for b in ratio}
    names = list(mix)
    ratios, buckets = [], []
    for size in STEPS:
        b = rng.choice(names, size=size, p=[mix[n] for n in names])
        r = np.log([ratio[int(x)] for x in b]) + sd * rng.standard_normal(size)
        ratios.append(r.tolist())
        buckets.append([int(x) for x in b])
    return ratios, buckets


def test_a_speed_up_in_every_required_bucket_is_adopted_with_each_buckets_interval():
    ratios, buckets = _traffic({128: 0.8, 256: 0.75})
    verdict = conclude_adoption(PLAN, "pass", ratios, buckets=buckets)
    assert verdict.outcome == "adopted", verdict.reason
    assert [b.bucket for b in verdict.buckets] == [128, 256]
    for b in verdict.buckets:
        assert b.status == "adopt"
        assert b.ratio_upper < 1.0 and b.ratio_lower < b.median_ratio < b.ratio_upper
        assert b.p_value <= PLAN.alpha
    # each bucket's median sits near its own planted ratio, not the pooled one
    medians = {b.bucket: b.median_ratio for b in verdict.buckets}
    assert abs(medians[128] - 0.8) < 0.03 and abs(medians[256] - 0.75) < 0.03
    assert "128 tokens: faster" in verdict.reason and "256 tokens: faster" in verdict.reason


def test_a_speed_up_in_one_required_bucket_only_is_not_adopted_and_names_the_other():
    """Pooled, the long bucket's gain would carry the claim: 3 of 4 requests are long."""
    ratios, buckets = _traffic({128: 1.0, 256: 0.7}, mix={128: 0.25, 256: 0.75})
    pooled = conclude_adoption(PLAN.model_copy(update={"buckets": []}), "pass", ratios)
    assert pooled.outcome == "adopted", pooled.reason
    verdict = conclude_adoption(PLAN, "pass", ratios, buckets=buckets)
    assert verdict.outcome != "adopted", verdict.reason
    status = {b.bucket: b.status for b in verdict.buckets}
    assert status == {128: "not_worth_it", 256: "adopt"}
    assert verdict.outcome == "not_worth_it"
    assert "in bucket(s) 128 tokens: not worth it" in verdict.reason
    assert "256 tokens" not in verdict.reason


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_false_adoption_on_a_a_traffic_is_within_alpha(alpha):
    """400 A/A canaries over four required buckets (none faster; a minimum worthwhile
    effect of 1 % so that "not worth it" rarely ends a run first): adopted at most alpha
    of the time. At alpha 0.2 each bucket's own test adopts often enough that a rule
    adopting where *any* bucket adopts would exceed alpha: the check can fail."""
    plan = DecisionPlan(against="production", minimum_worthwhile_ratio=0.99, alpha=alpha,
                        power=0.8, noise_sd=0.1, max_pairs=200,
                        mixture_rho=tuned_rho(alpha, 50), buckets=[64, 128, 256, 512])
    runs, adopted, any_bucket, bucket_adopts = 400, 0, 0, 0
    for seed in range(runs):
        ratios, buckets = _traffic(dict.fromkeys(plan.buckets, 1.0), sd=0.1, seed=seed)
        verdict = conclude_adoption(plan, "pass", ratios, buckets=buckets)
        adopted += verdict.outcome == "adopted"
        said = [b.status == "adopt" for b in verdict.buckets]
        any_bucket += any(said)
        bucket_adopts += sum(said)
    assert adopted / runs <= alpha
    assert bucket_adopts / (4 * runs) <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / (4 * runs))
    if alpha == 0.2:
        assert any_bucket / runs > alpha


def test_a_bucket_with_too_few_pairs_is_not_assessed_and_never_passed():
    ratios, buckets = _traffic({128: 0.7, 256: 0.7}, mix={128: 0.98, 256: 0.02}, seed=1)
    plan = PLAN.model_copy(update={"min_pairs_per_bucket": 30})
    verdict = conclude_adoption(plan, "pass", ratios, buckets=buckets)
    short = next(b for b in verdict.buckets if b.bucket == 256)
    assert short.n_pairs < 30 and short.status == "not_assessed"
    assert short.ratio_lower is None and "fewer than the 30 needed" in short.reason
    assert verdict.outcome == "inconclusive"
    assert "256 tokens: not assessed" in verdict.reason
    # a required bucket the traffic never reached is not assessed either
    none = conclude_adoption(plan.model_copy(update={"buckets": [128, 512]}), "pass", ratios,
                             buckets=buckets)
    assert none.outcome == "inconclusive" and "512 tokens: not assessed (0 pairs" in none.reason


def test_requests_without_a_length_bucket_leave_every_bucket_not_assessed():
    ratios, _ = _traffic({128: 0.7, 256: 0.7})
    verdict = conclude_adoption(PLAN, "pass", ratios)
    assert verdict.outcome == "inconclusive"
    assert {b.status for b in verdict.buckets} == {"not_assessed"}
    assert "200 compared requests carry no length bucket" in verdict.reason


def test_an_unsafe_canary_stays_unsafe_and_no_pairs_stays_inconclusive_with_buckets():
    ratios, buckets = _traffic({128: 0.7, 256: 0.7})
    assert conclude_adoption(PLAN, "fail", ratios, buckets=buckets).outcome == "unsafe"
    empty = conclude_adoption(PLAN, "pass", [[], []], buckets=[[], []],
                              not_assessed_reason="ran interpreted")
    assert empty.outcome == "inconclusive" and "ran interpreted" in empty.reason


def test_buckets_that_do_not_line_up_with_the_pairs_are_refused_naming_the_step():
    ratios, buckets = _traffic({128: 1.0, 256: 1.0})
    buckets[1] = buckets[1][:-1]
    with pytest.raises(AdoptionInputError, match="step 1: 60 log ratios but 59 buckets"):
        conclude_adoption(PLAN, "pass", ratios, buckets=buckets)
    with pytest.raises(AdoptionInputError, match="given for 2 steps, log ratios for 3"):
        conclude_adoption(PLAN, "pass", ratios, buckets=buckets[:2])


def test_split_keeps_canary_order_and_each_buckets_cumulative_looks():
    split = split_by_bucket([[0.1, 0.2], [0.3], [0.4, 0.5]], [[1, 2], [2], [9, 1]], [1, 2])
    assert split == {1: ([0.1, 0.5], [1, 2]), 2: ([0.2, 0.3], [1, 2])}


def test_first_decidable_is_where_all_concordant_signs_first_adopt():
    """Checked against the test itself: all pairs faster adopts at that count, not one
    pair before."""
    for alpha, rho in [(0.05, 20.0), (0.05, 0.8), (0.01, 5.0)]:
        n = first_decidable(alpha, rho)
        plan = PLAN.adoption_plan().model_copy(update={"alpha": alpha, "mixture_rho": rho,
                                                       "max_pairs": 10_000})
        fast = [-0.5] * n
        assert judge(plan, fast).decided_at == n
        assert judge(plan, fast[:-1]).decision == "continue"


def test_combine_needs_a_bucket_and_reads_not_worth_it_before_adopted():
    with pytest.raises(ValueError, match="at least one required bucket"):
        combine([])
    adopt = BucketAdoption(bucket=64, status="adopt", n_pairs=40, looks=[40],
                           median_ratio=0.8, ratio_lower=0.7, ratio_upper=0.9, p_value=0.01)
    short = adopt.model_copy(update={"bucket": 128, "status": "not_worth_it"})
    assert combine([adopt, short])[0] == "not_worth_it"
    assert combine([adopt, adopt.model_copy(update={"bucket": 128})])[0] == "adopted"


# --- the schema ---------------------------------------------------------------------------

def _bucketed(workload: str | None = "longdoc-cpu-small", **decision):
    """The flow-test registration with ``decision`` (over :data:`DECISION`) and, unless
    None, the canary replaying ``workload``."""
    data = _flow(**{**DECISION, **decision})
    if workload is not None:
        data["canary"]["workload"] = workload
    return _parsed(data)


@pytest.mark.parametrize(("change", "words"), [
    ({"buckets": [256, 128]}, "strictly increasing"),
    ({"buckets": [0, 128]}, "positive token counts"),
    ({"buckets": [128], "min_pairs_per_bucket": 2}, "below the .* pairs at which the adoption "
                                                    "test can first decide"),
])
def test_bad_bucket_declarations_are_refused_naming_the_constraint(change, words):
    with pytest.raises(ValueError, match=words):
        _bucketed(**change)


def test_buckets_without_a_workload_that_records_them_are_refused():
    """MiniLM's recorded requests carry no bucket: every rollout would be inconclusive."""
    with pytest.raises(ValueError, match="decision.buckets .* needs canary.workload"):
        _bucketed(workload=None, buckets=[128])
    assert _bucketed(workload=None).decision.buckets == []  # pooled: no workload needed


def test_declared_buckets_read_from_the_registration_and_default_min_pairs_is_decidable():
    plan = _bucketed(buckets=[128, 256]).decision
    assert plan.buckets == [128, 256] and plan.min_pairs_per_bucket is None
    least = plan.bucket_min_pairs
    assert least == first_decidable(plan.alpha, plan.mixture_rho)
    assert least <= plan.max_pairs


def test_dropping_a_bucket_or_lowering_its_pairs_is_looser_adding_one_is_not():
    base = _bucketed(buckets=[128, 256], min_pairs_per_bucket=12)
    fewer = _bucketed(buckets=[256], min_pairs_per_bucket=12)
    more = _bucketed(buckets=[64, 128, 256], min_pairs_per_bucket=12)
    lower = _bucketed(buckets=[128, 256], min_pairs_per_bucket=11)
    assert loosenings(base, fewer) == ["decision.buckets: 128 removed"]
    assert loosenings(base, more) == []
    assert loosenings(base, lower) == ["decision.min_pairs_per_bucket 12 -> 11"]
    # another request source is another test: a change a person must name
    other = _bucketed(workload="longdoc-modernbert-base", buckets=[128, 256],
                      min_pairs_per_bucket=12)
    assert loosenings(base, other) == ["canary.workload longdoc-cpu-small -> "
                                       "longdoc-modernbert-base"]


# --- what people see ------------------------------------------------------------------------

def test_the_evidence_lists_each_required_bucket_with_its_interval_and_no_table():
    ratios, buckets = _traffic({128: 1.0, 256: 0.7}, mix={128: 0.25, 256: 0.75})
    plan = PLAN.model_copy(update={"buckets": [128, 256, 512]})
    verdict = conclude_adoption(plan, "pass", ratios, buckets=buckets)
    text = adoption_markdown(plan, verdict)
    assert "**not worth adopting**" in text
    assert "in every bucket of 128, 256, 512 tokens" in text
    items = [line for line in text.splitlines() if line.startswith("  - ")]
    assert [i.split()[1] for i in items] == ["128", "256", "512"]
    b128, b256, _ = verdict.buckets
    assert "**below it**" in items[0] and "**meets it**" in items[1]
    assert f"[{b256.ratio_lower:.3f}, {b256.ratio_upper:.3f}]" in items[1]
    assert f"of {b128.n_pairs} pairs" in items[0]
    assert items[2] == "  - 512 tokens: **not assessed** (0 pairs, fewer than the " \
        f"{plan.bucket_min_pairs} needed (min_pairs_per_bucket))"
    # a list, not a table: the approval form's canary table must stay the first and last
    assert "|" not in text
    # the verdict reads back as written
    assert AdoptionVerdict.model_validate_json(verdict.model_dump_json()) == verdict


def test_the_approval_form_shows_the_per_bucket_effect_above_the_canary_table():
    from gates.approval_view import approval_markdown
    from tests.test_gates_approval_view import _decision
    from tests.test_gates_approval_view import _steps as form_steps

    ratios, buckets = _traffic({128: 0.75, 256: 0.7})
    verdict = conclude_adoption(PLAN, "pass", ratios, buckets=buckets)
    evidence = adoption_markdown(PLAN, verdict)
    shadow, ok, _ = form_steps()
    text = approval_markdown("canary->production", "3", _decision(), traffic=[shadow, ok],
                             confirmation=_decision(), adoption=evidence)
    assert text.index("### Adoption") < text.index("  - 128 tokens: **meets it**") \
        < text.index("  - 256 tokens: **meets it**") < text.index("| step")
    assert text.count("\n|---") == 1  # the canary's table is the only one


# --- the canary carries each compared request's bucket; the audit re-derives per bucket ---

def _canary_steps(ratio: dict[int, float], seed: int = 0):
    """local-dry-run's canary (5 + 25 + 50 compared requests) timed ABBA, each request's
    bucket drawn evenly from ``ratio``'s keys, its candidate time ``ratio[bucket]`` times
    production's (< 1: faster)."""
    from gates.canary import analyse_canary_step
    from gates.thresholds import load_thresholds

    plan = load_thresholds(ROOT / "thresholds" / "local-dry-run.yaml").canary
    rng = np.random.default_rng(seed)
    results = []
    for step, n in zip(plan.steps, plan.pairs_per_step(), strict=True):
        lengths = rng.choice(list(ratio), size=n)
        base = rng.lognormal(np.log(0.02), 0.3, (n, 1)) * np.ones((1, 2))
        factor = np.array([ratio[int(b)] for b in lengths])[:, None]
        cand = base * factor * np.exp(rng.normal(0, 0.03, (n, 2)))
        prod = base * np.exp(rng.normal(0, 0.03, (n, 2)))
        results.append(analyse_canary_step(step, cand[:, 0], prod[:, 0], np.zeros(n), 0, 0, 0,
                                           0, plan, abba=(cand, prod), earlier=results,
                                           length_buckets=lengths.tolist()))
    return plan, results


def test_a_canary_step_keeps_each_compared_requests_bucket_and_refuses_a_mismatch():
    plan, results = _canary_steps({128: 0.7, 256: 1.0})
    assert [len(r.length_buckets) for r in results] == [5, 25, 50]
    assert all(len(r.length_buckets) == len(r.log_ratios) for r in results)
    # the faster bucket's pairs are the ones carrying its length, request by request
    r = np.concatenate([x.log_ratios for x in results])
    b = np.concatenate([x.length_buckets for x in results])
    assert np.median(r[b == 128]) < np.log(0.8) < np.median(r[b == 256])
    from gates.canary import analyse_canary_step

    abba = (np.ones((4, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="3 entries for 4 ABBA rows"):
        analyse_canary_step(plan.steps[0], np.ones(4), np.ones(4), np.zeros(4), 0, 0, 0, 0,
                            plan, abba=abba, length_buckets=[1, 2, 3])


def test_the_audit_re_derives_the_per_bucket_decision_and_names_a_doctored_bucket(monkeypatch):
    from lineage.audit import canary_audit

    _, results = _canary_steps({128: 0.7, 256: 1.0}, seed=4)
    plan = DecisionPlan(against="production", minimum_worthwhile_ratio=0.9, alpha=0.05,
                        power=0.8, noise_sd=0.1, max_pairs=80, mixture_rho=5.0,
                        buckets=[128, 256])
    signed = conclude_adoption(plan, "pass", [r.log_ratios for r in results],
                               buckets=[r.length_buckets for r in results])
    assert [b.status for b in signed.buckets] == ["adopt", "not_worth_it"], signed.reason
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: ("run", signed))
    [(_, _, ok, detail)] = canary_audit.adoption(None, plan, "pass", results, "3",
                                                 promoted=False)
    assert ok, detail
    doctored_bucket = signed.buckets[1].model_copy(update={"status": "adopt"})
    doctored = signed.model_copy(update={"buckets": [signed.buckets[0], doctored_bucket]})
    monkeypatch.setattr(canary_audit, "signed_adoption", lambda source, version: ("run", doctored))
    [(_, _, ok, detail)] = canary_audit.adoption(None, plan, "pass", results, "3",
                                                 promoted=False)
    assert not ok and "bucket 256: not_worth_it" in detail and "bucket 256: adopt " in detail


def test_not_worth_it_names_the_buckets_below_it_then_those_not_decided():
    adopt = BucketAdoption(bucket=512, status="adopt", n_pairs=40, looks=[40],
                           median_ratio=0.5, ratio_lower=0.45, ratio_upper=0.55, p_value=0.01)
    short = adopt.model_copy(update={"bucket": 128, "status": "not_worth_it",
                                     "median_ratio": 1.0, "ratio_lower": 0.95,
                                     "ratio_upper": 1.05})
    open_ = adopt.model_copy(update={"bucket": 256, "status": "continue", "median_ratio": 0.9,
                                     "ratio_lower": 0.7, "ratio_upper": math.inf})
    outcome, words = combine([short, open_, adopt])
    assert outcome == "not_worth_it"
    assert words == ("128 tokens: not worth it, median ratio 1.000 [0.950, 1.050] over 40 "
                     "pairs; not decided: 256 tokens: undecided, median ratio 0.900 "
                     "[0.700, inf] over 40 pairs")


def test_claim_power_matches_the_rollouts_own_verdicts_at_the_minimum_worthwhile_effect():
    """Checked against ``conclude_adoption`` itself: 300 canaries with every bucket at
    exactly the minimum worthwhile ratio (a look after every pair, as the simulation
    looks), adopted at the predicted rate within a binomial margin."""
    from gates.adoption_buckets import claim_power

    plan = DecisionPlan(against="production", minimum_worthwhile_ratio=0.9, alpha=0.05,
                        power=0.8, noise_sd=0.1, max_pairs=80, mixture_rho=tuned_rho(0.05, 40),
                        buckets=[128, 256])
    pairs = {128: 30, 256: 50}
    predicted, per = claim_power(plan.adoption_plan(), pairs, plan.bucket_min_pairs)
    assert predicted == pytest.approx(per[128] * per[256])
    assert 0.05 < per[128] < per[256] < 1.0  # fewer pairs, less power
    runs, adopted = 300, 0
    rng = np.random.default_rng(21)
    for _ in range(runs):
        lengths = [128] * 30 + [256] * 50
        rng.shuffle(lengths)
        r = math.log(0.9) + 0.1 * rng.standard_normal(80)
        verdict = conclude_adoption(plan, "pass", [[x] for x in r],
                                    buckets=[[b] for b in lengths])
        adopted += verdict.outcome == "adopted"
    margin = 3 * math.sqrt(predicted * (1 - predicted) / runs)
    assert abs(adopted / runs - predicted) <= margin, (adopted, predicted)
    # a bucket below min_pairs has no power at all, so neither has the claim
    none, per = claim_power(plan.adoption_plan(), {128: 30, 256: plan.bucket_min_pairs - 1},
                            plan.bucket_min_pairs)
    assert none == 0.0 and per[256] == 0.0
    with pytest.raises(ValueError, match="at least one bucket"):
        claim_power(plan.adoption_plan(), {}, 5)
