"""The rollout flow end to end: real Prefect flow runs (``prefect_test_harness``), a
real MLflow SQLite store, the real MiniLM serving path, and candidates with injected
faults (``tests/faulty_kernels.py``).

All tests share one store and one family, seeded with a promoted control version;
each test compares the registry before and after its own rollout.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.flow_runs import resume_flow_run
from prefect.testing.utilities import prefect_test_harness

import kernels
from evaluation import serving
from evaluation.testset import load_split
from flows import judge, promotion, tasks, traffic, traffic_plan
from flows.end_states import RolloutNotPromoted, outcome_of
from flows.errored import RolloutErrored
from flows.rollout import rollout, run_rollout
from flows.settings import RolloutSettings
from kernels.kernel import Capability, Kernel
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model, registry
from lineage.rollout.rollout import close_rollout
from lineage.store import tags
from tests import faulty_kernels
from tests.faulty_kernels import Fault
from tests.flow_thresholds import FLOW_TEST, untimed
from tests.shared_builds import HARNESS_STARTUP_S, copy_of, flow_testset

FAMILY = "attention-test"
APPROVAL_FAMILY = "attention-approval"
"""The approval tests register stricter thresholds; in a family of their own, so the
family's registration chain (no loosening after a rejection) does not bind the others."""
STRICT_THRESHOLDS = FLOW_TEST
"""The flow-test registration with its latency plan as written (noise sd 0.5): only the
canary-latency test, in a family of its own (``LATENCY_FAMILY``), times the host with it."""
LATENCY_FAMILY = "attention-latency"
TESTSET_PROFILE = "minimal"
"""The profile of ``store``'s test set, which each rollout's registration binds."""
SMALL_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                          head_dim=32, dtype="float32", causal=False)]


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store and a test set shared by the module (a copy of the run's one ``minimal``
    test set, ``tests.shared_builds.flow_testset``: the rollouts add confirmation draws to
    it). These rollouts judge the pipeline's decisions, not a kernel: every category and
    dtype is there, at the fewest cases the validation accepts."""
    root = tmp_path_factory.mktemp("flows")
    copy_of(flow_testset(tmp_path_factory), root / "testset")
    return root


@pytest.fixture(scope="module")
def flow_thresholds(tmp_path_factory) -> Path:
    """The thresholds ``FAMILY`` registers: the flow-test file, untimed (:func:`untimed`)."""
    return untimed(STRICT_THRESHOLDS, tmp_path_factory.mktemp("thresholds") / "flow.yaml")


@pytest.fixture
def make_settings(store, tmp_path, monkeypatch, flow_thresholds):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    faulty_kernels.register(monkeypatch)
    monkeypatch.setattr(Fault, "active", False)

    def make(implementation: str, thresholds: Path | None = None, family: str = FAMILY,
             **overrides) -> RolloutSettings:
        return RolloutSettings(**{
            "implementation": f"test_{implementation}", "family": family,
            "thresholds": thresholds or flow_thresholds, "testset_dir": store / "testset",
            "store_dir": store / "store", "shadow_requests": 8, "perf_repeats": 3,
            "perf_shapes": SMALL_SHAPE, "model_check": False,
            "testset_profile": TESTSET_PROFILE, **overrides})
    return make


@pytest.fixture
def tracking(store):
    from lineage.store.tracking import local_tracking

    return local_tracking(store / "store")


@pytest.fixture
def source(tracking, signing):
    """The family's signed record, read with the pipeline's keys."""
    from lineage.signing.sources import StoreSource

    return StoreSource(tracking, FAMILY, signing.trust)


@pytest.fixture
def seeded(prefect_server, make_settings, tracking):
    """Production holds a promoted control version before the test's rollout."""
    if registered_model.alias_version(tracking, FAMILY, "production") is None:
        outcome = rollout(make_settings("good"))
        assert outcome.result == "promoted", outcome.reason
    return registered_model.aliases(tracking, FAMILY)


@pytest.fixture(scope="module")
def rejected_at_gate(prefect_server, store, flow_thresholds):
    """One numerically wrong candidate's rollout, rejected at the gate, shared by the two
    tests that need one (the suite's time: a rollout of its own in each took 20-47 s): its
    final state, and the family's aliases just before it ran.

    Module-scoped, so it cannot use the function-scoped ``make_settings``/``seeded``; it
    seeds production itself when no test has yet (the same check as ``seeded``)."""
    from lineage.store.tracking import local_tracking

    tracking = local_tracking(store / "store")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        faulty_kernels.register(mp)
        mp.setattr(Fault, "active", False)

        def settings(implementation: str) -> RolloutSettings:
            return RolloutSettings(implementation=f"test_{implementation}", family=FAMILY,
                                   thresholds=flow_thresholds, testset_dir=store / "testset",
                                   store_dir=store / "store", shadow_requests=8,
                                   perf_repeats=3, perf_shapes=SMALL_SHAPE, model_check=False,
                                   testset_profile=TESTSET_PROFILE)

        if registered_model.alias_version(tracking, FAMILY, "production") is None:
            outcome = rollout(settings("good"))
            assert outcome.result == "promoted", outcome.reason
        before = registered_model.aliases(tracking, FAMILY)
        state = rollout(settings("wrong_scale"), return_state=True)
        tags_of_run, recorded = flow_run_tags(state), recorded_state(state)
    return SimpleNamespace(state=state, before=before, flow_run_tags=tags_of_run,
                           recorded=recorded)


def thresholds_with(tmp_path: Path, **approval) -> Path:
    """The flow-test thresholds with ``approval``'s settings, untimed (:func:`untimed`),
    for the approval family."""
    return untimed(STRICT_THRESHOLDS, tmp_path / "thresholds.yaml", **approval)


def version_tags(tracking, version: str) -> dict[str, str]:
    mv = tracking.client().get_model_version(registered_model.registered_model_name(FAMILY), version)
    return mv.tags


