"""The evaluate stage runs the candidate under the interpreters and MiniLM document count
of the registration it is judged by (``flows.judge.evaluate``, from the registered bytes
the preregister stage reads back), not those of whatever thresholds file is in hand: a
nightly re-validation holds the default file (``thresholds/local-dry-run.yaml``) while
the version it re-judges was registered under another profile."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from flows import judge
from flows.paths import PROJECT_DIR
from flows.results import Built, Prepared, Preregistered
from gates.thresholds import load_thresholds
from kernels.interpreters import GENERIC_INTERPRET, TPU_INTERPRET
from lineage.records.registration import frozen_registration, preregister
from lineage.rollout import evidence
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr

THRESHOLDS = PROJECT_DIR / "thresholds"


def _evaluated_plan(tmp_path, monkeypatch, signing, *, registered: str, in_hand: str):
    tracking = tr.local_tracking(tmp_path / "store")
    registration = preregister(THRESHOLDS / registered, tracking=tracking, family="fam",
                               signing=signing)
    seen = {}

    def fake_evaluate_candidate(candidate, **kwargs):
        seen["plan"], seen["documents"] = kwargs["interpreters"], kwargs["model_documents"]
        raise LookupError("stop here: the plan is what this test looks at")

    monkeypatch.setattr(judge, "evaluate_candidate", fake_evaluate_candidate)
    monkeypatch.setattr(evidence, "evaluation_run",
                        lambda *a, **k: contextlib.nullcontext("run-1"))
    for name in ("log_evaluation_inputs", "log_evaluation_files", "log_evaluation_result"):
        monkeypatch.setattr(evidence, name, lambda *a, **k: None)
    context = SimpleNamespace(
        record=SimpleNamespace(tracking=tracking, family="fam", signing=signing,
                               work_dir=tmp_path / "work"),
        settings=SimpleNamespace(thresholds=THRESHOLDS / in_hand, model_check=False,
                                 perf_repeats=1, perf_shapes=None, store_dir=tmp_path),
        versions=SimpleNamespace(runner=lambda version: SimpleNamespace(name=f"k@v{version}")),
        serving=SimpleNamespace(contract=None), model=None)
    with pytest.raises(LookupError, match="stop here"):
        # read back from the signed record, as the preregister stage returns it
        frozen = frozen_registration(StoreSource(tracking, "fam", signing.trust),
                                     registration.registration_id)
        judge.evaluate.fn(context, Preregistered.read_back(frozen),
                          Built(build_run_id="b", version="1"), Prepared(testset_dir=tmp_path),
                          split="heldout", compare_production=False)
    return seen["plan"], seen["documents"]


def test_revalidation_with_the_default_file_keeps_the_registered_generic_serving_paths(
        tmp_path, monkeypatch, signing):
    plan, documents = _evaluated_plan(tmp_path, monkeypatch, signing,
                                      registered="local-interpreted.yaml",
                                      in_hand="local-dry-run.yaml")
    assert plan.accuracy == TPU_INTERPRET
    assert plan.model_check == GENERIC_INTERPRET
    assert documents == 4  # the registered model_check_documents (the file in hand's: 16)


def test_a_file_in_hand_that_loosens_does_not_loosen_the_registered_interpreters(
        tmp_path, monkeypatch, signing):
    """Registered strict (TPU interpret mode on the serving paths), file in hand
    local-interpreted: the model check must still run in TPU interpret mode."""
    plan, documents = _evaluated_plan(tmp_path, monkeypatch, signing,
                                      registered="local-dry-run.yaml",
                                      in_hand="local-interpreted.yaml")
    assert plan.model_check == TPU_INTERPRET
    assert documents == load_thresholds(THRESHOLDS / "local-dry-run.yaml").model_check_documents
    assert documents != 4  # the file in hand's
