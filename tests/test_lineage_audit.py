"""The audit re-derives from signed evidence: a real MLflow SQLite store, stand-in
builds, every record signed; each kind of tampering is named. (tests/test_attacks.py
replays the attacks on stores written by real rollouts.)"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gates.decision import decide
from gates.thresholds import load_thresholds
from lineage.aliases import registered_model
from lineage.audit.audit import audit
from lineage.records.records import log_decision
from lineage.records.registration import preregister
from lineage.signing import keys
from lineage.store import tags
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    Chain,
    complete_chain,
    evaluation_report,
    passing_metrics,
    promotable_chain,
    promote,
    signed_build,
    slug,
    thresholds_yaml,
)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def promoted(tracking, request, tmp_path, signing):
    """A version promoted under a policy that needs an approval; returns (family, chain)."""
    family = slug(request.node.name)
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, chain, signing)
    return family, chain


def _audit(tracking, family, signing, target="production", trust=None):
    return audit(tracking, family, target, trust=trust or signing.trust, load_model=False)


def _local(tracking, run_id: str, artifact_path: str) -> Path:
    uri = tracking.client().get_run(run_id).info.artifact_uri
    return Path(uri.removeprefix("file://")) / artifact_path


def test_untouched_store_passes_and_says_what_it_verified(tracking, promoted, signing):
    family, chain = promoted
    report = _audit(tracking, family, signing)
    assert report.ok and report.exit_code == 0, report.render()
    assert report.version == chain.version
    assert report.attestations_verified >= 10 and report.artifacts_verified == report.artifacts_checked
    names = {link.name: link.ref for link in report.chain}
    assert names["gate decision"] == chain.decision_run_id
    assert names["registration"] == chain.registration.registration_id
    assert names["gate evaluation"] == chain.evaluation_run_id
    for name in ("approval canary->production", "shadow run", "confirmation decision", "promotion"):
        assert name in names
    assert sum(link.name == "canary run" for link in report.chain) == 2
    assert "re-derived verdict promote" in next(link.detail for link in report.chain
                                                if link.name == "gate evaluation")
    assert report.summary().startswith("AUDIT PASSED")
    assert audit(tracking, family, chain.version, trust=signing.trust, load_model=False).ok


@pytest.mark.parametrize(("which", "artifact"), [
    ("build_run_id", "build/export/gpu.bin"),
    ("evaluation_run_id", "evaluation/evaluation_report.json"),
    ("registration", "thresholds/thresholds.yaml"),
])
def test_altered_artifact_is_named(tracking, promoted, signing, which, artifact):
    family, chain = promoted
    run_id = chain.registration.registration_id if which == "registration" else getattr(chain, which)
    local = _local(tracking, run_id, artifact)
    local.write_bytes(local.read_bytes() + b" ")
    report = _audit(tracking, family, signing)
    assert report.exit_code == 1
    assert any(artifact in p and (run_id in p) and ("signed digest" in p) for p in report.problems), \
        report.render()


def test_rewritten_decision_with_its_digest_tag_updated_is_caught(tracking, promoted, signing):
    """Rewrite the gate decision to something else and update its sha256 tag: the tag is
    not what protects it, the signature is."""
    import hashlib

    family, chain = promoted
    local = _local(tracking, chain.decision_run_id, tags.DECISION_ARTIFACT)
    decision = json.loads(local.read_text())
    decision["criteria"][0]["threshold"] = 1e9
    local.write_text(json.dumps(decision))
    tracking.client().set_tag(chain.decision_run_id, tags.DIGEST_PREFIX + tags.DECISION_ARTIFACT,
                              hashlib.sha256(local.read_bytes()).hexdigest())
    report = _audit(tracking, family, signing)
    assert report.exit_code == 1
    assert any(tags.DECISION_ARTIFACT in p and "signed digest" in p for p in report.problems)


def test_unsigned_extra_artifact_and_missing_artifact_are_named(tracking, promoted, signing):
    family, chain = promoted
    extra = _local(tracking, chain.evaluation_run_id, "plots/latency.png")
    extra.parent.mkdir(parents=True, exist_ok=True)
    extra.write_bytes(b"png")
    _local(tracking, chain.build_run_id, "build/config.json").unlink()
    report = _audit(tracking, family, signing)
    assert any("'plots/latency.png'" in p and "not covered by any signature" in p
               for p in report.problems)
    assert any("'build/config.json'" in p and "missing" in p for p in report.problems)


def test_production_moved_by_hand_is_named(tracking, promoted, signing, tmp_path):
    family, chain = promoted
    path = tmp_path / "t2.yaml"
    path.write_text(thresholds_yaml())
    other_run, other = signed_build(tracking, family, signing)
    tracking.client().set_registered_model_alias(registered_model.registered_model_name(family),
                                                 "production", other)
    report = _audit(tracking, family, signing)
    assert report.exit_code == 1
    assert any("alias production points at v" + other in p and "signed history" in p
               for p in report.problems), report.render()


def test_version_tag_edits_and_metric_edits_are_named(tracking, promoted, signing):
    family, chain = promoted
    name = registered_model.registered_model_name(family)
    tracking.client().set_model_version_tag(name, chain.version, tags.IMPLEMENTATION, "naive")
    tracking.client().log_metric(chain.evaluation_run_id, "accuracy.hard.max_error_ratio_to_baseline",
                                 0.5)
    report = _audit(tracking, family, signing)
    assert any(tags.IMPLEMENTATION in p and "signed build says 'xla'" in p for p in report.problems)
    assert any("accuracy.hard.max_error_ratio_to_baseline" in p and "signed" in p
               for p in report.problems)


def test_tags_cannot_switch_checks_off(tracking, promoted, signing):
    """Deleting the version's link tags used to turn the shadow/canary/approval checks
    off; the audit reads the chain from signatures now, and names the links the UI lost."""
    family, chain = promoted
    name = registered_model.registered_model_name(family)
    for key in (tags.ROLLOUT_RUN_ID, tags.PROMOTED_AT, tags.SHADOW_RUN_ID, tags.CANARY_RUN_IDS,
                tags.CONFIRMATION_RUN_ID, tags.DECISION_RUN_ID):
        with contextlib.suppress(Exception):  # not every key is set on a registry-only promotion
            tracking.client().delete_model_version_tag(name, chain.version, key)
    report = _audit(tracking, family, signing)
    checked = {link.name for link in report.chain if link.ok}
    assert {"shadow run", "canary run", "confirmation decision", "promotion"} <= checked, report.render()
    assert report.problems and all("the UI's link is wrong" in p for p in report.problems), report.render()
    assert any(tags.DECISION_RUN_ID in p for p in report.problems)


def test_deleted_evidence_is_missing_evidence(tracking, promoted, signing):
    family, chain = promoted
    experiment = tracking.client().get_experiment_by_name(f"kernelgate-{family}").experiment_id
    (shadow,) = tracking.client().search_runs([experiment], f"tags.`{tags.STAGE}` = 'shadow'")
    tracking.client().delete_run(shadow.info.run_id)  # what the UI's Delete does
    import shutil

    shutil.rmtree(_local(tracking, shadow.info.run_id, "attestations"))
    report = _audit(tracking, family, signing)
    assert report.exit_code == 1
    assert any("shadow" in p for p in report.problems), report.render()


def test_untrusted_and_revoked_keys_do_not_count(tracking, promoted, signing, tmp_path):
    family, _ = promoted
    stranger = keys.create_key(tmp_path / "stranger.pem")
    untrusted = keys.trust_from_files([keys.public_path(tmp_path / "stranger.pem")])
    assert stranger.keyid in untrusted.public_keys
    report = _audit(tracking, family, signing, trust=untrusted)
    assert report.exit_code == 1
    assert any("no valid signature by a trusted key" in p for p in report.problems)
    revoked = signing.trust.model_copy(update={"revoked": {signing.signer.public_key.keyid}})
    report = _audit(tracking, family, signing, trust=revoked)
    assert any("revoked" in p for p in report.problems)


def test_an_alias_no_version_holds_is_nothing_to_audit_not_a_failure(tracking, promoted, signing):
    family, chain = promoted
    report = _audit(tracking, family, signing, target="canary")
    assert (report.exit_code, report.problems, report.version) == (3, [], None)
    assert report.summary().startswith(f"NOTHING TO AUDIT: kernelgate-{family} canary: MLflow "
                                       "shows no alias 'canary' and the signed alias history "
                                       "sets none either")
    assert f"signed builds: v{chain.version}" in report.absent
    assert "vNone" not in report.render() and "AUDIT" not in report.render().replace(
        "NOTHING TO AUDIT", "")


def test_production_removed_by_hand_is_a_failure_naming_the_signed_version(
        tracking, promoted, signing):
    family, chain = promoted
    tracking.client().delete_registered_model_alias(
        registered_model.registered_model_name(family), "production")
    report = _audit(tracking, family, signing)
    assert report.exit_code == 1, report.render()
    assert any(f"alias production points at vNone but the signed history leaves it at "
               f"v{chain.version}" in p for p in report.problems), report.problems
    assert f"the signed alias history leaves it at v{chain.version}" in report.absent
    assert report.summary().startswith(f"AUDIT FAILED: kernelgate-{family} production -> no "
                                       "version;"), report.summary()


def test_a_version_number_the_family_never_had_is_nothing_to_audit_naming_its_versions(
        tracking, promoted, signing):
    family, chain = promoted
    report = _audit(tracking, family, signing, target="99")
    assert (report.exit_code, report.problems) == (3, [])
    assert report.absent == (f"kernelgate-{family} has no version 99: its log signs no build "
                             f"of it (signed builds: v{chain.version})")


def test_registration_after_evaluation_run_is_flagged(tracking, request, tmp_path, signing):
    """An evaluation run opened before the thresholds were frozen passes decide() (its
    reported start is later) but not the audit, which trusts the store's run start time."""
    family = slug(request.node.name)
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    build_run_id, version = signed_build(tracking, family, signing)
    evaluation_run_id = tr.start_run(tracking, family, "evaluation")
    registration = preregister(path, tracking=tracking, family=family, signing=signing)
    report = evaluation_report(passing_metrics(), started_at=datetime.now(UTC))
    tags_ = {tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration.registration_id,
             tags.SPLIT: "heldout"}
    tr.set_tags(tracking, evaluation_run_id, tags_)
    tr.log_model_json(tracking, evaluation_run_id, report, "evaluation/evaluation_report.json")
    from lineage.signing.attestations import attest

    attest(tracking, evaluation_run_id, "evaluation", {
        "family": family, "version": version, "build_run_id": build_run_id,
        "registration_id": registration.registration_id, "split": "heldout",
        "split_digest": "d" * 64, "report_artifact": "evaluation/evaluation_report.json",
        "tags": tags_}, signing.signer)
    tr.end_run(tracking, evaluation_run_id)
    decision = decide(report, load_thresholds(path), registration)
    decision_run_id = log_decision(tracking, family, decision, build_run_id=build_run_id,
                                   evaluation_run_id=evaluation_run_id, version=version,
                                   signing=signing)
    chain = Chain(registration=registration, build_run_id=build_run_id,
                  evaluation_run_id=evaluation_run_id, decision_run_id=decision_run_id,
                  version=version, decision=decision)
    complete_chain(tracking, family, chain, signing=signing)
    promote(tracking, family, chain, signing)
    result = _audit(tracking, family, signing)
    assert result.exit_code == 1
    assert any("after the evaluation run was created" in p for p in result.problems), result.render()