def assert_production_unchanged(tracking, before: dict[str, str], rejected_version: str,
                                family: str = FAMILY):
    after = registered_model.aliases(tracking, family)
    assert after.get("production") == before.get("production")
    assert rejected_version not in {after.get("canary"), after.get("shadow")}
    assert after.get("production") != rejected_version


def flow_run_tags(state) -> list[str]:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id).tags


def recorded_state(state) -> tuple[str, StateType]:
    """The flow run's final state as the server recorded it (what the Prefect UI shows
    and colours by type): its name and type."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    return run.state.name, run.state.type


def test_passing_candidate_is_promoted_with_full_lineage(seeded, make_settings, tracking, signing):
    state = rollout(make_settings("good"), return_state=True)
    assert (state.name, state.type) == ("Promoted", StateType.COMPLETED)
    assert recorded_state(state) == ("Promoted", StateType.COMPLETED)  # green in the UI
    assert "kernelgate-result:promoted" in flow_run_tags(state)
    # the log says which traffic the verdict rests on, MiniLM's requests included
    assert any(m.startswith("canary replays MiniLM's recorded requests (")
               for m in flow_run_log(state)), flow_run_log(state)
    outcome = state.result()
    assert outcome.result == "promoted"
    assert registered_model.alias_version(tracking, FAMILY, "production") == outcome.version
    assert outcome.version != seeded["production"]
    mv_tags = version_tags(tracking, outcome.version)
    assert mv_tags[tags.IMPLEMENTATION] == "test_good"
    for link in (tags.DECISION_RUN_ID, tags.EVALUATION_RUN_ID, tags.REGISTRATION_ID,
                 tags.CONFIRMATION_RUN_ID):
        assert link in mv_tags
    from lineage.records.records import load_decision
    from lineage.signing.sources import StoreSource

    source = StoreSource(tracking, FAMILY, signing.trust)
    confirmation = load_decision(source, mv_tags[tags.CONFIRMATION_RUN_ID]).decision
    assert confirmation.passed and confirmation.scope == ["accuracy"]
    from lineage.audit.audit import audit

    # The test kernels exist only in this process (monkeypatched registry), so the
    # loaded-model check runs in test_lineage_versions with real kernels.
    report = audit(tracking, FAMILY, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    stages_seen = [link.name for link in report.chain if link.ok]
    assert "shadow run" in stages_seen and stages_seen.count("canary run") >= 2


END_STATES = [("promoted", False, "Promoted", StateType.COMPLETED),
              ("rejected", False, "Rejected", StateType.FAILED),
              ("timed_out", False, "TimedOut", StateType.FAILED),
              ("rolled_back", False, "RolledBack", StateType.FAILED),
              ("rolled_back", True, "RolledBack", StateType.CANCELLED)]


@pytest.mark.parametrize(("result", "inconclusive", "name", "kind"), END_STATES)
def test_only_a_promotion_ends_completed_and_every_end_keeps_its_outcome_and_exit_code(
        prefect_server, result, inconclusive, name, kind):
    """What the Prefect UI colours a rollout's end by (the server's record of the state
    type): Completed only for *Promoted*; a verdict against the candidate Failed; an
    inconclusive rollback Cancelled. The names the notifications key on, the outcome a
    caller reads and the CLI's exit code (0 for each: README) stay as they were."""
    import pickle

    from prefect import flow

    from flows.end_states import rollout_end_state
    from flows.errored import EXIT_CODES
    from lineage.rollout.rollout import RolloutOutcome

    outcome = RolloutOutcome(family=FAMILY, version="7", result=result, stage="gate",
                             reason="why", inconclusive=inconclusive, rollout_run_id="r",
                             tracking_uri="file:///x", ui_command="kernelgate ui")

    @flow(name="kernelgate-end-state-check")
    def ends():
        return rollout_end_state(outcome)

    state = ends(return_state=True)
    assert recorded_state(state) == (name, kind)
    assert f"kernelgate-result:{result}" in flow_run_tags(state)
    assert outcome_of(state) == outcome and EXIT_CODES[outcome_of(state).result] == 0
    if result == "promoted":
        assert ends() == outcome
    else:
        with pytest.raises(RolloutNotPromoted) as raised:
            ends()
        assert raised.value.outcome == outcome
        assert pickle.loads(pickle.dumps(raised.value)).outcome == outcome  # a persisted result


def test_numerically_wrong_candidate_stops_at_the_gate(rejected_at_gate, tracking):
    state, seeded = rejected_at_gate.state, rejected_at_gate.before
    # a verdict against the candidate: Failed-type, never shown green like Promoted
    assert (state.name, state.type) == ("Rejected", StateType.FAILED)
    assert rejected_at_gate.recorded == ("Rejected", StateType.FAILED)
    assert "kernelgate-result:rejected" in rejected_at_gate.flow_run_tags
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage) == ("rejected", "gate")
    # Each failed criterion's reason is printed once (the gate's summary); the outcome's
    # reason only names the criteria.
    failures = [line for line in outcome.decision_summary.splitlines() if line.startswith("- fail")]
    assert failures
    assert all(outcome.markdown().count(line) == 1 for line in failures), outcome.markdown()
    assert "error-ratio" in outcome.reason or "error" in outcome.reason
    assert_production_unchanged(tracking, seeded, outcome.version)
    assert "gate" in version_tags(tracking, outcome.version)[tags.REJECTION_REASON]


