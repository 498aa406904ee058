"""CPU seconds of every process on the host while a command runs, added up by kind
(MLflow server, Prefect server, flow run, test process, Chromium, PostgreSQL, ...).

Why: CI's lanes start servers, workers and browsers whose CPU no test's timing shows.
This samples ``/proc`` every ``--interval`` seconds while ``COMMAND`` runs, charges each
process with the CPU it used while sampled (a process ending between two samples loses
at most one interval), prints a table by kind and writes every process to ``--json``::

    python tools/cpu_by_process.py --json /tmp/lanes.json -- make test-services SERVICES_WORKERS=1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
KINDS = [  # first match wins: servers before the generic Python patterns
    ("Prefect temporary server", r"uvicorn .*prefect\.server\.api\.server:create_app"),
    ("MLflow server", r"mlflow\.server|mlflow server|mlflow ui"),
    ("Prefect server", r"prefect server start"),
    ("flow run", r"prefect\.engine|prefect\.runner|prefect worker"),
    ("PostgreSQL", r"^postgres"),
    ("Chromium", r"chrom"),
    ("test process", r"pytest|execnet|from xdist"),
    ("kernelgate command", r"bin/kernelgate|flows\.cli"),
]


def proc_stats() -> dict[int, tuple[int, float]]:
    """``pid -> (parent pid, user + system CPU seconds)`` of every process now (``/proc``)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def snapshot(seen: dict[int, str]) -> dict[int, float]:
    """``pid -> CPU seconds`` of every process now; new command lines are added to ``seen``."""
    out = {}
    for pid, (_, cpu) in proc_stats().items():
        if pid not in seen:
            try:
                seen[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
            except OSError:
                continue
        out[pid] = cpu
    return out


def kind(command: str) -> str:
    """The kind of process ``command`` (its command line) is; ``other`` if none matches."""
    return next((name for name, pattern in KINDS if re.search(pattern, command)), "other")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write every process's CPU here")
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    args = parser.parse_args()
    seen: dict[int, str] = {}
    first = snapshot(seen)
    last = dict(first)
    child = subprocess.Popen(args.command)
    while child.poll() is None:
        time.sleep(args.interval)
        last.update(snapshot(seen))
    rows = sorted(((last[p] - first.get(p, 0.0), p, seen.get(p, "")) for p in last), reverse=True)
    by_kind, count = collections.Counter(), collections.Counter()
    for cpu, _, command in rows:
        by_kind[kind(command)] += cpu
        count[kind(command)] += cpu > 0
    print(f"{sum(by_kind.values()):.0f} CPU-s on the host while `{' '.join(args.command)}` "
          f"ran (exit status {child.returncode})")
    print("| kind | processes | CPU s |\n|---|---|---|")
    for name, cpu in by_kind.most_common():
        if count[name]:
            print(f"| {name} | {count[name]} | {cpu:.1f} |")
    if args.json:
        args.json.write_text(json.dumps([{"cpu_s": c, "pid": p, "command": cmd[:300]}
                                         for c, p, cmd in rows if c > 0], indent=1))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
