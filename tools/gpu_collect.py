"""The `gpu` tests each part of tools/gpu-test-parts.txt selects, collected in one process.

Why: `bash tools/gpu-tests.sh --collect` ran one pytest per part, and every one of them
imported JAX, the kernels and the test modules again: eleven parts and the suite's own
whole collection cost the CPU suite about 50 CPU-s for a check that needs no GPU. Here
pytest collects once per part inside one interpreter, so the imports are paid once.

    python tools/gpu_collect.py PARTS_FILE          one "PART<TAB>node id" line per test
    python tools/gpu_collect.py PARTS_FILE --all    also "*<TAB>node id" for every `gpu`
                                                    test under tests/, parts or not
                                                    (``gpu_test_files``: the modules that
                                                    can hold one)

Run from the repository root. A part's arguments are split as a shell would (quotes kept
together, nothing expanded). Exits 2 naming the part whose collection failed.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path


class _Collected:
    """A pytest plugin keeping the node ids left after ``-m``/``-k`` deselection."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_collection_finish(self, session) -> None:
        self.ids = [item.nodeid for item in session.items]


def gpu_test_files(tests: Path = Path("tests")) -> list[str]:
    """The test modules under ``tests`` that can hold a `gpu` test: those that apply
    ``pytest.mark.gpu`` (directly, through ``marks=`` or a name bound to it in the module),
    or every module when the marker is reached another way (``getattr(pytest.mark, ...)``
    anywhere, or the marker defined in a helper module and imported under another name).
    Collecting all 130 modules imports the whole project: about 17 CPU-s."""
    every = sorted(tests.glob("test_*.py"))
    helpers = [p for p in tests.glob("*.py") if not p.name.startswith("test_")]
    text = {p: p.read_text(encoding="utf-8") for p in [*every, *helpers]}
    indirect = any("getattr(pytest.mark" in t for t in text.values()) or any(
        "mark.gpu" in text[p] for p in helpers)
    applied = re.compile(r"mark\.gpu\b")
    return [str(p) for p in every if indirect or applied.search(text[p])]


def parts(path: str) -> list[tuple[str, list[str]]]:
    """``(name, pytest arguments)`` of each part line (``NAME<TAB>SECONDS<TAB>ARGS``)."""
    found = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip() and not line.startswith("#"):
                name, _, args = line.rstrip("\n").split("\t", 2)
                found.append((name, shlex.split(args)))
    return found


def collect(args: list[str]) -> list[str]:
    """The `gpu` test ids ``pytest --collect-only -m gpu ARGS`` selects (its output
    swallowed). Raises RuntimeError with pytest's output when the collection fails."""
    import pytest

    plugin, out = _Collected(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = pytest.main(["-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider",
                            *args], plugins=[plugin])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise RuntimeError(f"pytest exited {int(code)}:\n{out.getvalue()[-2000:]}")
    return plugin.ids


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or argv[1:] not in ([], ["--all"]):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        todo = parts(argv[0]) + ([("*", gpu_test_files())] if argv[1:] == ["--all"] else [])
    except (OSError, ValueError) as err:  # no such file; a line without NAME<tab>SECONDS<tab>ARGS
        print(f"{argv[0]}: cannot read the parts ({err})", file=sys.stderr)
        return 2
    for name, args in todo:
        try:
            ids = collect(args)
        except RuntimeError as err:
            print(f"part {name!r}: collection failed: {err}", file=sys.stderr)
            return 2
        for node in ids:
            print(f"{name}\t{node}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