def test_candidate_returning_nan_during_canary_is_rolled_back(seeded, make_settings, tracking,
                                                              monkeypatch):
    real_step = serving.replay_canary_step

    def fault_starts_with_canary_traffic(*args, **kwargs):
        Fault.active = True
        return real_step(*args, **kwargs)

    monkeypatch.setattr(serving, "replay_canary_step", fault_starts_with_canary_traffic)
    state = rollout(make_settings("nan_under_fault"), return_state=True)
    assert (state.name, state.type) == ("RolledBack", StateType.FAILED)  # a canary finding
    assert "kernelgate-result:rolled_back" in flow_run_tags(state)
    outcome = outcome_of(state)
    assert outcome.result == "rolled_back"
    assert outcome.stage.startswith("canary"), outcome
    assert "NaN" in outcome.reason or "non-finite" in outcome.reason
    assert_production_unchanged(tracking, seeded, outcome.version)
    assert "canary" in version_tags(tracking, outcome.version)[tags.ROLLBACK_REASON]


def test_slow_candidate_is_rejected_by_the_canary_latency_test(prefect_server, make_settings,
                                                               tracking, monkeypatch):
    """The written latency plan (noise sd 0.5), in a family of its own: the candidate is
    compared with the native baseline, which serves a family with no production."""
    before = registered_model.aliases(tracking, LATENCY_FAMILY)
    outcome = run_rollout(make_settings("slow", thresholds=STRICT_THRESHOLDS,
                                        family=LATENCY_FAMILY))
    assert outcome.result == "rolled_back"
    assert outcome.stage in ("shadow", "canary-25pct", "canary-50pct")
    assert "latency" in outcome.reason and "signed-rank" in outcome.reason
    assert_production_unchanged(tracking, before, outcome.version, family=LATENCY_FAMILY)


def _answer_when_paused(transition: str, run_input: dict, timeout_s: float = 240,
                        attempt: int = 0) -> None:
    """Resume the paused rollout through the Prefect API once its form schema exists
    (``attempt``: the how-many-th time the flow asks)."""
    schema_key = f"paused-{promotion.pause_key(transition, attempt)}-schema"
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


def _rollout_answered(settings, transition: str, *run_inputs: dict, return_state: bool = False):
    """Run the rollout while another thread answers its pauses with ``run_inputs`` in turn
    (the outcome, or the flow run's final state with ``return_state``)."""
    errors: list[BaseException] = []

    def answer_all():
        try:
            for attempt, run_input in enumerate(run_inputs):
                _answer_when_paused(transition, run_input, attempt=attempt)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    answer = threading.Thread(target=answer_all, daemon=True)
    answer.start()
    state = rollout(settings, return_state=True)
    answer.join(timeout=5)
    if errors:
        raise errors[0]
    return state if return_state else outcome_of(state)


def flow_run_log(state) -> list[str]:
    """The messages of a flow run's log lines (what the Prefect UI shows)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=[state.state_details.flow_run_id])))
    return [log.message for log in logs]


def test_blank_approver_is_asked_again_then_approved(
        seeded, make_settings, tracking, tmp_path, signing):
    """An answer Prefect's server accepts but whose approver is blank is asked again,
    never recorded; the next, complete answer continues to production. (An answer
    without the approver field at all is refused by the server: the form keeps its
    required fields and ``minLength``.)"""
    from lineage.records.records import load_approval
    from lineage.signing.sources import StoreSource

    settings = make_settings("good", family=APPROVAL_FAMILY, thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=240))
    state = _rollout_answered(settings, "shadow->canary",
                              {"decision": "approve", "approver": "   ", "comment": "ok"},
                              {"decision": "approve", "approver": "rm@example.com", "comment": "ok"},
                              return_state=True)
    outcome = state.result()
    assert outcome.result == "promoted", outcome.reason
    # the release manager sees why: a warning line in the flow run's log
    refused = [m for m in flow_run_log(state) if "not accepted" in m]
    assert len(refused) == 1 and "approver" in refused[0] and "blank" in refused[0], refused
    assert registered_model.alias_version(tracking, APPROVAL_FAMILY, "production") == outcome.version
    runs = tracking.client().search_runs(
        [tracking.client().get_experiment_by_name(f"kernelgate-{APPROVAL_FAMILY}").experiment_id],
        filter_string=f"tags.`{tags.STAGE}` = 'approval' and tags.`{tags.MODEL_VERSION}` = '{outcome.version}'")
    assert len(runs) == 1
    record, _ = load_approval(StoreSource(tracking, APPROVAL_FAMILY, signing.trust), runs[0].info.run_id)
    assert record.authentication.startswith("unauthenticated")
    assert (record.approved, record.approver, record.comment) == (True, "rm@example.com", "ok")
    # wherever the approver is named, so is how (no key authenticated this one)
    said = "shadow->canary: rm@example.com (unauthenticated: typed into the Prefect UI)"
    assert said in outcome.decided_by, outcome.decided_by
    mv = tracking.client().get_model_version(
        registered_model.registered_model_name(APPROVAL_FAMILY), outcome.version)
    # the page starts with where the version stands (the signed production story), then
    # the rollout's verdict line naming who approved and how
    from lineage.aliases.production_story import STORY_END

    story, _, verdict = mv.description.partition(STORY_END)
    assert "**In production since " in story, mv.description
    assert said in verdict.strip().splitlines()[0], mv.description


def test_a_person_s_rejection_ends_rejected_naming_them(seeded, make_settings, tracking, tmp_path):
    """A person's explicit rejection ends *Rejected* (not RolledBack, not like a
    timeout); the rejecter is named in the outcome, the state message and the version's
    description, which links the version's chain; the approval run says who and how."""
    settings = make_settings("good", family=APPROVAL_FAMILY, thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=240))
    before = registered_model.aliases(tracking, APPROVAL_FAMILY)
    state = _rollout_answered(settings, "shadow->canary",
                              {"decision": "reject", "approver": "rm@example.com",
                               "comment": "not this week"}, return_state=True)
    assert (state.name, state.type) == ("Rejected", StateType.FAILED)
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage) == ("rejected", "approval")
    assert "rm@example.com" in outcome.decided_by and "unauthenticated" in outcome.decided_by
    assert "rm@example.com" in state.message and "not this week" in state.message
    assert_production_unchanged(tracking, before, outcome.version, APPROVAL_FAMILY)
    mv = tracking.client().get_model_version(
        registered_model.registered_model_name(APPROVAL_FAMILY), outcome.version)
    first = mv.description.splitlines()[0]
    assert "rejected at approval" in first and "rm@example.com" in first
    for label in ("build", "evaluation (held-out)", "gate decision", "approval shadow → canary",
                  "shadow", "rollout"):
        assert f"- {label}" in mv.description, (label, mv.description)
    approval_run = tracking.client().get_run(mv.tags[tags.approval_run_id("shadow->canary")])
    note = approval_run.data.tags[tags.NOTE]
    assert "rejected by rm@example.com" in note and "unauthenticated" in note
    assert "not this week" in note


