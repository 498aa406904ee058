"""Audit of a promoted version against a real MLflow SQLite store; tampering is caught."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gates.decision import decide
from gates.thresholds import load_thresholds
from lineage import registry, tags
from lineage import tracking as tr
from lineage.audit import audit
from lineage.records import log_decision
from lineage.registration import preregister
from tests.conftest_lineage import (
    Chain,
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
def promoted(tracking, request, tmp_path):
    """A version promoted under a policy that needs an approval; returns (family, chain,
    approval run id)."""
    family = slug(request.node.name)
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path)
    registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id)
    approval_run_id = registry.version_tags(tracking, family, chain.version)[
        tags.approval_run_id("canary->production")]
    return family, chain, approval_run_id


def _local_artifact(tracking, run_id: str, artifact_path: str) -> Path:
    uri = tracking.client().get_run(run_id).info.artifact_uri
    return Path(uri.removeprefix("file://")) / artifact_path


def test_audit_of_promoted_version_passes(tracking, promoted):
    family, chain, approval_run_id = promoted
    report = audit(tracking, family, "production")
    assert report.ok and report.exit_code == 0, report.render()
    assert report.version == chain.version
    refs = {link.name: link.ref for link in report.chain}
    vtags = registry.version_tags(tracking, family, chain.version)
    assert {k: refs[k] for k in ("version", "build run", "gate decision", "gate evaluation run",
                                 "preregistration run", "approval canary->production",
                                 "shadow run", "confirmation decision")} == {
        "version": chain.version,
        "build run": chain.build_run_id,
        "gate decision": chain.decision_run_id,
        "gate evaluation run": chain.evaluation_run_id,
        "preregistration run": chain.registration.registration_id,
        "approval canary->production": approval_run_id,
        "shadow run": vtags[tags.SHADOW_RUN_ID],
        "confirmation decision": vtags[tags.CONFIRMATION_RUN_ID],
    }
    canary = [link for link in report.chain if link.name == "canary run"]
    assert [link.ref for link in canary] == json.loads(vtags[tags.CANARY_RUN_IDS])
    assert all(link.ok for link in report.chain)
    paths = {(a.run_id, a.path) for a in report.artifacts}
    assert (chain.build_run_id, "build/export/gpu.bin") in paths
    assert (chain.evaluation_run_id, "reports/evaluation.json") in paths
    assert (chain.registration.registration_id, "thresholds/thresholds.yaml") in paths
    assert (chain.decision_run_id, tags.DECISION_ARTIFACT) in paths
    assert (approval_run_id, tags.APPROVAL_ARTIFACT) in paths
    # each verified digest is the sha256 of the stored bytes, recomputed here
    for check in report.artifacts:
        data = _local_artifact(tracking, check.run_id, check.path).read_bytes()
        assert check.actual_sha256 == check.expected_sha256 == hashlib.sha256(data).hexdigest()
    assert "AUDIT PASSED" in report.render()
    # the version number audits the same way as its alias
    assert audit(tracking, family, chain.version).ok


@pytest.mark.parametrize(
    ("which", "artifact"),
    [
        ("build_run_id", "build/export/gpu.bin"),
        ("evaluation_run_id", "reports/evaluation.json"),
        ("registration", "thresholds/thresholds.yaml"),
    ],
)
def test_altered_artifact_fails_the_audit_and_is_named(tracking, promoted, which, artifact):
    family, chain, _ = promoted
    run_id = (
        chain.registration.registration_id if which == "registration" else getattr(chain, which)
    )
    local = _local_artifact(tracking, run_id, artifact)
    local.write_bytes(local.read_bytes() + b" ")
    report = audit(tracking, family, "production")
    assert not report.ok and report.exit_code == 1
    assert any(artifact in p and run_id in p and "sha256 mismatch" in p for p in report.problems)
    bad = [a for a in report.artifacts if not a.ok]
    assert [(a.run_id, a.path) for a in bad] == [(run_id, artifact)]
    assert "AUDIT FAILED" in report.render() and artifact in report.render()


def test_artifact_without_digest_or_missing_is_named(tracking, promoted):
    family, chain, _ = promoted
    # logged behind lineage.tracking's back: no recorded digest
    extra = Path(
        tracking.client().get_run(chain.evaluation_run_id).info.artifact_uri.removeprefix("file://")
    )
    (extra / "plots").mkdir()
    (extra / "plots" / "latency.png").write_bytes(b"png")
    _local_artifact(tracking, chain.build_run_id, "build/config.json").unlink()
    report = audit(tracking, family, "production")
    assert report.exit_code == 1
    assert any("'plots/latency.png'" in p and "no recorded sha256" in p for p in report.problems)
    assert any("'build/config.json'" in p and "missing" in p for p in report.problems)


def test_broken_link_is_named(tracking, promoted):
    family, chain, _ = promoted
    name = registry.registered_model_name(family)
    tracking.client().set_model_version_tag(name, chain.version, tags.DECISION_RUN_ID, "f" * 32)
    report = audit(tracking, family, "production")
    assert report.exit_code == 1
    assert any("gate decision" in p and "f" * 32 in p and "not found" in p for p in report.problems)


@pytest.mark.parametrize("evidence", ["shadow", "canary", "confirmation", "approval"])
def test_production_without_its_full_chain_fails_the_audit(tracking, promoted, evidence):
    """The audit holds a production version to the registry's definition of a
    complete chain: missing shadow, canary, confirmation or approval is named."""
    family, chain, _ = promoted
    key = {"shadow": tags.SHADOW_RUN_ID, "canary": tags.CANARY_RUN_IDS,
           "confirmation": tags.CONFIRMATION_RUN_ID,
           "approval": tags.approval_run_id("canary->production")}[evidence]
    tracking.client().delete_model_version_tag(registry.registered_model_name(family),
                                               chain.version, key)
    report = audit(tracking, family, "production")
    assert report.exit_code == 1 and any(evidence in p for p in report.problems), report.render()


def test_forged_decision_document_is_caught(tracking, promoted):
    family, chain, _ = promoted
    local = _local_artifact(tracking, chain.decision_run_id, tags.DECISION_ARTIFACT)
    decision = json.loads(local.read_text())
    decision["criteria"][0]["threshold"] = 1e9
    local.write_text(json.dumps(decision))
    report = audit(tracking, family, "production")
    assert report.exit_code == 1
    assert any(tags.DECISION_ARTIFACT in p for p in report.problems)


def test_unknown_alias_and_unpromoted_version(tracking, promoted, tmp_path):
    family, chain, _ = promoted
    report = audit(tracking, family, "canary")
    assert report.exit_code == 1 and "no such alias is set" in report.problems[0]
    # a version that was only registered needs no decision and audits clean
    path = tmp_path / "t2.yaml"
    path.write_text(thresholds_yaml())
    other = build_chain(tracking, family, path, passing_metrics())
    report = audit(tracking, family, other.version)
    assert report.ok, report.render()


def test_registration_after_evaluation_run_is_flagged(tracking, request, tmp_path):
    """An evaluation run opened before the thresholds were frozen passes decide() (its
    reported start is later) but not the audit, which trusts the store's run start time."""
    family = slug(request.node.name)
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    with tr.stage_run(tracking, family, "build") as build_run_id:
        tr.log_text(tracking, build_run_id, "{}", "build/config.json")
    evaluation_run_id = tr.start_run(tracking, family, "evaluation")
    registration = preregister(path, tracking=tracking, family=family)
    tr.set_tags(
        tracking,
        evaluation_run_id,
        {tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration.registration_id},
    )
    tr.end_run(tracking, evaluation_run_id)
    report = StandInReport(
        metrics=passing_metrics(), baseline_metrics=baseline_metrics(), started_at=datetime.now(UTC)
    )
    decision = decide(report, load_thresholds(path), registration)
    decision_run_id = log_decision(
        tracking, family, decision, build_run_id=build_run_id, evaluation_run_id=evaluation_run_id
    )
    version = registry.register_build(tracking, family, build_run_id, implementation="xla",
                                      config=None)
    chain = Chain(registration=registration, build_run_id=build_run_id,
                  evaluation_run_id=evaluation_run_id, decision_run_id=decision_run_id,
                  version=version, decision=decision)
    complete_chain(tracking, family, chain)
    registry.promote(tracking, family, version, decision_run_id=decision_run_id)
    result = audit(tracking, family, "production")
    assert result.exit_code == 1
    assert any(
        "evaluation run" in p and "after the evaluation run was created" in p
        for p in result.problems
    ), result.render()
