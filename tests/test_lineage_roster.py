"""The approver roster: how a family's first approvers are named when the registration
they would loosen names none (trust on first use, said by every audit after), and why
that is the only loosening that needs no approval.

The locked case: a candidate rejected under a registration that names no approver (every
shipped profile) makes every later loosening need an approval that nobody can sign, and
adding an approver is itself a loosening."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from lineage.audit.audit import audit
from lineage.records.loosening_approval import sign_loosening
from lineage.records.registration import LooseningRefused, latest_registration, preregister
from lineage.records.roster import approver_entry
from lineage.signing import keys
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    build_chain,
    passing_metrics,
    promotable_chain,
    promote,
    thresholds_yaml,
)

FAMILY = "rostered"
LOOSER = ('op: "<=", value: 2.0', 'op: "<=", value: 4.0')
REJECTED = passing_metrics() | {"accuracy.hard.max_error_ratio_to_baseline": 3.0}


class Lab:
    """A store whose family promoted a version and then had a candidate rejected, all
    under a registration naming no approver (``plain``): the locked case."""

    def __init__(self, root: Path, signing, *, locked: bool = True):
        self.root, self.signing = root, signing
        root.mkdir(exist_ok=True)
        self.tracking = tr.local_tracking(root / "store")
        self.plain = self.write("plain.yaml", thresholds_yaml())
        if not locked:
            return
        promote(self.tracking, FAMILY, promotable_chain(self.tracking, FAMILY, self.plain,
                                                        signing=signing), signing)
        chain = build_chain(self.tracking, FAMILY, self.plain, REJECTED, signing=signing)
        assert chain.decision.verdict == "reject"

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(text)
        return path

    def key(self, name: str) -> Path:
        path = self.root / f"{name}.pem"
        if not path.exists():
            keys.create_key(path)
        return path

    def entry(self, name: str, family: str = FAMILY) -> dict:
        return approver_entry(keys.load_signer(self.key(name)), family, name)

    def with_approvers(self, name: str, *entries: dict, text: str | None = None) -> Path:
        lines = f"  approvers: [{', '.join(json.dumps(e) for e in entries)}]\n"
        return self.write(name, (text or thresholds_yaml()) + lines)

    def register(self, path: Path, **kw):
        return preregister(path, tracking=self.tracking, family=FAMILY, signing=self.signing, **kw)

    def source(self) -> StoreSource:
        return StoreSource(self.tracking, FAMILY, self.signing.trust)

    def registrations(self) -> list:
        return [a for a in self.source().attestations() if a.kind == "registration"]

    def signed(self, registration_id: str):
        (found,) = [a for a in self.registrations() if a.run_id == registration_id]
        return found

    def approval(self, name: str, path: Path) -> bytes:
        newest = latest_registration(self.source())[0]
        return sign_loosening(keys.load_signer(self.key(name)), FAMILY, path, "measured again",
                              previous=newest, bindings=None)

    def audit(self):
        return audit(self.tracking, FAMILY, "production", trust=self.signing.trust,
                     load_model=False)

    def artifact(self, run_id: str, path: str) -> Path:
        uri = self.tracking.client().get_run(run_id).info.artifact_uri
        return Path(uri.removeprefix("file://")) / path


@pytest.fixture
def lab(tmp_path, signing, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return Lab(tmp_path, signing)


def _refused(lab: Lab, path: Path, **kw) -> str:
    before = len(lab.registrations())
    with pytest.raises(LooseningRefused) as refused:
        lab.register(path, **kw)
    assert len(lab.registrations()) == before, "a refused registration was signed"
    return " ".join(str(refused.value).split())


def test_the_locked_family_names_its_first_approver_on_first_use_and_every_audit_says_so(lab):
    """The lock reproduced, then lifted in the two documented steps: the roster alone (no
    approval: nobody could sign one), then the loosening with the new approver's approval."""
    loose = lab.write("loose.yaml", thresholds_yaml().replace(*LOOSER))
    message = _refused(lab, loose)
    assert "names no approver" in message and "kernelgate keys entry" in message, message
    assert "approve-loosening" in message, message

    founding = lab.with_approvers("founded.yaml", lab.entry("alice"))
    registration = lab.register(founding)
    signed = lab.signed(registration.registration_id)
    alice = keys.load_signer(lab.key("alice")).public_key.keyid
    assert signed.predicate["roster_founded"]["approvers"] == [{"name": "alice", "keyid": alice}]
    assert signed.predicate["loosening_approval"] is None
    assert signed.predicate["loosened"] == [f"approval.approvers[{alice}]: added"]

    report = lab.audit()
    assert report.exit_code == 0, report.render()
    (notice,) = report.notices
    assert (f"first named at registration {registration.registration_id}" in notice
            and "trust on first use" in notice and "alice" in notice and alice[:12] in notice
            and lab.signing.signer.public_key.keyid[:12] in notice), notice
    assert f"NOTICE: {notice}" in report.render()
    assert any("ROSTER FOUNDED" in r for r in report.registrations), report.registrations

    # step two: the loosening, approved by the approver the roster now names
    loose = lab.with_approvers("loose-approved.yaml", lab.entry("alice"),
                               text=thresholds_yaml().replace(*LOOSER))
    approved = lab.register(loose, loosening_approval=lab.approval("alice", loose))
    assert lab.signed(approved.registration_id).predicate["loosening_approval"]["approver"] == "alice"
    later = lab.audit()
    assert later.exit_code == 0 and later.notices == report.notices, later.render()


