"""Appends to a family's log as a compare-and-swap on its sequence, on an
embedded store with a folder sequencer (``lineage.log.log_sequence.FolderSequencer``; the
servers profile's Prefect-variable one is drilled in ``tests/test_services_attacks.py``)."""

from __future__ import annotations

import concurrent.futures
import sqlite3
import threading

import pytest

from lineage.aliases import registered_model, registry
from lineage.log import family_log, log_writer
from lineage.log.family_log import LogDamaged
from lineage.log.log_sequence import FolderSequencer, SequenceTaken, safe_name
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from tests.conftest_lineage import promotable_chain, signed_build, thresholds_yaml


@pytest.fixture
def lab(tmp_path):
    key_dir = tmp_path / "keys"
    signer = keys.load_signer(keys.ensure_pipeline_key(key_dir))
    sequencer = FolderSequencer(tmp_path / "claims")
    signing = Signing(signer=signer, trust=keys.folder_trust(key_dir), sequencer=sequencer)
    tracking = tr.local_tracking(tmp_path / "store")
    return tracking, signing, sequencer, tmp_path


def test_of_many_claims_of_one_position_exactly_one_wins(tmp_path):
    sequencer = FolderSequencer(tmp_path)
    barrier = threading.Barrier(16)

    def claim(i: int) -> bool:
        barrier.wait()
        return sequencer.claim("fam", 7, f"{i:064x}")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        won = list(pool.map(claim, range(16)))
    assert won.count(True) == 1
    assert sequencer.claim("fam", 8, "0" * 64) and not sequencer.claim("fam", 8, "1" * 64)
    assert sequencer.claim("other", 7, "0" * 64)  # positions are per family


def test_family_names_map_to_distinct_safe_names():
    names = {safe_name(f) for f in ("fam", "Fam", "f.am", "f_am", "f-am")}
    assert len(names) == 5 and all(n == n.lower() for n in names)


class Racer:
    """A sequencer whose first claim loses to another writer's whole move, made just
    before it (the race, deterministically)."""

    def __init__(self, inner: FolderSequencer, race) -> None:
        self.inner, self.race, self.raced = inner, race, False

    def claim(self, family, seq, digest):
        if not self.raced:
            self.raced = True
            self.race()
        return self.inner.claim(family, seq, digest)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_lost_claim_logs_nothing(lab):
    tracking, signing, sequencer, _ = lab
    signed_build(tracking, "fam", signing)
    length = family_log.read(StoreSource(tracking, "fam", signing.trust)).length
    sequencer.claim("fam", length + 1, "f" * 64)  # another writer holds the next position
    with (pytest.raises(SequenceTaken, match=f"entry {length + 1} of fam"),
          tr.stage_run(tracking, "fam", "promotion") as run_id):
        tr.log_text(tracking, run_id, "{}", "rollout/outcome.json")
        log_writer.append(tracking, run_id, "outcome", {"family": "fam"}, signing, retry=False)
    log = family_log.read(StoreSource(tracking, "fam", signing.trust))
    assert log.length == length and log.problems == []


def test_a_move_that_lost_its_position_is_signed_again_from_the_new_head(lab):
    tracking, signing, sequencer, _ = lab
    _, v1 = signed_build(tracking, "fam", signing)
    _, v2 = signed_build(tracking, "fam", signing)
    racing = signing.model_copy(update={"sequencer": Racer(sequencer, lambda: registry.assign_shadow(
        tracking, "fam", v1, signing=signing))})
    registry.assign_shadow(tracking, "fam", v2, signing=racing)
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["sequence"] for m in moves] == [1, 2]
    assert [m.predicate["version"] for m in moves] == [v1, v2]
    assert moves[1].predicate["previous_version"] == v1  # re-derived from the new head
    assert family_log.read(StoreSource(tracking, "fam", signing.trust)).problems == []
    assert registered_model.alias_version(tracking, "fam", "shadow") == v2


def test_an_assignment_takes_its_previous_version_from_the_signed_history(lab, monkeypatch):
    """Another writer signed its move but has not set the MLflow alias yet (it sets it after
    signing) when this one reads the alias: the move must still name v1 as its previous
    version. Seen in the services drill (two processes, CI 2026-12-01): previous None."""
    tracking, signing, _, _ = lab
    _, v1 = signed_build(tracking, "fam", signing)
    _, v2 = signed_build(tracking, "fam", signing)
    with monkeypatch.context() as m:  # the other writer, stopped between signing and alias
        m.setattr(registry, "_apply", lambda *args, **kwargs: None)
        registry.assign_shadow(tracking, "fam", v1, signing=signing)
    assert registered_model.alias_version(tracking, "fam", "shadow") is None
    registry.assign_shadow(tracking, "fam", v2, signing=signing)
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["version"] for m in moves] == [v1, v2]
    assert moves[1].predicate["previous_version"] == v1
    assert registered_model.alias_version(tracking, "fam", "shadow") == v2



