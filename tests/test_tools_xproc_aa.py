"""tools.xproc_aa: the per-placement summary judges like the canary, and the command
line refuses placements it does not know."""

from __future__ import annotations

import numpy as np
import pytest

from tools import xproc_aa


def _timings(n: int, slowdown: float, seed: int = 0):
    """``n`` ABBA requests: production about 10 ms, the candidate ``slowdown`` times it."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = 0.010 * np.exp(rng.normal(0, 0.02, 2))
        c = slowdown * 0.010 * np.exp(rng.normal(0, 0.02, 2))
        out.append((list(c), list(p), "CPPC" if i % 2 == 0 else "PCCP"))
    return out


def test_a_slower_candidate_is_rejected_in_every_block_and_an_identical_one_in_none():
    slow = xproc_aa._summary("c", "p", _timings(90, 1.08), step_pairs=30, alpha=0.00184)
    same = xproc_aa._summary("c", "p", _timings(90, 1.0), step_pairs=30, alpha=0.00184)
    assert slow["blocks"] == same["blocks"] == 3
    assert slow["blocks_rejected"] == 3 and slow["median_ratio"] > 1.05
    assert same["blocks_rejected"] == 0 and abs(same["median_ratio"] - 1) < 0.02
    assert set(same["slot_median_ms"]) == {"CPPC", "PCCP"}
    row = xproc_aa.table({"placements": {"local_vs_local": same}}).splitlines()[1]
    assert row.startswith("local_vs_local") and "0/3" in row


def test_an_unknown_placement_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        xproc_aa.main(["--placements", "gpu_vs_cpu", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "--requests must be at least 1, got 0"),
    (["--step-pairs", "0"], "--step-pairs must be at least 1, got 0"),
    (["--alpha", "2"], "--alpha must lie strictly between 0 and 1, got 2.0"),
    (["--placements", ","], "--placements: unknown [] or none given"),
])
def test_bad_counts_alpha_or_no_placement_are_named_before_measuring(args, message, tmp_path,
                                                                       capsys):
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as exit_:
        xproc_aa.main([*args, "--out", str(out)])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
