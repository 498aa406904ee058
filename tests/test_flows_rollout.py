"""The rollout flow end to end: real Prefect flow runs (``prefect_test_harness``), a
real MLflow SQLite store, the real MiniLM serving path, and candidates with injected
faults (``tests/faulty_kernels.py``).

All tests share one store and one family, seeded with a promoted control version;
each test compares the registry before and after its own rollout.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.flow_runs import resume_flow_run
from prefect.testing.utilities import prefect_test_harness

from evaluation.performance import BenchShape
from flows import serving, stages
from flows.rollout import approval_key, rollout
from flows.stages import RolloutSettings
from lineage import registry, tags
from tests import faulty_kernels
from tests.faulty_kernels import Fault

FAMILY = "attention-test"
THRESHOLDS = Path(__file__).parent / "data" / "thresholds-flow-test.yaml"
SMALL_SHAPE = [BenchShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                          head_dim=32, dtype="float32", causal=False)]


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store and a CI test set shared by the module (the test set takes a while)."""
    from evaluation.testset import build_testset

    root = tmp_path_factory.mktemp("flows")
    build_testset(root / "testset", profile="ci")
    return root


@pytest.fixture
def make_settings(store, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    faulty_kernels.register(monkeypatch)
    monkeypatch.setattr(Fault, "active", False)

    def make(implementation: str, thresholds: Path = THRESHOLDS, **overrides) -> RolloutSettings:
        return RolloutSettings(implementation=f"test_{implementation}", family=FAMILY,
                               thresholds=thresholds, testset_dir=store / "testset",
                               store_dir=store / "store", shadow_requests=8, perf_repeats=3,
                               perf_shapes=SMALL_SHAPE, model_check=False, **overrides)
    return make


@pytest.fixture
def tracking(store):
    from lineage.tracking import local_tracking

    return local_tracking(store / "store")


@pytest.fixture
def seeded(prefect_server, make_settings, tracking):
    """Production holds a promoted control version before the test's rollout."""
    if registry.alias_version(tracking, FAMILY, "production") is None:
        outcome = rollout(make_settings("good"))
        assert outcome.result == "promoted", outcome.reason
    return registry.aliases(tracking, FAMILY)


def thresholds_with(tmp_path: Path, **approval) -> Path:
    data = yaml.safe_load(THRESHOLDS.read_text())
    data["approval"].update(approval)
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def version_tags(tracking, version: str) -> dict[str, str]:
    mv = tracking.client().get_model_version(registry.registered_model_name(FAMILY), version)
    return mv.tags


def assert_production_unchanged(tracking, before: dict[str, str], rejected_version: str):
    after = registry.aliases(tracking, FAMILY)
    assert after.get("production") == before["production"]
    assert rejected_version not in {after.get("canary"), after.get("shadow")}
    assert after.get("production") != rejected_version


def test_passing_candidate_is_promoted_with_full_lineage(seeded, make_settings, tracking):
    outcome = rollout(make_settings("good"))
    assert outcome.result == "promoted"
    assert registry.alias_version(tracking, FAMILY, "production") == outcome.version
    assert outcome.version != seeded["production"]
    mv_tags = version_tags(tracking, outcome.version)
    assert mv_tags[stages.IMPLEMENTATION_TAG] == "test_good"
    for link in (tags.DECISION_RUN_ID, tags.EVALUATION_RUN_ID, tags.REGISTRATION_ID,
                 stages.CONFIRMATION_TAG):
        assert link in mv_tags
    from lineage.records import load_decision

    confirmation = load_decision(tracking, mv_tags[stages.CONFIRMATION_TAG]).decision
    assert confirmation.passed and confirmation.scope == ["accuracy"]
    from lineage.audit import audit

    report = audit(tracking, FAMILY, "production")
    assert report.exit_code == 0, report.render()
    stages_seen = [link.name for link in report.chain if link.ok]
    assert "shadow run" in stages_seen and stages_seen.count("canary run") >= 2


def test_numerically_wrong_candidate_stops_at_the_gate(seeded, make_settings, tracking):
    outcome = rollout(make_settings("wrong_scale"))
    assert (outcome.result, outcome.stage) == ("rejected", "gate")
    assert "error-ratio" in outcome.reason or "error" in outcome.reason
    assert_production_unchanged(tracking, seeded, outcome.version)
    assert "gate" in version_tags(tracking, outcome.version)[stages.REJECTION_TAG]


def test_candidate_returning_nan_during_canary_is_rolled_back(seeded, make_settings, tracking,
                                                              monkeypatch):
    real_step = serving.replay_canary_step

    def fault_starts_with_canary_traffic(*args, **kwargs):
        Fault.active = True
        return real_step(*args, **kwargs)

    monkeypatch.setattr(serving, "replay_canary_step", fault_starts_with_canary_traffic)
    outcome = rollout(make_settings("nan_under_fault"))
    assert outcome.result == "rolled_back"
    assert outcome.stage.startswith("canary"), outcome
    assert "NaN" in outcome.reason or "non-finite" in outcome.reason
    assert_production_unchanged(tracking, seeded, outcome.version)
    assert "canary" in version_tags(tracking, outcome.version)[tags.ROLLBACK_REASON]


def test_slow_candidate_is_rejected_by_the_canary_latency_test(seeded, make_settings, tracking,
                                                               monkeypatch):
    monkeypatch.setattr(Fault, "delay_s", 0.01)  # per attention call; six per request
    outcome = rollout(make_settings("slow"))
    assert outcome.result == "rolled_back"
    assert outcome.stage in ("shadow", "canary-25pct", "canary-50pct")
    assert "latency" in outcome.reason and "Mann-Whitney" in outcome.reason
    assert_production_unchanged(tracking, seeded, outcome.version)


def _answer_when_paused(transition: str, run_input: dict, timeout_s: float = 240) -> None:
    """Resume the paused rollout through the Prefect API once its form schema exists."""
    schema_key = f"paused-{approval_key(transition)}-schema"
    paused = FlowRunFilter(state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(flow_run_filter=paused):
                try:
                    client.read_flow_run_input(flow_run_id=run.id, key=schema_key)
                except Exception:
                    continue  # paused, but the form is not saved yet
                resume_flow_run(run.id, run_input=run_input)
                return
            time.sleep(0.5)
    raise AssertionError("the rollout never paused for approval")


def _rollout_answered(settings, transition: str, run_input: dict):
    answer = threading.Thread(target=_answer_when_paused, args=(transition, run_input), daemon=True)
    answer.start()
    outcome = rollout(settings)
    answer.join(timeout=5)
    return outcome


def test_approved_rollout_continues_to_production(seeded, make_settings, tracking, tmp_path):
    settings = make_settings("good", thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=240))
    outcome = _rollout_answered(settings, "shadow->canary",
                                {"approve": True, "approver": "rm@example.com", "comment": "ok"})
    assert outcome.result == "promoted"
    assert registry.alias_version(tracking, FAMILY, "production") == outcome.version
    from lineage.records import load_approval

    runs = tracking.client().search_runs(
        [tracking.client().get_experiment_by_name(f"kernelgate-{FAMILY}").experiment_id],
        filter_string=f"tags.`{tags.STAGE}` = 'approval' and tags.`kernelgate.model_version` = '{outcome.version}'")
    assert len(runs) == 1
    record, _ = load_approval(tracking, runs[0].info.run_id)
    assert (record.approved, record.approver) == (True, "rm@example.com")


def test_rejected_approval_rolls_back(seeded, make_settings, tracking, tmp_path):
    settings = make_settings("good", thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=240))
    before = registry.aliases(tracking, FAMILY)
    outcome = _rollout_answered(settings, "shadow->canary",
                                {"approve": False, "approver": "rm@example.com",
                                 "comment": "not this week"})
    assert (outcome.result, outcome.stage) == ("rolled_back", "approval")
    assert_production_unchanged(tracking, before, outcome.version)


