"""The Mosaic GPU kernel's floor and goal judge (kernels.tools.grid_summary), tested both ways on
synthetic reports whose expected figures are computed here from the inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from kernels.tools import call_aa, grid_summary

CEILING = 700.0


def _report(ratio_of, tflops_cudnn=500.0, correct=lambda shape: True):
    """A grid report of 24 rows: cuDNN at ``tflops_cudnn``, the default at
    ``ratio_of(dtype, d, causal, seq) * tflops_cudnn``."""
    rows = []
    for dtype in ("bfloat16", "float16"):
        for d in (64, 128, 256):
            for causal in (False, True):
                for b, s in ((1, 16384), (4, 4096)):
                    label = (f"{dtype} d{d} {'causal' if causal else 'full'} B{b} "
                             f"S{s}x{s} H{2048 // d}/{2048 // d}")
                    rows.append({"shape": label, "variant": "cudnn", "tflops": tflops_cudnn,
                                 "correct": True})
                    rows.append({"shape": label, "variant": "default", "correct": correct(label),
                                 "tflops": ratio_of(dtype, d, causal, s) * tflops_cudnn,
                                 "ptxas": {"registers": 168, "spill_store_bytes": 0,
                                           "spill_load_bytes": 0}})
    return {"rows": rows, "matmul_ceiling_tflops": {"ceiling": CEILING}}


def test_a_kernel_ahead_everywhere_meets_the_floor_with_the_geomean_of_its_ratios():
    rng = np.random.default_rng()
    table = {}

    def ratio(dtype, d, causal, s):
        return table.setdefault((dtype, d, causal, s), float(rng.uniform(1.04, 1.20)))

    s = grid_summary.summarize(_report(ratio))["default"]
    expected = math.exp(np.mean(np.log(list(table.values()))))
    assert s["geomean_ratio_to_cudnn"] == pytest.approx(expected, rel=1e-12)
    assert s["floor_met"] is True and s["not_assessed"] == []
    d64_full = [v for (dt, d, c, _), v in table.items() if d == 64 and not c]
    assert s["groups"]["d64 full"] == pytest.approx(math.exp(np.mean(np.log(d64_full))))


def test_one_group_below_cudnn_fails_the_floor_even_with_a_high_geomean():
    def ratio(dtype, d, causal, s):
        return 0.97 if (d, causal) == (256, False) else 1.30

    s = grid_summary.summarize(_report(ratio))["default"]
    assert s["geomean_ratio_to_cudnn"] > 1.05
    assert s["groups"]["d256 full"] == pytest.approx(0.97)
    assert s["floor_met"] is False


def test_a_geomean_just_under_the_floor_fails_it():
    s = grid_summary.summarize(_report(lambda *_: 1.049))["default"]
    assert all(v >= 1.0 for v in s["groups"].values())
    assert s["floor_met"] is False


def test_an_incorrect_row_is_not_assessed_never_a_speed():
    bad = "float16 d128 causal B4 S4096x4096 H16/16"
    s = grid_summary.summarize(_report(lambda *_: 1.2, correct=lambda lab: lab != bad))["default"]
    assert s["floor_met"] is False
    assert any(bad in reason for reason in s["not_assessed"])
    assert s["rows"] == 24 and bad not in json.dumps(s["rows_by_dtype"])


def test_the_goal_is_the_fraction_of_the_same_call_s_ceiling_at_16k_full():
    # 0.95 of the ceiling at d128/d256 and 0.80 at d64 on the goal rows: met.
    def ratio(dtype, d, causal, s):
        frac = 0.80 if d == 64 else 0.95
        return frac * CEILING / 500.0

    s = grid_summary.summarize(_report(ratio))["default"]
    assert s["of_ceiling_at_goal"]["128"] == pytest.approx([0.95, 0.95])
    assert s["goal_met"] is True
    s = grid_summary.summarize(_report(lambda *a: 0.85 * CEILING / 500.0))["default"]
    assert s["goal_met"] is False  # 0.85 < 0.90 at d128 and d256


def test_a_missing_group_is_named_not_passed():
    report = _report(lambda *_: 1.2)
    report["rows"] = [r for r in report["rows"]
                      if not (r["variant"] == "default" and " d64 causal " in r["shape"])]
    s = grid_summary.summarize(report)["default"]
    assert s["floor_met"] is False
    assert "group d64 causal: no row" in s["not_assessed"]


def _with_fa3(report, fa3_of):
    """``report`` with an FA3 row on every head_dim-128 shape: the default's TFLOP/s
    divided by ``fa3_of(label)`` (the ratio ours/FA3 the judge should read), or an error
    row where ``fa3_of`` returns None."""
    for r in list(report["rows"]):
        if r["variant"] == "default" and " d128 " in r["shape"]:
            ratio = fa3_of(r["shape"])
            report["rows"].append(
                {"shape": r["shape"], "variant": "fa3", "error": "ImportError: no wheel"}
                if ratio is None else
                {"shape": r["shape"], "variant": "fa3", "tflops": r["tflops"] / ratio})
    return report


def test_the_fa3_floor_is_every_d128_row_and_the_geomean_against_fa3():
    rng = np.random.default_rng()
    drawn = {}

    def fa3_of(label):
        return drawn.setdefault(label, float(rng.uniform(1.031, 1.09)))

    s = grid_summary.summarize(_with_fa3(_report(lambda *_: 1.1), fa3_of))
    assert set(s) == {"default"}  # FA3 is a peer, never a variant
    fa3 = s["default"]["against_fa3"]
    assert len(fa3["ratios"]) == 8 and set(fa3["ratios"]) == set(drawn)
    assert fa3["geomean"] == pytest.approx(math.exp(np.mean(np.log(list(drawn.values())))))
    assert fa3["min_row"]["ratio_to_fa3"] == pytest.approx(min(drawn.values()))
    assert fa3["floor_met"] is True and fa3["not_assessed"] == []
    assert fa3["goal_met"] is (fa3["geomean"] >= 1.05)


def test_one_d128_row_behind_fa3_fails_its_floor_whatever_the_geomean():
    behind = "float16 d128 full B4 S4096x4096 H16/16"
    s = grid_summary.summarize(_with_fa3(_report(lambda *_: 1.1),
                                         lambda lab: 0.99 if lab == behind else 1.15))
    fa3 = s["default"]["against_fa3"]
    assert fa3["geomean"] > 1.05 and fa3["min_row"]["shape"] == behind
    assert fa3["floor_met"] is False and fa3["goal_met"] is True


def test_a_geomean_under_1_03_against_fa3_fails_its_floor():
    fa3 = grid_summary.summarize(_with_fa3(_report(lambda *_: 1.1),
                                           lambda _: 1.029))["default"]["against_fa3"]
    assert fa3["floor_met"] is False and fa3["goal_met"] is False
    fa3 = grid_summary.summarize(_with_fa3(_report(lambda *_: 1.1),
                                           lambda _: 1.031))["default"]["against_fa3"]
    assert fa3["floor_met"] is True


def test_a_row_behind_cudnn_anywhere_fails_the_fa3_floor():
    def ratio(dtype, d, causal, s):
        return 0.98 if (dtype, d, causal, s) == ("bfloat16", 64, True, 4096) else 1.2

    fa3 = grid_summary.summarize(_with_fa3(_report(ratio),
                                           lambda _: 1.2))["default"]["against_fa3"]
    assert fa3["geomean"] == pytest.approx(1.2)
    assert fa3["every_row_vs_cudnn"] is False and fa3["floor_met"] is False


def test_an_untimed_fa3_row_is_not_assessed_never_passed():
    missing = "bfloat16 d128 causal B1 S16384x16384 H16/16"
    fa3 = grid_summary.summarize(_with_fa3(
        _report(lambda *_: 1.2), lambda lab: None if lab == missing else 1.2)
    )["default"]["against_fa3"]
    assert fa3["floor_met"] is False and fa3["goal_met"] is False
    assert len(fa3["ratios"]) == 7
    assert any(missing in r and "ImportError: no wheel" in r for r in fa3["not_assessed"])
    # no FA3 row at all: every d128 shape is named
    fa3 = grid_summary.summarize(_report(lambda *_: 1.2))["default"]["against_fa3"]
    assert len(fa3["not_assessed"]) == 8 and fa3["floor_met"] is False
    assert "against FA3" in grid_summary.format_summary(
        grid_summary.summarize(_report(lambda *_: 1.2)))


def test_a_head_dim_128_call_is_judged_on_its_own_rows():
    """A call of the d128 rows only (how the kernel work runs it): the goal's missing
    head_dims are not rows of the call, so they do not fail the cuDNN clause; the floor
    says how many rows the call held."""
    report = _with_fa3(_report(lambda *_: 1.2), lambda _: 1.2)
    report["rows"] = [r for r in report["rows"] if " d128 " in r["shape"]]
    s = grid_summary.summarize(report)["default"]
    assert any("goal at head_dim 64" in r for r in s["not_assessed"])
    fa3 = s["against_fa3"]
    assert fa3["every_row_vs_cudnn"] is True and fa3["rows_in_call"] == 8
    assert fa3["floor_met"] is True
    assert "each of the call's 8 rows >= 1.0x cuDNN: yes" in grid_summary.format_summary(
        {"default": s})


def test_an_fa3_row_that_is_wrong_or_gave_no_reason_is_not_a_divisor():
    report = _with_fa3(_report(lambda *_: 1.2), lambda _: 1.2)
    fa3_rows = [r for r in report["rows"] if r["variant"] == "fa3"]
    fa3_rows[0]["correct"] = False
    fa3_rows[1].pop("tflops")
    fa3_rows[1]["error"] = ""
    fa3 = grid_summary.summarize(report)["default"]["against_fa3"]
    assert len(fa3["ratios"]) == 6 and fa3["floor_met"] is False
    assert any("not correct against float64" in r for r in fa3["not_assessed"])
    assert any("no reason given" in r for r in fa3["not_assessed"])


def test_the_command_line_refuses_a_file_that_is_not_a_report(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": [{"shape": "nonsense", "variant": "default"}],
                               "matmul_ceiling_tflops": {"ceiling": 1.0}}))
    proc = subprocess.run([sys.executable, "-m", "kernels.tools.grid_summary", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a benchmark shape label" in proc.stderr


# --------------------------------------------------------------------------- the call's A/A


def _with_twin(report, twin_of, correct=lambda lab: True):
    """``report`` with the registered kernel's second timing on every shape: the default's
    TFLOP/s times ``twin_of(label)`` (the A/A ratio the judge should read)."""
    for r in list(report["rows"]):
        if r["variant"] == "default":
            report["rows"].append({"shape": r["shape"], "variant": call_aa.AA_VARIANT,
                                   "correct": correct(r["shape"]),
                                   "tflops": r["tflops"] * twin_of(r["shape"])})
    return report


def test_the_a_a_is_the_twin_over_the_default_and_its_widest_log_ratio():
    rng = np.random.default_rng()
    drawn = {}

    def twin_of(label):
        return drawn.setdefault(label, float(np.exp(rng.normal(0.0, 0.01))))

    report = _with_twin(_with_fa3(_report(lambda *_: 1.1), lambda _: 1.0), twin_of)
    aa = call_aa.a_a(report["rows"])
    assert aa["ratios"] == pytest.approx(drawn) and aa["not_assessed"] == []
    assert aa["band"] == pytest.approx(max(abs(math.log(r)) for r in drawn.values()))
    assert aa["geomean"] == pytest.approx(math.exp(np.mean(np.log(list(drawn.values())))))
    summary = grid_summary.summarize(report)
    assert set(summary) == {"default"}  # the twin is the yardstick, never a judged variant
    d128 = [r for lab, r in drawn.items() if " d128 " in lab]
    assert summary["default"]["against_fa3"]["a_a_band"] == pytest.approx(
        max(abs(math.log(r)) for r in d128))  # the band of the rows it sorts
    assert aa["pairs"] == 24 and aa["lowest"] == pytest.approx(min(drawn.values()))


def test_rows_against_fa3_are_resolved_only_beyond_the_a_a_band():
    # A/A on the d128 rows: one pair at +3 %, the rest at 1.0, so the band is log(1.03);
    # a wider pair on a d64 row is noise of another shape and sets no band here.
    widest = "float16 d128 full B4 S4096x4096 H16/16"
    elsewhere = "bfloat16 d64 full B1 S16384x16384 H32/32"
    fa3 = {"bfloat16 d128 full B1 S16384x16384 H16/16": 1.05,     # ahead
           "bfloat16 d128 full B4 S4096x4096 H16/16": 0.95,       # behind
           "bfloat16 d128 causal B1 S16384x16384 H16/16": 1.029,  # within
           "bfloat16 d128 causal B4 S4096x4096 H16/16": 1 / 1.029}
    report = _with_twin(_with_fa3(_report(lambda *_: 1.1), lambda lab: fa3.get(lab, 1.0)),
                        lambda lab: {widest: 1.03, elsewhere: 1.2}.get(lab, 1.0))
    fa3_block = grid_summary.summarize(report)["default"]["against_fa3"]
    assert fa3_block["a_a_pairs"] == 8
    assert fa3_block["a_a_band"] == pytest.approx(math.log(1.03))
    res = fa3_block["resolved"]
    assert res["ahead"] == ["bfloat16 d128 full B1 S16384x16384 H16/16"]
    assert res["behind"] == ["bfloat16 d128 full B4 S4096x4096 H16/16"]
    assert len(res["within"]) == 6  # the two at 1.029 either way and the four at 1.0
    text = grid_summary.format_summary(grid_summary.summarize(report))
    assert ("beside the call's A/A on these rows (8 pairs, band [0.971, 1.030]): "
            "1 rows ahead, 1 behind, 6 within") in text
    whole = call_aa.format_a_a(call_aa.a_a(report["rows"]))
    assert "24 pairs" in whole and "range [1.000, 1.200]" in whole


def test_the_band_reports_the_noise_and_never_moves_the_issue_s_verdicts():
    """A floor met as measured stays met inside a wide A/A band, and one missed stays
    missed: the band sorts rows for the reader, the thresholds stay the issue's."""
    for fa3_ratio, met in ((1.031, True), (1.029, False)):
        report = _with_twin(_with_fa3(_report(lambda *_: 1.1), lambda _, r=fa3_ratio: r),
                            lambda _: 1.06)
        fa3 = grid_summary.summarize(report)["default"]["against_fa3"]
        assert fa3["floor_met"] is met
        assert len(fa3["resolved"]["within"]) == 8


