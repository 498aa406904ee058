"""The paired canary's acceptance by simulation: committed per-request ABBA samples
(``tests/data/latency/*.json``, every file: the CPU's now, the H200's when captured),
resampled into at least 1000 simulated canaries at each shipped profile's sizes, run
through the canary's own analysis (``tests.latency_sim``).

* A/A: the whole-canary false-rollback rate (verdict ``fail``) is at most alpha plus its
  95 % binomial margin.
* Planted slowdown: the candidate's timings multiplied by the profile's
  ``min_slowdown_ratio`` are rolled back at least at the profile's stated power.

The 1000 canaries per case are judged at once (``tests.latency_sim.verdicts``, numpy and
``scipy.stats.wilcoxon`` over the rows); that this is the canary's own judge is checked
draw for draw against ``gates.canary.analyse_canary_step`` and
``gates.canary_latency.conclude_canary`` on a subset of every case.
"""

from __future__ import annotations

import pytest

from tests import latency_sim as sim

N = 1000
FILES = sim.sample_files()
# profiles with the same canary plan (bf16-long is local-dry-run's) are simulated once
DISTINCT = list({sim.plan_of(p).model_dump_json(include={"steps", "latency", "max_p99_ratio", "extend"}): p
                 for p in sim.PROFILES}.values())
# a plan that declares it cannot reach its power (local-interpreted: its canary's latency
# is reported not assessed, with that reason) has no power or A/A rate to simulate
UNDERPOWERED = sorted(p for p in DISTINCT if sim.plan_of(p).power_problem())
CASES = [(f, p) for f in FILES for p in sorted(DISTINCT) if p not in UNDERPOWERED]


def test_only_profiles_whose_latency_never_blocks_may_be_underpowered():
    from gates.thresholds import load_thresholds

    assert "local-dry-run" not in UNDERPOWERED and "production" not in UNDERPOWERED
    for profile in UNDERPOWERED:
        thresholds = load_thresholds(sim.ROOT / "thresholds" / f"{profile}.yaml")
        assert not thresholds.not_assessed_blocks_promotion, profile


def test_samples_are_committed():
    assert FILES, "no committed latency samples under tests/data/latency/"
    for path in FILES:
        cand, prod = sim.load_sample(path)
        assert cand.shape == prod.shape and cand.shape[1] == 2 and len(cand) >= 100


CHECKED = 25
"""Canaries per case and null that are also judged one by one through the real judge."""


@pytest.mark.parametrize(("path", "profile"), CASES, ids=[f"{f.stem}-{p}" for f, p in CASES])
def test_the_vectorised_verdicts_are_the_canary_judges(path, profile):
    import numpy as np

    plan = sim.plan_of(profile)
    cand, prod = sim.load_sample(path)
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    seen = set()
    for null, slowdown in (("exchange", 1.0), ("raw", 1.0),
                           ("exchange", plan.latency.min_slowdown_ratio),
                           ("exchange", float(rng.uniform(1.0, 1.1)))):
        indices, swaps = sim.draw(plan, len(cand), CHECKED, rng, null=null)
        fast = sim.verdicts(plan, cand, prod, indices, swaps, slowdown=slowdown)
        slow = [sim.judged_canary(plan, cand, prod, indices[i], swaps[i],
                                  slowdown=slowdown).verdict for i in range(CHECKED)]
        assert list(fast) == slow, (null, slowdown)
        seen.update(slow)
    assert {"pass", "fail"} <= seen  # both outcomes were compared, not one


@pytest.mark.parametrize(("path", "profile"), CASES, ids=[f"{f.stem}-{p}" for f, p in CASES])
def test_a_a_false_rollbacks_within_alpha(path, profile):
    plan = sim.plan_of(profile)
    cand, prod = sim.load_sample(path)
    alpha = plan.latency.alpha
    result = sim.simulate(plan, cand, prod, n=N, seed=11)
    assert result["fail_rate"] <= alpha + sim.margin(alpha, N), result
    # inconclusive (too noisy) is not a rollback by the test, but a reject policy makes
    # it one: it stays rare on the device the plan's noise_sd was written for
    assert result["inconclusive"] / N <= 0.05, result