@pytest.mark.parametrize("action", ["rollback", "clear"])
def test_a_move_away_from_a_version_another_writer_replaced_is_refused(lab, monkeypatch, action):
    """The caller reads the MLflow alias (v1) after another writer signed shadow -> v2 and
    before it set the alias (it sets it after signing): rolling back or clearing v1 is
    refused naming v2, nothing signed or tagged. Signed as it was before (only a lost
    compare-and-swap was checked), it said v1 was rolled back and took v2 down unsigned."""
    tracking, signing, _, _ = lab
    _, v1 = signed_build(tracking, "fam", signing)
    _, v2 = signed_build(tracking, "fam", signing)
    registry.assign_shadow(tracking, "fam", v1, signing=signing)
    with monkeypatch.context() as m:  # the other writer, stopped between signing and alias
        m.setattr(registry, "_apply", lambda *args, **kwargs: None)
        registry.assign_shadow(tracking, "fam", v2, signing=signing)
    assert registered_model.alias_version(tracking, "fam", "shadow") == v1
    length = family_log.read(StoreSource(tracking, "fam", signing.trust)).length
    with pytest.raises(registry.PromotionRefused,
                       match=rf"{action} of shadow refused: another writer moved it to v{v2} "
                             rf"meanwhile \(this move expected v{v1}\)"):
        if action == "rollback":
            registry.rollback(tracking, "fam", alias="shadow", reason="drill", signing=signing)
        else:
            registry.clear_stale(tracking, "fam", "shadow", reason="drill", signing=signing)
    log = family_log.read(StoreSource(tracking, "fam", signing.trust))
    assert log.length == length and log.problems == []
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["version"] for m in moves] == [v1, v2]
    assert registered_model.alias_version(tracking, "fam", "shadow") == v1  # nothing applied
    assert not {tags.ROLLBACK_REASON, tags.STALE_REASON} & set(
        registered_model.version_tags(tracking, "fam", v1))



def test_a_promotion_refuses_a_production_another_writer_moved_while_it_checked(lab,
                                                                                 monkeypatch):
    """Production is None when the second candidate's promotion reads it; while it checks
    the chain, another writer signs production -> the first candidate (alias not set yet).
    The second promotion is refused naming that version, nothing signed; signed as before
    (only a lost compare-and-swap was checked), it replaced the first unseen, previous None."""
    tracking, signing, _, tmp_path = lab
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    first = promotable_chain(tracking, "fam", path, signing=signing)
    second = promotable_chain(tracking, "fam", path, signing=signing)
    check, raced = registry._refuse_incomplete, []

    def racing(tracking_, family, version, *args):
        evidence = check(tracking_, family, version, *args)
        if version == second.version and not raced:  # the other writer, signing meanwhile
            raced.append(first.version)
            with monkeypatch.context() as m:  # stopped between signing and the alias
                m.setattr(registry, "_apply", lambda *args, **kwargs: None)
                registry.promote(tracking, "fam", first.version, expected_previous=None,
                                 decision_run_id=first.decision_run_id, signing=signing)
        return evidence

    monkeypatch.setattr(registry, "_refuse_incomplete", racing)
    with pytest.raises(registry.PromotionRefused,
                       match=rf"promote of production refused: another writer moved it to "
                             rf"v{first.version} meanwhile \(this move expected vNone\)"):
        registry.promote(tracking, "fam", second.version, expected_previous=None,
                         decision_run_id=second.decision_run_id, signing=signing)
    assert raced == [first.version]
    assert family_log.read(StoreSource(tracking, "fam", signing.trust)).problems == []
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["version"] for m in moves
                               if m.predicate["alias"] == "production"] == [first.version]
    assert registered_model.alias_version(tracking, "fam", "production") is None
    assert tags.PROMOTED_AT not in registered_model.version_tags(tracking, "fam", second.version)



