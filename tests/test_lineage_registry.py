"""Preregistration, promotion and rollback against a real MLflow SQLite store (no mocks),
every record signed and every rule enforced by the registry, whoever calls it."""

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
from lineage.aliases import registered_model, registry
from lineage.aliases.registry import PromotionRefused
from lineage.records.records import load_approval, load_decision, log_canary_step
from lineage.records.registration import (
    LooseningRefused,
    preregister,
    registered_thresholds,
    verify_registration,
)
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    StandInReport,
    baseline_metrics,
    build_chain,
    complete_chain,
    passing_metrics,
    promotable_chain,
    promote,
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


def _source(tracking, family, signing):
    return StoreSource(tracking, family, signing.trust)


def _production_has_passing_decision(tracking, family, signing) -> bool:
    """The invariant, checked from the signed store alone."""
    version = registered_model.alias_version(tracking, family, "production")
    if version is None:
        return True
    from lineage.records import chain

    evidence = chain.collect(_source(tracking, family, signing), version)
    return not chain.problems(evidence, "canary->production")


def test_preregistration_is_signed_before_evaluation(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    before = datetime.now(UTC)
    registration = preregister(path, tracking=tracking, family=family, signing=signing)
    run = tracking.client().get_run(registration.registration_id)
    assert run.data.tags[tags.STAGE] == "preregistration" and run.info.status == "FINISHED"
    assert run.data.tags[tags.THRESHOLDS_SHA256] == load_thresholds(path).source_sha256
    assert before <= registration.registered_at <= datetime.now(UTC)
    source = _source(tracking, family, signing)
    (signed,) = [a for a in source.attestations() if a.kind == "registration"]
    assert signed.predicate["thresholds_sha256"] == load_thresholds(path).source_sha256
    assert signed.keyid == signing.signer.public_key.keyid
    frozen = registered_thresholds(source, registration)
    assert frozen.model_dump() == load_thresholds(path).model_dump()
    assert verify_registration(source, registration.registration_id, path,
                               datetime.now(UTC)) == registration


def test_invalid_thresholds_are_not_registered(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml().replace("schema_version: 2", "schema_version: 9"))
    with pytest.raises(ValueError, match="schema_version"):
        preregister(path, tracking=tracking, family=family, signing=signing)
    assert tracking.client().get_experiment_by_name(f"kernelgate-{family}") is None


def test_editing_thresholds_after_preregistration_is_refused(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    registration = preregister(path, tracking=tracking, family=family, signing=signing)
    path.write_text(thresholds_yaml().replace("min_improvement: 1.2", "min_improvement: 1.0"))
    with pytest.raises(PreregistrationError, match="changed after preregistration"):
        verify_registration(_source(tracking, family, signing), registration.registration_id,
                            path, datetime.now(UTC))
    report = StandInReport(metrics=passing_metrics(), baseline_metrics=baseline_metrics(),
                           started_at=datetime.now(UTC))
    with pytest.raises(PreregistrationError):
        decide(report, load_thresholds(path), registration)


def test_evaluation_before_registration_is_refused(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    started = datetime.now(UTC) - timedelta(milliseconds=5)
    registration = preregister(path, tracking=tracking, family=family, signing=signing)
    with pytest.raises(PreregistrationError, match="before registration"):
        verify_registration(_source(tracking, family, signing), registration.registration_id,
                            path, started)


def test_passing_report_promotes_failing_does_not(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    good = promotable_chain(tracking, family, path, signing=signing)
    assert good.decision.passed
    change = promote(tracking, family, good, signing)
    assert change.previous_version is None
    assert registered_model.alias_version(tracking, family, "production") == good.version
    mv = tracking.client().get_model_version(registered_model.registered_model_name(family), good.version)
    assert mv.tags[tags.DECISION_RUN_ID] == good.decision_run_id
    assert mv.tags[tags.REGISTRATION_ID] == good.registration.registration_id

    bad_metrics = passing_metrics() | {"accuracy.all.nan_count": math.nan}
    bad = complete_chain(tracking, family, build_chain(
        tracking, family, path, bad_metrics, signing=signing,
        production_metrics=passing_metrics()), signing=signing)
    assert bad.decision.verdict == "reject"
    with pytest.raises(PromotionRefused, match="gate decision .* rejects"):
        promote(tracking, family, bad, signing)
    with pytest.raises(PromotionRefused, match="rejects"):
        registry.assign_canary(tracking, family, bad.version, decision_run_id=bad.decision_run_id,
                               signing=signing)
    assert registered_model.aliases(tracking, family) == {"production": good.version}
    # a passing decision for another build does not carry over to this version
    with pytest.raises(PromotionRefused, match="judged build"):
        registry.promote(tracking, family, bad.version, decision_run_id=good.decision_run_id,
                         expected_previous=good.version, signing=signing)
    assert _production_has_passing_decision(tracking, family, signing)


def test_promotion_is_a_compare_and_swap(tracking, family, tmp_path, signing):
    """Two candidates judged against the same production: the second promotion is
    refused once the first moved production."""
    path = _write(tmp_path, thresholds_yaml())
    first = promotable_chain(tracking, family, path, signing=signing)
    second = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, first, signing)
    with pytest.raises(PromotionRefused, match="not the vNone this candidate was judged against"):
        registry.promote(tracking, family, second.version, decision_run_id=second.decision_run_id,
                         expected_previous=None, signing=signing)
    assert registered_model.alias_version(tracking, family, "production") == first.version


@pytest.mark.parametrize("missing", ["shadow", "canary", "confirmation", "approval"])
def test_promotion_needs_the_complete_signed_chain(tracking, family, tmp_path, signing, missing):
    """Whoever calls promote meets the same rule: gate, shadow, approvals, every canary
    step and the confirmation split, each signed — deleting a run's evidence (or its
    tag) does not let a version through."""
    path = _write(tmp_path, thresholds_yaml(required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path, signing=signing)
    stage = {"shadow": "shadow", "canary": "canary", "confirmation": "gate",
             "approval": "approval"}[missing]
    experiment = tracking.client().get_experiment_by_name(f"kernelgate-{family}").experiment_id
    for run in tracking.client().search_runs([experiment], f"tags.`{tags.STAGE}` = '{stage}'"):
        if run.info.run_id != chain.decision_run_id:
            tracking.client().delete_run(run.info.run_id)
            _remove_attestations(tracking, run.info.run_id)
    with pytest.raises(PromotionRefused, match=missing):
        promote(tracking, family, chain, signing)
    assert registered_model.alias_version(tracking, family, "production") is None


def _remove_attestations(tracking, run_id):
    import shutil

    uri = tracking.client().get_run(run_id).info.artifact_uri
    shutil.rmtree(Path(uri.removeprefix("file://")) / "attestations", ignore_errors=True)


def test_failing_confirmation_blocks_promotion(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    chain = complete_chain(tracking, family,
                           build_chain(tracking, family, path, passing_metrics(), signing=signing),
                           signing=signing, confirmation_metrics=passing_metrics()
                           | {"accuracy.hard.max_error_ratio_to_baseline": 9.0})
    with pytest.raises(PromotionRefused, match="confirmation decision .* rejects"):
        promote(tracking, family, chain, signing)


def test_a_reused_confirmation_split_blocks_promotion(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    first = complete_chain(tracking, family, build_chain(
        tracking, family, path, passing_metrics(), signing=signing), signing=signing,
        confirmation_digest="c" * 64)
    promote(tracking, family, first, signing)
    second = complete_chain(tracking, family, build_chain(
        tracking, family, path, passing_metrics(), signing=signing), signing=signing,
        confirmation_digest="c" * 64)
    with pytest.raises(PromotionRefused, match="confirmation split .* already used"):
        promote(tracking, family, second, signing)


def test_rollback_restores_the_newest_usable_version(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    chains = [promotable_chain(tracking, family, path, signing=signing) for _ in range(3)]
    for chain in chains:
        promote(tracking, family, chain, signing)
    # the middle version was deleted from the registry since it served
    tracking.client().delete_model_version(registered_model.registered_model_name(family),
                                           chains[1].version)
    parent = tr.start_run(tracking, family, "rollout")
    back = registry.rollback(tracking, family, reason="p99 regression", signing=signing,
                             parent_run_id=parent)
    assert (back.version, back.previous_version) == (chains[0].version, chains[2].version)
    assert f"v{chains[1].version} no longer exists" in back.reason
    assert registered_model.alias_version(tracking, family, "production") == chains[0].version
    assert _production_has_passing_decision(tracking, family, signing)
    (run,) = tracking.client().search_runs(
        [tracking.client().get_run(parent).info.experiment_id],
        filter_string=f"tags.`{tags.PARENT}` = '{parent}'")
    assert run.data.tags[tags.STAGE] == "rollback"
    # rolling back the first production leaves none: the native baseline serves
    last = registry.rollback(tracking, family, reason="library upgrade broke it", signing=signing)
    assert last.version is None and "production taken down" in last.reason
    assert registered_model.alias_version(tracking, family, "production") is None
    with pytest.raises(ValueError, match="nothing to roll back"):
        registry.rollback(tracking, family, reason="again", signing=signing)


def test_rollback_passes_over_a_version_whose_evidence_was_altered(tracking, family, tmp_path,
                                                                   signing):
    path = _write(tmp_path, thresholds_yaml())
    first = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, first, signing)
    second = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, second, signing)
    local = Path(tracking.client().get_run(first.decision_run_id).info.artifact_uri
                 .removeprefix("file://")) / tags.DECISION_ARTIFACT
    local.write_text(local.read_text() + " ")
    change = registry.rollback(tracking, family, reason="nightly failure", signing=signing)
    assert change.version is None and "unusable" in change.reason
    assert registered_model.alias_version(tracking, family, "production") is None


def test_altered_decision_artifact_cannot_promote(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    chain = promotable_chain(tracking, family, path, signing=signing)
    run = tracking.client().get_run(chain.decision_run_id)
    local = Path(run.info.artifact_uri.removeprefix("file://")) / tags.DECISION_ARTIFACT
    local.write_text(local.read_text().replace('"profile": "test"', '"profile": "forged"'))
    with pytest.raises(PromotionRefused, match="signed digest"):
        promote(tracking, family, chain, signing)
    assert registered_model.alias_version(tracking, family, "production") is None


@pytest.mark.parametrize("answer", ["rejected", "timed_out", "wrong_version", "auto"])
def test_approval_required_by_policy(tracking, family, tmp_path, signing, answer):
    path = _write(tmp_path, thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = build_chain(tracking, family, path, passing_metrics(), signing=signing)
    policy = chain.decision.approval_policy
    with pytest.raises(PermissionError):
        record_auto_approval(policy, transition="canary->production", family=family, version="1")
    ids = dict(transition="canary->production", family=family, version=chain.version)
    record, why = {
        "rejected": (record_answer(ApprovalInput(decision="reject", approver="rm", comment="no"), **ids),
                     "does not approve"),
        "timed_out": (record_timeout(policy, **ids), "timed out"),
        "wrong_version": (record_answer(ApprovalInput(decision="approve", approver="rm", comment="ok"),
                                        **(ids | {"version": "999"})), "missing"),
        "auto": (ApprovalRecord(**ids, approved=True, approver="(auto)", comment="forged",
                                at=datetime.now(UTC), auto_approved=True), "requires a person"),
    }[answer]
    complete_chain(tracking, family, chain, signing=signing,
                   approve={"canary->production": record})
    with pytest.raises(PromotionRefused, match=why):
        promote(tracking, family, chain, signing)
    assert registered_model.alias_version(tracking, family, "production") is None


def test_a_persons_approval_promotes(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml(profile="prod", required_for=("canary->production",)))
    chain = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, chain, signing)
    assert registered_model.alias_version(tracking, family, "production") == chain.version
    approval_run = registered_model.version_tags(tracking, family, chain.version)[
        tags.approval_run_id("canary->production")]
    record, _ = load_approval(_source(tracking, family, signing), approval_run)
    assert record.approved and record.approver == "rm@example.com"


def test_auto_approval_allowed_only_with_a_reason_in_policy(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml(profile="dry", required_for=("canary->production",),
                                            auto_approve=True))
    chain = promotable_chain(tracking, family, path, signing=signing)
    run_id = registered_model.version_tags(tracking, family, chain.version)[
        tags.approval_run_id("canary->production")]
    record, _ = load_approval(_source(tracking, family, signing), run_id)
    assert record.auto_approved and "test dry run" in record.comment
    promote(tracking, family, chain, signing)
    assert registered_model.alias_version(tracking, family, "production") == chain.version


def test_shadow_clear_stale_and_reconcile(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    chain = build_chain(tracking, family, path, passing_metrics(), signing=signing)
    registry.assign_shadow(tracking, family, chain.version, signing=signing)
    assert registered_model.aliases(tracking, family) == {"shadow": chain.version}
    # moved by hand, outside the pipeline: the next pipeline step puts it back as signed
    name = registered_model.registered_model_name(family)
    tracking.client().set_registered_model_alias(name, "production", chain.version)
    assert registry.reconcile(tracking, family, signing) == [
        f"production: {chain.version} -> None (as signed)"]
    assert registered_model.aliases(tracking, family) == {"shadow": chain.version}
    with pytest.raises(ValueError, match="production"):
        registry.clear_stale(tracking, family, "production", reason="x", signing=signing)
    assert registry.clear_stale(tracking, family, "shadow", reason="superseded",
                                signing=signing) == chain.version
    assert registered_model.aliases(tracking, family) == {}


def test_stage_run_records_failure_and_parent(tracking, family):
    parent = tr.start_run(tracking, family, "rollout")
    with (pytest.raises(RuntimeError),
          tr.stage_run(tracking, family, "build", parent_run_id=parent) as child):
        raise RuntimeError("compile failed")
    run = tracking.client().get_run(child)
    assert run.info.status == "FAILED" and run.data.tags[tags.PARENT] == parent
    tr.end_run(tracking, parent)
    assert tracking.client().get_run(parent).info.status == "FINISHED"


def test_canary_step_is_recorded_signed(tracking, family, tmp_path, signing):
    path = _write(tmp_path, thresholds_yaml())
    chain = build_chain(tracking, family, path, passing_metrics(), signing=signing)
    plan = load_thresholds(path).canary
    rng = np.random.default_rng(0)
    abba = rng.lognormal(np.log(0.01), 0.3, (2, 20, 2))  # the paired test's raw samples
    result = analyse_canary_step(plan.steps[0], rng.lognormal(np.log(0.01), 0.3, 20),
                                 rng.lognormal(np.log(0.01), 0.3, 80), np.array([1e-6, np.nan]),
                                 error_count=0, nan_count=0, memory_start_bytes=0,
                                 memory_end_bytes=0, plan=plan, abba=(abba[0], abba[1]))
    assert np.isfinite(result.p_value) and len(result.log_ratios) == 20
    assert not result.passed  # the NaN drift breaches
    run_id = log_canary_step(tracking, family, result, version=chain.version,
                             decision_run_id=chain.decision_run_id, signing=signing)
    run = tracking.client().get_run(run_id)
    assert run.data.tags[tags.STAGE] == "canary"
    assert run.data.tags[tags.CANARY_PASSED] == "false"
    assert run.data.metrics["canary.p_value"] == pytest.approx(result.p_value)
    (signed,) = [a for a in _source(tracking, family, signing).attestations() if a.run_id == run_id]
    assert signed.kind == "canary" and signed.predicate["passed"] is False
    assert set(signed.subjects) == {f"{run_id}/canary/{result.step}.json"}


def _approver(tmp_path: Path, name: str = "alice"):
    """``(key file, public key, the thresholds lines naming it as the approver)``."""
    from lineage.signing import keys

    path = tmp_path / f"{name}.pem"
    public = keys.create_key(path)
    lines = (f'  approvers: [{{name: {name}, keyid: "{public.keyid}", '
             f'public_key: {dict(public.to_dict())}}}]\n')
    return path, public, lines


def _rejected_under(tracking, family, tmp_path, signing, text: str, name: str):
    """A registration of ``text`` whose candidate the gate rejected."""
    chain = build_chain(tracking, family, _write(tmp_path, text, name), passing_metrics() | {
        "accuracy.hard.max_error_ratio_to_baseline": 3.0}, signing=signing)
    assert chain.decision.verdict == "reject"
    return chain


def _newest(tracking, family, signing):
    from lineage.records.registration import latest_registration

    return latest_registration(_source(tracking, family, signing))[0]


def test_loosening_after_a_rejection_needs_a_named_approval(tracking, family, tmp_path, signing):
    """Threshold shopping: a rejected candidate re-run under a copy of the file with one
    bound relaxed is refused; the same file with a signed approval by a person the
    previous policy names is registered, and the registration says so."""
    from lineage.records.loosening_approval import sign_loosening
    from lineage.signing import keys

    alice, public, approver = _approver(tmp_path)
    rejected = _rejected_under(tracking, family, tmp_path, signing, thresholds_yaml() + approver,
                               "strict.yaml")
    loose = _write(tmp_path, (thresholds_yaml() + approver).replace(
        "op: \"<=\", value: 2.0", "op: \"<=\", value: 4.0"), "loose.yaml")
    with pytest.raises(LooseningRefused, match="error-ratio"):
        preregister(loose, tracking=tracking, family=family, signing=signing)
    mallory = keys.create_key(tmp_path / "mallory.pem")
    assert mallory.keyid != public.keyid
    previous = _newest(tracking, family, signing)
    forged = sign_loosening(keys.load_signer(tmp_path / "mallory.pem"), family, loose, "trust me",
                            previous=previous, bindings=None)
    with pytest.raises(LooseningRefused, match="not accepted"):
        preregister(loose, tracking=tracking, family=family, signing=signing,
                    loosening_approval=forged)
    approval = sign_loosening(keys.load_signer(alice), family, loose,
                              "the bound was set before we measured bf16 naive error",
                              previous=previous, bindings=None)
    registration = preregister(loose, tracking=tracking, family=family, signing=signing,
                               loosening_approval=approval)
    (signed,) = [a for a in _source(tracking, family, signing).attestations()
                 if a.run_id == registration.registration_id]
    assert signed.predicate["loosening_approval"]["approver"] == "alice"
    assert signed.predicate["previous_registration_id"] == rejected.registration.registration_id


def test_a_loosening_approval_is_no_bearer_token(tracking, family, tmp_path, signing):
    """An approval binds what it approves: the registration it loosens (an old approval
    cannot re-loosen the family after a later tightening and rejection), the rollout
    settings (another binding cannot ride along), an expiry, and a key not revoked."""
    from lineage.records.bindings import RolloutBindings
    from lineage.records.loosening_approval import sign_loosening
    from lineage.signing import keys
    from lineage.signing.attestations import Signing, TrustPolicy

    alice, public, approver = _approver(tmp_path)
    strict_text = thresholds_yaml() + approver
    _rejected_under(tracking, family, tmp_path, signing, strict_text, "strict.yaml")
    loose = _write(tmp_path, strict_text.replace("op: \"<=\", value: 2.0",
                                                 "op: \"<=\", value: 4.0"), "loose.yaml")
    first = _newest(tracking, family, signing)

    def approval(**kw) -> bytes:
        return sign_loosening(keys.load_signer(alice), family, loose, "measured bf16 naive",
                              previous=kw.pop("previous", first), bindings=kw.pop("bindings", None),
                              **kw)

    other = RolloutBindings(perf_shapes=None, perf_repeats=None, shadow_requests=8,
                            model_check=False, testset_profile="minimal", testset_digest="t",
                            documents_digest="d")
    with pytest.raises(LooseningRefused, match="other rollout settings.*testset_profile: approved"
                                               " None, this rollout 'minimal'"):
        preregister(loose, tracking=tracking, family=family, signing=signing,
                    loosening_approval=approval(), bindings=other)
    with pytest.raises(LooseningRefused, match="expired"):
        preregister(loose, tracking=tracking, family=family, signing=signing,
                    loosening_approval=approval(valid_for_s=-1))
    revoked = Signing(signer=signing.signer, key_dir=signing.key_dir,
                      trust=TrustPolicy(public_keys=signing.trust.public_keys,
                                        revoked=signing.trust.revoked | {public.keyid}))
    with pytest.raises(LooseningRefused, match="not accepted.*revoked"):
        preregister(loose, tracking=tracking, family=family, signing=revoked,
                    loosening_approval=approval())
    kept = approval()
    preregister(loose, tracking=tracking, family=family, signing=signing, loosening_approval=kept)
    # tightened again, and a candidate rejected under it: the kept approval was for the
    # first registration, not this one
    _rejected_under(tracking, family, tmp_path, signing, strict_text + "# again\n", "strict2.yaml")
    with pytest.raises(LooseningRefused, match=f"approves a loosening of registration "
                                               f"{first.predicate['registration_id']}"):
        preregister(loose, tracking=tracking, family=family, signing=signing,
                    loosening_approval=kept)


def test_a_loosening_approval_is_good_for_one_registration(tracking, family, tmp_path, signing):
    """Its nonce is spent by the registration that carries it (checked on the log, beside
    the binding to the previous registration, which a race could share)."""
    from lineage.records.loosening_approval import check_loosening_approval, sign_loosening
    from lineage.records.registration import latest_registration
    from lineage.signing import keys

    alice, _, approver = _approver(tmp_path)
    _rejected_under(tracking, family, tmp_path, signing, thresholds_yaml() + approver, "s.yaml")
    loose = _write(tmp_path, (thresholds_yaml() + approver).replace(
        "op: \"<=\", value: 2.0", "op: \"<=\", value: 4.0"), "loose.yaml")
    source = _source(tracking, family, signing)
    previous = latest_registration(source)
    envelope = sign_loosening(keys.load_signer(alice), family, loose, "once",
                              previous=previous[0], bindings=None)
    digest = __import__("hashlib").sha256(loose.read_bytes()).hexdigest()
    accepted = check_loosening_approval(envelope, previous, family, digest, ["x"], None, source,
                                        set())
    spender = type("Spent", (), {"kind": "registration", "run_id": "r-spent",
                                 "predicate": {"loosening_approval": accepted}})()
    spent = type("Source", (), {"attestations": lambda self: [spender]})()
    with pytest.raises(LooseningRefused, match="used already \\(registration r-spent\\)"):
        check_loosening_approval(envelope, previous, family, digest, ["x"], None, spent, set())


def test_a_v1_registration_in_the_chain_compares_with_v2_files(tracking, family, tmp_path,
                                                                signing):
    """A family registered under schema 1 (a store made before schema 2) keeps its chain:
    its frozen v1 bytes read back intact and compare with a v2 file field by field."""
    from lineage.records.registration import latest_registration

    v1_text = thresholds_yaml().replace("schema_version: 2\n", "schema_version: 1\n")
    assert "schema_version: 1\n" in v1_text
    v1 = _write(tmp_path, v1_text, "v1.yaml")
    rejected = build_chain(tracking, family, v1, passing_metrics() | {
        "accuracy.hard.max_error_ratio_to_baseline": 3.0}, signing=signing)
    assert rejected.decision.verdict == "reject"
    _, frozen = latest_registration(_source(tracking, family, signing))
    assert frozen.source_schema_version == 1
    assert frozen.source_sha256 == rejected.registration.thresholds_sha256
    looser = _write(tmp_path, thresholds_yaml().replace("max_nan_count: 0", "max_nan_count: 3"),
                    "looser.yaml")
    with pytest.raises(LooseningRefused, match=r"canary\.max_nan_count 0 -> 3"):
        preregister(looser, tracking=tracking, family=family, signing=signing)
    same = preregister(_write(tmp_path, thresholds_yaml(), "v2.yaml"), tracking=tracking,
                       family=family, signing=signing)  # same content as v1: not looser
    assert same.thresholds_sha256 != rejected.registration.thresholds_sha256


def test_a_decision_read_back_comes_from_its_signature_not_its_tags(tracking, family, tmp_path,
                                                                    signing):
    path = _write(tmp_path, thresholds_yaml())
    chain = build_chain(tracking, family, path, passing_metrics(), signing=signing)
    tracking.client().set_tag(chain.decision_run_id, tags.BUILD_RUN_ID, "f" * 32)
    record = load_decision(_source(tracking, family, signing), chain.decision_run_id)
    assert record.build_run_id == chain.build_run_id


def test_what_counts_as_a_rejection_for_the_loosening_rule():
    """Findings about a kernel count; a crash, want of evidence and the shadow/canary
    alias taken back when a rollout ends (its outcome says why) do not."""
    from types import SimpleNamespace

    from lineage.records.registration import _rejects

    def record(kind: str, **predicate) -> SimpleNamespace:
        return SimpleNamespace(kind=kind, predicate=predicate)

    counted = [record("decision", verdict="reject"), record("canary", passed=False),
               record("shadow", passed=False), record("outcome", result="rejected"),
               record("outcome", result="timed_out"), record("outcome", result="rolled_back"),
               record("alias", action="rollback", alias="production")]
    not_counted = [record("outcome", result="errored"),
                   record("outcome", result="rolled_back", inconclusive=True),
                   record("alias", action="rollback", alias="shadow"),
                   record("alias", action="rollback", alias="canary"),
                   record("decision", verdict="promote"), record("canary", passed=True)]
    assert [_rejects(a) for a in counted] == [True] * len(counted)
    assert [_rejects(a) for a in not_counted] == [False] * len(not_counted)


def test_after_a_rollback_to_an_earlier_version_its_audit_and_page_tell_the_rollback(
        tracking, family, tmp_path, signing):
    """``rollback --to``: the audit of the version restored lists its promotion and the
    rollback that restored it (with the reason); its version page starts with where it
    stands now; the one rolled away from says it was rolled back; the registered model's
    history tag carries every production move with its time and reason."""
    import json

    from lineage.audit.audit import audit

    path = _write(tmp_path, thresholds_yaml())
    chains = [promotable_chain(tracking, family, path, signing=signing) for _ in range(3)]
    for chain in chains:
        promote(tracking, family, chain, signing)
    first, last = chains[0].version, chains[2].version
    name = registered_model.registered_model_name(family)
    client = tracking.client()
    client.update_model_version(name, first, description="**promoted: the gate passed**")
    registry.rollback(tracking, family, reason="manual rollback requested by rm: pager storm",
                      signing=signing, to=first)

    report = audit(tracking, family, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    moves = [link.detail for link in report.chain if link.name == "production move"]
    assert len(moves) == 3, moves  # promoted, replaced by v2's promotion, restored
    assert "promoted to production" in moves[0]
    assert "replaced in production by a promotion to v" in moves[1]
    assert f"restored to production by a rollback from v{last}" in moves[2]
    assert "pager storm" in moves[2] and "pager storm" in report.render()

    page = client.get_model_version(name, first).description
    assert page.splitlines()[1].startswith("**In production since ")
    assert "(restored by a rollback)" in page.splitlines()[1]
    assert "pager storm" in page and "**promoted: the gate passed**" in page  # kept below
    gone = client.get_model_version(name, last).description
    assert gone.splitlines()[1].startswith("**Not in production: rollback at ")
    rolled_back = audit(tracking, family, last, trust=signing.trust, load_model=False)
    assert any(link.name == "production move" and "rolled back from production to "
               f"v{first}" in link.detail for link in rolled_back.chain)

    model_tags = client.get_registered_model(name).tags
    history = json.loads(model_tags[tags.PRODUCTION_HISTORY])
    assert [(h["action"], h["version"], h["from"]) for h in history] == [
        ("promote", chains[0].version, None), ("promote", chains[1].version, first),
        ("promote", last, chains[1].version), ("rollback", first, last)]
    assert all(h["at"] and h["run_id"] for h in history)
    assert "pager storm" in history[-1]["reason"]
    assert model_tags[tags.PREVIOUS_PRODUCTION] == last


def test_a_rewritten_version_page_keeps_its_production_story(tracking, family, tmp_path,
                                                             signing):
    """The rollout's end rewrites the version page (``describe_version``) after the
    promotion told its story: the story block stays at the top, once."""
    path = _write(tmp_path, thresholds_yaml())
    chain = promotable_chain(tracking, family, path, signing=signing)
    promote(tracking, family, chain, signing)
    for _ in range(2):
        text = registered_model.describe_version(tracking, family, chain.version,
                                                 "promoted: every criterion passed")
    assert text.count("Production history") == 1
    assert text.splitlines()[1].startswith("**In production since ")
    assert "**promoted: every criterion passed**" in text


def test_a_version_page_shows_the_evidence_under_its_verdict_line(tracking, family, signing):
    """``describe_version`` with evidence (the adoption test's claim and effect) puts it
    right under the verdict line; without evidence the page is what it was."""
    from tests.conftest_lineage import signed_build

    _, version = signed_build(tracking, family, signing)
    verdict = "not adopted at adoption"
    plain = registered_model.describe_version(tracking, family, version, verdict)
    evidence = ("### Adoption (preregistered `decision:`): **not worth adopting**\n\n"
                "- claim: c\n- measured: m")
    text = registered_model.describe_version(tracking, family, version, verdict,
                                             evidence=evidence)
    assert text.splitlines()[:7] == [f"**{verdict}**", "", *evidence.splitlines(), ""]
    assert text.replace(evidence + "\n\n", "") == plain
    assert "Adoption" not in plain


def test_check_rollback_refuses_what_rollback_would_and_moves_nothing(tracking, family, tmp_path,
                                                                        signing):
    path = _write(tmp_path, thresholds_yaml())
    with pytest.raises(ValueError, match="nothing to roll back"):
        registry.check_rollback(tracking, family, signing=signing)
    chains = [promotable_chain(tracking, family, path, signing=signing) for _ in range(2)]
    for chain in chains:
        promote(tracking, family, chain, signing)
    history = registered_model.production_history(tracking, family, signing.trust)
    with pytest.raises(PromotionRefused, match="v99 is not an earlier production version"):
        registry.check_rollback(tracking, family, signing=signing, to=99)
    with pytest.raises(ValueError, match="is what it serves now"):
        registry.check_rollback(tracking, family, signing=signing, to=chains[1].version)
    assert registry.check_rollback(tracking, family, signing=signing,
                                   to=chains[0].version) == chains[1].version
    # asked three times: production and its signed history are as they were
    assert registered_model.alias_version(tracking, family, "production") == chains[1].version
    assert registered_model.production_history(tracking, family, signing.trust) == history