@pytest.mark.parametrize(("path", "profile"), CASES, ids=[f"{f.stem}-{p}" for f, p in CASES])
def test_power_at_the_preregistered_min_slowdown(path, profile):
    plan = sim.plan_of(profile)
    cand, prod = sim.load_sample(path)
    result = sim.simulate(plan, cand, prod, n=N, seed=12,
                          slowdown=plan.latency.min_slowdown_ratio)
    assert result["fail_rate"] >= plan.latency.power, result


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_no_slowdown_below_the_tolerated_one_is_caught_more_than_alpha(path):
    """The judge tested the other way: a candidate 2x slower passes a plan that tolerates
    2x (its H0), and is caught by a plan that tolerates none."""
    plan = sim.plan_of("local-dry-run")
    cand, prod = sim.load_sample(path)
    tolerant = plan.model_copy(update={"latency": plan.latency.model_copy(
        update={"tolerated_slowdown_ratio": 2.0, "min_slowdown_ratio": 2.2})})
    at_h0 = sim.simulate(tolerant, cand, prod, n=300, seed=13, slowdown=2.0)
    assert at_h0["fail_rate"] <= plan.latency.alpha + sim.margin(plan.latency.alpha, 300)
    caught = sim.simulate(plan, cand, prod, n=100, seed=14, slowdown=2.0)
    assert caught["fail_rate"] == 1.0


CPU_FILES = [f for f in FILES if f.stem.startswith("cpu-")]


@pytest.mark.parametrize("path", CPU_FILES, ids=[f.stem for f in CPU_FILES])
def test_the_legacy_judge_lacks_the_power_the_new_plan_states(path):
    """Today's judge (unpaired Mann-Whitney per step at full alpha, median-ratio floor)
    on the same samples: at the local plan's min slowdown it misses most slowdowns the
    paired judge catches. CPU samples only: on the H200's (far less noisy) the legacy
    judge caught 299 of 300 as well."""
    import numpy as np
    from scipy import stats

    plan = sim.plan_of("local-dry-run")
    cand, prod = sim.load_sample(path)
    rho = plan.latency.min_slowdown_ratio
    rng = np.random.default_rng(15)
    caught = 0
    for _ in range(300):
        for k in sim.LEGACY_STEPS:
            i = rng.integers(0, len(cand), k)
            c, p = cand[i, 0] * rho, prod[i, 0]
            if (stats.mannwhitneyu(c, p, alternative="greater").pvalue < 0.05
                    and np.median(c) / np.median(p) >= 1.05):
                caught += 1
                break
    assert caught / 300 < plan.latency.power


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_the_legacy_judge_fails_the_a_a_criterion_through_its_uncorrected_looks(path):
    """Where today's judge fails A/A, and why. On the committed samples' own draws
    (each compared request's two sides, as captured) it rolls back well under alpha
    (reliability/canary-calibration.json, ``legacy_judge_a_a_rate``: the shared
    between-request spread makes the unpaired test conservative there), so it does
    *not* fail the A/A criterion on these samples. On the null it is built for, each
    side's latencies drawn independently from the same pooled timings, every look holds
    its alpha, and the three looks at the full alpha together roll back about 14 % of
    identical kernels: more than alpha plus its 95 % margin, where the paired judge's
    spent alpha stays within it (``test_a_a_false_rollbacks_within_alpha``)."""
    cand, prod = sim.load_sample(path)
    alpha = 0.05
    rate, looks = sim.legacy_looks(cand, prod, n=N, seed=16, alpha=alpha, independent=True)
    assert all(look <= alpha + sim.margin(alpha, N) for look in looks), looks
    assert rate > alpha + sim.margin(alpha, N), (rate, looks)