def test_a_promotion_leaves_a_shadow_another_writer_moved_before_it_was_retired(lab,
                                                                                monkeypatch):
    """Promoting the version ``shadow`` pointed at retires that alias; when another writer
    signed shadow -> v_other in between (alias not set yet), the alias is not this
    version's to clear: the promotion completes and the other writer's shadow stays signed
    (the retiring clear refused inside promote had raised after production moved)."""
    tracking, signing, _, tmp_path = lab
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    chain = promotable_chain(tracking, "fam", path, signing=signing)
    _, other = signed_build(tracking, "fam", signing)
    registry.assign_shadow(tracking, "fam", chain.version, signing=signing)
    move, raced = registry._move, []

    def racing(tracking_, family, change, signing_, **kwargs):
        if change.action == "clear" and not raced:  # the other writer, signing meanwhile
            raced.append(other)
            with monkeypatch.context() as m:  # stopped between signing and the alias
                m.setattr(registry, "_apply", lambda *args, **kwargs: None)
                registry.assign_shadow(tracking, "fam", other, signing=signing)
        return move(tracking_, family, change, signing_, **kwargs)

    monkeypatch.setattr(registry, "_move", racing)
    promoted = registry.promote(tracking, "fam", chain.version, expected_previous=None,
                                decision_run_id=chain.decision_run_id, signing=signing)
    assert raced == [other] and promoted.version == chain.version
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["action"] for m in moves] == ["assign", "promote",
                                                                          "assign"]
    assert registered_model.signed_aliases(moves) == {"production": chain.version,
                                                      "shadow": other}
    assert registered_model.alias_version(tracking, "fam", "production") == chain.version
    assert tags.PROMOTED_AT in registered_model.version_tags(tracking, "fam", chain.version)


def test_a_position_claimed_and_never_logged_is_given_up_on_naming_it(lab, monkeypatch):
    tracking, signing, sequencer, _ = lab
    _, version = signed_build(tracking, "fam", signing)
    length = family_log.read(StoreSource(tracking, "fam", signing.trust)).length
    sequencer.claim("fam", length + 1, "f" * 64)  # a writer that died after its claim
    monkeypatch.setattr(log_writer, "CLAIM_WAIT_S", 0.5)
    with pytest.raises(SequenceTaken, match="died between its claim and its entry"):
        registry.assign_shadow(tracking, "fam", version, signing=signing)
    assert registered_model.alias_version(tracking, "fam", "shadow") is None


def test_concurrent_alias_moves_are_each_signed_once_in_one_unbroken_history(lab):
    tracking, signing, _, _ = lab
    versions = [signed_build(tracking, "fam", signing)[1] for _ in range(2)]
    barrier = threading.Barrier(6)

    def move(i: int) -> str:
        barrier.wait()
        return registry.assign_shadow(tracking, "fam", versions[i % 2], signing=signing).version

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        moved = list(pool.map(move, range(6)))
    log = family_log.read(StoreSource(tracking, "fam", signing.trust))
    assert log.problems == [], log.problems
    moves, problems = registered_model.store_alias_history(tracking, "fam", signing.trust)
    assert problems == [] and [m.predicate["sequence"] for m in moves] == list(range(1, 7))
    assert sorted(str(m.predicate["version"]) for m in moves) == sorted(moved)
    for earlier, later in zip(moves, moves[1:], strict=False):  # each move's previous is the one before
        assert later.predicate["previous_version"] == earlier.predicate["version"]
    signed = registered_model.signed_aliases(moves)["shadow"]
    assert registered_model.alias_version(tracking, "fam", "shadow") == signed


def test_an_older_copy_of_the_store_restored_is_a_cut_log(lab):
    tracking, signing, _, tmp_path = lab
    _, version = signed_build(tracking, "fam", signing)
    registry.assign_shadow(tracking, "fam", version, signing=signing)
    backup = sqlite3.connect(tmp_path / "backup.db")
    with sqlite3.connect(tmp_path / "store" / "mlflow.db") as live:
        live.backup(backup)
    registry.rollback(tracking, "fam", alias="shadow", reason="drill", signing=signing)
    with sqlite3.connect(tmp_path / "store" / "mlflow.db") as live:
        backup.backup(live)  # the older backup restored (the same file: the store stays open)
    restored = tracking
    with pytest.raises(LogDamaged, match="last entries were cut"):
        log_writer.require_intact(restored, "fam", signing)
    with pytest.raises(LogDamaged, match="claims/fam/checkpoint.json"):
        registry.assign_shadow(restored, "fam", version, signing=signing)
