"""The family's append-only signed log, its checkpoints and re-anchoring.

Each judge is tested both ways: silent on an untouched store, firing on the planted cut.
Every test has a store, a key folder (checkpoints beside the key) and a kernelgate home
(the auditor's remembered heads) of its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lineage.aliases import registered_model, registry
from lineage.audit.audit import audit
from lineage.log import checkpoints, family_log, log_writer
from lineage.log.family_log import LogDamaged
from lineage.records.registration import LooseningRefused, preregister
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    build_chain,
    passing_metrics,
    promotable_chain,
    promote,
    thresholds_yaml,
)


@pytest.fixture
def lab(tmp_path):
    key_dir = tmp_path / "keys"
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(key_dir)),
                      trust=keys.folder_trust(key_dir), key_dir=key_dir)
    alice = tmp_path / "alice.pem"
    public = keys.create_key(alice)
    approver = (f'  approvers: [{{name: alice, keyid: "{public.keyid}", '
                f'public_key: {dict(public.to_dict())}}}]\n')
    strict = tmp_path / "strict.yaml"
    strict.write_text(thresholds_yaml() + approver)
    loose = tmp_path / "loose.yaml"
    loose.write_text(strict.read_text().replace('op: "<=", value: 2.0', 'op: "<=", value: 4.0'))

    class Lab:
        pass

    lab = Lab()
    lab.tracking, lab.family, lab.signing = tr.local_tracking(tmp_path / "store"), "fam", signing
    lab.key_dir, lab.home, lab.alice, lab.strict, lab.loose = key_dir, tmp_path / "home", alice, strict, loose
    lab.log = lambda: family_log.read(StoreSource(lab.tracking, "fam", signing.trust))
    lab.seen = checkpoints.Witnessing(key_dir=key_dir, home=lab.home)
    return lab


def _envelope(lab, entry) -> Path:
    uri = lab.tracking.client().get_run(entry.run_id).info.artifact_uri
    return Path(uri.removeprefix("file://")) / entry.path


def _promoted_then_rejected(lab):
    first = promotable_chain(lab.tracking, lab.family, lab.strict, signing=lab.signing)
    promote(lab.tracking, lab.family, first, lab.signing)
    rejected = build_chain(lab.tracking, lab.family, lab.strict, passing_metrics() | {
        "accuracy.hard.max_error_ratio_to_baseline": 3.0}, signing=lab.signing)
    assert rejected.decision.verdict == "reject"
    return first, rejected


def test_every_entry_is_numbered_and_chained_and_the_checkpoint_follows(lab):
    _promoted_then_rejected(lab)
    log = lab.log()
    assert log.problems == [] and log.legacy == 0 and log.length >= 10
    kinds = {e.kind for e in log.entries.values()}
    assert {"registration", "build", "evaluation", "decision", "shadow", "canary", "alias"} <= kinds
    assert sorted(log.entries) == list(range(1, log.length + 1))
    for seq in range(2, log.length + 1):
        assert log.entries[seq].predicate["log"]["prev"] == log.entries[seq - 1].envelope_sha256
    checkpoint, why = checkpoints.pipeline_checkpoint(log, lab.key_dir, lab.signing.trust)
    assert why == [] and checkpoint == log.head()
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                   load_model=False, witnessing=lab.seen)
    assert report.exit_code == 0, report.render()
    assert checkpoints.remembered(log, lab.home) == log.head()


def test_a_deleted_rejection_is_a_gap_the_loosening_rule_refuses(lab):
    _, rejected = _promoted_then_rejected(lab)
    log = lab.log()
    decision = next(e for e in log.entries.values()
                    if e.kind == "decision" and e.run_id == rejected.decision_run_id)
    assert decision.predicate["log"]["seq"] == log.length  # the rejection is the last entry
    _envelope(lab, decision).unlink()
    assert lab.log().problems == []  # no gap: only the checkpoint beside the key sees it
    with pytest.raises(LooseningRefused, match="last entries were cut"):
        preregister(lab.loose, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    with pytest.raises(LogDamaged, match="last entries were cut"):
        preregister(lab.strict, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                   load_model=False, witnessing=lab.seen)
    assert report.exit_code == 1 and any("were cut" in p for p in report.problems)


def test_a_rejection_deleted_in_the_middle_is_a_gap(lab):
    _, rejected = _promoted_then_rejected(lab)
    registry.reconcile(lab.tracking, lab.family, lab.signing)
    build_chain(lab.tracking, lab.family, lab.strict, passing_metrics(), signing=lab.signing)
    decision = next(e for e in lab.log().entries.values()
                    if e.kind == "decision" and e.run_id == rejected.decision_run_id)
    _envelope(lab, decision).unlink()
    with pytest.raises(LooseningRefused, match="missing entries"):
        preregister(lab.loose, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust, load_model=False)
    assert report.exit_code == 1 and any("is missing" in p for p in report.problems)


def test_a_cut_at_the_end_is_seen_by_the_checkpoint_and_the_remembered_head(lab):
    first, _ = _promoted_then_rejected(lab)
    assert audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                 load_model=False, witnessing=lab.seen).exit_code == 0
    log = lab.log()
    _envelope(lab, log.entries[log.length]).unlink()
    assert lab.log().problems == []  # the log alone cannot see its end cut
    with pytest.raises(LogDamaged, match="last entries were cut"):
        registry.reconcile(lab.tracking, lab.family, lab.signing)
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                   load_model=False, witnessing=lab.seen)
    text = "\n".join(report.problems)
    assert "pipeline's checkpoint" in text and "head you verified before" in text
    # the auditor's own head stops the key's owner too: without the key folder's checkpoint
    shutil.rmtree(lab.key_dir / checkpoints.CHECKPOINTS)
    alone = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                  load_model=False, witnessing=checkpoints.Witnessing(home=lab.home))
    assert any("head you verified before" in p for p in alone.problems), alone.render()


def test_a_checkpoint_brought_by_the_auditor_and_one_of_another_log(lab, tmp_path):
    _promoted_then_rejected(lab)
    log = lab.log()
    kept = tmp_path / "kept.json"
    kept.write_bytes(checkpoints.checkpoint_file(lab.key_dir, "fam", log.store).read_bytes())
    found, _ = checkpoints.witness(log, lab.signing.trust, files=[kept])
    assert found == []
    # a stranger's own pipeline key (a Signing only takes a signer its trust names)
    stranger = keys.ensure_pipeline_key(tmp_path / "other")
    forged = tmp_path / "forged.json"
    forged.write_bytes(checkpoints.sign_checkpoint(
        family_log.Head(family="fam", genesis=log.genesis, length=1, head=log.genesis),
        Signing(signer=keys.load_signer(stranger), trust=keys.folder_trust(tmp_path / "other"))))
    found, _ = checkpoints.witness(log, lab.signing.trust, files=[forged])
    assert any("unusable" in p for p in found)
    longer = family_log.Head(family="fam", genesis=log.genesis, length=log.length + 3, head="a" * 64)
    assert "were cut" in family_log.compare(log, longer, "x")[0][0]
    other = family_log.Head(family="fam", genesis="b" * 64, length=1, head="b" * 64)
    assert "another log" in family_log.compare(log, other, "x")[0][0]


def test_reanchor_needs_a_named_approver_and_is_reported_forever(lab, tmp_path):
    from lineage.aliases.reanchor import ReanchorRefused, reanchor

    first, _ = _promoted_then_rejected(lab)
    with pytest.raises(ReanchorRefused, match="intact"):
        reanchor(lab.tracking, lab.family, keys.load_signer(lab.alice), "nothing", lab.signing)
    log = lab.log()
    _envelope(lab, log.entries[3]).unlink()
    _envelope(lab, log.entries[log.length]).unlink()
    mallory = keys.load_signer(keys.ensure_pipeline_key(tmp_path / "mallory"))
    with pytest.raises(ReanchorRefused, match="not an approver"):
        reanchor(lab.tracking, lab.family, mallory, "let me in", lab.signing)
    entry = reanchor(lab.tracking, lab.family, keys.load_signer(lab.alice),
                     "disk lost; restored from backup", lab.signing)
    assert entry.predicate["missing"] == [3, log.length]
    after = lab.log()
    assert after.problems == [] and any("alice" in w for w in after.warnings)
    registry.reconcile(lab.tracking, lab.family, lab.signing)  # writers go on
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                   load_model=False, witnessing=lab.seen)
    assert any("re-anchor" in w for w in report.warnings), report.render()
    assert "WARNING" in report.render()
    # a re-anchored range counts as a possible rejection: loosening still needs approval
    with pytest.raises(LooseningRefused, match="missing entries"):
        preregister(lab.loose, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    assert registered_model.alias_version(lab.tracking, lab.family, "production") == first.version


def test_a_writer_without_a_key_folder_still_numbers(lab, tmp_path):
    bare = Signing(signer=lab.signing.signer, trust=lab.signing.trust)
    tracking = tr.local_tracking(tmp_path / "bare")
    promotable_chain(tracking, "bare", lab.strict, signing=bare)
    log = family_log.read(StoreSource(tracking, "bare", bare.trust))
    assert log.problems == [] and log.length > 5
    assert log_writer.damage(log, bare) == ([], None)


def test_a_reanchor_after_a_cut_rollback_keeps_what_serves(lab):
    """The signed rollback of production is cut from the end of the log (its envelope
    deleted): the signed history says the rolled-back version serves, MLflow the restored
    one. The re-anchor re-attests the aliases as the approver saw them, so the
    ``reconcile`` every rollout starts with does not resurrect the rolled-back version."""
    from lineage.aliases.reanchor import reanchor

    chains = [promotable_chain(lab.tracking, lab.family, lab.strict, signing=lab.signing)
              for _ in range(2)]
    for chain in chains:
        promote(lab.tracking, lab.family, chain, lab.signing)
    registry.rollback(lab.tracking, lab.family, reason="p99 regression", signing=lab.signing)
    restored, rolled_back = chains[0].version, chains[1].version
    log = lab.log()
    last = log.entries[log.length]
    assert last.kind == "alias" and last.predicate["action"] == "rollback"
    _envelope(lab, last).unlink()  # the end of the log cut: the rollback's signed move gone
    assert registered_model.alias_version(lab.tracking, lab.family, "production") == restored

    entry = reanchor(lab.tracking, lab.family, keys.load_signer(lab.alice),
                     "rollback envelope lost with a disk", lab.signing)
    assert entry.predicate["aliases"] == {"production": restored}
    changed = registry.reconcile(lab.tracking, lab.family, lab.signing)
    assert changed == []
    assert registered_model.alias_version(lab.tracking, lab.family, "production") == restored, \
        f"v{rolled_back} resurrected"
    moves, problems = registered_model.store_alias_history(lab.tracking, lab.family,
                                                           lab.signing.trust)
    assert problems == [] and moves[-1].predicate["action"] == "reattest"
    report = audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                   load_model=False, witnessing=lab.seen)
    assert not any("signed history leaves it" in p for p in report.problems), report.render()


def _rename_family(lab, to: str) -> None:
    client = lab.tracking.client()
    experiment = client.get_experiment_by_name(tr.experiment_name(lab.family))
    client.rename_experiment(experiment.experiment_id, tr.experiment_name(to))
    client.rename_registered_model(registered_model.registered_model_name(lab.family),
                                   registered_model.registered_model_name(to))


def test_a_family_renamed_away_starts_again_only_by_an_approvers_restart(lab, tmp_path):
    """The family's experiment and registered model renamed: the store holds no log of
    ``fam`` under its name. A new first entry is refused (the pipeline's checkpoint is
    kept per store and family), ``--new-family`` names the earlier log, and only an
    approver named in the earlier log's newest registration restarts it: the re-anchor
    continues the family's log, giving up every entry of the old one, said by the log."""
    from lineage.aliases.reanchor import ReanchorRefused, reanchor

    _promoted_then_rejected(lab)
    before = lab.log()
    assert before.store is not None and before.problems == []
    assert audit(lab.tracking, lab.family, "production", trust=lab.signing.trust,
                 load_model=False, witnessing=lab.seen).exit_code == 0
    assert log_writer.earlier_log(lab.tracking, "fresh", lab.key_dir) is None
    _rename_family(lab, "fam-old")
    assert "has or had a log" in log_writer.earlier_log(lab.tracking, "fam", lab.key_dir)
    with pytest.raises(LogDamaged, match="restarted"):
        preregister(lab.strict, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    assert lab.log().length == 0
    mallory = keys.load_signer(keys.ensure_pipeline_key(tmp_path / "mallory"))
    with pytest.raises(ReanchorRefused, match="not an approver"):
        reanchor(lab.tracking, lab.family, mallory, "let me start over", lab.signing)
    entry = reanchor(lab.tracking, lab.family, keys.load_signer(lab.alice),
                     "experiment renamed by mistake; the family starts again", lab.signing)
    assert entry.predicate["missing"] == list(range(1, before.length + 1))
    preregister(lab.strict, tracking=lab.tracking, family=lab.family, signing=lab.signing)
    after = lab.log()
    assert after.problems == [] and after.store == before.store
    assert after.genesis == before.genesis and after.length == before.length + 2
    found, said = checkpoints.witness(after, lab.signing.trust, key_dir=lab.key_dir,
                                      home=lab.home, location=lab.tracking.tracking_uri)
    assert found == [] and any("alice" in w for w in after.warnings), (found, said)


def test_a_log_without_a_store_identity_is_verified_and_said(lab):
    """A log whose first entry names no store (made before logs carried one) is read and
    compared as before; the log says so, as a warning."""
    promotable_chain(lab.tracking, lab.family, lab.strict, signing=lab.signing)
    log = lab.log()
    first = log.entries[1]
    first.predicate["log"].pop("store")
    legacy = family_log.FamilyLog(family="fam", entries=log.entries)
    assert legacy.store is None and legacy.head().store is None
    found, _ = checkpoints.witness(legacy, lab.signing.trust, key_dir=lab.key_dir,
                                   location=lab.tracking.tracking_uri)
    assert found == []  # known by the store id the key folder remembers for its place


def test_a_store_made_afresh_where_another_was_gets_a_new_id(lab):
    """The store emptied and made again in its folder (``make clean``, then a rollout):
    the pipeline starts the family there under a new store id; an auditor who saw the
    old store there fails the new one, naming both."""
    import sqlite3

    promotable_chain(lab.tracking, lab.family, lab.strict, signing=lab.signing)
    old = lab.log()
    checkpoints.remember(old, lab.home, lab.tracking.tracking_uri)
    folder = lab.key_dir.parent / "store"
    empty = tr.local_tracking(lab.key_dir.parent / "empty")
    empty.client().search_experiments()  # the tables of a new store
    with sqlite3.connect(folder.parent / "empty" / "mlflow.db") as src, \
            sqlite3.connect(folder / "mlflow.db") as dst:
        src.backup(dst)  # in place: this process's open connections see the new store
    shutil.rmtree(folder / "mlartifacts")
    assert log_writer.earlier_log(lab.tracking, lab.family, lab.key_dir) is None
    promotable_chain(lab.tracking, lab.family, lab.strict, signing=lab.signing)
    new = lab.log()
    assert new.problems == [] and new.store not in (None, old.store)
    found, _ = checkpoints.witness(new, lab.signing.trust, key_dir=lab.key_dir, home=lab.home,
                                   location=lab.tracking.tracking_uri)
    assert any("another store was put in its place" in p and "your kernelgate home" in p
               for p in found), found
    assert not any("key folder" in p for p in found), found
