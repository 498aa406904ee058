"""The shipped long-document adoption profile (``thresholds/adoption-longdoc.yaml``): it is
``adoption.yaml``'s registration with its canary replaying a shipped long-document
workload and a per-bucket claim; the numbers its comments state (pairs a bucket is
expected to get, the claim's power, the tuned mixture) are what the code computes from
the registration, and an identical kernel is adopted in a bucket at most at alpha."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.longdoc import canary_source
from evaluation.longdoc.spec import load_spec, shipped
from gates.adoption_buckets import claim_power
from gates.adoption_power import adoption_power, tuned_rho
from gates.thresholds import load_thresholds

ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "thresholds" / "adoption-longdoc.yaml"
SOURCE = ROOT / "thresholds" / "adoption.yaml"
OWN = {"profile", "description", "canary", "decision"}
"""The sections the long-document profile does not take from adoption.yaml."""


@pytest.fixture(scope="module")
def profile():
    return load_thresholds(PROFILE)


@pytest.fixture(scope="module")
def expected_pairs(profile):
    """Compared documents each claimed bucket is expected to get over the registered steps."""
    steps = canary_source.record_steps(profile.canary.workload,
                                       [s.requests for s in profile.canary.steps],
                                       profile.decision.buckets)
    return canary_source.expected_pairs(steps, [s.traffic_fraction for s in profile.canary.steps],
                                        profile.decision.buckets)


def test_it_is_adoption_yaml_with_a_long_document_canary_and_per_bucket_claim(profile):
    source = load_thresholds(SOURCE)
    assert profile.model_dump(exclude=OWN) == source.model_dump(exclude=OWN)
    # its own: the documents, and leaving out those production cannot serve (32k on xla)
    own_canary = {"steps", "workload", "exclude_production_failures"}
    assert profile.canary.model_dump(exclude=own_canary | {"latency"}) == (
        source.canary.model_dump(exclude=own_canary | {"latency"}))
    # and its noise measured within the length buckets, whose ratios differ by design
    assert profile.canary.latency.model_dump(exclude={"noise_within_buckets"}) == (
        source.canary.latency.model_dump(exclude={"noise_within_buckets"}))
    assert profile.canary.latency.noise_within_buckets and not source.canary.latency.noise_within_buckets
    assert profile.decision.model_dump(exclude={"buckets", "max_pairs", "mixture_rho",
                                                "noise_sd"}) == (
        source.decision.model_dump(exclude={"buckets", "max_pairs", "mixture_rho", "noise_sd"}))
    workload = load_spec(shipped(profile.canary.workload))
    assert workload.encoder.dtype == "bfloat16" == profile.serving.model_dtype
    # the claim is made where attention dominates, inside the workload's buckets
    assert set(profile.decision.buckets) <= set(workload.buckets)
    assert min(profile.decision.buckets) >= 4096


def test_the_stated_pairs_and_claim_power_are_what_the_registration_gives(profile,
                                                                          expected_pairs):
    assert expected_pairs == {4096: 39, 8192: 73, 16384: 62}  # the comment's figures
    plan = profile.decision
    assert max(expected_pairs.values()) <= plan.max_pairs
    assert min(expected_pairs.values()) >= plan.bucket_min_pairs  # every bucket assessable
    power, _ = claim_power(plan.adoption_plan(), expected_pairs, plan.bucket_min_pairs,
                           runs=1000)
    assert power >= plan.power
    assert tuned_rho(plan.alpha, plan.max_pairs) == plan.mixture_rho


def test_an_identical_kernel_is_adopted_in_a_bucket_at_most_at_alpha(profile, expected_pairs):
    plan = profile.decision.adoption_plan()
    for pairs in expected_pairs.values():
        capped = plan.model_copy(update={"max_pairs": min(pairs, plan.max_pairs)})
        assert adoption_power(capped, ratio=1.0, runs=1000) <= plan.alpha
