"""The dispatch-overhead tool's command line refuses bad input before measuring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import dispatch_overhead

COMMITTED = Path(__file__).parent.parent / "reliability/dispatch-overhead-cpu-h100-policy.json"


def test_too_few_requests_is_a_usage_error(tmp_path, capsys):
    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        dispatch_overhead.main(["--policy", str(policy), "--requests", "3"])
    assert exit_.value.code == 2
    assert "--requests must be at least 4, got 3" in capsys.readouterr().err


def test_a_missing_policy_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        dispatch_overhead.main(["--policy", str(tmp_path / "none.json")])
    assert exit_.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_a_file_that_is_not_a_policy_is_a_usage_error(tmp_path, capsys):
    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        dispatch_overhead.main(["--policy", str(policy), "--requests", "4"])
    assert exit_.value.code == 2
    assert f"--policy {policy}: " in capsys.readouterr().err


def test_the_committed_result_is_its_own_timings_judged():
    from gates.latency_judge import abba_log_ratios

    result = json.loads(COMMITTED.read_text())
    r = abba_log_ratios(result["candidate_s"], result["production_s"])
    assert len(r) == result["pairs"] == result["requests"] == 400
    assert result["median_ratio"] == pytest.approx(float(np.exp(np.median(r))), rel=1e-9)
