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


def _expected_seconds() -> dict[str, int]:
    """The parts file's parts in order: name -> expected seconds."""
    return {line.split("\t")[0]: int(line.split("\t")[1])
            for line in PARTS.read_text().splitlines() if line and not line.startswith("#")}


def _part_names() -> list[str]:
    return list(_expected_seconds())


def test_the_parts_cover_every_gpu_test_exactly_once():
    done = subprocess.run(["bash", str(SCRIPT), "--collect", "--all"], cwd=ROOT,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHON": sys.executable})
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    every = [node for part, node in rows if part == "*"]
    rows = [(part, node) for part, node in rows if part != "*"]
    by_part: dict[str, list[str]] = {}
    for part, node in rows:
        by_part.setdefault(part, []).append(node)
    assert sorted(by_part) == sorted(_part_names()), "a part selects no gpu test"
    selected = [node for part, node in rows]
    duplicates = sorted({n for n in selected if selected.count(n) > 1})
    assert not duplicates, f"in more than one part: {duplicates[:5]}"
    assert every, "no gpu test collected at all"
    missing = sorted(set(every) - set(selected))
    assert not missing, f"gpu tests in no part of {PARTS.name}: {missing[:5]}"


def test_the_modules_searched_for_gpu_tests_include_every_way_to_mark_one(tmp_path):
    """Only modules applying the marker are collected for the coverage check, unless the
    marker is reached in a way that does not spell it: then every module is."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from gpu_collect import gpu_test_files
    finally:
        sys.path.remove(str(ROOT / "tools"))
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_direct.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_a(): ...\n")
    (tests / "test_param.py").write_text(
        "import pytest\n@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.gpu)])"
        "\ndef test_b(x): ...\n")
    (tests / "test_plain.py").write_text("def test_c():\n    assert 'gpu_table'\n")
    names = lambda: sorted(Path(p).name for p in gpu_test_files(tests))  # noqa: E731
    assert names() == ["test_direct.py", "test_param.py"]
    (tests / "test_indirect.py").write_text(
        "import pytest\nON = getattr(pytest.mark, 'g' + 'pu')\n@ON\ndef test_d(): ...\n")
    assert names() == ["test_direct.py", "test_indirect.py", "test_param.py", "test_plain.py"]
    (tests / "test_indirect.py").unlink()
    (tests / "marks.py").write_text("import pytest\nDEVICE = pytest.mark.gpu\n")
    assert names() == ["test_direct.py", "test_param.py", "test_plain.py"]


@pytest.fixture
def fake_python(tmp_path) -> Path:
    """An interpreter stand-in: `-c ...` succeeds (pydantic 'imports'); `-m pytest ...`
    logs its arguments and exits with $FAKE_RC (default 0)."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\n[ "$1" = -c ] && exit 0\n'
                    'echo "$@" >> "$FAKE_LOG"\nexit "${FAKE_RC:-0}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


def _run(fake: Path, tmp_path: Path, *parts: str, budget: int = 5000, rc: int = 0):
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(tmp_path / "calls.log"),
           "FAKE_RC": str(rc), "BUDGET_S": str(budget), "OUT": str(tmp_path / "out"),
           "KG_GPU_TESTS_STATE": str(tmp_path / "state")}
    (tmp_path / "calls.log").write_text("")
    done = subprocess.run(["bash", str(SCRIPT), *parts], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    return done, calls


def test_back_to_back_calls_resume_where_the_budget_stopped(fake_python, tmp_path):
    needs = _expected_seconds()
    # A budget that fits only the shortest parts, with 10 s to spare for the script's own
    # start (the stand-in takes no time, so what fits at the start fits throughout).
    budget = min(needs.values()) + 10
    assert not any(budget - 10 < n <= budget for n in needs.values())
    fits = [name for name, n in needs.items() if n <= budget - 10]
    rest = [name for name in needs if name not in fits]
    assert fits and rest, "the parts file no longer has parts of different lengths"
    done, calls = _run(fake_python, tmp_path, budget=budget)
    assert done.returncode == 1, done.stdout
    assert len(calls) == len(fits), calls
    for name in rest:
        assert f"{name:<22s} not run" in done.stdout and f"NOT YET  {name}" in done.stdout
    done, calls = _run(fake_python, tmp_path)
    assert done.returncode == 0, done.stdout
    assert len(calls) == len(rest), "a passed part ran again, or a part was left out"
    for name in fits:
        assert f"{name:<22s} passed in an earlier call" in done.stdout
    assert calls[0] == ("-m pytest -v -m gpu -p no:cacheprovider --durations=0 "
                        "tests/test_kernels_mosaic_variants.py -k bfloat16"), calls
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
    assert done.returncode == 0, "only the named part counts for a call that names parts"
    done, calls = _run(fake_python, tmp_path, name)
    assert done.returncode == 0 and calls == [], "a named part that passed ran again"


def test_a_part_that_does_not_exist_is_refused_by_name(fake_python, tmp_path):
    done, calls = _run(fake_python, tmp_path, _part_names()[0], "no-such-part")
    assert done.returncode == 2 and calls == [], "a part ran before the bad name was refused"
    assert "no part named 'no-such-part'" in done.stderr


@pytest.mark.parametrize("line", ["quick\tabout 60\ttests/test_x.py", "quick\t60"])
def test_a_malformed_parts_line_is_refused_before_any_run(fake_python, tmp_path, line):
    tools = tmp_path / "checkout" / "tools"
    tools.mkdir(parents=True)
    for name in ("gpu-tests.sh", "device-steps.sh"):
        (tools / name).write_text((SCRIPT.parent / name).read_text())
    (tools / "gpu-test-parts.txt").write_text(f"# a comment\n{line}\n")
    log = tmp_path / "calls.log"
    done = subprocess.run(["bash", str(tools / "gpu-tests.sh")], cwd=tmp_path / "checkout",
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake_python), "FAKE_LOG": str(log),
                               "OUT": str(tmp_path / "out"),
                               "KG_GPU_TESTS_STATE": str(tmp_path / "state")})
    assert done.returncode == 2 and not log.exists()
    assert "NAME<tab>SECONDS (whole seconds)<tab>PYTEST ARGS" in done.stderr
    assert f"2: {line}" in done.stderr


