"""The dispatch-overhead tool's command line refuses bad input before measuring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import dispatch_overhead

COMMITTED = Path(__file__).parent.parent / "reliability/dispatch-overhead-cpu-h100-policy.json"


@pytest.mark.parametrize(("policy_text", "extra", "message"), [
    ("{}", ["--requests", "3"], "--requests must be at least 4, got 3"),
    (None, [], "no such file"),
    ("{}", ["--requests", "4"], "--policy {policy}: "),
], ids=["too-few-requests", "missing-policy", "not-a-policy"])
def test_bad_arguments_are_usage_errors_naming_the_constraint(tmp_path, capsys, policy_text,
                                                                extra, message):
    policy = tmp_path / "policy.json"
    if policy_text is not None:
        policy.write_text(policy_text)
    with pytest.raises(SystemExit) as exit_:
        dispatch_overhead.main(["--policy", str(policy), *extra])
    assert exit_.value.code == 2
    assert message.format(policy=policy) in capsys.readouterr().err


def test_the_committed_result_is_its_own_timings_judged():
    from gates.latency_judge import abba_log_ratios

    result = json.loads(COMMITTED.read_text())
    r = abba_log_ratios(result["candidate_s"], result["production_s"])
    assert len(r) == result["pairs"] == result["requests"] == 400
    assert result["median_ratio"] == pytest.approx(float(np.exp(np.median(r))), rel=1e-9)
