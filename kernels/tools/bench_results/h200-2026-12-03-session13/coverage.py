"""Which `gpu` tests have run on the H200 for code sha256 0fc05d329737, and how they ended.

Reads the parts' test ids (`collect.txt`, the output of `bash tools/gpu-tests.sh --collect`
at this session's commit) and the pytest logs of session 11 (2026-12-02) and of this
session, and prints one line per outcome and every test id that no log shows.

Session 11's first call ran the variants' module with `pytest -q` (dots, no ids) and was cut
after 27 dots; pytest runs a module's tests in collection order, so those are the module's
first 27 collected `gpu` tests, and its 28th is the one call 2 ran by id.

Run from the repository root:
    python kernels/tools/bench_results/h200-2026-12-03-session13/coverage.py
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
SESSION11 = HERE.parent / "h200-2026-12-02-session11"
VERBOSE_LOGS = [
    SESSION11 / "gpu-tests-2-variant-rest-and-poisoned" / "gpu-tests.log",
    SESSION11 / "gpu-tests-3-other-modules" / "gpu-tests.log",
    *sorted(HERE.glob("*.log")),
]
QUIET_LOG = SESSION11 / "gpu-tests-1-variants" / "gpu-tests.log"
VARIANTS = "tests/test_kernels_mosaic_variants.py::"
# pytest's outcomes, worst first: a test two logs show keeps the worse of the two.
WORST_FIRST = ["FAILED", "ERROR", "XPASS", "XFAIL", "SKIPPED", "PASSED"]
# "node id OUTCOME [ nn%]" as pytest -v prints it; ids may hold spaces.
RESULT = re.compile(rf"^(tests/\S.*?) ({'|'.join(WORST_FIRST)})\b")


def main() -> None:
    """Print the outcome counts and every id that did not pass.

    A test that more than one log shows keeps its worst outcome (a failure in one session is
    not hidden by a pass in the other).

    Raises:
        SystemExit: when a test failed, or when some test has no outcome.
    """
    collected = [line.split("\t", 1)[1].strip() for line in (HERE / "collect.txt").read_text().splitlines() if "\t" in line]
    outcome: dict[str, str] = {}
    for log in VERBOSE_LOGS:
        for line in log.read_text().splitlines():
            match = RESULT.match(line)
            if match:
                test_id, ended = match.groups()
                outcome[test_id] = min(outcome.get(test_id, ended), ended, key=WORST_FIRST.index)
    dots = QUIET_LOG.read_text().splitlines()[0]
    passed_quietly = len(dots) - len(dots.lstrip("."))
    for test_id in [t for t in collected if t.startswith(VARIANTS)][:passed_quietly]:
        outcome.setdefault(test_id, "PASSED")
    ended = {test_id: outcome.get(test_id, "no outcome") for test_id in collected}
    counts = Counter(ended.values())
    print(f"{len(collected)} gpu tests in the parts ({len(set(collected))} distinct)")
    for name, n in sorted(counts.items()):
        print(f"  {name:10s} {n}")
    for test_id, how in ended.items():
        if how != "PASSED":
            print(f"  {how:10s} {test_id}")
    if set(counts) - {"PASSED", "SKIPPED"}:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
