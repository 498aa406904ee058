"""``tools.adoption_aa``: the adoption test on A/A pairs. Synthetic A/A pairs (a true zero
effect) give a false adoption rate within alpha's exact binomial margin; the planted
minimum worthwhile speed-up raises the adoption rate to the preregistered power; an A/B
(a real effect) is refused rather than resampled into an A/A; bad input is named; the
committed results reproduce from their command. Rates are checked with Clopper-Pearson
bounds (``scipy.stats.binomtest``), so each test can fail honestly."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from tests.json_compare import same_json
from tools import adoption_aa
from tools.adoption_aa import AAInputError, analyse, check_aa, load_pairs, main, resample

ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "thresholds" / "adoption.yaml"
RUNS = 400
ALPHA = 0.05  # thresholds/adoption.yaml's decision: alpha (asserted below)


def _calibration(path: Path, runs: list[list[float]], verdicts: list[str] | None = None,
                 **extra) -> Path:
    """A calibration record as ``kernelgate calibrate`` writes it (the fields read)."""
    record = {"family": "synthetic", "created_at": "2026-12-05T00:00:00+00:00",
              "facts": {"device_kind": "synthetic"}, "log_ratios": runs,
              "verdicts": verdicts or ["pass"] * len(runs), **extra}
    path.write_text(json.dumps(record))
    return path


def _samples(path: Path, candidate: np.ndarray, production: np.ndarray, **extra) -> Path:
    """Latency samples as ``evaluation.latency_samples`` writes them (``[n, 2]`` seconds)."""
    doc = {"device": "synthetic", "implementation": "synthetic",
           "aa": {"candidate_s": candidate.tolist(), "production_s": production.tolist()},
           **extra}
    path.write_text(json.dumps(doc))
    return path


def _aa_runs(rng: np.random.Generator, kind: str, runs: int = 100, pairs: int = 80):
    """Zero-median A/A log ratios: normal (sd 0.08, the H200 calibrations' spread) or
    Student t with 2 degrees of freedom (infinite variance)."""
    if kind == "normal":
        return (0.08 * rng.standard_normal((runs, pairs))).tolist()
    return (0.04 * rng.standard_t(2, (runs, pairs))).tolist()


def test_the_shipped_plan_is_the_one_these_tests_assume():
    from gates.thresholds import load_thresholds

    thresholds = load_thresholds(PROFILE)
    assert thresholds.decision.alpha == ALPHA
    assert thresholds.canary.pairs_per_step() == [5, 25, 50]


@pytest.mark.parametrize("kind", ["normal", "student_t2"])
def test_a_true_zero_effect_is_adopted_within_alpha(tmp_path, kind):
    rng = np.random.default_rng({"normal": 1, "student_t2": 2}[kind])
    source = load_pairs(_calibration(tmp_path / "c.json", _aa_runs(rng, kind)))
    result = analyse(source, PROFILE, runs=RUNS, seed=3)
    null = result["null"]
    assert null["outcomes"]["unsafe"] == 0 and sum(null["outcomes"].values()) == RUNS
    assert result["looks"] == [5, 30, 80] and null["true_median_ratio"] == 1.0
    # the rate is at most alpha beyond doubt: its exact 95 % upper bound is below alpha,
    # at the rollout's looks and with a look after every pair
    for block in (null, null["every_pair_looks"]):
        k = block["adopted"]["count"]
        assert binomtest(k, RUNS).proportion_ci(0.95, method="exact").high <= ALPHA, k
    assert null["within_alpha"] and null["shown_at_most_alpha"]
    # the recorded A/A canaries themselves, judged as recorded
    assert result["recorded"]["runs"] == 100 and result["recorded"]["within_alpha"]


def test_the_planted_speed_up_raises_the_adoption_rate_to_the_power(tmp_path):
    rng = np.random.default_rng(4)
    source = load_pairs(_calibration(tmp_path / "c.json", _aa_runs(rng, "normal")))
    result = analyse(source, PROFILE, runs=RUNS, seed=5)
    null, planted = result["null"]["adopted"], result["planted"]["adopted"]
    assert result["planted"]["true_median_ratio"] == 0.95
    # clearly above the null's rate, and not shown below the preregistered power
    assert planted["ci95"][0] > null["ci95"][1], (planted, null)
    assert binomtest(planted["count"], RUNS, 0.8, alternative="less").pvalue > 0.01
    assert result["planted"]["power_reached"]


def test_a_planted_speed_up_too_small_to_matter_is_not_adopted_at_the_power(tmp_path,
                                                                           monkeypatch):
    """The planted effect is the plan's own: a plan whose minimum worthwhile ratio is
    0.995 (0.5 % faster) plants that, and under noise sd 0.08 its 80 pairs cannot reach
    the power (the check is not vacuous)."""
    from gates.thresholds import load_thresholds

    real = load_thresholds(PROFILE)
    tiny = real.model_copy(update={"decision": real.decision.model_copy(
        update={"minimum_worthwhile_ratio": 0.995})})
    monkeypatch.setattr("gates.thresholds.load_thresholds", lambda _path: tiny)
    rng = np.random.default_rng(6)
    source = load_pairs(_calibration(tmp_path / "c.json", _aa_runs(rng, "normal")))
    result = analyse(source, PROFILE, runs=RUNS, seed=7)
    assert result["planted"]["true_median_ratio"] == 0.995
    assert not result["planted"]["power_reached"], result["planted"]["adopted"]


def test_the_resampled_null_has_median_zero_whatever_the_pool():
    """The random signs force the centre: even a pool that is all 'candidate slower'
    resamples to a symmetric law (why an A/B must be refused before this step)."""
    rng = np.random.default_rng(8)
    pool = np.abs(0.1 * rng.standard_normal(500))
    r = resample(pool, 400, 80, rng)
    assert r.shape == (400, 80)
    k = int(np.sum(r > 0))
    assert binomtest(k, r.size).pvalue > 0.01, k / r.size
    planted = resample(pool, 400, 80, np.random.default_rng(9), math.log(0.95))
    assert abs(np.median(planted) - math.log(0.95)) < 0.01


def test_an_ab_input_with_a_real_effect_is_refused_not_treated_as_aa(tmp_path, capsys):
    rng = np.random.default_rng(10)
    production = 0.002 * np.exp(0.05 * rng.standard_normal((300, 2)))
    candidate = 0.9 * production * np.exp(0.05 * rng.standard_normal((300, 2)))  # 10 % faster
    path = _samples(tmp_path / "ab.json", candidate, production)
    source = load_pairs(path)
    with pytest.raises(AAInputError, match=r"do not look A/A: median ratio 0\.8\d+, 0 of 300"):
        check_aa(source, 0.001)
    with pytest.raises(AAInputError, match="do not look A/A"):
        analyse(source, PROFILE, runs=100)
    assert main(["--pairs", str(path), "--runs", "100"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "refused" in err
    # the same kernel on both sides passes the check
    same = _samples(tmp_path / "aa.json", production * np.exp(0.05 * rng.standard_normal(
        (300, 2))), production)
    assert check_aa(load_pairs(same), 0.001)["p_value"] >= 0.001


def test_a_two_kernel_record_and_the_slowed_section_are_never_read_as_aa(tmp_path):
    two = tmp_path / "longdoc.json"
    two.write_text(json.dumps({"workload": "w", "kernels": ["xla", "pallas_mosaic_gpu"],
                               "reports": {}}))
    with pytest.raises(AAInputError, match="2 different kernels .*an A/B, not A/A"):
        load_pairs(two)
    # latency samples: only "aa" is read; the slowed (A/B) section is ignored
    rng = np.random.default_rng(11)
    p = 0.002 * np.exp(0.05 * rng.standard_normal((200, 2)))
    path = _samples(tmp_path / "s.json", p * np.exp(0.05 * rng.standard_normal((200, 2))), p,
                    slowed={"candidate_s": (3 * p).tolist(), "production_s": p.tolist()})
    source = load_pairs(path)
    assert source.format == "latency_samples" and source.pooled.size == 200
    assert source.verdicts is None
    assert abs(np.median(source.pooled)) < 0.02  # not the slowed side's log 3


@pytest.mark.parametrize(("content", "words"), [
    ("", "the file is empty"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not JSON"),
    ('{"something": 1}', "not an A/A record"),
    ('{"log_ratios": [], "verdicts": []}', "'log_ratios' is empty"),
    ('{"log_ratios": [[0.1, -0.1]]}', "has no 'verdicts' field"),
    ('{"log_ratios": [[0.1, -0.1]], "verdicts": ["pass", "pass"]}', "one verdict per run"),
    ('{"log_ratios": [[0.1, NaN]], "verdicts": ["pass"]}', r"log_ratios\[0\] has 1 non-finite"),
    ('{"log_ratios": [[], []], "verdicts": ["fail", "fail"]}',
     "'log_ratios' holds no compared pair in its 2 runs"),
    ('{"log_ratios": [[0.1], "x"], "verdicts": ["pass", "pass"]}',
     r"log_ratios\[1\] is not numeric"),
    ('{"aa": {"candidate_s": [[0.1, 0.1]]}}', "'aa' has no 'production_s' field"),
    ('{"aa": {"candidate_s": [0.1], "production_s": [0.1]}}', r"must be \[n, 2\] seconds"),
    ('{"aa": {"candidate_s": [[0.1, 0]], "production_s": [[0.1, 0.1]]}}', "non-positive"),
    ('{"aa": {"candidate_s": [[0.1, 0.1]], "production_s": [[0.1, 0.1], [0.1, 0.1]]}}',
     "differ in length"),
])
def test_bad_input_is_named(tmp_path, capsys, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(AAInputError, match=words):
        load_pairs(path)
    assert main(["--pairs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adoption_aa: error: ") and str(path) in err


def test_a_missing_file_and_too_few_runs_are_usage_errors(tmp_path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(AAInputError, match="cannot be read"):
        load_pairs(missing)
    assert main(["--pairs", str(missing)]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["--pairs", str(missing), "--runs", "99"])
    assert exit_.value.code == 2
    assert "--runs must be at least 100, got 99" in capsys.readouterr().err


def test_too_many_runs_is_a_usage_error_naming_the_limit_before_any_draw(tmp_path, capsys):
    pairs = _calibration(tmp_path / "c.json", _aa_runs(np.random.default_rng(15), "normal",
                                                       runs=10))
    with pytest.raises(SystemExit) as exit_:
        main(["--pairs", str(pairs), "--runs", "1000000000000"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--runs must be at most {adoption_aa.MAX_RUNS}" in err and "1000000000000" in err
    with pytest.raises(SystemExit) as exit_:  # the limit itself is taken, one more is not
        main(["--pairs", str(pairs), "--runs", str(adoption_aa.MAX_RUNS + 1)])
    assert exit_.value.code == 2 and adoption_aa._runs(str(adoption_aa.MAX_RUNS)) \
        == adoption_aa.MAX_RUNS
    with pytest.raises(ValueError, match=rf"runs must lie in \[1, {adoption_aa.MAX_RUNS}\]"):
        analyse(load_pairs(pairs), PROFILE, runs=adoption_aa.MAX_RUNS + 1)


def test_runs_times_max_pairs_past_the_memory_limit_is_refused_naming_the_largest_runs(
        tmp_path, capsys):
    pairs = _calibration(tmp_path / "c.json", _aa_runs(np.random.default_rng(16), "normal",
                                                       runs=10))
    wide = tmp_path / "wide.yaml"
    wide.write_text(PROFILE.read_text().replace("max_pairs: 80", "max_pairs: 500000").replace(
        "traffic_fraction: 0.5, requests: 100}", "traffic_fraction: 0.5, requests: 1000000}"))
    assert main(["--pairs", str(pairs), "--thresholds", str(wide), "--runs", "100"]) == 2
    err = capsys.readouterr().err
    limit = adoption_aa.MAX_RESAMPLED_PAIRS
    assert f"--runs 100 x max_pairs 500000 ({wide}) = 50000000 resampled pairs" in err, err
    assert f"limit of {limit}" in err and f"--runs at most {limit // 500000}" in err, err


def test_a_thresholds_file_without_an_adoption_test_is_named(tmp_path, capsys):
    rng = np.random.default_rng(14)
    pairs = _calibration(tmp_path / "c.json", _aa_runs(rng, "normal", runs=10))
    bad = tmp_path / "bad.yaml"
    bad.write_text("x: [\n")
    for thresholds, words in [(ROOT / "thresholds" / "bf16-long.yaml", "has no decision:"),
                              (bad, "not valid YAML"), (tmp_path / "none.yaml", "cannot be read")]:
        assert main(["--pairs", str(pairs), "--thresholds", str(thresholds)]) == 2
        err = capsys.readouterr().err
        assert words in err and thresholds.name in err, err


def test_every_option_has_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for option, words in [("--pairs", "calibration record"), ("--thresholds", "decision:"),
                          ("--runs", f"at most {adoption_aa.MAX_RUNS}"), ("--seed", "seed"),
                          ("--aa-check-alpha", "sign test"), ("--out", "JSON")]:
        assert option in out and words in out, option


def test_a_recorded_rolled_back_canary_counts_as_unsafe(tmp_path):
    rng = np.random.default_rng(12)
    runs = _aa_runs(rng, "normal", runs=20)
    runs[3] = runs[3][:30]  # stopped at the breach, as a calibration records it
    runs[4] = []  # failed before comparing a request
    verdicts = ["pass"] * 20
    verdicts[3] = verdicts[4] = "fail"
    source = load_pairs(_calibration(tmp_path / "c.json", runs, verdicts))
    result = analyse(source, PROFILE, runs=100, seed=0)
    assert result["recorded"]["outcomes"]["unsafe"] == 2
    assert result["source"]["run_lengths"] == {"0": 1, "30": 1, "80": 18}
    assert result["source"]["pairs"] == 30 + 18 * 80


def test_the_tool_is_seeded(tmp_path):
    rng = np.random.default_rng(13)
    source = load_pairs(_calibration(tmp_path / "c.json", _aa_runs(rng, "student_t2")))
    first, again = (analyse(source, PROFILE, runs=100, seed=21) for _ in range(2))
    assert first == again
    other = analyse(source, PROFILE, runs=100, seed=22)
    assert other != first


COMMITTED = sorted((ROOT / "reliability").glob("adoption-aa-*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_the_committed_results_reproduce_from_their_command(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the command's paths are the repository's
    doc = json.loads(path.read_text())
    source = ROOT / doc["source"]["path"]
    assert hashlib.sha256(source.read_bytes()).hexdigest() == doc["source"]["sha256"]
    argv = shlex.split(doc["command"])[3:]  # python -m tools.adoption_aa ...
    out = tmp_path / "again.json"
    argv = argv[: argv.index("--out")] + ["--out", str(out)] + argv[argv.index("--out") + 2:]
    assert main(argv) == 0
    again = json.loads(out.read_text())
    for key in ("source", "plan", "looks", "runs", "seed", "recorded", "null", "planted"):
        assert same_json(again[key], doc[key]), key
    # what the committed figures claim
    assert doc["runs"] >= 100 and doc["null"]["within_alpha"]
    assert doc["planted"]["adopted"]["rate"] > doc["null"]["adopted"]["rate"]


def test_committed_results_exist():
    assert len(COMMITTED) >= 1, "reliability/adoption-aa-*.json"
    assert adoption_aa.OUTCOMES == ("adopted", "not_worth_it", "inconclusive", "unsafe")


def test_an_out_path_that_cannot_be_written_is_named_not_a_traceback(tmp_path, capsys):
    rng = np.random.default_rng(14)
    pairs = _calibration(tmp_path / "c.json", _aa_runs(rng, "normal", runs=5))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (tmp_path, blocker / "result.json"):  # a folder; under a file
        assert main(["--pairs", str(pairs), "--thresholds", str(PROFILE), "--runs", "100",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("adoption_aa: error: ") and f"cannot write {out}" in err, err


def test_a_negative_seed_is_a_usage_error(tmp_path, capsys):
    rng = np.random.default_rng(15)
    pairs = _calibration(tmp_path / "c.json", _aa_runs(rng, "normal", runs=5))
    with pytest.raises(SystemExit) as exit_:
        main(["--pairs", str(pairs), "--runs", "100", "--seed", "-1"])
    assert exit_.value.code == 2
    assert "--seed must be a non-negative integer, got -1" in capsys.readouterr().err


def test_a_decision_judged_per_bucket_is_refused_the_pairs_carry_no_bucket(tmp_path):
    import yaml

    data = yaml.safe_load(PROFILE.read_text())
    data["canary"]["workload"] = "longdoc-cpu-small"
    data["decision"]["buckets"] = [256, 512]
    bucketed = tmp_path / "bucketed.yaml"
    bucketed.write_text(yaml.safe_dump(data))
    rng = np.random.default_rng(15)
    source = load_pairs(_calibration(tmp_path / "c.json", _aa_runs(rng, "normal", runs=5)))
    with pytest.raises(AAInputError, match=r"decision.buckets \[256, 512\] judges each length "
                                           "bucket on its own pairs"):
        analyse(source, bucketed, runs=100, seed=0)