def test_founding_the_roster_and_loosening_anything_else_at_once_is_refused(lab):
    both = lab.with_approvers("both.yaml", lab.entry("alice"),
                              text=thresholds_yaml().replace(*LOOSER))
    message = _refused(lab, both)
    assert "error-ratio" in message and "names no approver" in message, message
    assert "only adds approvers" in message and "approve-loosening" in message, message


def test_after_the_founding_a_further_approver_needs_an_existing_approvers_approval(lab):
    founded = lab.register(lab.with_approvers("founded.yaml", lab.entry("alice")))
    chain = build_chain(lab.tracking, FAMILY, lab.root / "founded.yaml", REJECTED,
                        signing=lab.signing, registration=founded)
    assert chain.decision.verdict == "reject"
    more = lab.with_approvers("more.yaml", lab.entry("alice"), lab.entry("bob"))
    bob = keys.load_signer(lab.key("bob")).public_key.keyid
    message = _refused(lab, more)
    assert f"approval.approvers[{bob}]: added" in message, message
    assert "must approve it" in message and "first use" not in message, message
    # bob's own approval of his addition is no approval: he is not named yet
    message = _refused(lab, more, loosening_approval=lab.approval("bob", more))
    assert "is not an approver of registration" in message and "['alice']" in message, message
    registration = lab.register(more, loosening_approval=lab.approval("alice", more))
    assert "roster_founded" not in lab.signed(registration.registration_id).predicate


def test_an_approver_entry_must_prove_its_own_key_for_this_family(lab):
    alice, mallory = lab.entry("alice"), lab.entry("mallory")
    cases = {
        "by another key": {**alice, "proof": mallory["proof"]},
        "for another family": lab.entry("alice", family="elsewhere"),
        "without a proof": {k: v for k, v in alice.items() if k != "proof"},
        "a key id that is not its key's": {**mallory, "keyid": alice["keyid"]},
    }
    for case, entry in cases.items():
        message = _refused(lab, lab.with_approvers("unproved.yaml", entry))
        assert "proof" in message or "key id" in message, (case, message)
        assert "alice" in message or "mallory" in message, (case, message)


