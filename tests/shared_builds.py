"""Expensive, deterministic test inputs built once per test run and shared by the
xdist workers (for the suite's time).

``make test`` runs two worker processes; a module-scoped fixture is built once per
module, so an input several modules need (the CI test set: MiniLM forwards and 93
synthetic cases) was built once per module that asked. Here the first worker to ask
builds it, under a file lock, into the run's shared temporary folder; the others wait
for it and reuse it. Callers that write into what they get take a copy
(:func:`copy_of`): the shared folder is never written after it is complete.

The shared folder is the run's own (pytest's numbered ``pytest-N`` folder, the parent
of each worker's ``popen-gwK``), so nothing is reused across runs and a change of code
is never served a stale build.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

COMPLETE = ".complete"
HARNESS_STARTUP_S = 600
"""How long a test module waits for ``prefect_test_harness``'s ephemeral server. It
starts in seconds on a quiet machine; on the shared 2-core host (load average 8-14) a
harness timed out at 120 s (2026-12-01), and every test of its module then errors at
set-up. ``make test`` now starts its two slowest modules, both with a harness, together."""


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's folder shared by all its workers: the parent of a worker's base
    temporary folder under xdist, the base temporary folder itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], object]) -> Path:
    """The folder ``name`` of this run, built by ``build(folder)`` the first time any
    worker asks (the others block on a lock until it is complete).

    ``build`` writes into the folder where it will stay (never built elsewhere and
    moved: an MLflow store records its own absolute paths); the folder counts only once
    ``build`` has returned (a marker file). When it raises, the folder is removed and the
    next caller builds again (and most likely fails the same way, in its own test).
    Treat the result as read-only.
    """
    root = run_folder(tmp_path_factory)
    target = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not (target / COMPLETE).is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            try:
                build(target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            (target / COMPLETE).write_text("")
    return target


def copy_of(shared: Path, dst: Path) -> Path:
    """A private, writable copy of a :func:`built_once` folder (without its marker)."""
    shutil.copytree(shared, dst, ignore=shutil.ignore_patterns(COMPLETE))
    return dst


def ci_testset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CI-profile test set (``build_testset(profile="ci")``, default documents and
    seeds), built once per run. Read-only: a test that adds draws or edits splits copies
    it with :func:`copy_of`."""
    def build(folder: Path) -> None:
        from evaluation.testset import build_testset

        build_testset(folder, profile="ci")

    return built_once(tmp_path_factory, "ci-testset", build)


def flow_testset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``minimal``-profile test set (``build_testset(profile="minimal")``: 17 cases a
    split, the CI recipes at the validation's minimum), built once per run, for the tests
    whose rollouts judge the pipeline rather than a kernel (a test rollout's
    held-out evaluation and confirmation draw scale with the set). Read-only, like
    :func:`ci_testset`; a rollout's settings must name ``testset_profile="minimal"``
    (the registration binds the profile with the set's digest)."""
    def build(folder: Path) -> None:
        from evaluation.testset import build_testset

        build_testset(folder, profile="minimal")

    return built_once(tmp_path_factory, "flow-testset", build)