def test_without_a_twin_no_row_is_resolved_either_way():
    report = _with_fa3(_report(lambda *_: 1.1), lambda _: 1.2)
    fa3 = grid_summary.summarize(report)["default"]["against_fa3"]
    assert fa3["resolved"] is None and fa3["a_a_band"] is None
    assert "no A/A timed, no row resolved" in grid_summary.format_summary(
        grid_summary.summarize(report))
    aa = call_aa.a_a(report["rows"])
    assert "not timed in this call" in call_aa.format_a_a(aa)
    assert aa["not_assessed"] == [] and aa["pairs"] == 0 and aa["twin_timed"] is False


def test_an_incorrect_twin_row_is_not_part_of_the_a_a():
    bad = "float16 d256 causal B4 S4096x4096 H8/8"
    report = _with_twin(_report(lambda *_: 1.1),
                        lambda lab: 1.5 if lab == bad else 1.01, correct=lambda lab: lab != bad)
    aa = call_aa.a_a(report["rows"])
    assert aa["not_assessed"] == [bad] and len(aa["ratios"]) == 23
    assert aa["band"] == pytest.approx(math.log(1.01))


def test_a_peer_equal_to_the_kernel_is_resolved_at_the_nominal_rate():
    """On A/A data (FA3 timed with the same noise as the two timings of the kernel, and
    equal to it), a row falls outside the band of n = 8 pairs with probability 1/9
    (exchangeability); the judge's rate over many simulated calls is that."""
    rng = np.random.default_rng()
    trials, resolved_rows = 1500, 0
    for _ in range(trials):
        noise = iter(np.exp(rng.normal(0.0, 0.012, size=16)))
        report = _report(lambda *_: 1.1)
        report["rows"] = [r for r in report["rows"] if " d128 " in r["shape"]]
        report = _with_twin(_with_fa3(report, lambda _, it=noise: float(next(it))),
                            lambda _, it=noise: float(next(it)))
        res = grid_summary.summarize(report)["default"]["against_fa3"]["resolved"]
        resolved_rows += len(res["ahead"]) + len(res["behind"])
    rate = resolved_rows / (8 * trials)
    # 12000 row verdicts, correlated within a call through the shared band: the
    # standard error is at most about 0.006 here; 4 of them either side.
    assert abs(rate - 1 / 9) < 0.025, rate


