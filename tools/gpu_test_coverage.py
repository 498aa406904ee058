"""Which `gpu` tests have run on a GPU host, over one or more calls, and how they ended.

Reads the parts' test ids (``--collect``: the output of ``bash tools/gpu-tests.sh
--collect``, one ``PART<TAB>ID`` line per test) and the pytest logs of the calls (``pytest
-v``: a ``ID OUTCOME`` line per test run), and prints the number of tests, one line per
outcome and every test id that did not pass ("no outcome": no log shows it). A test that
more than one log shows keeps its worst outcome: a failure in one call is not hidden by a
pass in another.

A ``pytest -q`` log prints dots, not ids. ``--quiet MODULE=LOG`` counts the leading dots
of LOG's first line as passes of MODULE's first collected tests: pytest runs a module's
tests in collection order, so a call cut after N dots passed the module's first N. A test
a verbose log shows keeps the outcome that log gives it.

Run from the repository root; the command that made a committed ``coverage.txt`` is in the
README beside it. Exit 1 when a test failed, errored or has no outcome.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

WORST_FIRST = ["FAILED", "ERROR", "XPASS", "XFAIL", "SKIPPED", "PASSED"]
"""pytest's outcomes, worst first: a test two logs show keeps the worse of the two."""
RESULT = re.compile(rf"^(tests/\S.*?) ({'|'.join(WORST_FIRST)})\b")
"""``node id OUTCOME [ nn%]`` as ``pytest -v`` prints it; ids may hold spaces."""


def collected_ids(collect: Path) -> list[str]:
    """The test ids of ``tools/gpu-tests.sh --collect``'s output, in its order."""
    return [line.split("\t", 1)[1].strip() for line in collect.read_text().splitlines()
            if "\t" in line]


def outcomes(collected: list[str], logs: list[Path],
             quiet: list[tuple[str, Path]]) -> dict[str, str]:
    """Each collected id's worst outcome over ``logs``, then the quiet logs' passes for
    ids no verbose log shows; "no outcome" where none does."""
    outcome: dict[str, str] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            match = RESULT.match(line)
            if match:
                test_id, ended = match.groups()
                outcome[test_id] = min(outcome.get(test_id, ended), ended, key=WORST_FIRST.index)
    for module, log in quiet:
        dots = log.read_text().splitlines()[0]
        passed_quietly = len(dots) - len(dots.lstrip("."))
        for test_id in [t for t in collected if t.startswith(f"{module}::")][:passed_quietly]:
            outcome.setdefault(test_id, "PASSED")
    return {test_id: outcome.get(test_id, "no outcome") for test_id in collected}


def report(collected: list[str], ended: dict[str, str]) -> tuple[str, bool]:
    """The printed report, and whether every test passed or was skipped."""
    counts = Counter(ended.values())
    lines = [f"{len(collected)} gpu tests in the parts ({len(set(collected))} distinct)"]
    lines += [f"  {name:10s} {n}" for name, n in sorted(counts.items())]
    lines += [f"  {how:10s} {test_id}" for test_id, how in ended.items() if how != "PASSED"]
    return "\n".join(lines) + "\n", not set(counts) - {"PASSED", "SKIPPED"}


def _quiet(spec: str) -> tuple[str, Path]:
    module, sep, log = spec.partition("=")
    if not sep or not module or not log:
        raise argparse.ArgumentTypeError(f"--quiet takes MODULE=LOG, got {spec!r}")
    return module, Path(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", type=Path, help="pytest -v logs")
    parser.add_argument("--collect", type=Path, required=True,
                        help="the output of bash tools/gpu-tests.sh --collect")
    parser.add_argument("--quiet", type=_quiet, action="append", default=[],
                        metavar="MODULE=LOG", help="a pytest -q log of MODULE's tests")
    args = parser.parse_args(argv)
    collected = collected_ids(args.collect)
    text, ok = report(collected, outcomes(collected, args.logs, args.quiet))
    print(text, end="")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