def test_the_roster_is_founded_on_first_use_once(lab, tmp_path, signing):
    """A family whose registrations once named an approver is past first use: removing
    every approver (a tightening) and naming a new one after a rejection is refused."""
    other = Lab(tmp_path / "other", signing, locked=False)
    first = other.register(other.with_approvers("named.yaml", other.entry("alice")))
    unnamed = other.register(other.plain)
    build_chain(other.tracking, FAMILY, other.plain, REJECTED, signing=signing,
                registration=unnamed)
    message = _refused(other, other.with_approvers("again.yaml", other.entry("mallory")))
    assert f"registration {first.registration_id} named ['alice']" in message and "once" in message, message


def _payload_edited(envelope: Path, edit) -> None:
    data = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    edit(statement["predicate"])
    data["payload"] = base64.b64encode(json.dumps(statement, sort_keys=True).encode()).decode()
    envelope.write_text(json.dumps(data, sort_keys=True))


def test_an_edit_of_the_founding_record_after_signing_is_caught_by_the_audit(lab):
    founding = lab.register(lab.with_approvers("founded.yaml", lab.entry("alice")))
    assert lab.audit().exit_code == 0  # the untouched store: the notice, no problem
    # the founding's frozen thresholds swapped for a copy naming the attacker's own key,
    # with a valid proof by it: the audit names it, and no approval by that key is taken
    frozen = lab.artifact(founding.registration_id, "thresholds/founded.yaml")
    kept = frozen.read_bytes()
    swapped = lab.with_approvers("swapped.yaml", lab.entry("mallory"))
    frozen.write_bytes(swapped.read_bytes())
    report = lab.audit()
    assert report.exit_code == 1, report.render()
    assert any("roster" in p and founding.registration_id in p and "altered" in p
               for p in report.problems), report.render()
    loose = lab.with_approvers("loose.yaml", lab.entry("mallory"),
                               text=thresholds_yaml().replace(*LOOSER))
    with pytest.raises(Exception, match="altered"):
        lab.register(loose, loosening_approval=lab.approval("mallory", loose))
    frozen.write_bytes(kept)
    assert lab.audit().exit_code == 0
    # the signed record itself edited (the founding hidden): it no longer verifies
    envelope = lab.artifact(founding.registration_id, "attestations/registration.dsse.json")
    _payload_edited(envelope, lambda p: p.pop("roster_founded"))
    report = lab.audit()
    assert report.exit_code == 1 and any("does not verify" in p for p in report.problems), \
        report.render()


