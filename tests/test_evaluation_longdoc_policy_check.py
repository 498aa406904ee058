"""The policy-on-the-mix judge (``evaluation.longdoc.policy_check``) on synthetic replays
with planted per-bucket effects, on A/A replays at its nominal rate, on failures and bad
input, and on the committed H100 results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.longdoc import policy_check
from tests.longdoc_synthetic import comparison, spec

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "kernels/tools/bench_results/h100-2026-12-06-longdoc-cudnn/policy"
SHARP = 0.05  # per-kernel noise sd: a 30 % planted effect is far outside the interval


def _write(tmp_path: Path, kernel: str, factor, **kw) -> Path:
    result = comparison(factor, kernels=(kernel, "auto"), **kw)
    path = tmp_path / f"{kernel}-vs-policy.json"
    path.write_text(result.model_dump_json())
    return path


def _verdicts(found: policy_check.PolicyCheck) -> dict[tuple[str, str], str]:
    return {(r.group, r.kernel): r.verdict for r in found.buckets + found.mix}


def test_a_policy_serving_each_buckets_best_kernel_is_shown(tmp_path):
    """Three kernels, each the best (equal to the policy) in one bucket and 1/0.7 slower
    in the others; no bucket holds half the requests, so over the mix the policy is
    faster than each."""
    paths = [_write(tmp_path, k, {b: 1.0 if b == best else 0.7 for b in (8, 16, 32)},
                    noise=SHARP, seed=i)
             for i, (k, best) in enumerate((("k8", 8), ("k16", 16), ("k32", 32)))]
    found = policy_check.check(paths)
    assert found.shown and found.reasons == []
    verdicts = _verdicts(found)
    assert {verdicts[("all", k)] for k in ("k8", "k16", "k32")} == {"faster"}
    assert verdicts[("16", "k16")] == "not slower"  # the equal kernel: within its interval
    assert policy_check.main([str(p) for p in paths]) == 0


def test_a_bucket_where_a_single_kernel_beats_the_policy_is_named(tmp_path):
    paths = [_write(tmp_path, "k8", {8: 1.0, 16: 0.7, 32: 0.7}, noise=SHARP, seed=1),
             _write(tmp_path, "k16", {8: 0.7, 16: 1.3, 32: 0.7}, noise=SHARP, seed=2)]
    found = policy_check.check(paths)
    assert not found.shown
    assert _verdicts(found)[("16", "k16")] == "slower"
    (reason,) = found.reasons
    assert reason.startswith("16 tokens against k16: slower 1.2")  # 1.3 planted, 51 pairs
    (row,) = [r for r in found.buckets if (r.group, r.kernel) == ("16", "k16")]
    assert row.low <= 1.3 <= row.high
    assert policy_check.main([str(p) for p in paths]) == 1


def test_a_policy_equal_to_one_kernel_is_not_faster_over_the_mix(tmp_path):
    """An A/A (the policy names one kernel everywhere): never slower, never faster."""
    found = policy_check.check([_write(tmp_path, "only", 1.0, noise=SHARP)])
    assert not found.shown
    assert _verdicts(found)[("all", "only")] == "not faster"
    assert {r.verdict for r in found.buckets} == {"not slower"}


def test_on_a_a_replays_the_mix_is_called_faster_at_about_its_nominal_rate(tmp_path):
    """A one-sided miss of a 95 % two-sided interval: 2.5 % nominal. 60 A/A replays at
    the default noise: at most 6 called faster (binomial tail 3e-4 at 2.5 %)."""
    faster = 0
    for seed in range(60):
        path = _write(tmp_path, "same", 1.0, seed=seed)
        faster += policy_check.check([path]).mix[0].verdict == "faster"
    assert faster <= 6


def test_a_kernel_that_fails_a_bucket_the_policy_serves_does_not_block_the_claim(tmp_path):
    paths = [_write(tmp_path, "fails32", 0.7, noise=SHARP, fail_bucket=32, seed=3)]
    found = policy_check.check(paths)
    verdicts = _verdicts(found)
    assert verdicts[("32", "fails32")] == "kernel failed"
    assert found.shown, found.reasons


def test_a_policy_that_fails_requests_is_never_as_fast(tmp_path):
    paths = [_write(tmp_path, "k", 0.7, noise=SHARP, fail_bucket=32, fail_candidate=True)]
    found = policy_check.check(paths)
    assert not found.shown
    assert _verdicts(found)[("32", "k")] == "policy failed"
    assert _verdicts(found)[("all", "k")] == "policy failed"


def test_results_that_cannot_be_judged_together_are_refused(tmp_path, capsys):
    ab = tmp_path / "ab.json"
    ab.write_text(comparison(0.9).model_dump_json())  # kernels base,cand: not K,auto
    assert policy_check.main([str(ab)]) == 2
    assert "must serve a single kernel first and 'auto'" in capsys.readouterr().err
    stranger = tmp_path / "not-a-result.json"
    stranger.write_text('{"workload": "x"}')
    assert policy_check.main([str(stranger)]) == 2
    assert "not a result of python -m evaluation.longdoc.bench" in capsys.readouterr().err
    first = _write(tmp_path, "k", 1.0)
    twice = tmp_path / "again.json"
    twice.write_text(first.read_text())
    with pytest.raises(policy_check.BadInput, match="already given"):
        policy_check.check([first, twice])
    other = tmp_path / "other.json"
    other.write_text(comparison(1.0, kernels=("j", "auto"),
                                workload=spec(seed=99)).model_dump_json())
    with pytest.raises(policy_check.BadInput, match="not the same arrivals"):
        policy_check.check([first, other])


def test_the_committed_h100_policy_is_not_shown_faster_than_pallas_mosaic_gpu(tmp_path):
    """The committed H100 policy on the long-document mix (BENCHMARKS): slower than
    pallas_mosaic_gpu in the 4k-32k buckets and over the mix, an A/A with cuDNN from 8k
    (it names cuDNN there), faster than cuDNN at 1-2k (it names pallas_gpu there)."""
    out = tmp_path / "check.json"
    assert policy_check.main([*map(str, sorted(H100.glob("*.json"))), "--json", str(out)]) == 1
    found = json.loads(out.read_text())
    rows = {(r["group"], r["kernel"]): r for r in found["buckets"] + found["mix"]}
    assert rows[("all", "pallas_mosaic_gpu")]["verdict"] == "not faster"
    assert rows[("all", "pallas_mosaic_gpu")]["low"] > 1.0
    assert all(rows[(b, "pallas_mosaic_gpu")]["verdict"] == "slower"
               for b in ("4096", "8192", "16384", "32768"))
    assert rows[("1024", "cudnn")]["high"] < 1.0 and rows[("2048", "cudnn")]["high"] < 1.0
    assert rows[("all", "cudnn")]["low"] <= 1.0 <= rows[("all", "cudnn")]["high"]


def test_broken_results_and_outputs_are_refused_in_one_line_and_nothing_is_judged(
        tmp_path, capsys):
    """Found by trying to break it: each of these was a traceback (exit 1, which reads as
    "not shown") or, for the unwritable --json, a verdict printed before the traceback."""
    good = _write(tmp_path, "k", 0.7, noise=SHARP)
    data = json.loads(good.read_text())
    cases = {"one-kernel": {**data, "kernels": ["k"]},
             "no-auto-report": {**data, "reports": {"k": data["reports"]["k"]}}}
    unpaired = json.loads(good.read_text())
    unpaired["reports"]["auto"]["trace"]["requests"].pop()
    cases["unpaired"] = unpaired
    for name, content in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(content))
        assert policy_check.main([str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("policy_check: ") and err.count("\n") == 1, (name, err)
    (tmp_path / "a-folder").mkdir()
    assert policy_check.main([str(good), "--json", str(tmp_path / "a-folder")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "policy_check: " in out.err  # no verdict before the failure


def test_a_bucket_missing_from_the_summary_is_still_judged(tmp_path):
    path = _write(tmp_path, "k", {8: 0.7, 16: 1.3, 32: 0.7}, noise=SHARP, seed=2)
    data = json.loads(path.read_text())
    del data["reports"]["k"]["buckets"]["16"]
    path.write_text(json.dumps(data))
    found = policy_check.check([path])
    assert not found.shown and _verdicts(found)[("16", "k")] == "slower"


def test_a_request_both_sides_failed_is_not_charged_to_the_policy(tmp_path):
    path = _write(tmp_path, "k", 0.7, noise=SHARP, fail_bucket=32, seed=3)
    data = json.loads(path.read_text())
    failed = {r["id"] for r in data["reports"]["k"]["trace"]["requests"] if not r["ok"]}
    for r in data["reports"]["auto"]["trace"]["requests"]:
        if r["id"] in failed:
            r["ok"] = False
    path.write_text(json.dumps(data))
    assert _verdicts(policy_check.check([path]))[("32", "k")] == "kernel failed"