def test_approval_timeout_rolls_back(seeded, make_settings, tracking, tmp_path):
    settings = make_settings("good", thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=3))
    before = registry.aliases(tracking, FAMILY)
    outcome = rollout(settings)
    assert (outcome.result, outcome.stage) == ("rolled_back", "approval")
    assert_production_unchanged(tracking, before, outcome.version)


def test_rollout_killed_mid_canary_leaves_registry_consistent(seeded, make_settings, tracking):
    settings = make_settings("good")
    before = registry.aliases(tracking, FAMILY)
    # Run the stages by hand and stop after entering canary: the process "dies" there.
    ctx = stages.open_rollout(settings)
    registration = stages.preregister_thresholds(ctx, settings.thresholds)
    build_run_id, version = stages.build_candidate(ctx, None)
    report, evaluation_run_id = stages.evaluate_build(
        ctx, settings, registration=registration, build_run_id=build_run_id,
        testset_dir=settings.testset_dir)
    _, decision_run_id, _ = stages.gate(ctx, report, thresholds_path=settings.thresholds,
                                        registration=registration, build_run_id=build_run_id,
                                        evaluation_run_id=evaluation_run_id)
    stages.enter_canary(ctx, version, decision_run_id=decision_run_id, approval_run_id=None)
    killed = registry.aliases(tracking, FAMILY)
    assert killed["canary"] == version
    assert killed["production"] == before["production"]

    # While its owner may still be running (within the lease), a new run leaves it alone.
    live_ctx = stages.open_rollout(settings, clear_stale_aliases=True)
    assert registry.alias_version(tracking, FAMILY, "canary") == version
    stages.close_rollout(live_ctx, result="rejected", stage="open", reason="test", version=None)

    # Once the lease is over, the next run clears the stale canary and says why.
    expired = settings.model_copy(update={"stale_alias_after_s": 0})
    next_ctx = stages.open_rollout(expired, clear_stale_aliases=True)
    after = registry.aliases(tracking, FAMILY)
    assert "canary" not in after and after["production"] == before["production"]
    assert "did not finish" in version_tags(tracking, version)[tags.STALE_REASON]
    stages.close_rollout(next_ctx, result="rejected", stage="open", reason="test", version=None)


def test_nightly_revalidation_rolls_back_a_production_version_that_broke(
        seeded, make_settings, tracking, monkeypatch):
    """A kernel that passed its rollout starts returning NaN (say, after a library
    upgrade): the nightly run fails it and restores the previous production."""
    from flows.revalidate import revalidate_production

    promoted = rollout(make_settings("nan_under_fault"))
    assert promoted.result == "promoted", promoted.reason
    history = registry.production_history(tracking, FAMILY)
    assert history[-1] == promoted.version

    healthy = revalidate_production(FAMILY, make_settings("nan_under_fault"))
    assert healthy.result == "passed"
    assert registry.alias_version(tracking, FAMILY, "production") == promoted.version

    monkeypatch.setattr(Fault, "active", True)
    broken = revalidate_production(FAMILY, make_settings("nan_under_fault"))
    assert broken.result == "rolled_back", broken.reason
    assert registry.alias_version(tracking, FAMILY, "production") == history[-2]
    assert f"v{history[-2]}" in broken.now_serving and "nan" in broken.reason.lower()
    assert "re-validation" in version_tags(tracking, promoted.version)[tags.ROLLBACK_REASON]
