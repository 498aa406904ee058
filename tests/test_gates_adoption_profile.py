"""The shipped adoption profile (``thresholds/adoption.yaml``): it loads with a
``decision:`` section, is bf16-long's registration plus that section and nothing else,
its decision is the one the README documents, and its numbers are what its comments
claim (power reached within ``max_pairs``, the mixture tuned for that count)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gates.adoption import sign_boundary
from gates.adoption_power import adoption_power, pairs_for_adoption_power, tuned_rho
from gates.loosening import loosenings
from gates.thresholds import load_thresholds

ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "thresholds" / "adoption.yaml"
SOURCE = ROOT / "thresholds" / "bf16-long.yaml"
OWN = {"profile", "description", "decision"}
"""The fields the adoption profile does not take from bf16-long."""


def _readme_decision() -> dict:
    """The ``decision:`` block of the README's adoption section, parsed as YAML."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(decision:\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "the README shows one decision: section"
    return yaml.safe_load(blocks[0])["decision"]


def test_the_adoption_profile_loads_with_a_decision_over_production():
    thresholds = load_thresholds(PROFILE)
    assert thresholds.profile == "adoption"
    plan = thresholds.decision
    assert plan is not None
    assert (plan.against, plan.metric) == ("production", "canary_paired_latency_ratio")
    assert plan.minimum_worthwhile_ratio == 0.95  # >= 5 % faster
    assert plan.max_pairs <= sum(thresholds.canary.pairs_per_step())


def test_the_adoption_profile_is_bf16_long_plus_its_decision():
    adoption, source = load_thresholds(PROFILE), load_thresholds(SOURCE)
    assert source.decision is None  # bf16-long's own rollouts run as before
    assert adoption.model_dump(exclude=OWN) == source.model_dump(exclude=OWN)
    assert adoption.profile != source.profile  # a registration of its own
    # from bf16-long, the only difference the loosening rule sees is the added section
    assert loosenings(source, adoption) == ["decision unset -> set"]


def test_the_readme_documents_the_shipped_decision():
    plan = load_thresholds(PROFILE).decision
    assert _readme_decision() == plan.model_dump()


def test_the_shipped_decision_reaches_its_power_within_max_pairs():
    """The loader does not check power; the shipped section is held to it here."""
    adoption = load_thresholds(PROFILE).decision.adoption_plan()
    assert pairs_for_adoption_power(adoption) <= adoption.max_pairs
    assert adoption_power(adoption) >= adoption.power
    # an identical kernel is adopted at most at alpha
    assert adoption_power(adoption, ratio=1.0) <= adoption.alpha


def test_the_shipped_mixture_is_the_one_tuned_for_max_pairs():
    plan = load_thresholds(PROFILE).decision
    assert tuned_rho(plan.alpha, plan.max_pairs) == plan.mixture_rho
    # the count its comment names
    assert int(sign_boundary(plan.max_pairs, plan.alpha, plan.mixture_rho)) == 53