def test_approvers_named_before_any_rejection_are_a_notice_on_every_audit(tmp_path, signing,
                                                                           monkeypatch):
    """Before any rejection the file's writer may name anyone, with no approver's
    signature: every audit says so, and whether each named person proved the key (a key
    labelled "alice" that is mallory's, with no proof, is said to be unproved)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    lab = Lab(tmp_path, signing, locked=False)
    lab.register(lab.plain)
    mallory = keys.load_signer(lab.key("mallory")).public_key
    unproved = {"name": "alice", "keyid": mallory.keyid, "public_key": mallory.to_dict()}
    named = lab.register(lab.with_approvers("named.yaml", unproved, lab.entry("bob")))
    promote(lab.tracking, FAMILY, promotable_chain(lab.tracking, FAMILY,
                                                   lab.root / "named.yaml", signing=signing),
            signing)
    report = lab.audit()
    assert report.exit_code == 0, report.render()
    (notice,) = report.notices
    assert f"approvers named at registration {named.registration_id}" in notice
    assert f"alice (key {mallory.keyid[:12]}: no valid proof" in notice
    assert "bob (key" in notice and "proof of holding it checked" in notice


def _damaged(lab: Lab) -> int:
    """Delete the envelope of an entry in the middle of the family's log (a disk lost):
    the newest log entry that is not the last, a registration or a re-anchor. Returns
    its seq."""
    from lineage.log import family_log

    log = family_log.read(lab.source())
    seq = max(s for s, e in log.entries.items()
              if s < log.length and e.kind not in ("registration", "reanchor"))
    entry = log.entries[seq]
    lab.artifact(entry.run_id, entry.path).unlink()
    return seq


def _reanchor(lab: Lab, name: str, reason: str = "disk lost; restored from backup"):
    from lineage.aliases.reanchor import reanchor

    return reanchor(lab.tracking, FAMILY, keys.load_signer(lab.key(name)), reason, lab.signing,
                    name=name)


def _reanchors(lab: Lab) -> list:
    return [a for a in lab.source().attestations() if a.kind == "reanchor"]


def test_a_damaged_log_with_no_approver_named_is_reanchored_by_its_first_approver(lab):
    """The locked family's log is damaged before anyone was named: the re-anchor's key is
    accepted as the family's first approver on first use (its entry proves the key), every
    audit says so, and that approver can then approve a loosening."""
    from typer.testing import CliRunner

    from flows.cli import app

    _damaged(lab)
    newest = latest_registration(lab.source())[0]
    out = CliRunner().invoke(app, [
        "reanchor", "--family", FAMILY, "--key", str(lab.key("alice")), "--reason",
        "disk lost; restored from backup", "--store-dir", str(lab.root / "store")])
    assert out.exit_code == 0 and "alice" in out.output and "first approver" in out.output, \
        out.output
    (entry,) = _reanchors(lab)
    alice = keys.load_signer(lab.key("alice")).public_key
    founded = entry.predicate["roster_founded"]
    (named,) = founded["approvers"]
    assert (named["name"], named["keyid"], named["public_key"]) == ("alice", alice.keyid,
                                                                      alice.to_dict())
    assert named["proof"]["signatures"][0]["keyid"] == alice.keyid
    assert founded["previous_registration_id"] == newest.predicate["registration_id"]
    assert entry.predicate["approver"] == "alice"

    report = lab.audit()
    assert report.exit_code == 0, report.render()
    (notice,) = report.notices
    assert ("re-anchor" in notice and "alice" in notice and alice.keyid[:12] in notice
            and lab.signing.signer.public_key.keyid[:12] in notice
            and "trust on first use" in notice and "no earlier approver" in notice), notice
    assert f"NOTICE: {notice}" in report.render()

    loose = lab.write("loose.yaml", thresholds_yaml().replace(*LOOSER))
    message = _refused(lab, loose)  # a re-anchored range counts as a possible rejection
    assert "must approve it" in message, message
    message = _refused(lab, loose, loosening_approval=lab.approval("mallory", loose))
    assert "is not an approver of registration" in message and "['alice']" in message, message
    approved = lab.register(loose, loosening_approval=lab.approval("alice", loose))
    assert lab.signed(approved.registration_id).predicate["loosening_approval"]["approver"] == "alice"
    later = lab.audit()
    assert later.exit_code == 0 and later.notices == report.notices, later.render()
    # the roster stays alice's while no thresholds file names approvers: the next
    # re-anchor is hers to sign, and founds nothing
    from lineage.aliases.reanchor import ReanchorRefused

    _damaged(lab)
    with pytest.raises(ReanchorRefused, match="not an approver") as refused:
        _reanchor(lab, "mallory")
    assert "['alice']" in str(refused.value), refused.value
    assert "roster_founded" not in _reanchor(lab, "alice").predicate
    assert lab.audit().notices == report.notices


def test_a_reanchor_founds_the_roster_on_first_use_once(tmp_path, signing, monkeypatch):
    """A family whose registrations once named an approver (alice, then none: a
    tightening) is past first use: a damaged log is not re-anchored by a new key."""
    from lineage.aliases.reanchor import ReanchorRefused

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    lab = Lab(tmp_path, signing, locked=False)
    first = lab.register(lab.with_approvers("named.yaml", lab.entry("alice")))
    plain = lab.register(lab.plain)
    promote(lab.tracking, FAMILY, promotable_chain(lab.tracking, FAMILY, lab.plain,
                                                   signing=signing, registration=plain), signing)
    build_chain(lab.tracking, FAMILY, lab.plain, REJECTED, signing=signing, registration=plain)
    _damaged(lab)
    for name in ("mallory", "alice"):
        with pytest.raises(ReanchorRefused, match="first use once") as refused:
            _reanchor(lab, name)
        assert f"registration {first.registration_id} named ['alice']" in str(refused.value)
    assert _reanchors(lab) == []


def test_a_reanchor_founding_whose_entry_does_not_prove_its_key_fails_the_audit(lab):
    """Planted: a writer that signs the re-anchor's founding without checking the entry
    (its public key edited to another's, or its proof's signature edited). The writer's
    own check refuses it; signed anyway, the audit fails it and nobody is named by it."""
    import lineage.aliases.reanchor as module
    from lineage.aliases.reanchor import ReanchorRefused

    made = module.approver_entry
    mallory = keys.load_signer(lab.key("mallory")).public_key.to_dict()

    def edited_key(signer, family, name):
        return {**made(signer, family, name), "public_key": mallory}

    def edited_signature(signer, family, name):
        entry = made(signer, family, name)
        sig = entry["proof"]["signatures"][0]
        sig["sig"] = ("0" if sig["sig"][0] != "0" else "1") + sig["sig"][1:]
        return entry

    for i, edit in enumerate((edited_key, edited_signature)):
        here = Lab(lab.root / f"planted{i}", lab.signing)
        _damaged(here)
        with pytest.MonkeyPatch.context() as planted:
            planted.setattr(module, "approver_entry", edit)
            with pytest.raises(ReanchorRefused, match="proof|key id") as refused:
                _reanchor(here, "alice")
            assert "alice" in str(refused.value) and _reanchors(here) == [], refused.value
            planted.setattr(module, "possession_problem", lambda *a: None)
            planted.setattr(module, "check_approval", lambda *a: None)
            _reanchor(here, "alice")
        report = here.audit()
        assert report.exit_code == 1, report.render()
        assert any("re-anchor" in p and "alice" in p for p in report.problems), report.render()
        loose = here.write("loose.yaml", thresholds_yaml().replace(*LOOSER))
        message = _refused(here, loose, loosening_approval=here.approval("alice", loose))
        assert "names no approver" in message, message


def test_a_reanchor_founding_after_a_registration_that_named_approvers_fails_the_audit(
        tmp_path, signing, monkeypatch):
    """Planted: a writer that founds a roster at the re-anchor although the registration
    it follows names alice (it read that registration as naming none and skipped the
    first-use check): mallory is
    founded, the audit fails it, and mallory approves nothing."""
    import lineage.aliases.reanchor as module

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    lab = Lab(tmp_path, signing, locked=False)
    named = lab.with_approvers("named.yaml", lab.entry("alice"))
    lab.register(named)
    promote(lab.tracking, FAMILY, promotable_chain(lab.tracking, FAMILY, named, signing=signing),
            signing)
    build_chain(lab.tracking, FAMILY, named, REJECTED, signing=signing)
    _damaged(lab)
    read = module.latest_registration

    def as_if_unnamed(source):
        attestation, thresholds = read(source)
        policy = thresholds.approval.model_copy(update={"approvers": []})
        return attestation, thresholds.model_copy(update={"approval": policy})

    with pytest.MonkeyPatch.context() as planted:
        planted.setattr(module, "latest_registration", as_if_unnamed)
        planted.setattr(module, "earlier_naming", lambda *a: None)
        entry = _reanchor(lab, "mallory")
    assert entry.predicate["roster_founded"]["approvers"][0]["name"] == "mallory"
    report = lab.audit()
    assert report.exit_code == 1, report.render()
    assert any("re-anchor" in p and "named approvers" in p for p in report.problems), \
        report.render()
    loose = lab.with_approvers("loose.yaml", lab.entry("alice"),
                               text=thresholds_yaml().replace(*LOOSER))
    message = _refused(lab, loose, loosening_approval=lab.approval("mallory", loose))
    assert "is not an approver of registration" in message and "['alice']" in message, message


def test_with_approvers_named_only_a_named_one_may_reanchor(lab):
    """Unchanged where the roster exists: an unnamed key is refused (nothing written), a
    named one re-anchors and founds nothing."""
    from lineage.aliases.reanchor import ReanchorRefused

    lab.register(lab.with_approvers("founded.yaml", lab.entry("alice")))
    _damaged(lab)
    with pytest.raises(ReanchorRefused, match="not an approver") as refused:
        _reanchor(lab, "mallory")
    assert "['alice']" in str(refused.value) and _reanchors(lab) == [], refused.value
    entry = _reanchor(lab, "alice")
    assert "roster_founded" not in entry.predicate and entry.predicate["approver"] == "alice"
    assert len(lab.audit().notices) == 1  # the registration's founding, nothing more


def _revoked_in_log(lab: Lab, name: str) -> str:
    """Revoke ``name``'s key from the start in the family's signed log (as ``kernelgate keys
    revoke`` records it); returns the refusal every approval by that key gets."""
    from lineage.aliases.key_changes import KeyChange, log_key_change
    from lineage.log import family_log
    from lineage.signing.approvals import revocations, revoked_key

    keyid = keys.load_signer(lab.key(name)).public_key.keyid
    log_key_change(lab.tracking, FAMILY, KeyChange(action="revoke", keyid=keyid), lab.signing)
    log = family_log.read(lab.source())
    seq = int(log.entries[log.length].predicate["log"]["seq"])
    refusal = revoked_key([keyid], revocations(lab.signing.trust, log.entries.values()))
    assert refusal == (f"key {keyid[:12]} is revoked (entry {seq}: key {keyid[:12]} revoked "
                       "from the start): a revoked key approves nothing")
    return refusal


def test_a_key_revoked_in_the_log_founds_no_roster_at_a_registration_or_a_reanchor(lab):
    """Revoked in the log only (the key folder knows nothing of it): alice's proved entry
    founds no roster, at a registration or at the re-anchor, in the same words naming the
    key and the revocation's entry; another key still may."""
    from lineage.aliases.reanchor import ReanchorRefused

    refusal = _revoked_in_log(lab, "alice")
    assert refusal.startswith("key ") and "is revoked (entry " in refusal, refusal
    message = _refused(lab, lab.with_approvers("founded.yaml", lab.entry("alice")))
    assert refusal in message, message
    _damaged(lab)
    with pytest.raises(ReanchorRefused) as refused:
        _reanchor(lab, "alice")
    assert refusal in " ".join(str(refused.value).split()) and _reanchors(lab) == [], refused.value
    assert "roster_founded" in _reanchor(lab, "bob").predicate


