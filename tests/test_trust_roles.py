"""Trust roles, key rotation and revocation, bindings of a registration, and values
MLflow stores differently from how they were signed.

Each detector is run on an untouched record (silent) and on a planted fault (fires).
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lineage.aliases import key_rotation, registered_model, registry
from lineage.audit import store_check
from lineage.audit.audit import audit
from lineage.records.bindings import BindingsRefused, RolloutBindings
from lineage.records.registration import preregister
from lineage.signing import keys
from lineage.signing.attestations import AttestationError, Signing, attest, verify_envelope
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr
from tests.conftest_lineage import promotable_chain, promote, slug, thresholds_yaml


@pytest.fixture
def tracking(tmp_path):
    return tr.local_tracking(tmp_path / "store")


@pytest.fixture
def family(request):
    return slug(request.node.name)


@pytest.fixture
def key_dir(tmp_path):
    folder = tmp_path / "keys"
    keys.ensure_pipeline_key(folder)
    return folder


def _signing(key_dir: Path) -> Signing:
    return Signing(signer=keys.load_signer(key_dir / "pipeline.pem"),
                   trust=keys.folder_trust(key_dir))


def _thresholds(tmp_path: Path) -> Path:
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    return path


def test_an_approver_key_is_never_a_pipeline_key(tmp_path, key_dir, tracking, family):
    from flows.cli_keys import keys_app

    result = CliRunner().invoke(keys_app, ["create", "--name", "alice", "--key-dir", str(key_dir)])
    assert result.exit_code == 0, result.output
    assert not (key_dir / "alice.pem").exists() and not (key_dir / "alice.pub.json").exists()
    alice_pem = key_dir / keys.APPROVER_DIR / "alice.pem"
    alice = keys.load_signer(alice_pem)
    trust = keys.folder_trust(key_dir)
    assert alice.public_key.keyid not in trust.public_keys and len(trust.public_keys) == 1
    # an approver key left in the folder by an older `keys create --name` is not trusted either
    (key_dir / "bob.pub.json").write_text((key_dir / keys.APPROVER_DIR / "alice.pub.json").read_text())
    assert alice.public_key.keyid not in keys.folder_trust(key_dir).public_keys
    with pytest.raises(ValueError, match="not a pipeline-role key"):
        Signing(signer=alice, trust=keys.folder_trust(key_dir))
    # alice signs a promotion herself: neither the registry nor the audit counts it
    signing = _signing(key_dir)
    chain = promotable_chain(tracking, family, _thresholds(tmp_path), signing=signing)
    run_id = tr.start_run(tracking, family, "promotion")
    attest(tracking, run_id, "alias", {"family": family, "alias": "production",
                                       "version": chain.version, "action": "promote",
                                       "sequence": 1, "previous_envelope": None}, alice,
           subjects={"x": "0" * 64})
    tr.end_run(tracking, run_id, "FINISHED")
    assert registered_model.production_history(tracking, family, signing.trust) == []
    tracking.client().set_registered_model_alias(registered_model.registered_model_name(family),
                                                 "production", chain.version)
    report = audit(tracking, family, "production", trust=signing.trust, load_model=False)
    assert report.exit_code != 0
    assert any("does not verify" in p for p in report.problems), report.render()


def test_rotate_revoke_reconcile_keeps_production_and_the_audit_passes(tmp_path, key_dir,
                                                                       tracking, family):
    signing = _signing(key_dir)
    chain = promotable_chain(tracking, family, _thresholds(tmp_path), signing=signing)
    promote(tracking, family, chain, signing)
    stolen = tmp_path / "stolen.pem"  # what a thief of the old key holds
    stolen.write_bytes((key_dir / "pipeline.pem").read_bytes())
    old, _ = keys.rotate(key_dir)
    rotated = _signing(key_dir)
    assert key_rotation.reattest(tracking, family, rotated, reason="rotation") == [
        f"production -> v{chain.version}"]
    assert keys.revoke(old, key_dir) is not None  # from its retirement: a position
    after = _signing(key_dir)
    assert after.trust.revoked_at and old not in after.trust.revoked
    assert registry.reconcile(tracking, family, after) == []
    assert registered_model.alias_version(tracking, family, "production") == chain.version
    report = audit(tracking, family, "production", trust=after.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    # the thief signs with the old key now: void; backdated to before the revocation, the
    # move is out of order in the signed history
    from lineage.signing.attestations import make_envelope

    thief = keys.load_signer(stolen)
    with pytest.raises(AttestationError, match="revoked before"):
        verify_envelope(make_envelope("alias", {"x": "0" * 64}, {"alias": "production"}, thief), after.trust)
    moves, _ = registered_model.store_alias_history(tracking, family, after.trust)
    run_id = tr.start_run(tracking, family, "promotion")
    attest(tracking, run_id, "alias", {
        "family": family, "alias": "production", "version": None, "action": "clear",
        "sequence": len(moves) + 1, "previous_envelope": moves[-1].envelope_sha256,
        "attested_at": moves[0].predicate["attested_at"]}, thief, subjects={"x": "0" * 64})
    tr.end_run(tracking, run_id, "FINISHED")
    _, problems = registered_model.store_alias_history(tracking, family, after.trust)
    assert any("backdated" in p for p in problems), problems
    tracking.client().delete_run(run_id)
    # revoked from the start instead: the old key's entries are void, so the family log is
    # damaged (re-anchor needed) and reconcile refuses; still nothing moves production
    from lineage.log.family_log import LogDamaged

    keys.revoke(old, key_dir, at=None)
    with pytest.raises(LogDamaged):
        registry.reconcile(tracking, family, _signing(key_dir))
    assert registered_model.alias_version(tracking, family, "production") == chain.version


def test_a_positioned_revocation_voids_later_signatures_only(key_dir, tmp_path):
    from datetime import UTC, datetime, timedelta

    from lineage.signing.attestations import make_envelope

    signer = keys.load_signer(key_dir / "pipeline.pem")
    envelope = make_envelope("outcome", {"x": "0" * 64}, {"note": "before"}, signer)
    trust = keys.folder_trust(key_dir)
    keys.revoke(signer.public_key.keyid, key_dir, at=datetime.now(UTC) + timedelta(seconds=60))
    assert verify_envelope(envelope, keys.folder_trust(key_dir)).keyid == signer.public_key.keyid
    keys.revoke(signer.public_key.keyid, key_dir, at=datetime.now(UTC) - timedelta(seconds=60))
    with pytest.raises(AttestationError, match="revoked before"):
        verify_envelope(envelope, keys.folder_trust(key_dir))
    assert verify_envelope(envelope, trust)  # the trust from before the revocation


def _bindings(**changes) -> RolloutBindings:
    values = dict(perf_shapes=None, perf_repeats=3, shadow_requests=8, model_check=False,
                  testset_profile="ci", testset_digest="a" * 64, documents_digest="b" * 64)
    return RolloutBindings(**(values | changes))


def test_a_registration_reused_with_other_settings_is_refused(tmp_path, tracking, family,
                                                              signing):
    path = _thresholds(tmp_path)
    first = preregister(path, tracking=tracking, family=family, signing=signing,
                        bindings=_bindings())
    signed = [a for a in StoreSource(tracking, family, signing.trust).attestations()
              if a.run_id == first.registration_id and a.kind == "registration"]
    assert signed[0].predicate["bindings"]["shadow_requests"] == 8
    preregister(path, tracking=tracking, family=family, signing=signing, bindings=_bindings())
    with pytest.raises(BindingsRefused, match="shadow_requests: registered 8, this rollout 2"):
        preregister(path, tracking=tracking, family=family, signing=signing,
                    bindings=_bindings(shadow_requests=2))
    other = tmp_path / "other.yaml"
    other.write_text(thresholds_yaml() + "# a new registration\n")
    again = preregister(other, tracking=tracking, family=family, signing=signing,
                        bindings=_bindings(shadow_requests=2))
    assert again.registration_id != first.registration_id


def test_an_infinite_signed_metric_reads_back_without_a_false_alarm(tracking, family, signing):
    from gates.canary import analyse_canary_step
    from gates.thresholds import load_thresholds
    from lineage.records.records import log_canary_step
    plan = load_thresholds(Path(__file__).parent / "data" / "thresholds-flow-test.yaml").canary
    result = analyse_canary_step(plan.steps[0], [0.01] * 10, [0.0] * 10, [0.0] * 10, 0, 0, 0, 0,
                                 plan)
    assert math.isinf(result.median_latency_ratio), result.median_latency_ratio
    run_id = log_canary_step(tracking, family, result, version="1", decision_run_id="d",
                             signing=signing)
    shown = tracking.client().get_run(run_id).data.metrics["canary.median_latency_ratio"]
    assert not math.isinf(shown)  # MLflow keeps the largest double
    source = StoreSource(tracking, family, signing.trust)
    _, _, problems = store_check.cross_check(tracking, source, {run_id}, family, "1", None)
    assert problems == []
    db = tracking.tracking_uri.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE metrics SET value = 1.0 WHERE run_uuid = ? AND key = ?",
                     (run_id, "canary.median_latency_ratio"))
        conn.execute("UPDATE latest_metrics SET value = 1.0 WHERE run_uuid = ? AND key = ?",
                     (run_id, "canary.median_latency_ratio"))
    _, _, problems = store_check.cross_check(tracking, source, {run_id}, family, "1", None)
    assert problems == [f"run {run_id}: metric canary.median_latency_ratio is 1.0, signed inf"]


def test_dataset_inputs_are_compared_with_the_signed_list():
    signed = [{"name": "t", "context": "heldout", "digest": "d1", "sha256": "s1", "source": "x"}]
    assert store_check.dataset_problems("r", signed, signed) == []
    edited = [dict(signed[0], digest="d2")]
    assert store_check.dataset_problems("r", edited, signed) == [
        "run r: dataset input t (heldout): digest is 'd2', signed 'd1'"]
    assert "not shown" in store_check.dataset_problems("r", [], signed)[0]
    # the same content read from elsewhere (a relocated store): a warning, not a problem
    moved = [dict(signed[0], source="y")]
    assert store_check.dataset_problems("r", moved, signed) == []
    assert store_check.moved_datasets("r", moved, signed) == [
        "run r: dataset input t (heldout): source is 'y', signed 'x'; its digest and sha256 "
        "are the signed ones (the same data, located elsewhere: a relocated or restored store)"]
    # other content under the moved source: both named as problems, no warning
    other = [dict(signed[0], source="y", sha256="s2")]
    assert store_check.dataset_problems("r", other, signed) == [
        "run r: dataset input t (heldout): sha256 is 's2', signed 's1'",
        "run r: dataset input t (heldout): source is 'y', signed 'x'"]
    assert store_check.moved_datasets("r", other, signed) == []