def test_a_twin_without_an_assessable_pair_says_so_not_untimed():
    report = _with_twin(_report(lambda *_: 1.1), lambda _: 1.0)
    for r in report["rows"]:
        if r["variant"] == "default":
            r["correct"] = False
    aa = call_aa.a_a(report["rows"])
    assert aa["band"] is None and len(aa["not_assessed"]) == 24
    assert "timed, but no shape assessable" in call_aa.format_a_a(aa)


@pytest.mark.parametrize("bad_rate", [0.0, -5.0, float("nan"), float("inf")])
def test_a_twin_rate_that_is_no_finite_positive_number_is_not_a_pair(bad_rate):
    broken = "bfloat16 d128 full B1 S16384x16384 H16/16"
    report = _with_twin(_with_fa3(_report(lambda *_: 1.1), lambda _: 1.0),
                        lambda lab: 1.01)
    for r in report["rows"]:
        if r["variant"] == call_aa.AA_VARIANT and r["shape"] == broken:
            r["tflops"] = bad_rate
    aa = call_aa.a_a(report["rows"])
    assert aa["not_assessed"] == [broken] and aa["band"] == pytest.approx(math.log(1.01))
    fa3 = grid_summary.summarize(report)["default"]["against_fa3"]
    assert fa3["a_a_pairs"] == 7 and fa3["floor_met"] is False


