"""The family lock of a store of files: taken whatever the tracking URI names, and said
when another rollout holds it (``lineage.rollout.rollout.family_lock``)."""

from __future__ import annotations

import logging

import filelock
import pytest

from lineage.rollout.rollout import family_lock, lock_folder


def test_the_embedded_store_locks_in_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert lock_folder(tmp_path / "store") == tmp_path / "store" / "locks"


def test_a_sqlite_uri_locks_beside_its_database_whatever_the_store_folder(tmp_path, monkeypatch):
    """Two rollouts writing one SQLite database from two store folders queue on one
    lock (they ran unlocked before, and forked the family's log)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}")
    assert lock_folder(tmp_path / "a") == lock_folder(tmp_path / "b") == tmp_path / "db" / "locks"
    with family_lock(tmp_path / "a", "fam") as held:
        assert held
        with pytest.raises(filelock.Timeout), family_lock(tmp_path / "b", "fam", timeout_s=0.2):
            pass
        with family_lock(tmp_path / "b", "other") as other:  # another family: its own lock
            assert other


def test_a_tracking_server_queues_on_prefect_not_on_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert lock_folder(tmp_path) is None
    with family_lock(tmp_path, "fam") as held:
        assert held is False


def test_waiting_for_the_lock_is_said(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with (family_lock(tmp_path, "fam"),
          caplog.at_level(logging.WARNING, logger="lineage.rollout.rollout"),
          pytest.raises(filelock.Timeout),
          family_lock(tmp_path, "fam", timeout_s=0.2)):
        pass
    assert [r.getMessage() for r in caplog.records] == [
        f"waiting for {tmp_path / 'locks' / 'fam.lock'}: another rollout of fam holds it (it "
        "queues here until that one ends or dies)"]
    caplog.clear()
    with family_lock(tmp_path, "fam"):  # free: nothing said
        pass
    assert caplog.records == []
