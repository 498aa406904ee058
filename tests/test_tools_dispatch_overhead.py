"""The dispatch-overhead tool's command line refuses bad input before measuring."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_the_committed_result_is_its_own_latencies_summarised():
    result = json.loads(COMMITTED.read_text())
    import numpy as np
    ratios = (np.asarray(result["latencies_s"]["dispatch"])
              / np.asarray(result["latencies_s"][result["kernel"]]))
    assert len(ratios) == result["requests"] == 400
    assert result["median_ratio"] == pytest.approx(float(np.median(ratios)), rel=1e-12)
    assert result["share_dispatch_slower"] == pytest.approx(float(np.mean(ratios > 1)))
