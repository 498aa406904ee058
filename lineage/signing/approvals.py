"""Approvals by people who are who they say: signed with their own keys.

``kernelgate approve`` signs an ``approval`` statement naming the paused flow run, the
transition and the answer with the approver's key; the flow accepts it only when the
signature verifies with a key the *registration's* approval policy names
(``approval.approvers``), and records the approver as authenticated by that key. An
answer typed into the Prefect UI (behind a shared server password at best) is recorded
as unauthenticated; a policy with ``require_signed: true`` does not count it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from securesystemslib.formats import encode_canonical
from securesystemslib.signer import Signer, SSlibKey

from gates.approval_policy import ApprovalPolicy, Approver
from lineage.signing.attestations import (
    Attestation,
    AttestationError,
    TrustPolicy,
    make_envelope,
    verify_envelope,
)


def key_id_of(public_key: dict) -> str:
    """The key id a securesystemslib key dict (keytype, scheme, keyval) has by default:
    the sha256 of its canonical JSON (securesystemslib's ``compute_default_keyid``, which
    ``SSlibKey.from_crypto`` and ``kernelgate keys create`` use).

    Raises:
        KeyError, TypeError, ValueError: not a key dict.
    """
    fields = {k: public_key[k] for k in ("keytype", "scheme", "keyval")}
    return hashlib.sha256(encode_canonical(fields).encode()).hexdigest()


def approvers_trust(approvers: Iterable[Approver],
                    revoked: Iterable[str] = ()) -> tuple[TrustPolicy, list[str]]:
    """The approvers' public keys as a trust policy, and why any entry was left out.

    An entry is trusted only where its ``keyid`` is its own public key's
    (:func:`key_id_of`): an entry pairing alice's key id with another key would let that
    other key sign as alice (a DSSE signature names the key id it claims), so it is left
    out and named in the returned reasons. ``revoked``: key ids that sign nothing any more.
    """
    keys, left_out = {}, []
    for approver in approvers:
        try:
            computed = key_id_of(dict(approver.public_key))
            key = SSlibKey.from_dict(approver.keyid, dict(approver.public_key))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            left_out.append(f"{approver.name}'s entry: its public key is unusable ({err})")
            continue
        if computed != approver.keyid:
            left_out.append(f"{approver.name}'s entry names key id {approver.keyid[:12]}, "
                            f"which is not its public key's ({computed[:12]}): not trusted")
            continue
        keys[approver.keyid] = key
    return TrustPolicy(public_keys=keys, revoked=set(revoked)), left_out


def revocations(trust: TrustPolicy, entries: Iterable[Attestation] = ()) -> dict[str, str]:
    """Every key id that signs no approval any more, and how it was revoked: a ``revoke``
    key change among ``entries`` (a family's log entries: ``entry <seq>: key .. revoked
    from ..``, the first such entry), else ``trust``'s own revocation (the pipeline's key
    folder, from the start or from a position). A key revoked from a position approves
    nothing new either: an approval is signed now, after any position."""
    found: dict[str, str] = {}
    for entry in sorted(entries, key=lambda e: _seq(e.predicate)):
        p = entry.predicate
        if entry.kind == "key_change" and p.get("action") == "revoke" and p.get("keyid"):
            keyid = str(p["keyid"])
            found.setdefault(keyid, f"entry {_seq(p)}: key {keyid[:12]} revoked "
                             + (f"from {p['revoked_from']}" if p.get("revoked_from")
                                else "from the start"))
    for keyid in sorted(trust.revoked):
        found.setdefault(keyid, "revoked from the start in the pipeline's key folder")
    for keyid, at in sorted(trust.revoked_at.items()):
        found.setdefault(keyid, f"revoked from {at.isoformat()} in the pipeline's key folder")
    return found


def _seq(predicate: dict) -> int:
    """A log entry's signed sequence number (0: none)."""
    pos = predicate.get("log")
    seq = pos.get("seq") if isinstance(pos, dict) else None
    return int(seq) if isinstance(seq, (int, float)) else 0