def test_the_floor_lead_passes_its_readings_at_the_stated_probability():
    """Simulated: 16 readings of a true lead ``floor_lead(sd)`` with normal noise ``sd`` all
    clear 1.0 in 90 % of trials; two standard deviations of the lead less, far fewer."""
    rng = np.random.default_rng()
    sd = 0.012
    lead = call_aa.floor_lead(sd)
    readings = lead + rng.normal(0.0, sd, size=(20000, call_aa.FLOOR_READINGS))
    rate = float(np.mean(np.all(readings > 0.0, axis=1)))
    assert abs(rate - 0.9) < 0.012, rate  # 4 standard errors of a 20000-trial rate
    short = (lead - 2 * sd) + rng.normal(0.0, sd, size=(20000, call_aa.FLOOR_READINGS))
    assert float(np.mean(np.all(short > 0.0, axis=1))) < 0.5
    with pytest.raises(ValueError, match="probability"):
        call_aa.floor_lead(sd, probability=1.0)


def test_the_a_a_reports_its_noise_and_the_lead_the_floor_needs_at_it():
    from scipy import stats

    pairs = [0.994, 1.010, 1.007, 1.029, 1.000, 1.010]
    report = _report(lambda *_: 1.1)
    labels = [r["shape"] for r in report["rows"] if r["variant"] == "default"][:6]
    report["rows"] = [r for r in report["rows"] if r["shape"] in labels]
    report = _with_twin(report, lambda lab: pairs[labels.index(lab)])
    aa = call_aa.a_a(report["rows"])
    assert aa["log_sd"] == pytest.approx(np.std(np.log(pairs), ddof=1))
    lead = stats.norm.ppf(0.9 ** (1 / 16)) * aa["log_sd"]
    assert call_aa.floor_lead(aa["log_sd"]) == pytest.approx(lead)
    assert f"need a true lead of {math.expm1(lead):.1%} on every row" in call_aa.format_a_a(aa)
    one = call_aa.a_a([r for r in report["rows"] if r["shape"] == labels[0]])
    assert one["pairs"] == 1 and one["log_sd"] is None
    assert "true lead" not in call_aa.format_a_a(one)
