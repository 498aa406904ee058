"""``kernelgate approve-loosening``: refuses up front what a rollout would refuse, and
what it writes is accepted by the registration it names."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from lineage.records.registration import preregister
from lineage.signing import keys
from lineage.store import tracking as tr
from tests.conftest_lineage import build_chain, passing_metrics, thresholds_yaml

FAMILY = "loosen"


@pytest.fixture
def rejected(tmp_path, signing, monkeypatch):
    """A store whose family's newest registration (naming alice as its approver) saw a
    rejection; returns ``(store, alice's key, the looser file)``."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    tracking = tr.local_tracking(store)
    alice = tmp_path / "alice.pem"
    public = keys.create_key(alice)
    text = thresholds_yaml() + (f'  approvers: [{{name: alice, keyid: "{public.keyid}", '
                                f'public_key: {dict(public.to_dict())}}}]\n')
    strict = tmp_path / "strict.yaml"
    strict.write_text(text)
    chain = build_chain(tracking, FAMILY, strict, passing_metrics() | {
        "accuracy.hard.max_error_ratio_to_baseline": 3.0}, signing=signing)
    assert chain.decision.verdict == "reject"
    loose = tmp_path / "loose.yaml"
    loose.write_text(text.replace('op: "<=", value: 2.0', 'op: "<=", value: 4.0'))
    return store, alice, loose, strict, tracking


def _approve(store: Path, key: Path, thresholds: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, [
        "approve-loosening", "--thresholds", str(thresholds), "--family", FAMILY, "--key",
        str(key), "--reason", "measured bf16 naive", "--out", str(out), "--store-dir",
        str(store), *extra])


def test_a_key_the_registration_does_not_name_is_refused_before_anything_is_written(
        rejected, tmp_path):
    store, _, loose, _, _ = rejected
    mallory = tmp_path / "mallory.pem"
    keys.create_key(mallory)
    out = tmp_path / "approval.json"
    result = _approve(store, mallory, loose, out)
    assert result.exit_code == 2, result.output
    assert "is not an approver of registration" in result.output and "['alice']" in result.output
    assert not out.exists()


def test_a_file_that_is_not_looser_needs_no_approval(rejected, tmp_path):
    store, alice, _, strict, _ = rejected
    out = tmp_path / "approval.json"
    result = _approve(store, alice, strict, out)
    assert result.exit_code == 2 and "nothing to approve" in result.output, result.output
    assert not out.exists()


def test_the_approval_written_is_accepted_once_by_the_registration_it_names(
        rejected, tmp_path, signing):
    store, alice, loose, _, tracking = rejected
    out = tmp_path / "approval.json"
    result = _approve(store, alice, loose, out, "--valid-for-days", "1")
    assert result.exit_code == 0, result.output
    assert "alice approves" in result.output and "usable once within 1 days" in result.output
    registration = preregister(loose, tracking=tracking, family=FAMILY, signing=signing,
                               loosening_approval=out.read_bytes())
    assert registration.thresholds_sha256
