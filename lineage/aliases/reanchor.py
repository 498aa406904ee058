"""Re-anchoring a family's signed log that is damaged for real (a disk lost, a restore
from an older backup): the only way past :class:`~lineage.log.family_log.LogDamaged`.

A person named in the approval policy of the family's latest registration signs, with
their own key, what is missing or damaged and why (a ``reanchor-approval`` envelope);
the pipeline checks that key against the policy, keeps the person's envelope as an
artifact of a ``reanchor`` run and appends a ``reanchor`` entry to the log that lists
every entry it gives up on. The audit says so on every run after (a warning line, not a
failure): nothing missing is ever silently forgotten. The loosening rule counts a
re-anchored range as a possible rejection (``lineage.records.registration``).

A family whose log this store lost entirely (its experiment renamed or deleted: a
writer refuses a new first entry of a family the pipeline's checkpoint knows) is
restarted the same way: the re-anchor continues the family's log after the checkpoint's
head, giving up every entry of it, and its approver is one named in the newest
registration of that log, read where the log still is (the experiment the family's was
renamed to, deleted ones included). Without one the family stays refused.

The aliases are re-attested too: the approval names the aliases as MLflow shows them
(what serves), and every alias the signed history leaves elsewhere gets a signed
``reattest`` move to that version. Without it a cut rollback (its signed move lost)
would be undone by the next ``reconcile``, putting the rolled-back version back in
production "as signed".
"""

from __future__ import annotations

import hashlib
import json

from securesystemslib.signer import Signer

from gates.approval_policy import Approver
from kernels.errors import KernelgateError
from lineage.aliases import key_rotation, registered_model
from lineage.log import family_log, log_writer
from lineage.records.registration import latest_registration
from lineage.records.roster import (
    approver_entry,
    approvers_of,
    earlier_naming,
    possession_problem,
)
from lineage.signing.approvals import approvers_trust, revocations, revoked_key
from lineage.signing.attestations import (
    Attestation,
    AttestationError,
    Signing,
    TrustPolicy,
    make_envelope,
    verify_envelope,
)
from lineage.signing.sources import StoreSource
from lineage.store import store_identity, tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

APPROVAL_ARTIFACT = "log/reanchor-approval.dsse.json"


class ReanchorRefused(KernelgateError, RuntimeError):
    """The log is intact, the reason is empty, the key is revoked or not an approver's,
    or it cannot found the family's roster."""


def reanchor(tracking: Tracking, family: str, approver: Signer, reason: str,
             signing: Signing, *, name: str | None = None) -> Attestation:
    """Re-anchor ``family``'s damaged log with an approver's signed approval.

    The approver is one of the family's latest verified registration (named there, or
    founded at an earlier re-anchor: ``lineage.records.roster.approvers_of``). Where it
    has none and none was ever named, ``approver`` becomes the family's first approver
    here, named ``name``: the entry carries their roster entry (public key and their
    signature over it, as ``kernelgate keys entry`` makes it) as ``roster_founded``, and
    every audit after says so (trust on first use).

    Returns the ``reanchor`` entry appended.

    Raises:
        ReanchorRefused: nothing is damaged, no reason, ``approver``'s key is revoked (in
            the pipeline's key folder or the family's log), it is not an approver where
            approvers exist, or, where none exists, the family is past its roster's first
            use, the log was restarted from another experiment, or no ``name`` is given.
    """
    if not reason.strip():
        raise ReanchorRefused("a re-anchor needs a reason (what was lost, and how)")
    source = StoreSource(tracking, family, signing.trust)
    log = family_log.read(source)
    damage, checkpoint = log_writer.damage(log, signing,
                                           location=store_identity.location(tracking))
    if not damage:
        raise ReanchorRefused(f"the signed log of {family} is intact: nothing to re-anchor")
    own = latest_registration(source)
    latest = own or earlier_registration(tracking, family, signing.trust, checkpoint)
    keyid = approver.public_key.keyid
    refusal = revoked_key([keyid], revocations(signing.trust, log.entries.values()))
    if refusal is not None:
        raise ReanchorRefused(refusal)
    approvers = {a.keyid: a for a in approvers_of(source, latest)} if own else {
        a.keyid: a for a in (latest[1].approval.approvers if latest else [])}
    founded = None
    if not approvers:
        founded = _founding(source, own or latest, approver, family, name)
        approvers = {keyid: Approver.model_validate(founded["approvers"][0])}
    if keyid not in approvers:
        raise ReanchorRefused(
            f"key {keyid[:12]} is not an approver named in {family}'s latest registration "
            f"(named: {sorted(a.name for a in approvers.values()) or 'none'})")
    length = max(log.length, checkpoint.length if checkpoint else 0)
    missing = sorted(set(log.gaps()) | set(range(log.length + 1, length + 1))
                     | ({checkpoint.length} if checkpoint and checkpoint.length <= log.length
                        and log.digest_at(checkpoint.length) != checkpoint.head else set()))
    shown = registered_model.aliases(tracking, family)
    predicate = {"family": family, "missing": missing, "damage": damage, "reason": reason,
                 "genesis": log.genesis or (checkpoint.genesis if checkpoint else None),
                 "store": log.store or (checkpoint.store if checkpoint else None),
                 "aliases": shown}
    digest = hashlib.sha256(json.dumps(damage).encode()).hexdigest()
    approval = make_envelope("reanchor-approval", {f"log/{family}/damage": digest}, predicate,
                             approver)
    check_approval(approval, approvers_trust(approvers.values())[0], predicate)
    with tr.stage_run(tracking, family, "reanchor", run_name="reanchor-log") as run_id:
        tr.log_bytes(tracking, run_id, approval, APPROVAL_ARTIFACT)
        entry = log_writer.append(tracking, run_id, "reanchor", {
            **predicate, "approver": approvers[keyid].name, "approver_keyid": keyid,
            "approval_artifact": APPROVAL_ARTIFACT,
            **({"roster_founded": founded} if founded else {})}, signing, force=True)
    key_rotation.reattest(tracking, family, signing, to=shown,
                          reason=f"re-anchor {run_id}: the aliases as {approvers[keyid].name} "
                                 "approved them")
    return entry


