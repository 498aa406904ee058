"""What reading a family's signed record from the store costs, and that the fast path
reads the same thing (an append reads the family back)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from lineage.log import log_writer
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr

FAMILY = "fam"


@pytest.fixture
def family(tmp_path):
    """A store with one family of ``ENTRIES`` signed log entries, one run each."""
    key_dir = tmp_path / "keys"
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(key_dir)),
                      trust=keys.folder_trust(key_dir), key_dir=key_dir)
    tracking = tr.local_tracking(tmp_path / "store")
    for step in range(5):
        with tr.stage_run(tracking, FAMILY, "evaluation", run_name=f"e{step}") as run_id:
            tr.log_bytes(tracking, run_id, json.dumps({"step": step}).encode(), "x/step.json")
            log_writer.append(tracking, run_id, "evaluation", {"family": FAMILY, "step": step},
                              signing)
    return tracking, signing


def _get_run_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    original = SqlAlchemyStore.get_run

    def counting(self, run_id):
        calls.append(run_id)
        return original(self, run_id)

    monkeypatch.setattr(SqlAlchemyStore, "get_run", counting)
    return calls


def test_reading_the_family_fetches_no_run_by_run(family, monkeypatch):
    """The runs come from one search; listing and reading their envelopes must not fetch
    each run again (MLflow's ``runs:/`` resolution does, twice per call: it was most of an
    append's time)."""
    tracking, signing = family
    calls = _get_run_calls(monkeypatch)
    found = StoreSource(tracking, FAMILY, signing.trust).attestations()
    assert sorted(a.predicate["step"] for a in found) == list(range(5))
    assert calls == []


def test_a_tampered_or_deleted_envelope_is_still_seen(family):
    tracking, signing = family
    entries = sorted(StoreSource(tracking, FAMILY, signing.trust).attestations(),
                     key=lambda a: a.predicate["step"])
    client = tracking.client()

    def envelope(entry) -> Path:
        return Path(client.get_run(entry.run_id).info.artifact_uri.removeprefix("file://")) / entry.path

    tampered = envelope(entries[1])
    tampered.write_bytes(tampered.read_bytes().replace(b'"payload": "', b'"payload": "AA'))
    envelope(entries[3]).unlink()
    source = StoreSource(tracking, FAMILY, signing.trust)
    assert sorted(a.predicate["step"] for a in source.attestations()) == [0, 2, 4]
    assert any(entries[1].run_id in p for p in source.problems())
    with pytest.raises(FileNotFoundError):
        source.artifact(entries[3].run_id, entries[3].path)
    assert json.loads(source.artifact(entries[0].run_id, "x/step.json")) == {"step": 0}
