"""The second process that runs half of an interpreted candidate's cases on a CPU host
(evaluation.case_processes): the same rows as one process, the split divided by shape."""

from __future__ import annotations

import pytest

from evaluation import case_processes
from evaluation.accuracy import evaluate_accuracy
from evaluation.runners import LocalRunner
from evaluation.testset.recipes import Recipe, synthetic_case
from kernels.registry import IMPLEMENTATIONS

RECIPES = (
    Recipe("a", "hard", ("gqa",), 129, 129, num_heads=4, num_kv_heads=2, causal=True),
    Recipe("b", "hard", (), 64, 200, dtype="bfloat16"),
    Recipe("c", "adversarial", ("padding",), 64, 128, batch=3, lengths="with_zero"),
    Recipe("d", "ordinary", (), 8, 8, num_heads=2, num_kv_heads=2, head_dim=32),
)


def _cases(seed: int):
    return [synthetic_case(r, "heldout", seed + i) for i, r in enumerate(RECIPES)]


def _rows(result):
    return {role: [c.model_dump(exclude={"seconds"}) for c in acc.cases]
            for role, acc in result.items()}


def test_divide_is_by_shape_and_balanced():
    cases = _cases(0)
    theirs = case_processes.divide(cases)
    assert theirs and len(theirs) < len(cases)
    assert case_processes.divide(_cases(100)) == theirs  # other values, same shapes
    costs = [case_processes.case_cost(c) for c in cases]
    mine = sum(c for i, c in enumerate(costs) if i not in theirs)
    helper = case_processes.STARTUP_S + sum(costs[i] for i in theirs)
    assert abs(mine - helper) <= max(costs)


def test_only_builtin_local_runners_ship(monkeypatch):
    naive = LocalRunner.for_implementation("naive")
    assert case_processes.shippable(naive) == ("naive", None)
    assert case_processes.shippable(LocalRunner("plain", lambda *a, **k: None)) is None
    # a kernel replaced in this process would not be the one the helper builds
    monkeypatch.setitem(IMPLEMENTATIONS, "naive", IMPLEMENTATIONS["xla"].__class__())
    assert case_processes.shippable(naive) is None


def test_no_helper_for_native_runners_or_when_turned_off(monkeypatch):
    naive = LocalRunner.for_implementation("naive")
    assert case_processes.helper_for({"baseline": naive}, "cpu") is None  # all native
    tpu = LocalRunner.for_implementation("pallas_tpu")
    monkeypatch.setenv(case_processes.PROCESSES_ENV, "1")
    assert case_processes.helper_for({"candidate": tpu, "baseline": naive}, "cpu") is None
    monkeypatch.setenv(case_processes.PROCESSES_ENV, "2")
    assert case_processes.helper_for({"candidate": tpu, "baseline": naive}, "gpu") is None


def test_two_processes_score_what_one_does(monkeypatch):
    monkeypatch.setenv(case_processes.PROCESSES_ENV, "2")
    runners = {"candidate": LocalRunner.for_implementation("pallas_tpu"),
               "baseline": LocalRunner.for_implementation("naive")}
    helper = case_processes.helper_for(runners, "cpu")
    assert helper is not None and set(helper.roles) == {"candidate", "baseline"}
    cases = _cases(0)
    alone = evaluate_accuracy(cases, runners)
    submitted = []
    real_submit = helper.submit

    def spying(cases):
        submitted.append(waiting := real_submit(cases))
        return waiting

    monkeypatch.setattr(helper, "submit", spying)
    both = evaluate_accuracy(cases, runners, helper=helper)
    assert sorted(submitted[0]) == sorted(case_processes.divide(cases))
    assert all(wait() is not None for wait in submitted[0].values())  # ran there
    assert _rows(both) == _rows(alone)
    # the helper stays for the next split, and a dead one is replaced
    assert case_processes.helper_for(runners, "cpu") is helper
    helper.close()
    assert case_processes.helper_for(runners, "cpu") is not helper


def test_a_failed_helper_leaves_its_cases_to_this_process(monkeypatch):
    runners = {"candidate": LocalRunner.for_implementation("pallas_tpu"),
               "baseline": LocalRunner.for_implementation("naive")}
    cases = _cases(0)

    class Broken:
        def submit(self, cases):
            return {i: (lambda: None) for i in case_processes.divide(cases)}

    assert _rows(evaluate_accuracy(cases, runners, helper=Broken())) == \
        _rows(evaluate_accuracy(cases, runners))


@pytest.fixture(autouse=True)
def _close_helpers():
    yield
    case_processes._close_all()
