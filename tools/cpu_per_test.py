"""A pytest plugin charging each test with the CPU it cost: its process's own and its
children's (reaped, through ``getrusage``; live, through ``/proc``, which counts the
Prefect and MLflow servers a test or its module starts).

Why: CI's three lanes keep both cores of its host busy, so its wall time follows its
CPU-seconds, and ``--durations`` (wall time, inflated by waits and by the lanes beside)
cannot say where they go. Each xdist worker writes ``[node id, CPU s, wall s]`` rows to
``$CPU_PER_TEST_DIR/cpu-<worker>.json`` at its end; ``--summary`` adds them up by module::

    PYTHONPATH=tools CPU_PER_TEST_DIR=/tmp/cpu make test TEST_ARGS="-p cpu_per_test"
    python tools/cpu_per_test.py --summary /tmp/cpu
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest
from cpu_by_process import proc_stats  # tools/ is on the path: the plugin's usage


def live_descendants_cpu_s(root: int) -> float:
    """User + system CPU seconds of every live descendant of process ``root``."""
    stats = proc_stats()
    children = collections.defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    total, front = 0.0, [root]
    while front:
        for pid in children[front.pop()]:
            total += stats[pid][1]
            front.append(pid)
    return total


def process_cpu_s() -> float:
    """This process's CPU seconds, its reaped children's and its live descendants'."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
            + live_descendants_cpu_s(os.getpid()))


_ROWS: list[tuple[str, float, float]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = process_cpu_s(), time.monotonic()
    yield
    _ROWS.append((item.nodeid, process_cpu_s() - cpu, time.monotonic() - wall))


def pytest_sessionfinish(session):
    folder = Path(os.environ.get("CPU_PER_TEST_DIR", ".kernelgate/cpu-per-test"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (folder / f"cpu-{worker}.json").write_text(json.dumps(_ROWS))


def summary(folder: Path, top: int) -> str:
    """The CPU and wall seconds of every module, most CPU first, from a run's files.

    Raises:
        FileNotFoundError: ``folder`` holds no ``cpu-*.json``.
    """
    files = sorted(folder.glob("cpu-*.json"))
    if not files:
        raise FileNotFoundError(f"no cpu-*.json in {folder}: run the suite with the plugin")
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    for f in files:
        for node, c, w in json.loads(f.read_text()):
            module = node.split("::")[0]
            cpu[module] += c
            wall[module] += w
            count[module] += 1
    lines = [f"{sum(cpu.values()):.0f} CPU-s charged to {sum(count.values())} tests",
             "| module | tests | CPU s | wall s |", "|---|---|---|---|"]
    lines += [f"| {m} | {count[m]} | {c:.1f} | {wall[m]:.1f} |" for m, c in cpu.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summary", type=Path, required=True, help="the run's folder")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    try:
        print(summary(args.summary, args.top))
    except FileNotFoundError as err:
        parser.error(str(err))
