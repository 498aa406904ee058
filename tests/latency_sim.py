"""Simulated canaries from committed per-request ABBA samples (``tests/data/latency/``).

A simulated canary draws, for each step of a profile's plan, ``floor(fraction *
requests)`` requests with replacement from a captured A/A sample (production against
itself through the serving path), and runs them through the canary's own analysis
(``gates.canary.analyse_canary_step`` for every step with the earlier steps' results,
then ``gates.canary_latency.conclude_canary``), stopping at the first step that breaches,
as the rollout does.

* ``null="exchange"`` (the A/A null): each drawn request's candidate and production
  timings are swapped with probability 1/2. Under A/A the labels are exchangeable, so
  this is the null distribution the test assumes; it keeps the samples' tails and
  their within-request noise.
* ``null="raw"``: the draws as captured (the sample's own measured median, an estimate
  with its own error, stays in: at production's 5100 pairs a 0.8 % measured median
  is itself "detected").
* ``slowdown``: the candidate's timings multiplied by it (a planted, known slowdown).

``python -m tests.latency_sim --out reliability/canary-calibration.json`` writes the
summary RELIABILITY.md quotes (the file's other keys are kept). The acceptance test
judges its canaries at once with :func:`verdicts` (numpy and ``scipy.stats.wilcoxon``
over rows), checked draw for draw against :func:`judged_canary`, the real judge.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from scipy import stats

from gates import latency_judge
from gates.canary import analyse_canary_step
from gates.canary_latency import MIN_TAIL_PAIRS, another_look, conclude_canary
from gates.canary_plan import CanaryPlan
from gates.thresholds import load_thresholds

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "tests" / "data" / "latency"
PROFILES = tuple(sorted(p.stem for p in (ROOT / "thresholds").glob("*.yaml")))
"""Every shipped profile."""


def sample_files() -> list[Path]:
    return sorted(SAMPLES.glob("*.json"))


def load_sample(path: Path, part: str = "aa") -> tuple[np.ndarray, np.ndarray]:
    data = json.loads(path.read_text())[part]
    return (np.asarray(data["candidate_s"], dtype=np.float64),
            np.asarray(data["production_s"], dtype=np.float64))


def plan_of(profile: str) -> CanaryPlan:
    return load_thresholds(ROOT / "thresholds" / f"{profile}.yaml").canary


def draw(plan: CanaryPlan, n_requests: int, n: int, rng: np.random.Generator, *,
         null: str = "exchange") -> tuple[np.ndarray, np.ndarray]:
    """The draws of ``n`` simulated canaries: ``(indices, swaps)``, both
    ``[n, sum(pairs_per_look)]`` (int request indices into a sample of ``n_requests``,
    drawn with replacement; bool: exchange the request's two sides). A look's pairs are
    its consecutive columns (an extension's extra looks drawn too, used if taken);
    ``null="raw"`` exchanges nothing."""
    total = sum(plan.pairs_per_look())
    indices = rng.integers(0, n_requests, (n, total))
    swaps = (rng.random((n, total)) < 0.5 if null == "exchange"
             else np.zeros((n, total), dtype=bool))
    return indices, swaps


def _sides(cand, prod, indices, swaps, slowdown):
    """The drawn ABBA timings ``(candidate, production)``, ``[..., 2]`` each."""
    c, p = cand[indices], prod[indices]
    c, p = np.where(swaps[..., None], p, c), np.where(swaps[..., None], c, p)
    return c * slowdown, p


def judged_canary(plan: CanaryPlan, cand: np.ndarray, prod: np.ndarray, indices: np.ndarray,
                  swaps: np.ndarray, *, slowdown: float = 1.0):
    """One simulated canary (one row of :func:`draw`) through the canary's own analysis
    (``analyse_canary_step`` per look while ``another_look`` says so, as the rollout
    does, then ``conclude_canary``); returns its ``CanaryVerdict``. The reference
    :func:`verdicts` is checked against."""
    c_all, p_all = _sides(cand, prod, indices, swaps, slowdown)
    bounds = np.cumsum([0, *plan.pairs_per_look()])
    results = []
    for k, step in enumerate(plan.looks()):
        if not another_look(plan, results):
            break
        c, p = c_all[bounds[k]:bounds[k + 1]], p_all[bounds[k]:bounds[k + 1]]
        n = len(c)
        results.append(analyse_canary_step(
            step, c[:, 0], p[:, 0], np.zeros(n), 0, 0, 0, 0, plan, abba=(c, p),
            earlier=results))
    return conclude_canary(plan, results)


def one_canary(plan: CanaryPlan, cand: np.ndarray, prod: np.ndarray,
               rng: np.random.Generator, *, null: str = "exchange", slowdown: float = 1.0):
    """One simulated canary drawn from ``rng``; returns its ``CanaryVerdict``."""
    indices, swaps = draw(plan, len(cand), 1, rng, null=null)
    return judged_canary(plan, cand, prod, indices[0], swaps[0], slowdown=slowdown)


def signed_rank_p(r: np.ndarray) -> np.ndarray:
    """One-sided (greater) Wilcoxon signed-rank p-value of each row of ``r`` (``[n, k]``),
    equal to ``gates.latency_judge.look``'s per row: ``scipy.stats.wilcoxon`` vectorised
    over the rows whose method its ``auto`` would pick unambiguously (no ties and
    k <= 50: exact; ties and k > 13, or k > 50: asymptotic), the rest (zeros, or ties at
    k <= 13: its permutation test) row by row through ``look`` itself."""
    n, k = r.shape
    p = np.full(n, np.nan)
    if k == 0:
        return np.ones(n)
    zeros = np.any(r == 0.0, axis=1)
    if k > 50:
        groups = [(~zeros, "asymptotic")]
    else:
        ties = np.any(np.diff(np.sort(np.abs(r), axis=1), axis=1) == 0.0, axis=1)
        groups = [(~zeros & ~ties, "exact")] + ([(~zeros & ties, "asymptotic")] if k > 13 else [])
    for rows, method in groups:
        if rows.any():
            p[rows] = stats.wilcoxon(r[rows], alternative="greater", method=method,
                                     axis=1).pvalue
    for i in np.flatnonzero(np.isnan(p)):
        p[i] = latency_judge.look("row", r[i], 1.0).p_value
    return p


def _per_request(cand, prod, indices, swaps, slowdown, reduce):
    """``(candidate, production)`` of ``reduce`` (``np.sum``/``np.mean`` over each side's
    two ABBA timings) for every drawn request, ``[n, k]`` each: computed per sample
    request first (the same float operations as the real path's on the drawn arrays),
    then gathered, exchanged where ``swaps``."""
    a, b = reduce(cand * slowdown, axis=1), reduce(prod, axis=1)
    a_swapped, b_swapped = reduce(prod * slowdown, axis=1), reduce(cand, axis=1)
    return (np.where(swaps, a_swapped[indices], a[indices]),
            np.where(swaps, b_swapped[indices], b[indices]))


def _p99_ratio(c: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per row, ``canary_latency.p99_ratio`` from per-request mean latencies ``[n, k]``."""
    return np.quantile(c, 0.99, axis=1) / np.quantile(p, 0.99, axis=1)


def verdicts(plan: CanaryPlan, cand: np.ndarray, prod: np.ndarray, indices: np.ndarray,
             swaps: np.ndarray, *, slowdown: float = 1.0) -> np.ndarray:
    """The whole-canary verdict of every row of :func:`draw` at once (``[n]`` strings
    ``fail`` / ``inconclusive`` / ``pass``), by the rules of ``conclude_canary`` for a
    paired plan with no errors, drift or memory growth: a step breaches when its look
    (the cumulative pairs at its spent alpha) finds the candidate slower or, with
    ``MIN_TAIL_PAIRS`` of its own, its p99 ratio exceeds ``max_p99_ratio``; the canary
    fails at a breach or on the p99 ratio over every pair; else it passes with the
    plan's pairs and noise at most ``noise_sd``, or is inconclusive. With an extension
    (a sequential plan) a row takes extra looks while it is neither failed nor powered
    (its last look's power at the measured noise, ``latency_judge.measured_power``) and
    passes at the first look that is powered. Equal to :func:`judged_canary` row by row
    (``tests/test_canary_simulation.py`` checks it).

    Raises:
        ValueError: a plan that is not paired or cannot reach its power (its latency
            would be not assessed: nothing to simulate).
    """
    if not plan.paired or plan.power_problem() is not None:
        raise ValueError(f"the simulation needs a paired plan that reaches its power: "
                         f"{plan.power_problem() or plan.latency.test}")
    c_sum, p_sum = _per_request(cand, prod, indices, swaps, slowdown, np.sum)
    r = np.log(c_sum / p_sum) - math.log(plan.latency.tolerated_slowdown_ratio)
    limit = plan.max_p99_ratio
    if limit is not None:
        c, p = _per_request(cand, prod, indices, swaps, slowdown, np.mean)
    bounds = np.cumsum([0, *plan.pairs_per_look()])
    alphas, last_step = plan.step_alphas(), len(plan.steps) - 1
    verdict = np.full(len(r), "", dtype=object)
    for k, alpha in enumerate(alphas):
        going = verdict == ""
        breach = signed_rank_p(r[:, :bounds[k + 1]]) < alpha
        own = slice(bounds[k], bounds[k + 1])
        if limit is not None and bounds[k + 1] - bounds[k] >= MIN_TAIL_PAIRS:
            breach |= _p99_ratio(c[:, own], p[:, own]) > limit
        verdict[going & breach] = "fail"
        if k < last_step:
            continue
        going = verdict == ""
        if limit is not None and bounds[k + 1] >= MIN_TAIL_PAIRS:
            verdict[going & (_p99_ratio(c[:, :bounds[k + 1]], p[:, :bounds[k + 1]]) > limit)] \
                = "fail"
            going = verdict == ""
        prefix = r[:, :bounds[k + 1]]
        noise = latency_judge.MAD_TO_SD * np.median(
            np.abs(prefix - np.median(prefix, axis=1, keepdims=True)), axis=1)
        if plan.extend is None:
            enough = (bounds[k + 1] >= plan.required_pairs()) & (noise <= plan.latency.noise_sd)
        else:
            enough = np.array([latency_judge.measured_power(latency_judge.LatencyLook(
                step="", n_pairs=int(bounds[k + 1]), alpha=alpha, p_value=1.0,
                median_ratio=1.0, noise_sd=float(sd), slower=False), plan.detectable_ratio)
                >= plan.latency.power for sd in noise])
        verdict[going & enough] = "pass"
    verdict[verdict == ""] = "inconclusive"
    return verdict.astype(str)


def margin(rate: float, n: int) -> float:
    """The 95 % binomial margin (normal approximation) of a rate over ``n`` trials."""
    return 1.96 * math.sqrt(rate * (1.0 - rate) / n)


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson 95 % interval of ``k`` successes in ``n`` trials."""
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def simulate(plan: CanaryPlan, cand, prod, *, n: int, seed: int, null: str = "exchange",
             slowdown: float = 1.0) -> dict:
    """``n`` simulated canaries (:func:`draw` from ``seed``, judged by :func:`verdicts`):
    counts of each verdict, the fail rate and its Wilson 95 % interval."""
    indices, swaps = draw(plan, len(cand), n, np.random.default_rng(seed), null=null)
    found = list(verdicts(plan, cand, prod, indices, swaps, slowdown=slowdown))
    fails = found.count("fail")
    return {"n": n, "fail": fails, "inconclusive": found.count("inconclusive"),
            "pass": found.count("pass"), "fail_rate": fails / n,
            "fail_rate_95": wilson(fails, n)}


LEGACY_STEPS = (5, 25, 50)
"""Compared requests per step of the local profile's plan (5/25/50 % of 100)."""


def legacy_looks(cand, prod, *, n: int, seed: int, alpha: float = 0.05,
                 min_ratio: float = 1.05, raw: bool = True,
                 independent: bool = False) -> tuple[float, list[float]]:
    """The judge the canary had before its ABBA pairing, in ``n`` simulated A/A
    canaries: per step an unpaired Mann-Whitney U (one-sided,
    ``scipy.stats.mannwhitneyu``) on one timing a side at the full ``alpha``, a breach
    needing the median ratio >= ``min_ratio``, the local profile's steps
    (:data:`LEGACY_STEPS`), each step on requests of its own.

    Draws: the first ABBA timing of each side of the same drawn requests (as the
    canary times them; ``raw=False`` exchanges the sides at random), or, with
    ``independent``, each side's timings from requests drawn independently out of the
    pooled first timings (the i.i.d. A/A null the unpaired test assumes).

    Returns:
        ``(whole-canary rollback rate, [each look's rejection rate over all n])``: the
        canary stops at its first breach, the per-look rates count every look.
    """
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([cand[:, 0], prod[:, 0]])
    fails, per_look = 0, [0] * len(LEGACY_STEPS)
    for _ in range(n):
        failed = False
        for s, k in enumerate(LEGACY_STEPS):
            if independent:
                c, p = pooled[rng.integers(0, len(pooled), k)], pooled[rng.integers(0, len(pooled), k)]
            else:
                i = rng.integers(0, len(cand), k)
                c, p = cand[i, 0], prod[i, 0]
                if not raw:
                    swap = rng.random(k) < 0.5
                    c, p = np.where(swap, p, c), np.where(swap, c, p)
            pv = stats.mannwhitneyu(c, p, alternative="greater").pvalue
            if pv < alpha and np.median(c) / np.median(p) >= min_ratio:
                per_look[s] += 1
                failed = True
        fails += failed
    return fails / n, [x / n for x in per_look]


def legacy_a_a(cand, prod, *, n: int, seed: int, alpha: float = 0.05,
               min_ratio: float = 1.05, raw: bool = True) -> float:
    """The whole-canary A/A rollback rate of :func:`legacy_looks` on the paired draws."""
    return legacy_looks(cand, prod, n=n, seed=seed, alpha=alpha, min_ratio=min_ratio,
                        raw=raw)[0]


def summary(n: int = 1000) -> dict:
    out = {}
    for path in sample_files():
        cand, prod = load_sample(path)
        meta = json.loads(path.read_text())
        r = np.log(cand.sum(1) / prod.sum(1))
        entry = {"device": meta.get("device"), "implementation": meta.get("implementation"),
                 "requests": len(r), "median_ratio": float(np.exp(np.median(r))),
                 "robust_noise_sd": float(1.4826 * np.median(np.abs(r - np.median(r)))),
                 "profiles": {}}
        for profile in PROFILES:
            plan = plan_of(profile)
            start = time.perf_counter()
            entry["profiles"][profile] = {
                "alpha": plan.latency.alpha, "power": plan.latency.power,
                "min_slowdown_ratio": plan.latency.min_slowdown_ratio,
                "pairs": sum(plan.pairs_per_step()),
                "a_a": simulate(plan, cand, prod, n=n, seed=1),
                "a_a_raw": simulate(plan, cand, prod, n=n, seed=2, null="raw"),
                "at_min_slowdown": simulate(plan, cand, prod, n=n, seed=3,
                                            slowdown=plan.latency.min_slowdown_ratio),
                "seconds": round(time.perf_counter() - start, 1)}
        entry["legacy_judge_a_a_rate"] = legacy_a_a(cand, prod, n=n, seed=4)
        rate, looks = legacy_looks(cand, prod, n=n, seed=5, independent=True)
        entry["legacy_judge_independent_a_a"] = {"rate": rate, "per_look": looks,
                                                 "rate_95": wilson(round(rate * n), n)}
        out[path.name] = entry
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    # the file's other parts (the GPU runs per device, the note) are kept
    result = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    result.update({"simulation": summary(args.n),
                   "command": "python -m tests.latency_sim --out "
                              "reliability/canary-calibration.json"})
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