def _founding(source: StoreSource, latest, approver: Signer, family: str,
              name: str | None) -> dict:
    """The roster a re-anchor founds with ``approver`` as the family's first approver
    (``roster_founded`` of the entry): their own signed entry, and the registration it
    follows (``latest``, of this log; None: the family has none).

    Raises:
        ReanchorRefused: ``latest`` is another experiment's (a restarted log: the audit
            could not re-check it), the family is past its roster's first use, no
            ``name``, or the entry does not prove its key.
    """
    if latest is not None and latest[0].run_id not in {
            a.run_id for a in source.attestations() if a.kind == "registration"}:
        raise ReanchorRefused(
            f"{family}'s log is restarted and the registration it continues "
            f"({latest[0].predicate['registration_id']}) names no approver: a roster is not "
            "founded at a restart, since no audit of this log could re-check that "
            "registration; name an approver there, or start a new family")
    if (past := earlier_naming(source)) is not None:
        raise ReanchorRefused(
            f"{family}'s latest registration names no approver, and a family's roster is "
            f"founded on first use once ({past}): only an approver named before can "
            "re-anchor it")
    if not (name or "").strip():
        raise ReanchorRefused(
            f"{family}'s latest registration names no approver: the re-anchor's key becomes "
            "the family's first approver, and needs a name (--name)")
    entry = approver_entry(approver, family, name.strip())
    try:
        problem = possession_problem(Approver.model_validate(entry), family)
    except ValueError as err:
        problem = f"{name}: an unreadable approver entry ({' '.join(str(err).split())})"
    if problem is not None:
        raise ReanchorRefused(f"the re-anchor names the family's first approver, and the "
                              f"entry must prove its person holds the key: {problem}")
    return {"approvers": [entry],
            "previous_registration_id": latest[0].predicate["registration_id"] if latest else None,
            "after": "a damaged log, re-anchored before anyone was named",
            "trust": "on first use: no approver existed to sign it"}


def earlier_registration(tracking: Tracking, family: str, trust: TrustPolicy,
                         checkpoint: family_log.Head | None):
    """The newest verified registration of ``family``'s log as ``checkpoint`` knows it
    (same first entry), read from any experiment of the family (renamed or deleted ones
    included), with its thresholds; None: no checkpoint, or that log is nowhere here."""
    if checkpoint is None:
        return None
    from mlflow.entities import ViewType

    found = tracking.client().search_experiments(
        view_type=ViewType.ALL, filter_string=f"tags.`{tags.FAMILY}` = '{family}'")
    for experiment in found:
        source = StoreSource(tracking, family, trust, experiment_id=experiment.experiment_id)
        if family_log.read(source).genesis == checkpoint.genesis:
            latest = latest_registration(source)
            if latest is not None:
                return latest
    return None




def check_approval(envelope: bytes, trust: TrustPolicy, predicate: dict) -> None:
    """The person's envelope approves exactly this re-anchor.

    Raises:
        ReanchorRefused: not signed by a trusted approver, or for something else.
    """
    try:
        approval = verify_envelope(envelope, trust, path="re-anchor approval")
    except AttestationError as err:
        raise ReanchorRefused(str(err)) from err
    if approval.kind != "reanchor-approval" or any(
            approval.predicate.get(k) != v for k, v in predicate.items() if k != "damage"):
        raise ReanchorRefused("the re-anchor approval is for another family or range")
