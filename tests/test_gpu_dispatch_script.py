"""tools/gpu-dispatch.sh without a mode, or with one it does not know, prints its usage
(every mode it has) and exits 2, creating no folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "tools" / "gpu-dispatch.sh"


def _modes() -> list[str]:
    """The modes the script's case statement handles."""
    return re.findall(r"^  ([a-z]+)\)$", SCRIPT.read_text(), flags=re.M)


@pytest.mark.parametrize("args", [[], ["bogus"], ["--help"]])
def test_no_mode_or_an_unknown_one_prints_every_mode_and_exits_2(tmp_path, args):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "KG_DISPATCH": str(tmp_path / "work")}
    done = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert _modes() == ["evidence", "merge", "longdoc", "rollout", "xproc", "auto"]
    for mode in _modes():
        assert f"tools/gpu-dispatch.sh {mode}" in done.stdout, (mode, done.stdout)
    assert not any(tmp_path.iterdir()), "usage created a folder"


def test_evidence_without_a_dtype_is_a_usage_error_that_makes_no_folder(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "KG_DISPATCH": str(tmp_path / "work")}
    done = subprocess.run(["bash", str(SCRIPT), "evidence"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "evidence DTYPE [START:]" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())
