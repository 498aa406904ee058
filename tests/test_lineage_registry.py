"""Preregistration, promotion and rollback against a real MLflow SQLite store (no mocks)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from gates.approval import (
    ApprovalInput,
    ApprovalRecord,
    record_answer,
    record_auto_approval,
    record_timeout,
)
from gates.canary import analyse_canary_step
from gates.decision import decide
from gates.preregistration import PreregistrationError
from gates.thresholds import load_thresholds
from lineage import registry, tags
from lineage import tracking as tr
from lineage.records import load_approval, load_decision, log_approval, log_canary_step
from lineage.registration import preregister, registered_thresholds, verify_registration
from lineage.registry import PromotionRefused
from tests.conftest_lineage import (
    StandInReport,
    baseline_metrics,
    build_chain,
    complete_chain,
    passing_metrics,
    promotable_chain,
    slug,
    thresholds_yaml,
)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def family(request):
    return slug(request.node.name)


def _write(tmp_path: Path, text: str, name: str = "thresholds.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _production_has_passing_decision(tracking, family) -> bool:
    """The invariant, checked from the store alone."""
    version = registry.alias_version(tracking, family, "production")
    if version is None:
        return True
    mv = tracking.client().get_model_version(registry.registered_model_name(family), version)
    record = load_decision(tracking, mv.tags[tags.DECISION_RUN_ID])
    return record.decision.verdict == "promote" and record.build_run_id == mv.run_id


def test_preregistration_is_logged_before_evaluation(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    before = datetime.now(UTC)
    registration = preregister(path, tracking=tracking, family=family)
    run = tracking.client().get_run(registration.registration_id)
    assert run.data.tags[tags.STAGE] == "preregistration"
    assert run.info.status == "FINISHED"
    assert run.data.tags[tags.THRESHOLDS_SHA256] == load_thresholds(path).source_sha256
    assert before <= registration.registered_at <= datetime.now(UTC)
    # the frozen bytes are readable back and parse to the same thresholds
    frozen = registered_thresholds(registration, tracking=tracking)
    assert frozen.model_dump() == load_thresholds(path).model_dump()
    assert (
        verify_registration(
            registration.registration_id, path, datetime.now(UTC), tracking=tracking
        )
        == registration
    )


def test_invalid_thresholds_are_not_registered(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml().replace("schema_version: 1", "schema_version: 9"))
    with pytest.raises(ValueError, match="schema_version"):
        preregister(path, tracking=tracking, family=family)
    assert tracking.client().get_experiment_by_name(f"kernelgate-{family}") is None


def test_editing_thresholds_after_preregistration_is_refused(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    registration = preregister(path, tracking=tracking, family=family)
    path.write_text(thresholds_yaml().replace("min_improvement: 1.2", "min_improvement: 1.0"))
    with pytest.raises(PreregistrationError, match="changed after preregistration"):
        verify_registration(
            registration.registration_id, path, datetime.now(UTC), tracking=tracking
        )
    report = StandInReport(
        metrics=passing_metrics(), baseline_metrics=baseline_metrics(), started_at=datetime.now(UTC)
    )
    with pytest.raises(PreregistrationError):
        decide(report, load_thresholds(path), registration)


def test_evaluation_before_registration_is_refused(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    started = datetime.now(UTC) - timedelta(milliseconds=5)
    registration = preregister(path, tracking=tracking, family=family)
    with pytest.raises(PreregistrationError, match="before registration"):
        verify_registration(registration.registration_id, path, started, tracking=tracking)


def test_unknown_registration_is_refused(tracking, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    with pytest.raises(PreregistrationError, match="not found"):
        verify_registration("0" * 32, path, datetime.now(UTC), tracking=tracking)


def test_passing_report_promotes_failing_does_not(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    good = promotable_chain(tracking, family, path)
    assert good.decision.passed
    change = registry.promote(tracking, family, good.version, decision_run_id=good.decision_run_id)
    assert change.previous_version is None
    assert registry.alias_version(tracking, family, "production") == good.version
    mv = tracking.client().get_model_version(registry.registered_model_name(family), good.version)
    assert mv.tags[tags.DECISION_RUN_ID] == good.decision_run_id
    assert mv.tags[tags.EVALUATION_RUN_ID] == good.evaluation_run_id
    assert mv.tags[tags.REGISTRATION_ID] == good.registration.registration_id
    assert mv.source == f"runs:/{good.build_run_id}/build" and mv.run_id == good.build_run_id

    bad_metrics = passing_metrics() | {"accuracy.all.nan_count": math.nan}
    bad = complete_chain(tracking, family, build_chain(
        tracking, family, path, bad_metrics, production_metrics=passing_metrics()))
    assert bad.decision.verdict == "reject"
    with pytest.raises(PromotionRefused, match="gate decision .* rejects"):
        registry.promote(tracking, family, bad.version, decision_run_id=bad.decision_run_id)
    with pytest.raises(PromotionRefused, match="rejects"):
        registry.assign_canary(tracking, family, bad.version, decision_run_id=bad.decision_run_id)
    assert registry.aliases(tracking, family) == {"production": good.version}
    # a passing decision for another build does not carry over to this version
    with pytest.raises(PromotionRefused, match="judged build"):
        registry.promote(tracking, family, bad.version, decision_run_id=good.decision_run_id)
    assert registry.alias_version(tracking, family, "production") == good.version
    assert _production_has_passing_decision(tracking, family)


@pytest.mark.parametrize("missing", ["shadow", "canary", "confirmation", "approval"])
def test_promotion_needs_the_complete_chain(tracking, family, tmp_path, missing):
    """Whoever calls promote (a flow, the CLI, a shell) meets the same rule: gate,
    shadow, approvals, every canary step and the confirmation split."""
    path = _write(tmp_path, thresholds_yaml(required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path)
    key = {"shadow": tags.SHADOW_RUN_ID, "canary": tags.CANARY_RUN_IDS,
           "confirmation": tags.CONFIRMATION_RUN_ID,
           "approval": tags.approval_run_id("canary->production")}[missing]
    tracking.client().delete_model_version_tag(registry.registered_model_name(family),
                                               chain.version, key)
    with pytest.raises(PromotionRefused, match=missing):
        registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    assert registry.alias_version(tracking, family, "production") is None


def test_failing_confirmation_blocks_promotion(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    chain = complete_chain(tracking, family, build_chain(tracking, family, path, passing_metrics()),
                           confirmation_metrics=passing_metrics()
                           | {"accuracy.hard.max_error_ratio_to_baseline": 9.0})
    with pytest.raises(PromotionRefused, match="confirmation decision .* rejects"):
        registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)


def test_rollback_restores_previous_production(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    first = promotable_chain(tracking, family, path)
    registry.promote(tracking, family, first.version, decision_run_id=first.decision_run_id)
    second = promotable_chain(tracking, family, path, production_metrics=passing_metrics())
    registry.assign_canary(tracking, family, second.version, decision_run_id=second.decision_run_id)
    change = registry.promote(
        tracking, family, second.version, decision_run_id=second.decision_run_id
    )
    assert change.previous_version == first.version
    model = tracking.client().get_registered_model(registry.registered_model_name(family))
    assert model.tags[tags.PREVIOUS_PRODUCTION] == first.version
    assert registry.aliases(tracking, family) == {"production": second.version}  # canary cleared
    assert tags.alias_owner("canary") not in registry.version_tags(tracking, family, second.version)
    assert _production_has_passing_decision(tracking, family)

    parent = tr.start_run(tracking, family, "rollout")
    back = registry.rollback(tracking, family, reason="p99 regression in canary replay",
                             parent_run_id=parent)
    assert back.version == first.version and back.previous_version == second.version
    assert registry.alias_version(tracking, family, "production") == first.version
    rolled = tracking.client().get_model_version(
        registry.registered_model_name(family), second.version
    )
    assert rolled.tags[tags.ROLLBACK_REASON] == "p99 regression in canary replay"
    assert _production_has_passing_decision(tracking, family)

    (run,) = tracking.client().search_runs(
        [tracking.client().get_run(parent).info.experiment_id],
        filter_string=f"tags.`{tags.PARENT}` = '{parent}'")
    assert run.data.tags[tags.STAGE] == "rollback"
    assert run.data.tags[tags.NOTE] == "p99 regression in canary replay"
    logged = tr.read_verified_artifact(tracking, run.info.run_id, tags.ALIAS_CHANGE_ARTIFACT)
    assert registry.AliasChange.model_validate_json(logged) == back

    # rolling back the first-ever production leaves no production: serve the native baseline
    registry.rollback(tracking, family, reason="library upgrade broke it")
    assert registry.alias_version(tracking, family, "production") is None
    with pytest.raises(ValueError, match="nothing to roll back"):
        registry.rollback(tracking, family, reason="again")


def test_altered_decision_artifact_cannot_promote(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    chain = promotable_chain(tracking, family, path)
    # overwrite the logged decision with a different (still "promote") document
    run = tracking.client().get_run(chain.decision_run_id)
    local = Path(run.info.artifact_uri.removeprefix("file://")) / tags.DECISION_ARTIFACT
    local.write_text(local.read_text().replace('"profile": "test"', '"profile": "forged"'))
    with pytest.raises(PromotionRefused, match="sha256"):
        registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    assert registry.alias_version(tracking, family, "production") is None


@pytest.mark.parametrize("answer", ["rejected", "timed_out", "wrong_version", "auto"])
def test_approval_required_by_policy(tracking, family, tmp_path, answer):
    path = _write(tmp_path, thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path)
    policy = chain.decision.approval_policy
    with pytest.raises(PermissionError):
        record_auto_approval(policy, transition="canary->production", family=family, version="1")
    ids = dict(transition="canary->production", family=family, version=chain.version)
    record, why = {
        "rejected": (record_answer(ApprovalInput(approve=False, approver="rm", comment="no"), **ids),
                     "does not approve"),
        "timed_out": (record_timeout(policy, **ids), "timed out"),
        "wrong_version": (record_answer(ApprovalInput(approve=True, approver="rm", comment="ok"),
                                        **(ids | {"version": "999"})), "version 999"),
        "auto": (ApprovalRecord(**ids, approved=True, approver="(auto)", comment="forged",
                                at=datetime.now(UTC), auto_approved=True), "requires a person"),
    }[answer]
    run_id = log_approval(tracking, record, decision_run_id=chain.decision_run_id)
    registry.link_approval(tracking, family, chain.version, "canary->production", run_id)
    with pytest.raises(PromotionRefused, match=why):
        registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    assert registry.alias_version(tracking, family, "production") is None


def test_a_persons_approval_promotes(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path)
    registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    assert registry.alias_version(tracking, family, "production") == chain.version
    approval_run = registry.version_tags(tracking, family, chain.version)[
        tags.approval_run_id("canary->production")]
    run = tracking.client().get_run(approval_run)
    assert run.data.tags[tags.APPROVED] == "true"
    assert run.data.tags[tags.APPROVER] == "rm@example.com"


def test_auto_approval_allowed_only_with_a_reason_in_policy(tracking, family, tmp_path):
    path = _write(
        tmp_path,
        thresholds_yaml(profile="dry", required_for=("canary->production",), auto_approve=True),
    )
    chain = promotable_chain(tracking, family, path)
    run_id = registry.version_tags(tracking, family, chain.version)[
        tags.approval_run_id("canary->production")]
    record, _ = load_approval(tracking, run_id)
    assert record.auto_approved and "test dry run" in record.comment
    registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    assert registry.alias_version(tracking, family, "production") == chain.version


def test_shadow_and_clear_stale(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    chain = build_chain(tracking, family, path, passing_metrics())
    registry.assign_shadow(tracking, family, chain.version)
    assert registry.aliases(tracking, family) == {"shadow": chain.version}
    with pytest.raises(ValueError, match="production"):
        registry.clear_stale(tracking, family, "production", reason="x")
    assert registry.clear_stale(tracking, family, "shadow", reason="superseded") == chain.version
    assert registry.aliases(tracking, family) == {}
    assert registry.clear_stale(tracking, family, "shadow", reason="again") is None


def test_stage_run_records_failure_and_parent(tracking, family):
    parent = tr.start_run(tracking, family, "rollout")
    with (
        pytest.raises(RuntimeError),
        tr.stage_run(tracking, family, "build", parent_run_id=parent) as child,
    ):
        raise RuntimeError("compile failed")
    run = tracking.client().get_run(child)
    assert run.info.status == "FAILED" and run.data.tags[tags.PARENT] == parent
    tr.end_run(tracking, parent)
    assert tracking.client().get_run(parent).info.status == "FINISHED"


def test_canary_step_is_recorded_with_its_link(tracking, family, tmp_path):
    path = _write(tmp_path, thresholds_yaml())
    chain = build_chain(tracking, family, path, passing_metrics())
    plan = load_thresholds(path).canary
    rng = np.random.default_rng(0)
    result = analyse_canary_step(
        plan.steps[0],
        rng.lognormal(np.log(0.01), 0.3, 20),
        rng.lognormal(np.log(0.01), 0.3, 80),
        np.array([1e-6, np.nan]),
        error_count=0,
        nan_count=0,
        memory_start_bytes=0,
        memory_end_bytes=0,
        plan=plan,
    )
    assert not result.passed  # the NaN drift breaches
    run_id = log_canary_step(tracking, family, result, decision_run_id=chain.decision_run_id)
    run = tracking.client().get_run(run_id)
    assert run.data.tags[tags.STAGE] == "canary"
    assert run.data.tags[tags.DECISION_RUN_ID] == chain.decision_run_id
    assert run.data.tags[tags.CANARY_PASSED] == "false"
    assert run.data.metrics["canary.p_value"] == pytest.approx(result.p_value)
    assert tr.recorded_digests(tracking, run_id).keys() == {f"canary/{result.step}.json"}


def test_rollback_to_an_unusable_previous_version_raises_or_retires(tracking, family, tmp_path):
    """The previous production's decision was altered after it served: a plain rollback
    refuses to restore it; a recovery rollback retires production and says why."""
    path = _write(tmp_path, thresholds_yaml())
    first = promotable_chain(tracking, family, path)
    registry.promote(tracking, family, first.version, decision_run_id=first.decision_run_id)
    second = promotable_chain(tracking, family, path, production_metrics=passing_metrics())
    registry.promote(tracking, family, second.version, decision_run_id=second.decision_run_id)
    run = tracking.client().get_run(first.decision_run_id)
    local = Path(run.info.artifact_uri.removeprefix("file://")) / tags.DECISION_ARTIFACT
    local.write_text(local.read_text() + " ")

    with pytest.raises(PromotionRefused):
        registry.rollback(tracking, family, reason="nightly failure")
    assert registry.alias_version(tracking, family, "production") == second.version

    change = registry.rollback(tracking, family, reason="nightly failure", retire_if_unusable=True)
    assert change.version is None and registry.alias_version(tracking, family, "production") is None
    reason = registry.version_tags(tracking, family, second.version)[tags.ROLLBACK_REASON]
    assert reason.startswith("nightly failure; previous production not restored")
