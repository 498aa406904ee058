"""The suite's own plumbing, for its time: inputs built once per run, and the order in which
``make test`` hands out its modules."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import scheduling
from tests.shared_builds import COMPLETE, built_once, copy_of


class _Factory:
    def __init__(self, base: Path):
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def test_a_shared_folder_is_built_once_and_a_copy_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")  # under xdist: the run's folder is shared
    worker = tmp_path / "popen-gw1"
    worker.mkdir()
    calls = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "data.txt").write_text("built")

    first = built_once(_Factory(worker), "thing", build)
    again = built_once(_Factory(tmp_path / "popen-gw0"), "thing", build)
    assert first == again == tmp_path / "shared-thing" and calls == [first]
    copy = copy_of(first, tmp_path / "mine")
    (copy / "data.txt").write_text("edited")
    assert (first / "data.txt").read_text() == "built" and not (copy / COMPLETE).exists()


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds_again(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        built_once(_Factory(tmp_path), "thing", broken)
    assert not (tmp_path / "shared-thing").exists()
    built = built_once(_Factory(tmp_path), "thing", lambda f: (f / "ok.txt").write_text(""))
    assert sorted(p.name for p in built.iterdir()) == [COMPLETE, "ok.txt"]


def _item(nodeid: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, path=Path(nodeid.split("::")[0]))


def test_the_slowest_modules_go_first_and_the_second_part_after_the_flows():
    ids = ["tests/test_a.py::t1", "tests/test_attacks.py::test_x",
           "tests/test_attacks.py::test_attack_is_refused_or_detected[kind9-a]",
           "tests/test_attacks.py::test_attack_is_refused_or_detected[kind1-b]",
           "tests/test_b.py::t2", "tests/test_flows_rollout.py::t3",
           "tests/test_attacks.py::test_attack_is_refused_or_detected[kind17-c]"]
    items = [_item(i) for i in ids]
    scheduling.order(items)
    assert [i.nodeid for i in items] == [
        "tests/test_attacks.py::test_x",
        "tests/test_attacks.py::test_attack_is_refused_or_detected[kind1-b]",
        "tests/test_flows_rollout.py::t3",
        "tests/test_attacks.py::test_attack_is_refused_or_detected[kind9-a]",
        "tests/test_attacks.py::test_attack_is_refused_or_detected[kind17-c]",
        "tests/test_a.py::t1", "tests/test_b.py::t2"]


def test_both_parts_of_the_attacks_replay_some_kinds_and_together_all():
    from tests.test_attacks import KINDS

    second = {k for k in KINDS
              if scheduling.second_part(f"tests/test_attacks.py::t[kind{k}-x]")}
    assert set() < second < set(KINDS)
    assert not scheduling.second_part("tests/test_attacks.py::test_x")
    assert not scheduling.second_part("tests/test_other.py::t[kind9-x]")