def revoked_key(keyids: Iterable[str], revoked: Mapping[str, str]) -> str | None:
    """The one revocation check of approver keys: why the first of ``keyids`` (in sorted
    order) that ``revoked`` names (:func:`revocations`: key id -> how it was revoked)
    approves nothing, or None when none of them is revoked. Every entry point that takes
    an approver's key asks it and refuses with its words: a stage approval
    (:func:`verify_approval`), ``kernelgate approve``, ``kernelgate approve-loosening``,
    the rollout's loosening approval and roster founding at registration, and ``kernelgate
    reanchor``."""
    gone = sorted(set(keyids) & set(revoked))
    if not gone:
        return None
    return f"key {gone[0][:12]} is revoked ({revoked[gone[0]]}): a revoked key approves nothing"


def sign_approval(signer: Signer, *, flow_run_id: str, transition: str, approve: bool,
                  comment: str) -> bytes:
    """A person's signed answer to one paused approval (a DSSE envelope, JSON bytes);
    its subject is the answer itself (flow run, transition, answer, comment)."""
    answer = {"flow_run_id": flow_run_id, "transition": transition, "approve": approve,
              "comment": comment}
    digest = hashlib.sha256(json.dumps(answer, sort_keys=True).encode()).hexdigest()
    return make_envelope("approval", {f"prefect-flow-run/{flow_run_id}": digest}, answer, signer)


class SignedAnswer(NamedTuple):
    """A verified signed answer: who (the policy's name), how, and what they wrote."""

    approver: str
    authentication: str
    comment: str


def verify_approval(envelope: bytes, policy: ApprovalPolicy, *, flow_run_id: str | None,
                    transition: str, approve: bool,
                    revoked: Mapping[str, str]) -> SignedAnswer:
    """Check a signed answer against the registered policy and this pause
    (``flow_run_id`` None: any flow run, as an auditor re-checking a kept answer), by a
    key not in ``revoked`` (:func:`revocations`: key id -> how it was revoked; required,
    so no caller skips the check by leaving it out, :func:`revoked_key`).

    Returns:
        :class:`SignedAnswer`: the approver's name from the policy, how they were
        authenticated, and the comment they signed (the one to record).

    Raises:
        AttestationError: no approver key in the policy verifies it, the key that does
            is revoked, or it answers another flow run, transition or question.
    """
    approvers = {a.keyid: a for a in policy.approvers}
    trust, left_out = approvers_trust(policy.approvers)
    if not approvers:
        raise AttestationError("the registered approval policy names no approver keys")
    try:
        signed = verify_envelope(envelope, trust, path="signed approval")
    except AttestationError as err:
        raise AttestationError("; ".join([str(err), *left_out])) from err
    if (why := revoked_key([signed.keyid], revoked)) is not None:
        raise AttestationError(why)
    p = signed.predicate
    expected = (flow_run_id or p.get("flow_run_id"), transition, approve)
    if (p.get("flow_run_id"), p.get("transition"), p.get("approve")) != expected:
        raise AttestationError(
            f"the signed approval answers flow run {p.get('flow_run_id')} {p.get('transition')} "
            f"approve={p.get('approve')}, not this pause ({flow_run_id} {transition} "
            f"approve={approve})")
    approver = approvers[signed.keyid]
    return SignedAnswer(approver.name, f"signed with {approver.name}'s key {signed.keyid[:12]}",
                        str(p.get("comment", "")))


def recheck_answer(record, policy: ApprovalPolicy) -> str | None:
    """The audit's second look at an authenticated approval ``record``
    (``gates.approval.ApprovalRecord``) under the registered ``policy``: its kept signed
    answer must verify with a named approver's key and say what the record says (the
    transition, the answer, the approver, the comment). Returns the problem, or None."""
    if not record.authenticated:
        return None
    if not record.signed_answer:
        return "recorded as signed, but the approver's own signed answer is not kept"
    try:
        # revoked={}: the revocation check was made when the answer was taken
        # (flows.promotion); the audit re-checks its signature and what it says
        answer = verify_approval(record.signed_answer.encode(), policy, flow_run_id=None,
                                 transition=record.transition, approve=record.approved,
                                 revoked={})
    except AttestationError as err:
        return f"the kept signed answer does not verify: {err}"
    if (answer.approver, answer.comment) != (record.approver, record.comment):
        return (f"the record says {record.approver!r}: {record.comment!r}; the signed answer "
                f"{answer.approver!r}: {answer.comment!r}")
    return None