COVERAGE = ROOT / "tools" / "gpu_test_coverage.py"
FIRST, SECOND = (ROOT / "kernels" / "tools" / "bench_results" / name
                 for name in ("h200-2026-12-02-gpu-tests-a", "h200-2026-12-03-gpu-tests-b"))


def _coverage(*verbose: Path) -> subprocess.CompletedProcess:
    """tools/gpu_test_coverage.py over the two committed calls, as SECOND's README runs it
    (``verbose`` in place of FIRST's two pytest -v logs when given)."""
    verbose = verbose or (FIRST / "gpu-tests-2-variant-rest-and-poisoned" / "gpu-tests.log",
                          FIRST / "gpu-tests-3-other-modules" / "gpu-tests.log")
    return subprocess.run(
        [sys.executable, str(COVERAGE), "--collect", str(SECOND / "collect.txt"),
         *map(str, verbose), *map(str, sorted(SECOND.glob("*.log"))),
         "--quiet", f"tests/test_kernels_mosaic_variants.py="
                    f"{FIRST / 'gpu-tests-1-variants' / 'gpu-tests.log'}"],
        cwd=ROOT, capture_output=True, text=True)


def test_the_committed_gpu_test_coverage_reproduces_byte_for_byte():
    done = _coverage()
    assert done.returncode == 0, done.stderr
    assert done.stdout == (SECOND / "coverage.txt").read_text()


def test_a_failure_in_one_call_is_not_hidden_by_a_pass_in_a_later_one(tmp_path):
    """The later call passed every small-modules test; a failure planted in the earlier
    call's log of the same test is what the coverage reports, and it exits 1."""
    other = (FIRST / "gpu-tests-3-other-modules" / "gpu-tests.log").read_text()
    test_id = ("tests/test_kernels_bench_serving.py::"
               "test_gpu_serving_table_every_column_runs_correctly")
    assert f"{test_id} PASSED" in other
    assert f"{test_id} PASSED" in (SECOND / "small-modules.log").read_text()
    planted = tmp_path / "gpu-tests.log"
    planted.write_text(other.replace(f"{test_id} PASSED", f"{test_id} FAILED", 1))
    done = _coverage(FIRST / "gpu-tests-2-variant-rest-and-poisoned" / "gpu-tests.log", planted)
    assert done.returncode == 1
    assert "  FAILED     1\n  PASSED     246\n" in done.stdout
    assert f"  FAILED     {test_id}\n" in done.stdout
