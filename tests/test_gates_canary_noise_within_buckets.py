"""The canary's noise measured within length buckets (``latency.noise_within_buckets``):
on a long-document canary whose buckets' ratios differ by design, the pooled noise took
extra looks on an H100 (pooled sd 0.589 and 0.638, 0.05-0.20 within a bucket); measured
about each bucket's median it does not, while a uniform slowdown is still caught and an
identical kernel is still rolled back at most at alpha."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gates.canary import analyse_canary_step
from gates.canary_latency import another_look, conclude_canary
from gates.latency_judge import robust_sd, within_bucket_sd
from gates.loosening import loosenings
from gates.thresholds import load_thresholds
from lineage.audit.canary_audit import _step

ROOT = Path(__file__).resolve().parents[1]
SHARES = {1024: 0.2, 2048: 0.3, 4096: 0.15, 8192: 0.2, 16384: 0.15}
AGAINST_XLA = {1024: 0.61, 2048: 0.42, 4096: 0.20, 8192: 0.13, 16384: 0.095}
"""The H100's per-bucket median document ratios of pallas_mosaic_gpu over xla (BENCHMARKS)."""


def _thresholds(within: bool):
    loaded = load_thresholds(ROOT / "thresholds" / "adoption-longdoc.yaml")
    latency = loaded.canary.latency.model_copy(update={"noise_within_buckets": within})
    canary = loaded.canary.model_copy(update={"latency": latency})
    return loaded.model_copy(update={"canary": canary})


def _canary(plan, ratios: dict[int, float], rng, noise: float = 0.05) -> list:
    """The canary as the flow runs it: every registered step, then extra looks while
    ``another_look``; each compared document's bucket drawn by ``SHARES``, production's
    time growing with the length, the candidate ``ratios[bucket]`` times it, each side's
    two ABBA timings with independent log-normal noise."""
    results = []
    for i, (step, n) in enumerate(zip(plan.looks(), plan.pairs_per_look(), strict=True)):
        if i and not another_look(plan, results):
            break
        buckets = rng.choice(list(SHARES), size=n, p=list(SHARES.values()))
        base = (buckets / 1024.0) ** 1.5 * 4e-3
        prod = base[:, None] * np.exp(rng.normal(0, noise, (n, 2)))
        cand = (base * np.array([ratios[b] for b in buckets]))[:, None] * np.exp(
            rng.normal(0, noise, (n, 2)))
        results.append(analyse_canary_step(
            step, cand[:, 0], prod[:, 0], np.zeros(n), 0, 0, 0, 0, plan, abba=(cand, prod),
            earlier=results, length_buckets=buckets.tolist()))
    return results


def test_within_bucket_sd_is_the_spread_about_each_buckets_own_median():
    rng = np.random.default_rng(0)
    buckets = np.repeat([1, 2, 3], 400)
    x = np.log(np.repeat([0.6, 0.2, 0.1], 400)) + rng.normal(0, 0.05, 1200)
    assert within_bucket_sd(x, buckets) == pytest.approx(0.05, rel=0.1)
    assert robust_sd(x) > 0.5  # the buckets' spread, counted as noise when pooled
    assert within_bucket_sd([0.1, 0.2, 5.0], [1, 1, 2]) == pytest.approx(0.0741, rel=1e-3)
    assert np.isnan(within_bucket_sd([0.1, 5.0], [1, 2]))  # one ratio a bucket: no residual
    with pytest.raises(ValueError, match="one per compared request"):
        within_bucket_sd([0.1, 0.2], [1])


def test_pooled_noise_takes_extra_looks_and_noise_within_buckets_does_not():
    pooled, within = _thresholds(within=False).canary, _thresholds(within=True).canary
    extra = _canary(pooled, AGAINST_XLA, np.random.default_rng(1))
    assert len(extra) > len(pooled.steps)  # the H100's extra looks, reproduced
    assert conclude_canary(pooled, extra).noise_sd > 0.5
    steps = _canary(within, AGAINST_XLA, np.random.default_rng(1))
    assert len(steps) == len(within.steps)
    verdict = conclude_canary(within, steps)
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.noise_sd < 0.1 and "noise sd 0.0" in verdict.reason
    assert "noise measured about each length bucket's median, as registered" in verdict.reason
    assert "length bucket" not in conclude_canary(pooled, extra).reason


def test_a_uniform_slowdown_is_still_caught_with_the_noise_within_buckets():
    plan = _thresholds(within=True).canary
    slower = dict.fromkeys(SHARES, 1.25)
    results = _canary(plan, slower, np.random.default_rng(2))
    verdict = conclude_canary(plan, results)
    assert verdict.verdict == "fail" and "candidate slower" in verdict.reason


def test_an_identical_kernel_is_rolled_back_at_most_at_alpha():
    """100 A/A canaries on bucketed documents (alpha 0.05 over every look): at most 12
    rolled back (binomial tail 1e-3 at 5 %)."""
    plan = _thresholds(within=True).canary
    rng = np.random.default_rng(3)
    failed = sum(conclude_canary(plan, _canary(plan, dict.fromkeys(SHARES, 1.0), rng)).verdict
                 == "fail" for _ in range(100))
    assert failed <= 12


def test_the_audit_rederives_each_step_of_such_a_canary():
    plan = _thresholds(within=True).canary
    results = _canary(plan, AGAINST_XLA, np.random.default_rng(4))
    assert [_step(plan, r, results[:i]) for i, r in enumerate(results)] == [None] * len(results)
    signed = results[-1].latency_look
    assert signed.noise_sd == pytest.approx(conclude_canary(plan, results).noise_sd)


def test_the_switch_is_a_loosening_that_needs_the_paired_test_and_a_workload():
    pooled, within = _thresholds(within=False), _thresholds(within=True)
    assert any("noise_within_buckets" in w for w in loosenings(pooled, within))
    assert loosenings(within, pooled) == []
    minilm = load_thresholds(ROOT / "thresholds" / "local-dry-run.yaml").canary
    latency = minilm.latency.model_dump() | {"noise_within_buckets": True}
    with pytest.raises(ValidationError, match="needs canary.workload"):
        type(minilm).model_validate(minilm.model_dump() | {"latency": latency})
    legacy = {"test": "mannwhitneyu", "alternative": "greater", "alpha": 0.01,
              "noise_within_buckets": True}
    with pytest.raises(ValidationError, match="needs the paired signed_rank_abba test"):
        type(minilm.latency).model_validate(legacy)
