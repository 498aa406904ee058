"""``kernelgate approve-loosening``: refuses up front what a rollout would refuse, and
what it writes is accepted by the registration it names."""

from __future__ import annotations

import json
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


@pytest.fixture
def locked(tmp_path, signing, monkeypatch):
    """A store whose family's only registration names no approver and saw a rejection
    (every shipped profile names none); returns ``(store, tracking, the looser file)``."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    tracking = tr.local_tracking(store)
    plain = tmp_path / "plain.yaml"
    plain.write_text(thresholds_yaml())
    chain = build_chain(tracking, FAMILY, plain, passing_metrics() | {
        "accuracy.hard.max_error_ratio_to_baseline": 3.0}, signing=signing)
    assert chain.decision.verdict == "reject"
    loose = tmp_path / "loose.yaml"
    loose.write_text(thresholds_yaml().replace('op: "<=", value: 2.0', 'op: "<=", value: 4.0'))
    return store, tracking, loose


def _words(text: str) -> str:
    """Text as words, whatever the terminal's box and wrapping did to it."""
    return " ".join(text.replace("│", " ").split())


def test_where_the_registration_names_no_approver_the_refusal_comes_first_with_the_rollouts_reason(
        locked, tmp_path, signing):
    from lineage.records.loosening_approval import sign_loosening
    from lineage.records.registration import LooseningRefused, latest_registration
    from lineage.signing.sources import StoreSource

    store, tracking, loose = locked
    alice = tmp_path / "alice.pem"
    keys.create_key(alice)
    out = tmp_path / "approval.json"
    result = _approve(store, alice, loose, out)
    assert result.exit_code == 2, result.output
    assert not out.exists()
    said = _words(result.output)
    assert "names no approver" in said and "a rollout would refuse this approval" in said, said
    newest = latest_registration(StoreSource(tracking, FAMILY, signing.trust))[0]
    approval = sign_loosening(keys.load_signer(alice), FAMILY, loose, "measured",
                              previous=newest, bindings=None)
    with pytest.raises(LooseningRefused) as refused:
        preregister(loose, tracking=tracking, family=FAMILY, signing=signing,
                    loosening_approval=approval)
    reason = _words(str(refused.value)).removeprefix("loosening approval not accepted: ")
    assert reason in said, (reason, said)


def test_keys_entry_and_keys_create_print_entries_that_found_the_roster(locked, tmp_path, signing):
    """The two ways to get an approvers entry with its proof: for a key made before
    (``keys entry``) and with a new key (``keys create --family``); a file that adds
    them is the family's first roster, and approve-loosening then takes alice's key."""
    store, tracking, loose = locked
    alice = tmp_path / "alice.pem"
    keys.create_key(alice)
    made = CliRunner().invoke(app, ["keys", "entry", "--key", str(alice), "--family", FAMILY,
                                    "--name", "alice"])
    created = CliRunner().invoke(app, ["keys", "create", "--name", "bob", "--family", FAMILY,
                                       "--key-dir", str(tmp_path / "keys"),
                                       "--store-dir", str(tmp_path / "no-store")])
    assert made.exit_code == 0 and created.exit_code == 0, made.output + created.output
    entries = [json.loads(line.strip().removeprefix("- ")) for result in (made, created)
               for line in result.output.splitlines() if line.strip().startswith("- {")]
    assert [e["name"] for e in entries] == ["alice", "bob"] and all(e["proof"] for e in entries)
    listed = f"  approvers: [{', '.join(json.dumps(e) for e in entries)}]\n"
    founding = tmp_path / "founding.yaml"
    founding.write_text(thresholds_yaml() + listed)
    asked = _approve(store, alice, founding, tmp_path / "needless.json")
    assert asked.exit_code == 2 and "needs no approval" in _words(asked.output), asked.output
    registration = preregister(founding, tracking=tracking, family=FAMILY, signing=signing)
    assert registration.registration_id
    approved = tmp_path / "loose-named.yaml"
    approved.write_text(loose.read_text() + listed)
    out = tmp_path / "approval.json"
    result = _approve(store, alice, approved, out)
    assert result.exit_code == 0 and "alice approves" in result.output, result.output
