"""tools/gpu-tests.sh and its parts file: every `gpu` test runs in exactly one part, and
the resume logic (a passed part is not run again, a part that does not fit the budget or
fails is left for the next call) behaves as its header says. No GPU needed: --collect
only collects, and the runs below use a stand-in interpreter."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu-tests.sh"
PARTS = ROOT / "tools" / "gpu-test-parts.txt"


def _part_names() -> list[str]:
    return [line.split("\t")[0] for line in PARTS.read_text().splitlines()
            if line and not line.startswith("#")]


def _gpu_ids(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu",
                           "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_parts_cover_every_gpu_test_exactly_once():
    done = subprocess.run(["bash", str(SCRIPT), "--collect"], cwd=ROOT, capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHON": sys.executable})
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    by_part: dict[str, list[str]] = {}
    for part, node in rows:
        by_part.setdefault(part, []).append(node)
    assert sorted(by_part) == sorted(_part_names()), "a part selects no gpu test"
    selected = [node for part, node in rows]
    duplicates = sorted({n for n in selected if selected.count(n) > 1})
    assert not duplicates, f"in more than one part: {duplicates[:5]}"
    every = _gpu_ids("tests")
    assert every, "no gpu test collected at all"
    missing = sorted(set(every) - set(selected))
    assert not missing, f"gpu tests in no part of {PARTS.name}: {missing[:5]}"


@pytest.fixture
def fake_python(tmp_path) -> Path:
    """An interpreter stand-in: `-c ...` succeeds (pydantic 'imports'); `-m pytest ...`
    logs its arguments, takes $FAKE_SLEEP seconds and exits with $FAKE_RC (default 0)."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\n[ "$1" = -c ] && exit 0\n'
                    'echo "$@" >> "$FAKE_LOG"\nsleep "${FAKE_SLEEP:-0}"\nexit "${FAKE_RC:-0}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def _run(fake: Path, tmp_path: Path, *parts: str, budget: int = 5000, rc: int = 0,
         sleep: int = 0):
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(tmp_path / "calls.log"),
           "FAKE_RC": str(rc), "FAKE_SLEEP": str(sleep), "BUDGET_S": str(budget), "OUT": str(tmp_path / "out"),
           "KG_GPU_TESTS_STATE": str(tmp_path / "state")}
    (tmp_path / "calls.log").write_text("")
    done = subprocess.run(["bash", str(SCRIPT), *parts], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    return done, calls


def test_back_to_back_calls_resume_where_the_budget_stopped(fake_python, tmp_path):
    names = _part_names()
    first_seconds = int(PARTS.read_text().split(f"\n{names[0]}\t")[1].split("\t")[0])
    # The first part fits and takes 2 s; the second (as long) then no longer fits; the
    # shorter ones after it do.
    done, calls = _run(fake_python, tmp_path, budget=first_seconds + 1, sleep=2)
    assert done.returncode == 1, done.stdout
    assert calls[0].endswith("tests/test_kernels_mosaic_variants.py -k bfloat16")
    assert not any(c.endswith("-k float16 and not bfloat16") for c in calls), calls
    assert f"{names[1]:<22s} not run" in done.stdout and f"NOT YET  {names[1]}" in done.stdout
    done, calls = _run(fake_python, tmp_path)
    assert done.returncode == 0, done.stdout
    assert calls == ["-m pytest -v -m gpu -p no:cacheprovider --durations=0 "
                     "tests/test_kernels_mosaic_variants.py -k float16 and not bfloat16"], calls
    assert f"{names[0]:<22s} passed in an earlier call" in done.stdout
    done, calls = _run(fake_python, tmp_path)
    assert done.returncode == 0 and calls == []


def test_a_failed_part_is_not_recorded_and_is_run_again(fake_python, tmp_path):
    name = _part_names()[2]
    done, calls = _run(fake_python, tmp_path, name, rc=1)
    assert done.returncode == 1 and len(calls) == 1
    assert not (tmp_path / "state" / f"{name}.passed").exists()
    done, calls = _run(fake_python, tmp_path, name)
    assert (tmp_path / "state" / f"{name}.passed").exists() and len(calls) == 1
    assert "-m gpu" in calls[0] and "tests/test_kernels_poisoned.py" in calls[0]


def test_a_part_that_does_not_exist_is_refused_by_name(fake_python, tmp_path):
    done, calls = _run(fake_python, tmp_path, "no-such-part")
    assert done.returncode == 2 and calls == []
    assert "no part named 'no-such-part'" in done.stderr
