"""The per-bucket effect's interval (calibrated both ways) and the long-document plots,
from synthetic comparisons and from the committed H200 results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evaluation.longdoc import effect as ef
from evaluation.longdoc import figures
from evaluation.longdoc.bench import load_result
from evaluation.longdoc.plots import write_plots
from tests.json_compare import same_json
from tests.longdoc_synthetic import ar1, comparison

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "kernels" / "tools" / "bench_results" / "h200-2026-12-04-longdoc"
DOCS = ROOT / "docs" / "longdoc"
PNG = b"\x89PNG\r\n\x1a\n"


def _rates(true_log: float, phi: float, *, n: int = 100, sd: float = 0.3, draws: int = 600,
           seed: int = 0) -> tuple[float, float]:
    """Over ``draws`` AR(1) series of log ratios centred on ``true_log``: the share of
    95 % intervals covering the true ratio, and the share lying wholly below 1."""
    rng = np.random.default_rng(seed)
    covered = below = 0
    for _ in range(draws):
        low, high, _, _ = ef.median_interval(true_log + ar1(rng, n, phi, sd))
        covered += low <= true_log <= high
        below += high < 0
    return covered / draws, below / draws


@pytest.mark.parametrize(("phi", "least"), [(0.0, 0.93), (0.45, 0.89)])
def test_the_interval_covers_a_known_ratio_at_about_the_nominal_rate(phi, least):
    # evaluation.longdoc.effect's docstring: 0.96-0.97 independent, 0.92-0.94 at the
    # serial correlation of the committed H200 pairs (fixed seeds: the same draws each run)
    covered, _ = _rates(math.log(0.9), phi, draws=1000)
    assert least <= covered <= 0.99, covered


@pytest.mark.parametrize("phi", [0.0, 0.45])
def test_an_a_a_interval_contains_1_and_a_planted_effect_is_detected(phi):
    covered, below = _rates(0.0, phi, seed=1, draws=1000)
    assert covered >= 0.89 and below <= 0.05, (covered, below)  # A/A: no effect claimed
    _, detected = _rates(math.log(0.85), phi, sd=0.2, seed=2)
    assert detected >= 0.9, detected  # a 15 % speed-up at n=100 is found


def test_serial_dependence_widens_the_interval():
    rng = np.random.default_rng(3)
    iid = np.mean([ef.variance_factor(ar1(rng, 100, 0.0, 1.0), 9) for _ in range(200)])
    dep = np.mean([ef.variance_factor(ar1(rng, 100, 0.45, 1.0), 9) for _ in range(200)])
    assert iid < 1.15 and dep > 1.3, (iid, dep)
    assert ef.median_interval([0.1] * (ef.MIN_PAIRS - 1)) is None


def test_a_planted_compute_effect_through_the_replay_is_recovered_per_bucket():
    for factor in (0.8, 1.0):
        result = comparison(factor, seed=11)
        found = ef.effects(result.baseline, result.candidate)
        compute = [e for e in found if e.metric == "compute"]
        assert [e.group for e in compute] == ["all", "8", "16", "32"]
        for e in compute:
            assert e.pairs >= ef.MIN_PAIRS and e.excluded == 0
            assert e.low <= factor <= e.high, e
        overall = compute[0]
        assert (overall.high < 1) == (factor < 1), overall
        assert overall.pairs == result.baseline.overall.requests  # steady requests only


def test_requests_a_kernel_failed_are_left_out_of_the_ratio_and_counted():
    result = comparison(0.8, seed=4, fail_bucket=32)
    found = {(e.group, e.metric): e for e in ef.effects(result.baseline, result.candidate)}
    failed = result.baseline.buckets[32].requests
    assert failed > 0
    assert found[("32", "time_to_result")].pairs == 0
    assert found[("32", "time_to_result")].excluded == failed
    assert found[("32", "compute")].ratio is None
    assert found[("all", "compute")].excluded == failed
    assert found[("all", "compute")].pairs == result.baseline.overall.requests - failed


def test_the_plots_render_from_a_synthetic_comparison(tmp_path: Path):
    result = comparison(0.8, seed=4, fail_bucket=32)
    paths = write_plots(result, tmp_path, prefix="syn-")
    assert [p.name for p in paths] == ["syn-time-to-result.png", "syn-bucket-effect.png"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 20_000, p
    again = write_plots(result, tmp_path / "again")
    assert again[1].read_bytes() == paths[1].read_bytes()  # the same result, the same bytes


def test_same_json_tells_a_rounding_difference_from_a_changed_figure():
    assert same_json({"f": [2.8841380860898704, "x"]}, {"f": [2.8841380860898713, "x"]})
    assert not same_json({"f": [2.8841380860898704, "x"]}, {"f": [2.8841, "x"]})
    assert not same_json({"f": [1.0]}, {"f": [1.0], "g": 2}) and not same_json([1.0], ["1.0"])


def test_the_committed_figures_are_the_figures_command_on_the_committed_h200_results(
        tmp_path: Path, capsys):
    assert figures.main([str(H200), str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pallas_mosaic_gpu / cudnn on gpu:NVIDIA H200" in out
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in DOCS.iterdir())
    for name in made:
        if name.endswith(".json"):
            assert same_json(json.loads((tmp_path / name).read_text()),
                         json.loads((DOCS / name).read_text())), name
        else:
            assert (tmp_path / name).read_bytes()[:8] == PNG
    record = json.loads((DOCS / "longdoc-modernbert-base-cudnn-effects.json").read_text())
    assert record["source"] == "kernels/tools/bench_results/h200-2026-12-04-longdoc/" \
                               "longdoc-modernbert-base-cudnn.json"
    # the committed medians agree with the bench's own (steady requests here, all in the
    # bench's `paired`: close, not equal)
    result = load_result(H200 / "longdoc-modernbert-base-cudnn.json")
    compute = {e["group"]: e for e in record["effects"] if e["metric"] == "compute"}
    for group, pair in result.paired.items():
        assert compute[group]["ratio"] == pytest.approx(pair["compute_ratio_median"], rel=0.02)
        assert compute[group]["low"] <= compute[group]["ratio"] <= compute[group]["high"]
