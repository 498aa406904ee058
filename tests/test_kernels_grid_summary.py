"""The Mosaic GPU kernel's floor and goal judge (kernels.tools.grid_summary), tested both ways on
synthetic reports whose expected figures are computed here from the inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from kernels.tools import grid_summary

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


def test_the_command_line_refuses_a_file_that_is_not_a_report(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": [{"shape": "nonsense", "variant": "default"}],
                               "matmul_ceiling_tflops": {"ceiling": 1.0}}))
    proc = subprocess.run([sys.executable, "-m", "kernels.tools.grid_summary", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a benchmark shape label" in proc.stderr
