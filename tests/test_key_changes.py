"""Key changes as entries of each family's signed log: rotation, revocation
and new approver keys are seen by the audit in log order, and a deleted one is a gap."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lineage.aliases import key_changes
from lineage.aliases.key_changes import KeyChange
from lineage.audit.audit_report import AuditReport
from lineage.log import family_log
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr

FAMILIES = ("fam-a", "fam-b")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGATE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking = tr.tracking_for(tmp_path / "store")
    for family in FAMILIES:
        tracking.client().create_registered_model(f"kernelgate-{family}")
    key_dir = tmp_path / "keys"
    keys.ensure_pipeline_key(key_dir)
    return tracking, key_dir, tmp_path / "store"


def _signing(key_dir: Path) -> Signing:
    return Signing(signer=keys.load_signer(key_dir / "pipeline.pem"),
                   trust=keys.folder_trust(key_dir), key_dir=key_dir)


def _log(tracking, family, key_dir):
    return family_log.read(StoreSource(tracking, family, keys.folder_trust(key_dir)))


def _cli(*args: str) -> tuple[int, str]:
    from flows.cli import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_key_changes_are_entries_of_every_familys_log_in_order(store):
    tracking, key_dir, _ = store
    changes = [KeyChange(action="approver_key", keyid="a" * 64, name="alice"),
               KeyChange(action="rotate", keyid="b" * 64, new_keyid="c" * 64),
               KeyChange(action="revoke", keyid="b" * 64, revoked_from=None)]
    for change in changes:
        assert key_changes.log_everywhere(tracking, change, _signing(key_dir)) == list(FAMILIES)
    for family in FAMILIES:
        log = _log(tracking, family, key_dir)
        assert log.problems == [] and log.length == 3
        assert [log.entries[s].kind for s in (1, 2, 3)] == ["key_change"] * 3
        lines = key_changes.key_changes(log)
        assert [line.split(":")[0] for line in lines] == ["entry 1", "entry 2", "entry 3"]
        assert "created for alice" in lines[0] and "retired" in lines[1]
        assert "revoked from the start" in lines[2]


def test_a_deleted_key_change_is_a_gap(store):
    tracking, key_dir, _ = store
    for change in (KeyChange(action="approver_key", keyid="a" * 64, name="alice"),
                   KeyChange(action="revoke", keyid="b" * 64, revoked_from="2026-01-01T00:00:00"),
                   KeyChange(action="approver_key", keyid="d" * 64, name="dana")):
        key_changes.log_key_change(tracking, "fam-a", change, _signing(key_dir))
    middle = _log(tracking, "fam-a", key_dir).entries[2]
    uri = tracking.client().get_run(middle.run_id).info.artifact_uri
    (Path(uri.removeprefix("file://")) / middle.path).unlink()
    log = _log(tracking, "fam-a", key_dir)
    assert any("entry 2 of 3 is missing" in p for p in log.problems), log.problems
    assert len(key_changes.key_changes(log)) == 2


def test_the_cli_signs_rotation_revocation_and_approver_keys_into_the_logs(store):
    tracking, key_dir, store_dir = store
    old = keys.load_signer(key_dir / "pipeline.pem").public_key.keyid
    code, out = _cli("keys", "create", "--name", "alice", "--key-dir", str(key_dir),
                     "--store-dir", str(store_dir))
    assert code == 0 and "logged in fam-a's signed log: approver key" in out, out
    code, out = _cli("keys", "rotate", "--key-dir", str(key_dir), "--store-dir", str(store_dir))
    assert code == 0 and f"pipeline key {old[:12]} retired" in out, out
    new = keys.load_signer(key_dir / "pipeline.pem").public_key.keyid
    code, out = _cli("keys", "revoke", new, "--key-dir", str(key_dir),
                     "--store-dir", str(store_dir))
    assert code != 0 and "current pipeline key" in out, out  # refused, nothing written
    code, out = _cli("keys", "revoke", old, "--key-dir", str(key_dir),
                     "--store-dir", str(store_dir))
    assert code == 0 and f"key {old[:12]} revoked from" in out, out
    for family in FAMILIES:
        log = _log(tracking, family, key_dir)
        assert log.problems == [], log.problems
        lines = key_changes.key_changes(log)
        assert len(lines) == 3 and "alice" in lines[0] and "retired" in lines[1]
        assert "revoked from" in lines[2]
    report = AuditReport(family="fam-a", target="production", model_name="kernelgate-fam-a",
                         version=None, aliases={}, signed_aliases={}, chain=[],
                         registrations=[], attestations_verified=3, artifacts_verified=0,
                         artifacts_checked=0, problems=[], key_changes=lines)
    assert "key changes (signed log order):" in report.render()


def test_a_key_rotation_waits_for_a_rollout_of_any_family_to_end(store):
    """A rollout holds its family's lock for its whole run (another process here); the
    rotation waits for it before the key folder changes, so the rollout never signs with
    a key retired under it. The lock's holder says when it let go; the rotation's key
    must be newer than that."""
    import subprocess
    import sys
    import time

    tracking, key_dir, store_dir = store
    old = keys.load_signer(key_dir / "pipeline.pem").public_key.keyid
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from lineage.rollout.rollout import family_lock\n"
         f"with family_lock({str(store_dir)!r}, 'fam-b'):\n"
         "    print('held', flush=True)\n"
         "    time.sleep(4)\n"
         "    print(time.time(), flush=True)\n"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    assert holder.stdout.readline().strip() == "held"
    code, out = _cli("keys", "rotate", "--key-dir", str(key_dir), "--store-dir", str(store_dir))
    rotated_at = time.time()
    released_at = float(holder.stdout.readline())
    holder.wait(timeout=30)
    assert code == 0, out
    new_key = key_dir / "pipeline.pem"
    assert keys.load_signer(new_key).public_key.keyid != old
    # the new key was written after the holder let go, not while it held the lock
    assert new_key.stat().st_mtime >= released_at - 0.05, (new_key.stat().st_mtime, released_at)
    assert rotated_at >= released_at


def test_a_revocation_with_an_unreadable_time_is_refused_before_anything_changes(store):
    tracking, key_dir, store_dir = store
    code, out = _cli("keys", "rotate", "--key-dir", str(key_dir), "--store-dir", str(store_dir))
    assert code == 0, out
    before = sorted(p.name for p in key_dir.rglob("*"))
    old = [k for k in keys.folder_trust(key_dir).public_keys
           if k != keys.load_signer(key_dir / "pipeline.pem").public_key.keyid][0]
    code, out = _cli("keys", "revoke", old, "--at", "yesterday", "--key-dir", str(key_dir),
                     "--store-dir", str(store_dir))
    assert code == 2 and "--at" in out and "ISO time" in out, out
    assert sorted(p.name for p in key_dir.rglob("*")) == before