def test_approval_timeout_ends_timed_out(seeded, make_settings, tracking, tmp_path):
    settings = make_settings("good", family=APPROVAL_FAMILY, thresholds=thresholds_with(
        tmp_path, required_for=["shadow->canary"], timeout_s=3))
    before = registered_model.aliases(tracking, APPROVAL_FAMILY)
    state = rollout(settings, return_state=True)
    assert (state.name, state.type) == ("TimedOut", StateType.FAILED)  # the timeout rejects
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage) == ("timed_out", "approval")
    assert outcome.decided_by.startswith("nobody") and "3 s" in outcome.reason
    assert_production_unchanged(tracking, before, outcome.version, APPROVAL_FAMILY)


def test_rollout_killed_mid_canary_leaves_registry_consistent(seeded, make_settings, tracking):
    settings = make_settings("good")
    before = registered_model.aliases(tracking, FAMILY)
    # Run the stages' functions by hand and stop after entering canary: the process
    # "dies" there, so nothing closes its record or its aliases.
    ctx = tasks.open_rollout.fn(settings)
    preregistered = tasks.preregister.fn(ctx)
    built = judge.build.fn(ctx, preregistered)
    testset = tasks.prepare_testset.fn(ctx)
    evaluated = judge.evaluate.fn(ctx, preregistered, built, testset)
    gated = judge.gate.fn(ctx, preregistered, built, evaluated)
    assert (gated.version, evaluated.judged_against) == (built.version, before["production"])
    plan = traffic_plan.record_traffic.fn(ctx, preregistered, gated)
    assert traffic.shadow.fn(ctx, gated, evaluated, plan.shadow_look()).passed
    promotion.enter_canary.fn(ctx, gated)
    ctx.serving.close()
    killed = registered_model.aliases(tracking, FAMILY)
    assert killed["canary"] == built.version
    assert killed["production"] == before["production"]

    # While its owner may still be running (within the lease), a new run leaves it alone.
    live = tasks.open_rollout.fn(settings, clear_stale_aliases=True)
    assert registered_model.alias_version(tracking, FAMILY, "canary") == built.version
    close_rollout(live.record, result="rejected", stage="open", reason="test", version=None)

    # Once the lease is over, the next run clears the stale canary and says why.
    expired = settings.model_copy(update={"stale_alias_after_s": 0})
    next_state = tasks.open_rollout.fn(expired, clear_stale_aliases=True)
    after = registered_model.aliases(tracking, FAMILY)
    assert "canary" not in after and after["production"] == before["production"]
    assert "did not finish" in version_tags(tracking, built.version)[tags.STALE_REASON]
    close_rollout(next_state.record, result="rejected", stage="open", reason="test", version=None)


