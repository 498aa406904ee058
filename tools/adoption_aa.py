"""The adoption test on committed A/A latency pairs: its false adoption rate, and its power
at a planted minimum worthwhile speed-up.

What it reads. Committed per-request paired latencies where *both sides ran the same
kernel* (A/A), as log ratios ``r = log((c1 + c2) / (p1 + p2))`` (dimensionless; the
canary's ABBA pair, ``gates.latency_judge``). Two formats are A/A by construction:

* a calibration record (``kernelgate calibrate``, ``flows.calibrate.a_a_canary``: the
  production version on both sides of the canary's replay, ``"log_ratios"``: one list per
  A/A canary run, every compared request's log ratio in order; a run the latency judge
  rolled back stops early, at the step that breached, and one that failed before
  comparing a request has none);
* latency samples (``python -m evaluation.latency_samples``): its ``"aa"`` section,
  ``candidate_s``/``production_s`` ``[n, 2]`` seconds, one kernel on both endpoints. Its
  ``"slowed"`` section is an A/B (a planted slowdown) and is never read.

Anything else is refused (``AAInputError``, naming the file and what is missing), e.g. the
long-document bench's JSON, which holds one run of each of two kernels (an A/B). The
pooled pairs must also *look* A/A: an exact two-sided sign test of "median log ratio 0"
(``scipy.stats.binomtest``) must not reject at ``--aa-check-alpha`` (default 0.001); an
A/B with a real effect fails it and is refused, rather than resampled into an A/A (the
sign flips below would erase its effect).

What it does, on one source:

1. *As recorded* (calibration records only): every recorded A/A canary is judged by the
   rollout's own function, ``gates.adoption_decision.conclude_adoption``, with the
   canary's recorded safety verdict (a rolled-back run is ``unsafe``, as in a rollout)
   and its pairs cut into the registered steps' compared requests (looks after each
   step: 5, 30, 80 under ``thresholds/adoption.yaml``). No resampling.
2. *Resampled A/A* (``--runs``, default 2000, at least 100, at most :data:`MAX_RUNS`;
   ``--runs`` times ``max_pairs`` at most :data:`MAX_RESAMPLED_PAIRS`): each run draws
   ``max_pairs`` log ratios with replacement from the pooled pairs (an iid bootstrap,
   Efron 1979) and multiplies each by an independent random sign. Why that makes the
   null true: in an A/A pair both sides ran the same kernel, order-balanced (ABBA), so
   which side is called "candidate" is an arbitrary label; relabelling a pair swaps
   ``c`` and ``p`` and turns ``r`` into ``-r``. Drawing the label by a fair coin makes
   each resampled ``r`` symmetric about 0, so its median is exactly 0 and
   ``P(r < 0) = P(r > 0) = 1/2`` (ties at exactly 0 have probability ~0 for timings):
   the boundary of adoption's H0 "not faster at all", where the sign test's false
   adoption rate is largest. This is the randomisation argument of Fisher's sign-flip
   test (Fisher 1935, *The Design of Experiments*, 21; Good, *Permutation, Parametric
   and Bootstrap Tests of Hypotheses*, 2005, 3.1). The noise's shape (tails, spread)
   is the GPU's; only its centre is forced. Each run is judged as in 1 (safety
   ``pass``: the adoption test's own error, not the canary's), and also by
   ``gates.adoption_power.simulate_decisions`` (a look after *every* pair: the
   anytime guarantee's worst case, more looks than a rollout takes).
3. *Planted speed-up*: the same resampling, then every candidate time multiplied by the
   preregistered ``minimum_worthwhile_ratio`` ``m`` (0.95): since
   ``log((m c1 + m c2) / (p1 + p2)) = log m + r``, that is ``r + log m``, so the true
   median ratio is exactly ``m``. The adoption rate is the power, read against the
   preregistered ``power``.

Rates carry exact 95 % Clopper-Pearson intervals (``binomtest(...).proportion_ci``).
They are Monte Carlo intervals *given the pooled pairs*: the pool's own sampling error
(one device, one day) is not in them. The resampling treats pairs as independent; the
record's run-to-run spread of median log ratios is reported beside the spread an iid
draw of the same length gives, to show whether that holds. Verdicts: the false adoption
rate is "within alpha" when its interval's lower end is at most ``alpha`` (not shown
above it; ``shown_at_most_alpha``: its upper end is, too); the power is "reached" when
its interval's upper end is at least ``power`` (not shown below it).

Writes JSON::

    {"command", "date_utc", "source": {"path", "sha256", "format", "device", "kernel",
     "measured_at", "pairs", "runs", "run_lengths", "pooled_median_ratio",
     "robust_sd", "aa_check": {...}, "run_medians": {...}},
     "plan": {decision section}, "steps_pairs", "looks", "seed", "runs",
     "recorded": {...} | null, "null": {...}, "planted": {...}}

Seeded and reproducible (``--seed``). Run from the repository root::

    python -m tools.adoption_aa \\
        --pairs reliability/h200-2026-12-01-calibration/calibration.json \\
        --out reliability/adoption-aa-h200-pallas_gpu-calibration.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from kernels.errors import KernelgateError

OUTCOMES = ("adopted", "not_worth_it", "inconclusive", "unsafe")
MAX_RUNS = 100_000
"""The most resampled runs per condition ``--runs`` takes: about 2 minutes at the shipped
plan's 80 pairs (about 1 ms a run and condition on a 2-core host), and far past where the
Monte Carlo interval stops narrowing usefully (+-0.14 % at alpha 0.05)."""
MAX_RESAMPLED_PAIRS = 10_000_000
"""The most resampled log ratios per condition (runs times the plan's ``max_pairs``): the
draws are held at once, a few float64 and int64 arrays of that many entries (about 80 MB
each), so a larger request is refused rather than exhausting memory."""


class AAInputError(KernelgateError, ValueError):
    """Pairs this tool cannot use: not readable, not one of the A/A formats, a missing or
    empty field, a non-finite or non-positive value, or pairs that do not look A/A. The
    message names the file and the field."""


@dataclass(frozen=True)
class AASource:
    """One source of A/A pairs, as read.

    Attributes:
        path: the file read.
        sha256: hex digest of its bytes.
        format: ``calibration`` or ``latency_samples``.
        device: the device the pairs were measured on (as the file says).
        kernel: the kernel on both sides (the calibration's family, the samples'
            implementation).
        measured_at: ISO time the file records (a calibration's ``created_at``), or None.
        runs: per recorded A/A canary (one for latency samples), its log ratios
            ``log(candidate / production)`` in order, float ``[n_i]``.
        verdicts: per run, the canary's recorded safety verdict (``pass``/``fail``/
            ``inconclusive``), or None where the file has none (latency samples).
    """

    path: str
    sha256: str
    format: str
    device: str | None
    kernel: str | None
    measured_at: str | None
    runs: list[np.ndarray]
    verdicts: list[str] | None = field(default=None)

    @property
    def pooled(self) -> np.ndarray:
        """Every pair's log ratio, float ``[sum n_i]``."""
        return np.concatenate(self.runs)


def _field(data: dict, key: str, path: Path, what: str):
    if key not in data:
        raise AAInputError(f"{path}: {what} has no {key!r} field")
    return data[key]


def _finite(values, path: Path, name: str, *, may_be_empty: bool = False) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise AAInputError(f"{path}: {name} is not numeric ({err})") from None
    if arr.size == 0 and not may_be_empty:
        raise AAInputError(f"{path}: {name} is empty")
    if not np.all(np.isfinite(arr)):
        raise AAInputError(f"{path}: {name} has {int(np.sum(~np.isfinite(arr)))} "
                           "non-finite values")
    return arr


def load_pairs(path: Path | str) -> AASource:
    """Read one A/A source (see the module docstring for the two formats).

    Args:
        path: a calibration record (``calibration.json``) or latency samples JSON.

    Returns:
        :class:`AASource`.

    Raises:
        AAInputError: the file is missing, empty or not JSON; it is neither format
            (the long-document bench's two-kernel JSON is named as an A/B); a field is
            missing or empty (a calibration with no compared pair in any run); a value
            is non-finite; a latency sample is not a positive
            ``[n, 2]`` array of seconds on both sides.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise AAInputError(f"{path}: cannot be read ({err.strerror})") from None
    if not raw.strip():
        raise AAInputError(f"{path}: the file is empty")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise AAInputError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise AAInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    digest = hashlib.sha256(raw).hexdigest()
    if "log_ratios" in data:
        return _calibration(data, path, digest)
    if "aa" in data:
        return _samples(data, path, digest)
    kernels = data.get("kernels")
    if isinstance(kernels, list) and len(set(map(str, kernels))) > 1:
        raise AAInputError(
            f"{path}: holds per-request records of {len(set(kernels))} different kernels "
            f"({', '.join(map(str, kernels))}): an A/B, not A/A pairs")
    raise AAInputError(
        f"{path}: not an A/A record: expected a calibration record ('log_ratios', from "
        "kernelgate calibrate) or latency samples ('aa', from evaluation.latency_samples)")


def _calibration(data: dict, path: Path, digest: str) -> AASource:
    runs_raw = data["log_ratios"]
    if not isinstance(runs_raw, list) or not runs_raw:
        raise AAInputError(f"{path}: 'log_ratios' is empty (no A/A canary run recorded)")
    # a run may have compared no request (it failed at its first step): unsafe, no pairs
    runs = [_finite(run, path, f"log_ratios[{i}]", may_be_empty=True)
            for i, run in enumerate(runs_raw)]
    if any(r.ndim != 1 for r in runs):
        raise AAInputError(f"{path}: 'log_ratios' must be a list of lists of numbers")
    if not any(r.size for r in runs):
        raise AAInputError(f"{path}: 'log_ratios' holds no compared pair in its {len(runs)} "
                           "runs (every canary ended before comparing a request)")
    verdicts = _field(data, "verdicts", path, "the calibration record")
    if not isinstance(verdicts, list) or len(verdicts) != len(runs):
        raise AAInputError(f"{path}: 'verdicts' must list one verdict per run "
                           f"({len(runs)} runs)")
    facts = data.get("facts") or {}
    return AASource(path=str(path), sha256=digest, format="calibration",
                    device=facts.get("device_kind"), kernel=data.get("family"),
                    measured_at=data.get("created_at"), runs=runs,
                    verdicts=[str(v) for v in verdicts])


def _samples(data: dict, path: Path, digest: str) -> AASource:
    aa = data["aa"]
    if not isinstance(aa, dict):
        raise AAInputError(f"{path}: 'aa' must be an object with candidate_s and production_s")
    sides = {}
    for side in ("candidate_s", "production_s"):
        arr = _finite(_field(aa, side, path, "'aa'"), path, f"aa.{side}")
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise AAInputError(f"{path}: aa.{side} must be [n, 2] seconds (two ABBA timings "
                               f"a side), got shape {arr.shape}")
        if np.any(arr <= 0):
            raise AAInputError(f"{path}: aa.{side} has non-positive times")
        sides[side] = arr
    c, p = sides["candidate_s"], sides["production_s"]
    if c.shape != p.shape:
        raise AAInputError(f"{path}: aa.candidate_s {c.shape} and aa.production_s {p.shape} "
                           "differ in length")
    return AASource(path=str(path), sha256=digest, format="latency_samples",
                    device=data.get("device"), kernel=data.get("implementation"),
                    measured_at=data.get("created_at"),
                    runs=[np.log(c.sum(axis=1) / p.sum(axis=1))])


def check_aa(source: AASource, alpha: float) -> dict:
    """The pooled pairs' exact two-sided sign test of "median log ratio 0".

    Args:
        source: the pairs.
        alpha: refuse when the test's p-value is below this.

    Returns:
        ``{"pairs", "above", "below", "p_value", "alpha"}`` (``above``: pairs with the
        candidate side slower).

    Raises:
        AAInputError: the test rejects at ``alpha`` (an A/B, or an A/A whose sides are
            not exchangeable): named with its median ratio and p-value.
    """
    from scipy.stats import binomtest

    r = source.pooled
    above, below = int(np.sum(r > 0)), int(np.sum(r < 0))
    p = float(binomtest(above, above + below, 0.5).pvalue) if above + below else 1.0
    if p < alpha:
        raise AAInputError(
            f"{source.path}: the pairs do not look A/A: median ratio "
            f"{math.exp(float(np.median(r))):.4f}, {above} of {above + below} pairs with the "
            f"candidate slower (exact sign test p = {p:.3g} < {alpha:g}); resampling them "
            "with random signs would erase a real effect, so they are refused")
    return {"pairs": int(r.size), "above": above, "below": below, "p_value": p,
            "alpha": alpha}


def resample(pooled: np.ndarray, runs: int, pairs: int, rng: np.random.Generator,
             log_ratio: float = 0.0) -> np.ndarray:
    """Resampled A/A runs: an iid bootstrap of ``pooled`` with independent random signs
    (median exactly 0; see the module docstring), shifted by ``log_ratio`` (a planted
    effect: every candidate time multiplied by ``exp(log_ratio)``).

    Args:
        pooled: float ``[n]`` log ratios (n >= 1).
        runs, pairs: the output shape.
        rng: the generator (seeded by the caller).
        log_ratio: the planted ``log m`` (0: the A/A null).

    Returns:
        float ``[runs, pairs]`` log ratios ``log(candidate / production)``.
    """
    draws = pooled[rng.integers(0, pooled.size, size=(runs, pairs))]
    signs = rng.choice(np.array([-1.0, 1.0]), size=(runs, pairs))
    return signs * draws + log_ratio


def _cut(r: np.ndarray, steps: list[int]) -> list[list[float]]:
    """A run's log ratios cut into the registered steps' compared requests (the last
    step takes what remains; steps with none are dropped)."""
    out, start = [], 0
    for i, n in enumerate(steps):
        part = r[start:] if i == len(steps) - 1 else r[start:start + n]
        if part.size:
            out.append(part.tolist())
        start += n
    return out


def judge_runs(plan, steps: list[int], runs: list[np.ndarray] | np.ndarray,
               safety: list[str] | None = None) -> list[str]:
    """Each run's rollout outcome by ``gates.adoption_decision.conclude_adoption``.

    Args:
        plan: the ``decision:`` section (``gates.adoption_decision.DecisionPlan``).
        steps: compared requests per registered canary step (``pairs_per_step``).
        runs: per run, float ``[n_i]`` log ratios.
        safety: per run, the canary's safety verdict (default ``pass`` for all).

    Returns:
        one of ``adopted``, ``not_worth_it``, ``inconclusive``, ``unsafe`` per run.
    """
    from gates.adoption_decision import conclude_adoption

    safety = safety or ["pass"] * len(runs)
    return [conclude_adoption(plan, s, _cut(np.asarray(r), steps)).outcome
            for r, s in zip(runs, safety, strict=True)]


def rate(k: int, n: int, level: float = 0.95) -> dict:
    """``k`` of ``n`` with its exact (Clopper-Pearson) interval at ``level``."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(level, method="exact")
    return {"count": k, "of": n, "rate": k / n, "ci95": [float(ci.low), float(ci.high)]}


def _counts(outcomes) -> dict:
    outcomes = list(outcomes)
    return {o: int(sum(x == o for x in outcomes)) for o in OUTCOMES}


def _run_medians(source: AASource, max_pairs: int, rng: np.random.Generator) -> dict | None:
    """The sd of recorded full-length runs' median log ratios beside the sd an iid draw of
    the same length from the pool gives (2000 draws): the independence check."""
    full = [r[:max_pairs] for r in source.runs if r.size >= max_pairs]
    if len(full) < 10:
        return None
    med = np.median(np.stack(full), axis=1)
    iid = np.median(source.pooled[rng.integers(0, source.pooled.size, (2000, max_pairs))],
                    axis=1)
    return {"runs": len(full), "pairs": max_pairs, "sd_recorded": float(np.std(med, ddof=1)),
            "sd_iid": float(np.std(iid, ddof=1))}


def analyse(source: AASource, thresholds_path: Path | str, *, runs: int = 2000,
            seed: int = 0, aa_check_alpha: float = 0.001) -> dict:
    """The whole analysis of the module docstring on one source.

    Args:
        source: the A/A pairs (:func:`load_pairs`).
        thresholds_path: a thresholds file with a ``decision:`` section.
        runs: resampled runs per condition (1 to :data:`MAX_RUNS`; the CLI asks >= 100).
        seed: the generator's seed.
        aa_check_alpha: the sign test's refusal level (:func:`check_aa`).

    Returns:
        the JSON document (without ``command``/``date_utc``).

    Raises:
        ValueError: ``runs`` outside 1 to :data:`MAX_RUNS`.
        AAInputError: the pairs do not look A/A; the thresholds file cannot be read,
            is not a valid thresholds file, has no ``decision:``, or its decision
            declares ``buckets`` (the pairs carry none); ``runs`` times its
            ``max_pairs`` exceeds :data:`MAX_RESAMPLED_PAIRS` (checked before any draw).
    """
    from gates.adoption_power import simulate_decisions
    from gates.thresholds import load_thresholds

    if not 1 <= runs <= MAX_RUNS:
        raise ValueError(f"runs must lie in [1, {MAX_RUNS}], got {runs}")
    try:
        thresholds = load_thresholds(Path(thresholds_path))
    except OSError as err:
        raise AAInputError(f"{thresholds_path}: cannot be read ({err.strerror})") from None
    except ValueError as err:  # not YAML, or not a valid thresholds file (named inside)
        raise AAInputError(f"thresholds: {err}") from None
    plan = thresholds.decision
    if plan is None:
        raise AAInputError(f"{thresholds_path}: has no decision: section (no adoption test)")
    if plan.buckets:
        raise AAInputError(f"{thresholds_path}: decision.buckets {plan.buckets} judges each "
                           "length bucket on its own pairs, but the pairs read here carry "
                           "no length bucket: this tool judges a pooled decision only")
    if runs * plan.max_pairs > MAX_RESAMPLED_PAIRS:
        raise AAInputError(
            f"--runs {runs} x max_pairs {plan.max_pairs} ({thresholds_path}) = "
            f"{runs * plan.max_pairs} resampled pairs per condition, more than the limit "
            f"of {MAX_RESAMPLED_PAIRS} held in memory at once: give --runs at most "
            f"{MAX_RESAMPLED_PAIRS // plan.max_pairs}")
    steps = thresholds.canary.pairs_per_step()
    looks = sorted({min(int(c), plan.max_pairs) for c in np.cumsum(steps) if c > 0})
    check = check_aa(source, aa_check_alpha)
    pooled = source.pooled
    null_rng, planted_rng, check_rng = (np.random.default_rng(s) for s in
                                        np.random.SeedSequence(seed).spawn(3))
    adoption = plan.adoption_plan()

    def condition(r: np.ndarray, true_ratio: float) -> dict:
        counts = _counts(judge_runs(plan, steps, r))
        every = _counts({"adopt": "adopted"}.get(x, x)
                        for x in simulate_decisions(adoption, -r))
        return {"true_median_ratio": true_ratio, "outcomes": counts,
                "adopted": rate(counts["adopted"], runs),
                "every_pair_looks": {"outcomes": every,
                                     "adopted": rate(every["adopted"], runs)}}

    null = condition(resample(pooled, runs, plan.max_pairs, null_rng), 1.0)
    null["alpha"] = plan.alpha
    null["within_alpha"] = null["adopted"]["ci95"][0] <= plan.alpha
    null["shown_at_most_alpha"] = null["adopted"]["ci95"][1] <= plan.alpha
    null["every_pair_looks"]["within_alpha"] = (
        null["every_pair_looks"]["adopted"]["ci95"][0] <= plan.alpha)
    m = plan.minimum_worthwhile_ratio
    planted = condition(resample(pooled, runs, plan.max_pairs, planted_rng, math.log(m)), m)
    planted["power"] = plan.power
    planted["power_reached"] = planted["adopted"]["ci95"][1] >= plan.power

    recorded = None
    if source.verdicts is not None:
        counts = _counts(judge_runs(plan, steps, source.runs, source.verdicts))
        n = len(source.runs)
        recorded = {"runs": n, "outcomes": counts, "adopted": rate(counts["adopted"], n),
                    "within_alpha": rate(counts["adopted"], n)["ci95"][0] <= plan.alpha}

    return {
        "source": {"path": source.path, "sha256": source.sha256, "format": source.format,
                   "device": source.device, "kernel": source.kernel,
                   "measured_at": source.measured_at, "pairs": int(pooled.size),
                   "runs": len(source.runs),
                   "run_lengths": {str(k): int(v) for k, v in zip(*np.unique(
                       [r.size for r in source.runs], return_counts=True), strict=True)},
                   "pooled_median_ratio": math.exp(float(np.median(pooled))),
                   "robust_sd": float(1.4826 * np.median(np.abs(pooled - np.median(pooled)))),
                   "sd": float(np.std(pooled, ddof=1)) if pooled.size > 1 else None,
                   "aa_check": check,
                   "run_medians": _run_medians(source, plan.max_pairs, check_rng)},
        # the pooled plan's fields (a plan with buckets is refused above)
        "thresholds": str(thresholds_path),
        "plan": plan.model_dump(exclude={"buckets", "min_pairs_per_bucket"}),
        "steps_pairs": steps, "looks": looks, "seed": seed, "runs": runs,
        "recorded": recorded, "null": null, "planted": planted}


def _pct(r: dict) -> str:
    lo, hi = r["ci95"]
    return f"{r['count']}/{r['of']} = {100 * r['rate']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(result: dict) -> str:
    """The result as a plain-text table (rates with their 95 % intervals)."""
    src, plan = result["source"], result["plan"]
    lines = [f"source: {src['path']} ({src['format']}, {src['kernel']} on both sides, "
             f"{src['device']}, {src['pairs']} pairs in {src['runs']} run(s); median ratio "
             f"{src['pooled_median_ratio']:.4f}, robust sd {src['robust_sd']:.3f}, sign test "
             f"p {src['aa_check']['p_value']:.3g})",
             f"plan: alpha {plan['alpha']}, minimum worthwhile ratio "
             f"{plan['minimum_worthwhile_ratio']}, power {plan['power']}, max_pairs "
             f"{plan['max_pairs']}, looks {result['looks']}",
             f"{'condition':<38} {'adopted (95 % CI)':<30} {'not worth':>10} "
             f"{'inconcl.':>9} {'unsafe':>7}  verdict"]

    def row(name, block, verdict):
        o = block["outcomes"]
        lines.append(f"{name:<38} {_pct(block['adopted']):<30} {o['not_worth_it']:>10} "
                     f"{o['inconclusive']:>9} {o['unsafe']:>7}  {verdict}")

    if result["recorded"] is not None:
        rec = result["recorded"]
        row("A/A canaries as recorded", rec,
            f"within alpha {plan['alpha']}: {rec['within_alpha']}")
    null, planted = result["null"], result["planted"]
    row("A/A resampled (rollout looks)", null,
        f"within alpha {plan['alpha']}: {null['within_alpha']}")
    row("A/A resampled (every pair a look)", null["every_pair_looks"],
        f"within alpha: {null['every_pair_looks']['within_alpha']}")
    row(f"planted ratio {planted['true_median_ratio']} (rollout looks)", planted,
        f"power {plan['power']} reached: {planted['power_reached']}")
    row(f"planted ratio {planted['true_median_ratio']} (every pair)",
        planted["every_pair_looks"], "")
    return "\n".join(lines)


def _runs(text: str) -> int:
    """``--runs``: an integer from 100 to :data:`MAX_RUNS`.

    Raises:
        argparse.ArgumentTypeError: fewer than 100, or more than :data:`MAX_RUNS` (the
            limit named).
    """
    n = int(text)
    if n < 100:
        raise argparse.ArgumentTypeError(f"--runs must be at least 100, got {n}")
    if n > MAX_RUNS:
        raise argparse.ArgumentTypeError(
            f"--runs must be at most {MAX_RUNS} (the resampled runs are held in memory and "
            f"judged one by one, about 1 ms each), got {n}")
    return n


def _seed(text: str) -> int:
    n = int(text)
    if n < 0:  # numpy's generators take no negative seed
        raise argparse.ArgumentTypeError(f"--seed must be a non-negative integer, got {n}")
    return n


def _level(text: str) -> float:
    x = float(text)
    if not 0.0 < x < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return x


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); exit 0 on success, 2 on bad input or an ``--out``
    that cannot be written (named)."""
    p = argparse.ArgumentParser(prog="python -m tools.adoption_aa",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=Path, required=True,
                   help="committed A/A pairs: a calibration record (calibration.json, "
                   "'log_ratios') or latency samples JSON ('aa' section)")
    p.add_argument("--thresholds", type=Path, default=Path("thresholds/adoption.yaml"),
                   help="thresholds file whose decision: section is the preregistered "
                   "adoption plan, and whose canary steps give the looks "
                   "(default thresholds/adoption.yaml)")
    p.add_argument("--runs", type=_runs, default=2000,
                   help="resampled runs per condition, A/A and planted (at least 100, at "
                   f"most {MAX_RUNS}; default 2000)")
    p.add_argument("--seed", type=_seed, default=0,
                   help="generator seed, >= 0 (default 0)")
    p.add_argument("--aa-check-alpha", type=_level, default=0.001,
                   help="refuse pairs whose exact sign test of median 0 rejects at this "
                   "level (default 0.001)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here (default: print the table only)")
    args = p.parse_args(argv)
    try:
        source = load_pairs(args.pairs)
        result = analyse(source, args.thresholds, runs=args.runs, seed=args.seed,
                         aa_check_alpha=args.aa_check_alpha)
    except AAInputError as err:
        print(f"adoption_aa: error: {err}", file=sys.stderr)
        return 2
    doc = {"command": "python -m tools.adoption_aa " + shlex.join(
               sys.argv[1:] if argv is None else argv),
           "date_utc": datetime.now(UTC).isoformat(timespec="seconds"), **result}
    print(table(doc))
    if args.out is not None:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as err:
            print(f"adoption_aa: error: cannot write {args.out} ({err.strerror})",
                  file=sys.stderr)
            return 2
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
