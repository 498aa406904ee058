"""CPU that headless Chromium spends on an open page, against ``about:blank``.

Why: during CI the browser lane left Prefect's flow-run page open while a rollout ran on
for minutes, and Chromium's process tree then took about a core of the 2-core host from
the lanes beside it. This opens ``URL`` in Debian's Chromium through Playwright, waits
``--settle-s``, sums the CPU time of Chromium's processes (``ps`` cumulative times, whole
seconds) over ``--seconds``, then does the same on ``about:blank``; prints a table and
writes JSON (``--json``).

    python tools/page_cpu.py http://127.0.0.1:4200/runs/flow-run/ID --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path


def tree_cpu_s(root: int) -> int:
    """CPU seconds (user + system, whole seconds as ``ps`` gives them) of every
    descendant of process ``root``."""
    rows = subprocess.run(["ps", "-eo", "pid=,ppid=,times="], capture_output=True,
                          text=True, check=True).stdout.split("\n")
    children: dict[int, list[tuple[int, int]]] = {}
    for row in filter(None, (r.split() for r in rows)):
        pid, ppid, seconds = (int(x) for x in row)
        children.setdefault(ppid, []).append((pid, seconds))
    total, stack = 0, [root]
    while stack:
        for pid, seconds in children.get(stack.pop(), []):
            total += seconds
            stack.append(pid)
    return total


def measure(url: str, seconds: float, settle_s: float, chromium: str,
            extra_args: list[str]) -> list[dict]:
    """``[{page, cpu_s, seconds}]`` for ``url`` and then ``about:blank``."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", *extra_args])
        page = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
        for target in (url, "about:blank"):
            page.goto(target)
            time.sleep(settle_s)
            before = tree_cpu_s(os.getpid())
            time.sleep(seconds)
            out.append({"page": target, "cpu_s": tree_cpu_s(os.getpid()) - before,
                        "seconds": seconds, "chromium_args": extra_args})
        browser.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the page to hold open")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured span per page")
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="wait after loading, before measuring")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="browser executable")
    parser.add_argument("--arg", action="append", default=[],
                        help="an extra Chromium flag (repeat), e.g. --arg=--disable-gpu")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = measure(args.url, args.seconds, args.settle_s, args.chromium, args.arg)
    print(f"{'page':<60} {'CPU s':>6} {'over s':>7}")
    for row in rows:
        print(f"{row['page'][:60]:<60} {row['cpu_s']:>6} {row['seconds']:>7g}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