def test_nightly_revalidation_rolls_back_a_production_version_that_broke(
        seeded, make_settings, tracking, monkeypatch, signing):
    """A kernel that passed its rollout starts returning NaN (say, after a library
    upgrade): the nightly run fails it and restores the previous production."""
    from flows.revalidate import revalidate_production

    promoted = rollout(make_settings("nan_under_fault"))
    assert promoted.result == "promoted", promoted.reason
    history = registered_model.production_history(tracking, FAMILY, signing.trust)
    assert history[-1] == promoted.version

    links = (tags.DECISION_RUN_ID, tags.EVALUATION_RUN_ID, tags.REGISTRATION_ID)
    signed = {k: version_tags(tracking, promoted.version)[k] for k in links}
    healthy = revalidate_production(FAMILY, make_settings("nan_under_fault"))
    assert healthy.result == "passed"
    assert registered_model.alias_version(tracking, FAMILY, "production") == promoted.version
    # the re-validation's gate leaves the links the promotion signed (it had overwritten
    # them: the services backup drill's audit failed on it, 2026-12-01)
    assert {k: version_tags(tracking, promoted.version)[k] for k in links} == signed
    from lineage.audit.audit import audit

    report = audit(tracking, FAMILY, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()

    monkeypatch.setattr(Fault, "active", True)
    broken = revalidate_production(FAMILY, make_settings("nan_under_fault"))
    assert broken.result == "rolled_back", broken.reason
    assert registered_model.alias_version(tracking, FAMILY, "production") == history[-2]
    assert f"v{history[-2]}" in broken.now_serving and "nan" in broken.reason.lower()
    assert "re-validation" in version_tags(tracking, promoted.version)[tags.ROLLBACK_REASON]


def _record_table() -> list[dict]:
    text = (Path(__file__).parents[1] / "ARCHITECTURE.md").read_text()
    table = text.split("<!-- record-table")[1].split("<!-- end record-table")[0]
    rows = [line.strip().strip("|").split("|") for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")]
    return [{"stage": r[0].strip(), "count": r[1].strip(),
             "tags": [t.strip() for t in r[2].split(",")],
             "artifacts": [a.strip() for a in r[3].split(",")]} for r in rows]


def test_record_matches_architecture_table(seeded, tracking, source):
    """The promoted rollout's MLflow record has exactly the runs, tags and artifacts
    ARCHITECTURE.md's record table says (later changes to the record update both)."""
    import fnmatch

    from lineage.records.records import load_decision
    from lineage.records.registration import registered_thresholds
    from lineage.store import tracking as tr

    version = seeded["production"]
    vtags = version_tags(tracking, version)
    rollout_run = tracking.client().get_run(vtags[tags.ROLLOUT_RUN_ID])
    children = tracking.client().search_runs(
        [rollout_run.info.experiment_id],
        filter_string=f"tags.`{tags.PARENT}` = '{rollout_run.info.run_id}'")
    registration = load_decision(source, vtags[tags.DECISION_RUN_ID]).registration_id
    from lineage.records.registration import load_registration

    thresholds = registered_thresholds(source, load_registration(source, registration))
    counts = {"steps": len(thresholds.canary.steps),
              "approvals": len(thresholds.approval.required_for)}
    table = _record_table()
    assert {row["stage"] for row in table} >= {"rollout", "build", "gate", "canary"}
    by_stage: dict[str, list] = {}
    for run in children:
        by_stage.setdefault(run.data.tags[tags.STAGE], []).append(run)
    assert set(by_stage) <= {row["stage"] for row in table}, sorted(by_stage)
    for row in table:
        runs = [rollout_run] if row["stage"] == "rollout" else by_stage.get(row["stage"], [])
        expected = counts.get(row["count"]) if row["count"] in counts else int(row["count"])
        assert len(runs) == expected, (row["stage"], len(runs), expected)
        for run in runs:
            missing = [t for t in row["tags"] if t not in run.data.tags]
            assert not missing, (row["stage"], missing)
            files = tr.list_artifact_files(tracking, run.info.run_id)
            for pattern in row["artifacts"]:
                assert any(fnmatch.fnmatch(f, pattern) for f in files), (row["stage"], pattern, files)
            assert set(tr.recorded_digests(tracking, run.info.run_id)) == set(files)


def test_manual_rollback_restores_the_chosen_version_signed_and_audited(
        seeded, rejected_at_gate, make_settings, tracking, signing):
    """``kernelgate rollback --to N`` (the ``manual-rollback`` flow): production goes back
    to the chosen earlier version through the registry's rollback path; the move is a
    signed alias change the audit verifies, and a version that never served is refused
    (the module's one candidate rejected at the gate, ``rejected_at_gate``)."""
    from flows.rollback import manual_rollback
    from lineage.audit.audit import audit

    promoted = rollout(make_settings("good"))
    assert promoted.result == "promoted", promoted.reason
    earlier = registered_model.production_history(tracking, FAMILY, signing.trust)[-2]
    rejected = outcome_of(rejected_at_gate.state)
    assert rejected.result == "rejected" and rejected.version != earlier
    with pytest.raises(registry.PromotionRefused, match="not an earlier production"):
        manual_rollback(reason="test", requested_by="rm", to_version=int(rejected.version),
                        family=FAMILY, store_dir=str(make_settings("good").store_dir))
    assert registered_model.alias_version(tracking, FAMILY, "production") == promoted.version

    state = manual_rollback(reason="paging storm", requested_by="rm@example.com",
                            to_version=int(earlier), family=FAMILY,
                            store_dir=str(make_settings("good").store_dir), return_state=True)
    assert (state.name, state.type) == ("RolledBack", StateType.COMPLETED)
    assert registered_model.alias_version(tracking, FAMILY, "production") == earlier
    reason = version_tags(tracking, promoted.version)[tags.ROLLBACK_REASON]
    assert "rm@example.com" in reason and "paging storm" in reason
    report = audit(tracking, FAMILY, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    moves, problems = registered_model.store_alias_history(
        tracking, FAMILY, signing.trust)
    assert not problems
    last = moves[-1].predicate
    assert (last["action"], last["version"], last["previous_version"]) == (
        "rollback", earlier, promoted.version)
    # the story after the rollback is the true one: audit, version page, timeline
    text = report.render()
    assert f"restored to production by a rollback from v{promoted.version}" in text
    assert "paging storm" in text
    page = tracking.client().get_model_version(
        registered_model.registered_model_name(FAMILY), earlier).description
    assert "(restored by a rollback)" in page.splitlines()[1], page
    from typer.testing import CliRunner

    from flows.cli import app
    shown = CliRunner().invoke(app, ["timeline", "--family", FAMILY, "--store-dir",
                                     str(make_settings("good").store_dir)])
    assert shown.exit_code == 0, shown.output
    assert (f"rollback  v{promoted.version} -> v{earlier}: manual rollback requested by "
            "rm@example.com: paging storm") in shown.output, shown.output
    # the family's first production move comes from nothing, said in words
    assert re.search(r"promote +nothing -> v\d+\n", shown.output), shown.output


def test_a_rollout_that_fails_in_canary_is_closed_by_what_its_record_says(
        seeded, make_settings, tracking, monkeypatch):
    """A stage raises once the candidate is registered and in canary: the session reads
    back from the record what the rollout did (the version its build registered), rejects
    that version (canary rolled back) and ends the parent run FAILED, *errored*;
    production stays."""
    from flows import rollout as rollout_module

    seen = {}

    def broken(context, preregistered, built, testset):
        seen["version"] = built.version
        assert registered_model.alias_version(tracking, FAMILY, "canary") == built.version
        raise RuntimeError("confirmation store unreachable")

    monkeypatch.setattr(rollout_module, "confirm", broken)
    with pytest.raises(RolloutErrored, match="unreachable") as raised:
        rollout(make_settings("good"))
    assert isinstance(raised.value.__cause__, RuntimeError)
    version = seen["version"]
    after = registered_model.aliases(tracking, FAMILY)
    assert after.get("canary") != version and after["production"] == seeded["production"]
    vtags = version_tags(tracking, version)
    assert "rollout failed: RuntimeError: confirmation store unreachable" in vtags[
        tags.REJECTION_REASON]
    run = tracking.client().get_run(vtags[tags.ROLLOUT_RUN_ID])
    assert (run.info.status, run.data.tags[tags.RESULT]) == ("FAILED", "errored")


def test_a_failure_after_the_promotion_closes_the_record_as_promoted(
        seeded, make_settings, tracking, monkeypatch):
    """Production already serves the candidate when the last step fails: the record says
    promoted (with the failure noted), and the version is not tagged rejected."""
    from flows import rollout as rollout_module

    real_finish = rollout_module.finish

    def failing(context, result, *args, **kwargs):
        if result == "promoted":
            raise RuntimeError("artifact store hiccup")
        return real_finish(context, result, *args, **kwargs)

    monkeypatch.setattr(rollout_module, "finish", failing)
    with pytest.raises(RuntimeError, match="hiccup"):
        rollout(make_settings("good"))
    version = registered_model.alias_version(tracking, FAMILY, "production")
    assert version != seeded["production"]
    vtags = version_tags(tracking, version)
    assert tags.REJECTION_REASON not in vtags
    run = tracking.client().get_run(vtags[tags.ROLLOUT_RUN_ID])
    assert run.data.tags[tags.RESULT] == "promoted"
    assert ("a step after the promotion failed: RuntimeError: artifact store hiccup"
            in run.data.tags[tags.NOTE])


def test_every_stage_task_hands_prefect_the_context_quoted(monkeypatch):
    """Prefect walks (and may copy) task inputs; the session context (a signer, a tracking
    client, the model) goes in ``quote``-d, the stage results as plain parameters."""
    import inspect

    from prefect import Task
    from prefect.utilities.annotations import quote

    from flows import revalidate
    from flows import rollout as rollout_module

    stage_tasks = {obj for module in (judge, promotion, tasks, traffic, revalidate, rollout_module)
                   for obj in vars(module).values() if isinstance(obj, Task)}
    assert {t.name for t in stage_tasks} >= {"preregister", "build", "prepare-testset", "evaluate",
                                             "gate", "record-traffic", "shadow", "enter-canary",
                                             "canary-step", "confirm", "promote", "roll-back"}
    seen = []
    monkeypatch.setattr(Task, "__call__", lambda self, *args, **kwargs: seen.append(args))
    context = object()
    for stage in stage_tasks - {tasks.open_rollout}:  # open makes the context
        assert isinstance(stage, tasks.StageTask), stage.name
        assert next(iter(inspect.signature(stage.fn).parameters)) == "context", stage.name
        stage(context, "a result")
        passed = seen.pop()
        assert isinstance(passed[0], quote) and passed[0].unquote() is context, stage.name
        assert passed[1:] == ("a result",), stage.name


class RefusesLowPrecision(faulty_kernels.FaultyKernel):
    """Correct (XLA) but declares no float16, while its registration (the flow test's
    thresholds) serves float16 too: it refuses those cases by its capability (it still
    builds: the build's example problem is bf16)."""

    name = "test_refuses_low_precision"
    description = "fault injection: refuses part of its serving contract"
    fault = "good"
    capability = Capability(dtypes=("float32", "bfloat16"))

    def check_supported(self, spec, backend, config=None):
        Kernel.check_supported(self, spec, backend, config)  # the capability decides


def test_a_kernel_refusing_part_of_its_contract_is_rejected_naming_the_refused_cases(
        seeded, make_settings, tracking, store):
    refused = [c.spec.case_id for c in load_split(store / "testset", "heldout")
               if c.spec.dtype == "float16"]
    assert refused, "the test set's held-out split has float16 cases"
    with kernels.registered(RefusesLowPrecision):
        state = rollout(make_settings("refuses_low_precision"), return_state=True)
    assert (state.name, state.type) == ("Rejected", StateType.FAILED)
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage) == ("rejected", "gate")
    assert "coverage" in outcome.reason
    (line,) = [x for x in outcome.decision_summary.splitlines() if x.startswith("- fail: coverage:")]
    assert f"coverage.refused_cases = {len(refused)} violates == 0" in line
    assert "refused inside the serving contract" in line and refused[0] in line
    assert "supports dtypes ('float32', 'bfloat16'), got float16" in line
    assert_production_unchanged(tracking, seeded, outcome.version)


def test_a_stage_that_crashes_ends_errored_signed_with_nothing_half_written(
        seeded, make_settings, tracking, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("decision service exploded")

    monkeypatch.setattr(judge, "decide", broken)
    state = rollout(make_settings("good"), return_state=True)
    assert (state.name, state.type) == ("Errored", StateType.FAILED)
    assert "kernelgate-result:errored" in flow_run_tags(state)
    error = state.result(raise_on_failure=False)
    assert isinstance(error, RolloutErrored)
    outcome = error.outcome
    assert (outcome.result, outcome.stage) == ("errored", "gate")
    assert "RuntimeError: decision service exploded" in outcome.reason
    assert outcome.decision_summary is None  # a crash is never shown as a gate verdict
    assert_production_unchanged(tracking, seeded, outcome.version)
    assert outcome.version not in registered_model.aliases(tracking, FAMILY).values()
    assert "rollout failed: RuntimeError" in version_tags(tracking, outcome.version)[
        tags.REJECTION_REASON]
    client = tracking.client()
    run = client.get_run(outcome.rollout_run_id)
    assert (run.info.status, run.data.tags[tags.RESULT]) == ("FAILED", "errored")
    assert "decision service exploded" in run.data.tags[tags.NOTE]
    signed = {a.path for a in client.list_artifacts(outcome.rollout_run_id, "attestations")}
    assert "attestations/outcome.dsse.json" in signed
    experiment = run.info.experiment_id
    assert not client.search_runs([experiment], filter_string=(
        f"tags.`{tags.PARENT}` = '{outcome.rollout_run_id}' and tags.`{tags.STAGE}` = 'gate'"))
    assert not client.search_runs([experiment], filter_string="attributes.status = 'RUNNING'")


def test_exit_codes_are_the_ones_the_readme_documents():
    from flows.errored import EXIT_CODES

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = readme.split("<!-- exit-codes -->")[1]
    for result, code in EXIT_CODES.items():
        assert f"| {code} | {result.replace('_', ' ')} |" in table, result


INCONCLUSIVE_FAMILY = "attention-inconclusive"


def test_an_inconclusive_rollback_does_not_lock_the_family(prefect_server, make_settings,
                                                            tracking, tmp_path, signing):
    """A plan that needs a fresh A/A calibration, on a device with none: the rollout is
    rolled back before its canary — before any person is asked, though the plan requires
    approvals (a release manager is never asked to approve what the plan then refuses:
    asked, the rollout would have paused and timed out) — said *inconclusive* (no
    finding about the kernel), and that signed outcome is no rejection: the family's next
    registration may drop the requirement (a loosening) without a person's approval. A
    gate rejection still locks."""
    import yaml

    from lineage.records.registration import LooseningRefused, preregister

    needs = untimed(STRICT_THRESHOLDS, tmp_path / "calibrated.yaml",
                    required_for=["shadow->canary", "canary->production"], timeout_s=5)
    data = yaml.safe_load(needs.read_text())
    data["canary"]["latency"]["max_calibration_age_days"] = 30
    needs.write_text(yaml.safe_dump(data))
    state = rollout(make_settings("good", thresholds=needs, family=INCONCLUSIVE_FAMILY),
                    return_state=True)
    # called off for want of evidence: Cancelled-type, neither a success nor a verdict
    assert recorded_state(state) == ("RolledBack", StateType.CANCELLED)
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage, outcome.inconclusive) == ("rolled_back", "canary",
                                                                     True), outcome.reason
    with pytest.raises(RolloutNotPromoted, match="no fresh calibration") as raised:
        state.result()  # what calling the flow as a function raises, the outcome on it
    assert raised.value.outcome == outcome
    assert "no fresh calibration" in outcome.reason
    assert "inconclusive: not a verdict on the kernel" in outcome.verdict()
    looser = untimed(STRICT_THRESHOLDS, tmp_path / "uncalibrated.yaml")
    registration = preregister(looser, tracking=tracking, family=INCONCLUSIVE_FAMILY,
                               signing=signing)
    assert registration.profile == "flow-test"
    # a finding about the kernel still locks: the wrong kernel rejected at the gate
    rejected = run_rollout(make_settings("wrong_scale", thresholds=looser,
                                         family=INCONCLUSIVE_FAMILY))
    assert rejected.result == "rejected"
    with pytest.raises(LooseningRefused, match="rejected or rolled back"):
        preregister(_loosened(looser, tmp_path), tracking=tracking, family=INCONCLUSIVE_FAMILY,
                    signing=signing)


ADOPTION_FAMILY = "attention-adoption"
DECISION = {"against": "production", "minimum_worthwhile_ratio": 0.5, "alpha": 0.05,
            "power": 0.8, "noise_sd": 0.5, "max_pairs": 18, "mixture_rho": 0.25}
"""An adoption claim the flow-test canary's 6 + 12 compared requests can decide: worth it
only at half the alternative's time (a control kernel is nowhere near)."""


def test_a_safe_candidate_that_is_not_faster_ends_not_adopted(prefect_server, make_settings,
                                                              tracking, tmp_path, signing):
    """A registration with ``decision:``, in a family of its own (adding the section is a
    loosening, refused after the shared family's rejections), so the control kernel (XLA)
    is compared with the native baseline (XLA: no production yet). Safe, not faster: the
    rollout ends *NotAdopted* (exit code 4), production unchanged, the version not
    adopted with the figures, the decision signed and re-derived by the audit, and no
    rejection under the family's loosening rule."""
    import yaml

    from flows.errored import EXIT_CODES
    from lineage.audit.audit import audit
    from lineage.audit.canary_audit import signed_adoption
    from lineage.records.registration import preregister
    from lineage.signing.sources import StoreSource

    decided = untimed(STRICT_THRESHOLDS, tmp_path / "decided.yaml")
    data = yaml.safe_load(decided.read_text())
    decided.write_text(yaml.safe_dump(data | {"decision": DECISION}))
    before = registered_model.aliases(tracking, ADOPTION_FAMILY)
    state = rollout(make_settings("good", thresholds=decided, family=ADOPTION_FAMILY),
                    return_state=True)
    # Grey in the runs list: not the success it was run for, no verdict against the kernel.
    assert (state.name, state.type) == ("NotAdopted", StateType.CANCELLED)
    outcome = outcome_of(state)
    assert (outcome.result, outcome.stage, outcome.inconclusive) == ("not_adopted", "adoption",
                                                                     False), outcome.reason
    assert EXIT_CODES[outcome.result] == 4
    assert outcome.reason.startswith("not worth adopting over production")
    assert outcome.decided_by == "the adoption test (preregistered decision)"
    assert_production_unchanged(tracking, before, outcome.version, family=ADOPTION_FAMILY)
    version = tracking.client().get_model_version(
        registered_model.registered_model_name(ADOPTION_FAMILY), outcome.version)
    assert "confidence sequence" in version.tags[tags.NOT_ADOPTED_REASON]
    assert tags.REJECTION_REASON not in version.tags
    source = StoreSource(tracking, ADOPTION_FAMILY, signing.trust)
    run_id, verdict = signed_adoption(source, outcome.version)
    assert (run_id, verdict.outcome, verdict.n_pairs) == (outcome.rollout_run_id,
                                                          "not_worth_it", 18)
    # the version's page: the claim as preregistered and the measured effect, under its
    # verdict line
    page = version.description.splitlines()
    assert page[2] == "### Adoption (preregistered `decision:`): **not worth adopting**", page
    assert page[4] == ("- claim: median paired request latency ratio (candidate / production) "
                       "≤ 0.5, i.e. ≥ 50 % faster; α 0.05, power 0.8")
    assert page[5].startswith(f"- measured: median ratio {verdict.median_ratio:.3f} over "
                              f"{verdict.decided_at or 18} pairs, 95 % confidence sequence [")
    report = audit(tracking, ADOPTION_FAMILY, outcome.version, trust=signing.trust,
                   load_model=False)
    [link] = [link for link in report.chain if link.name == "adoption decision"]
    assert link.ok and link.detail.startswith("re-derived: not worth adopting"), report.render()
    # no rejection: the family's next registration may loosen without a person's approval
    preregister(_loosened(decided, tmp_path), tracking=tracking, family=ADOPTION_FAMILY,
                signing=signing)


LONGDOC_FAMILY = "attention-adoption-longdoc"


def test_a_canary_over_the_long_document_workload_judges_adoption_per_bucket(
        prefect_server, make_settings, tracking, tmp_path, signing):
    """A registration with ``canary.workload`` and ``decision.buckets``: the canary steps
    replay the small CPU workload's documents (ABBA, each carrying its bucket, signed with
    the step), and adoption is judged per declared bucket. The control kernel against the
    native baseline (both XLA) is not adopted; the signed decision's buckets hold exactly
    the signed compared requests of each bucket, and the audit re-derives it."""
    import yaml

    from evaluation.longdoc.canary_source import SHADOW_SEED_OFFSET
    from evaluation.report import EvaluationReport
    from evaluation.serving import TrafficResult
    from gates.canary import CanaryStepResult
    from lineage.audit.audit import audit
    from lineage.audit.canary_audit import signed_adoption
    from lineage.signing.sources import StoreSource, signed_artifact

    decided = untimed(STRICT_THRESHOLDS, tmp_path / "longdoc.yaml")
    data = yaml.safe_load(decided.read_text())
    data["canary"]["workload"] = "longdoc-cpu-small"
    # a family serving the workload's encoder, not MiniLM: no MiniLM check, though these
    # settings would run one
    data["serving"]["model_check"] = False
    decided.write_text(yaml.safe_dump(data | {"decision": DECISION | {
        "buckets": [128, 256, 512]}}))
    before = registered_model.aliases(tracking, LONGDOC_FAMILY)
    state = rollout(make_settings("good", thresholds=decided, family=LONGDOC_FAMILY,
                                  model_check=True), return_state=True)
    outcome = outcome_of(state)
    assert outcome.stage == "adoption" and outcome.result != "promoted", outcome.reason
    assert_production_unchanged(tracking, before, outcome.version, family=LONGDOC_FAMILY)
    source = StoreSource(tracking, LONGDOC_FAMILY, signing.trust)
    run_id, verdict = signed_adoption(source, outcome.version)
    assert verdict.outcome != "adopted" and verdict.n_pairs == 18  # 6 + 12 compared
    assert [b.bucket for b in verdict.buckets] == [128, 256, 512]
    # the MLflow UI shows each bucket as metrics of the rollout run, and the effect plot
    metrics = tracking.client().get_run(run_id).data.metrics
    assert metrics["adoption.adopted"] == 0.0
    assert [metrics[f"adoption.bucket_{b.bucket}.n_pairs"] for b in verdict.buckets] == [
        b.n_pairs for b in verdict.buckets]
    assert "adoption/effect.png" in [a.path for a in tracking.client().list_artifacts(
        run_id, "adoption")]
    signed = [a for a in source.attestations() if a.kind == "canary"
              and str(a.predicate.get("version")) == outcome.version]
    steps = [CanaryStepResult.model_validate_json(signed_artifact(
        source, a.run_id, "canary", f"canary/{a.predicate['step']}.json")[1]) for a in signed]
    assert sorted(s.step for s in steps) == ["canary-25pct", "canary-50pct"]
    served = [b for s in steps for b in s.length_buckets]
    assert len(served) == 18 and set(served) <= {128, 256, 512}
    assert [b.n_pairs for b in verdict.buckets] == [served.count(b) for b in (128, 256, 512)]
    # the shadow mirrored the workload's documents too, not MiniLM's requests: a kernel
    # is mirrored on what it will serve (a head_dim-128 kernel never meets MiniLM's 32)
    [shadow] = [a for a in source.attestations() if a.kind == "shadow"
                and str(a.predicate.get("version")) == outcome.version]
    mirrored = TrafficResult.model_validate_json(
        signed_artifact(source, shadow.run_id, "shadow", "shadow/traffic.json")[1])
    # from a stream of its own: the canary's documents do not depend on the shadow's size
    assert mirrored.records and all(
        r.request_id.startswith(f"longdoc-cpu-small-{SHADOW_SEED_OFFSET}-")
        and r.length_bucket in (128, 256, 512) for r in mirrored.records)
    assert mirrored.served_count("candidate") == 0
    [heldout] = [a for a in source.attestations() if a.kind == "evaluation"
                 and str(a.predicate.get("version")) == outcome.version
                 and a.predicate["split"] == "heldout"]
    report = EvaluationReport.model_validate_json(signed_artifact(
        source, heldout.run_id, "evaluation", heldout.predicate["report_artifact"])[1])
    assert report.model_accuracy == {} and report.serving.endswith("; no MiniLM check")
    # the version's page lists each declared bucket
    version = tracking.client().get_model_version(
        registered_model.registered_model_name(LONGDOC_FAMILY), outcome.version)
    assert "  - 512 tokens: **" in version.description, version.description
    report = audit(tracking, LONGDOC_FAMILY, outcome.version, trust=signing.trust,
                   load_model=False)
    [link] = [link for link in report.chain if link.name == "adoption decision"]
    assert link.ok, report.render()


def _loosened(path: Path, tmp_path: Path) -> Path:
    """``path`` with its canary's NaN bound relaxed (a loosening)."""
    import yaml

    data = yaml.safe_load(path.read_text())
    data["canary"]["max_nan_count"] = 5
    out = tmp_path / "loosened.yaml"
    out.write_text(yaml.safe_dump(data))
    return out