def test_a_canary_step_signed_with_a_verdict_its_samples_do_not_give_is_caught(
        tracking, promoted, signing):
    """The audit re-derives each canary look from the signed ABBA samples: a step whose
    samples show a slowdown, signed as passed (valid signature, wrong verdict), is named."""
    from gates.thresholds import parse_thresholds
    from lineage.records.records import log_canary_step
    from tests.conftest_lineage import _passing_step

    family, chain = promoted
    report = _audit(tracking, family, signing)
    assert report.ok, report.render()
    rederived = [link for link in report.chain if link.name == "canary re-derived"]
    assert len(rederived) == 2 and all(link.ok for link in rederived)
    plan = parse_thresholds(thresholds_yaml(profile="prod").encode()).canary
    first = _passing_step(plan.steps[0], plan)
    slow = _passing_step(plan.steps[1], plan, [first], slowdown=1.5)
    assert not slow.passed  # what the samples say
    doctored = slow.model_copy(update={
        "breaches": [], "passed": True, "latency_slower": False,
        "latency_look": slow.latency_look.model_copy(update={"slower": False})})
    log_canary_step(tracking, family, doctored, version=chain.version,
                    decision_run_id=chain.decision_run_id, signing=signing)
    report = _audit(tracking, family, signing)
    assert not report.ok
    assert any("canary re-derived" in p and "slower True" in p for p in report.problems), \
        report.problems


@pytest.mark.parametrize("config, shown", [
    (None, "pallas_tpu default config, code sha256 0123456789ab"),
    ({}, "pallas_tpu default config, code sha256 0123456789ab"),
    ({"block_q": 128}, "pallas_tpu config {'block_q': 128}, code sha256 0123456789ab"),
])
def test_the_build_line_says_default_config_where_the_build_passed_none(config, shown):
    from lineage.audit.audit import build_line

    predicate = {"implementation": "pallas_tpu", "config": config,
                 "code_sha256": "0123456789abcdef" * 4}
    assert build_line(predicate) == shown
