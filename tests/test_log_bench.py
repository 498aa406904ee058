"""``python -m lineage.tools.log_bench``: a synthetic family log built through the one writer,
measured as it grows (the audit-time benchmark; the figures are in BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from lineage.tools import log_bench


@pytest.mark.slow  # a store and a dozen signed runs: seconds on a quiet host, minutes on a loaded one
def test_the_bench_builds_an_intact_log_and_measures_each_size(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert log_bench.main(["--rollouts", "2", "--entries", "3", "--every", "1",
                           "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["rollouts"] for r in rows] == [1, 2]
    assert [r["entries"] for r in rows] == [3, 6]  # every append landed, in order
    assert all(r["problems"] == [] for r in rows)
    assert all(r["append_mean_s"] > 0 and r["audit_log_s"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert log_bench.HEADER.splitlines()[0] in printed and "| 2 | 6 |" in printed
