"""A person's signed answer: its comment is the one recorded, and the answer itself is
kept so the audit can verify it again with the registered approver keys."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gates.approval import ApprovalInput, record_answer
from gates.approval_policy import ApprovalPolicy
from lineage.signing import keys
from lineage.signing.approvals import (
    recheck_answer,
    revocations,
    revoked_key,
    sign_approval,
    verify_approval,
)
from lineage.signing.attestations import AttestationError


@pytest.fixture
def alice(tmp_path):
    public = keys.create_key(tmp_path / "alice.pem")
    policy = ApprovalPolicy(required_for=["canary->production"], timeout_s=30,
                            require_signed=True, approvers=[{
                                "name": "alice", "keyid": public.keyid,
                                "public_key": public.to_dict()}])
    return keys.load_signer(tmp_path / "alice.pem"), policy


def _answer(signer, comment="canary read; ship", approve=True, run="0f3c-run"):
    return sign_approval(signer, flow_run_id=run, transition="canary->production",
                         approve=approve, comment=comment)


def _record(envelope: bytes | None, *, approver="alice", comment="canary read; ship"):
    typed = ApprovalInput(decision="approve", approver=approver, comment=comment)
    return record_answer(typed, transition="canary->production", family="xla", version="3",
                         authenticated=envelope is not None, authentication="signed",
                         signed_answer=envelope and envelope.decode())


def test_the_signed_comment_is_returned_to_be_recorded(alice):
    signer, policy = alice
    got = verify_approval(_answer(signer, comment="p99 fine at 16k"), policy,
                          flow_run_id="0f3c-run", transition="canary->production", approve=True, revoked={})
    assert (got.approver, got.comment) == ("alice", "p99 fine at 16k")
    with pytest.raises(AttestationError, match="not this pause"):
        verify_approval(_answer(signer), policy, flow_run_id="another-run",
                        transition="canary->production", approve=True, revoked={})


def test_the_audit_rechecks_a_kept_answer_both_ways(alice, tmp_path):
    signer, policy = alice
    envelope = _answer(signer)
    assert recheck_answer(_record(envelope), policy) is None  # untouched: clean
    assert recheck_answer(_record(None), policy) is None  # unauthenticated: nothing to recheck
    edited = _record(envelope, comment="approved by the CTO")  # the comment edited after
    assert "signed answer 'alice': 'canary read; ship'" in recheck_answer(edited, policy)
    lost = _record(envelope).model_copy(update={"signed_answer": None})
    assert "not kept" in recheck_answer(lost, policy)
    mallory = keys.load_signer(keys.ensure_pipeline_key(tmp_path / "mallory"))
    forged = _record(_answer(mallory))
    assert "does not verify" in recheck_answer(forged, policy)
    rejected_as_approved = _record(_answer(signer, approve=False))
    assert "approve=False" in recheck_answer(rejected_as_approved, policy)


def test_an_old_record_without_the_field_still_loads():
    old = _record(None).model_dump(mode="json")
    old.pop("signed_answer")
    assert type(_record(None)).model_validate(old).signed_answer is None
    assert datetime.now(UTC) >= type(_record(None)).model_validate(old).at


def test_an_entry_whose_key_id_is_not_its_keys_trusts_nobody(alice, tmp_path):
    """An approver entry pairing alice's key id with mallory's public key: mallory's
    signature, relabelled with alice's key id (a DSSE signature does not sign its key id),
    would verify as alice's if the entry's key id were taken on trust. It is refused,
    naming the entry; alice's own entry still verifies."""
    import json

    signer, policy = alice
    mallory_public = keys.create_key(tmp_path / "mallory.pem")
    mallory = keys.load_signer(tmp_path / "mallory.pem")
    alice_id = policy.approvers[0].keyid
    mixed = policy.model_copy(update={"approvers": [policy.approvers[0].model_copy(
        update={"public_key": mallory_public.to_dict()})]})
    envelope = json.loads(_answer(mallory))
    envelope["signatures"][0]["keyid"] = alice_id
    relabelled = json.dumps(envelope).encode()
    with pytest.raises(AttestationError, match="not its public key's"):
        verify_approval(relabelled, mixed, flow_run_id="0f3c-run",
                        transition="canary->production", approve=True, revoked={})
    got = verify_approval(_answer(signer), policy, flow_run_id="0f3c-run",
                          transition="canary->production", approve=True, revoked={})
    assert got.approver == "alice"


def test_a_revoked_approver_key_signs_no_stage_approval(alice, tmp_path):
    """A stage approval is signed now, so a key revoked in the family's log or the key
    folder (from the start or from a position) approves nothing, in the words of the one
    check (``revoked_key``); another key's revocation changes nothing."""
    signer, policy = alice
    keyid = signer.public_key.keyid
    how = f"entry 12: key {keyid[:12]} revoked from the start"
    with pytest.raises(AttestationError) as refused:
        verify_approval(_answer(signer), policy, flow_run_id="0f3c-run",
                        transition="canary->production", approve=True, revoked={keyid: how})
    assert str(refused.value) == revoked_key([keyid], {keyid: how})
    assert str(refused.value) == (f"key {keyid[:12]} is revoked ({how}): a revoked key "
                                  "approves nothing")
    folder = tmp_path / "keys"
    keys.ensure_pipeline_key(folder)
    keys.revoke(keyid, folder, at=datetime(2026, 1, 1, tzinfo=UTC))  # from a position
    from_folder = revocations(keys.folder_trust(folder))
    with pytest.raises(AttestationError, match="a revoked key approves nothing"):
        verify_approval(_answer(signer), policy, flow_run_id="0f3c-run",
                        transition="canary->production", approve=True, revoked=from_folder)
    got = verify_approval(_answer(signer), policy, flow_run_id="0f3c-run",
                          transition="canary->production", approve=True,
                          revoked={"0" * 64: "revoked from the start in the pipeline's key folder"})
    assert got.approver == "alice"


def test_the_one_revocation_check_names_the_first_revoked_key_and_how():
    revoked = {"b" * 64: "entry 3: key bbbbbbbbbbbb revoked from the start",
               "a" * 64: "revoked from the start in the pipeline's key folder"}
    assert revoked_key([], revoked) is None
    assert revoked_key(["c" * 64], revoked) is None
    assert revoked_key(["c" * 64], {}) is None
    assert revoked_key({"c" * 64, "b" * 64, "a" * 64}, revoked) == (
        "key aaaaaaaaaaaa is revoked (revoked from the start in the pipeline's key folder): a "
        "revoked key approves nothing")


def test_a_stage_approval_cannot_be_verified_without_the_revocations(alice):
    """Leaving ``revoked`` out is an error, not a skipped check."""
    signer, policy = alice
    with pytest.raises(TypeError, match="revoked"):
        verify_approval(_answer(signer), policy, flow_run_id="0f3c-run",  # type: ignore[call-arg]
                        transition="canary->production", approve=True)