def test_a_key_revoked_in_the_log_approves_no_loosening_and_no_reanchor(lab):
    """The rollout, ``approve-loosening`` and the re-anchor refuse a named approver's key
    that the log shows revoked, in the same words."""
    from typer.testing import CliRunner

    from flows.cli import app
    from lineage.aliases.reanchor import ReanchorRefused

    lab.register(lab.with_approvers("founded.yaml", lab.entry("alice")))
    loose = lab.with_approvers("loose.yaml", lab.entry("alice"),
                               text=thresholds_yaml().replace(*LOOSER))
    approval = lab.approval("alice", loose)
    refusal = _revoked_in_log(lab, "alice")
    message = _refused(lab, loose, loosening_approval=approval)
    assert refusal in message, message
    out = CliRunner().invoke(app, [
        "approve-loosening", "--family", FAMILY, "--key", str(lab.key("alice")),
        "--thresholds", str(loose), "--reason", "measured again", "--out",
        str(lab.root / "a.json"), "--store-dir", str(lab.root / "store")])
    assert out.exit_code != 0 and refusal in " ".join(out.output.split()), out.output
    _damaged(lab)
    with pytest.raises(ReanchorRefused) as refused:
        _reanchor(lab, "alice")
    assert refusal in " ".join(str(refused.value).split()), refused.value
