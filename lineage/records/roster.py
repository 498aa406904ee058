"""The approver roster: who may approve a family's loosenings, and how its first
approvers are named (kept over 350 lines: the founding at a registration and at a
re-anchor are one rule, written, signed and re-checked by the audit side by side).

A loosening after a rejection needs the signed approval of an approver the previous
registration names (``lineage.records.loosening_approval``), and naming an approver is itself a
loosening (``approval.approvers``: a member added). A family whose registration names no
approver (every shipped profile) and whose log holds a rejection would be locked for good.
One registration is let through without an approval, the one that founds the roster:

- it follows a registration that names no approver, in a family none of whose
  registrations ever named one, its signed log without gaps (a deleted registration
  could have named one): a roster is founded on first use once;
- it loosens nothing but approvers added (anything else waits for the second step: an
  approval signed by one of them);
- each entry it adds carries the person's own signature (``proof``) over the family, their
  name and key id, by the key the entry names (``kernelgate keys entry --family F``).

The registration signs ``roster_founded`` (who, which keys, after what); every audit of
the family after says so as a notice (first named by the pipeline's key, trust on first
use) and re-checks it from the frozen thresholds: an entry swapped after signing is a
problem. Once an approver is named, adding another is an ordinary loosening.

A family whose log is damaged before anyone was named founds its roster at the re-anchor
instead (``lineage.aliases.reanchor``): the ``reanchor`` entry carries the re-anchoring
person's own proved entry as ``roster_founded``, on first use once like a registration's
founding. :func:`approvers_of` counts them as the approvers of the registration it follows
and of later ones while none names approvers of its own; every audit says so as a notice
and re-checks it (:func:`recheck_reanchor`). A key revoked in the pipeline's key folder or
the family's log founds nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping

from securesystemslib.signer import Signer, SSlibKey

from gates.approval_policy import Approver
from gates.loosening import loosenings
from gates.preregistration import PreregistrationError
from gates.thresholds import Thresholds, parse_thresholds
from lineage.log.family_log import read as read_log
from lineage.records.loosening_approval import LooseningRefused, no_roster_yet
from lineage.signing.approvals import key_id_of, revoked_key
from lineage.signing.attestations import (
    Attestation,
    AttestationError,
    TrustPolicy,
    make_envelope,
    verify_envelope,
)
from lineage.signing.sources import EvidenceSource, signed_artifact

POSSESSION = "approver-key"
"""The attestation kind of an approver's proof that they hold their key."""


def approver_entry(signer: Signer, family: str, name: str) -> dict:
    """The ``approval.approvers`` entry for the person whose key ``signer`` holds: name,
    key id, public key, and their signature over ``family``, ``name`` and the key id (the
    proof a family's first approvers carry)."""
    public = signer.public_key
    predicate = {"family": family, "name": name, "keyid": public.keyid,
                 "statement": f"{name} holds this key and may approve loosenings of {family}"}
    digest = hashlib.sha256(json.dumps(public.to_dict(), sort_keys=True).encode()).hexdigest()
    envelope = make_envelope(POSSESSION, {f"approver/{public.keyid}": digest}, predicate, signer)
    return {"name": name, "keyid": public.keyid, "public_key": public.to_dict(),
            "proof": json.loads(envelope)}


def possession_problem(approver: Approver, family: str) -> str | None:
    """Why ``approver``'s entry does not prove that its person holds its key for
    ``family`` (a key id that is not its public key's, no proof, a proof by another key
    or for another family, name or key), or None."""
    who = f"{approver.name} (key id {approver.keyid[:12]})"
    key = dict(approver.public_key)
    try:
        computed = key_id_of(key)
        trust = TrustPolicy(public_keys={approver.keyid: SSlibKey.from_dict(approver.keyid, key)})
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return f"{who}: its public key is unusable ({err})"
    if computed != approver.keyid:
        return f"{who}: the key id is not its public key's (that is {computed[:12]})"
    if not approver.proof:
        return (f"{who}: no proof that the person holds the key (the entry `kernelgate keys "
                f"entry --family {family}` prints carries one)")
    try:
        proof = verify_envelope(json.dumps(approver.proof).encode(), trust,
                                path=f"proof of {approver.name}")
    except AttestationError as err:
        return f"{who}: its proof is not signed by the key it names ({err})"
    p = proof.predicate
    if proof.kind != POSSESSION or (p.get("family"), p.get("name"), p.get("keyid")) != (
            family, approver.name, approver.keyid):
        return (f"{who}: its proof is {p.get('name')!r}'s for family {p.get('family')!r}, "
                f"not this entry's for {family}")
    return None


def _frozen(source: EvidenceSource, registration: Attestation) -> Thresholds:
    """A registration's thresholds as frozen (the signed digest checked)."""
    p = registration.predicate
    try:
        _, data = signed_artifact(source, registration.run_id, "registration",
                                  p["thresholds_artifact"])
    except AttestationError as err:
        raise PreregistrationError(str(err)) from err
    if hashlib.sha256(data).hexdigest() != p["thresholds_sha256"]:
        raise PreregistrationError(f"registration {registration.run_id}: stored thresholds "
                                   "were altered after signing")
    return parse_thresholds(data, source=f"registration {registration.run_id}")


def _past_first_use(source: EvidenceSource) -> str | None:
    """Why the family's roster can no longer be founded on first use, or None."""
    log = read_log(source)
    if log.gaps() or log.acknowledged or log.problems:
        return "the family's signed log is missing entries: a deleted registration may have named one"
    return earlier_naming(source)


def _seq(attestation: Attestation) -> int:
    """An entry's signed position in the family's log (0: signed before the log)."""
    pos = attestation.predicate.get("log")
    seq = pos.get("seq") if isinstance(pos, dict) else None
    return int(seq) if isinstance(seq, (int, float)) else 0


def earlier_naming(source: EvidenceSource, before: int | None = None,
                   frozen: Callable[[Attestation], Thresholds] | None = None) -> str | None:
    """Why the family is past its roster's first use, or None: a registration that named
    approvers or founded them, or a re-anchor (approved by a named approver, or founding
    the roster itself), among the entries before log position ``before`` (None: all)."""
    read = frozen or (lambda a: _frozen(source, a))
    entries = sorted((a for a in source.attestations() if a.kind in ("registration", "reanchor")
                      and (before is None or _seq(a) < before)),
                     key=lambda a: (_seq(a), a.predicate.get("registered_at", "")))
    for a in entries:
        if a.kind == "reanchor":
            return (f"the re-anchor at entry {_seq(a)} was approved by "
                    f"{a.predicate.get('approver')}"
                    + (", who founded it" if a.predicate.get("roster_founded") else ""))
        if a.predicate.get("roster_founded"):
            return f"registration {a.run_id} founded it"
        try:
            named = sorted(x.name for x in read(a).approval.approvers)
        except (PreregistrationError, ValueError) as err:
            return f"registration {a.run_id} cannot say whom it named ({err})"
        if named:
            return f"registration {a.run_id} named {named}"
    return None


def approvers_of(source: EvidenceSource,
                 previous: tuple[Attestation, Thresholds]) -> list[Approver]:
    """Who may approve a loosening of the registration ``previous``: the approvers its
    thresholds name; where they name none, those a re-anchor founded (on first use, the
    family's log damaged before anyone was named) when that re-anchor followed this
    registration, or this registration came after it with no registration between naming
    approvers of its own. A founding the audit finds wrong names nobody."""
    attestation, thresholds = previous
    if thresholds.approval.approvers:
        return list(thresholds.approval.approvers)
    for r in (a for a in source.attestations() if a.kind == "reanchor"
              and a.predicate.get("roster_founded")):
        founded = r.predicate["roster_founded"]
        follows = founded.get("previous_registration_id") == attestation.predicate.get(
            "registration_id")
        after = _seq(attestation) > _seq(r) and not any(
            _seq(r) < _seq(a) < _seq(attestation) and _names_any(source, a)
            for a in source.attestations() if a.kind == "registration")
        if (follows or after) and not recheck_reanchor(source, r):
            return [Approver.model_validate(x) for x in founded.get("approvers", [])]
    return []


def _names_any(source: EvidenceSource, registration: Attestation) -> bool:
    """Whether ``registration`` names approvers (one that cannot be read: as if it did)."""
    try:
        return bool(_frozen(source, registration).approval.approvers)
    except (PreregistrationError, ValueError):
        return True


def recheck_reanchor(source: EvidenceSource, reanchor: Attestation,
                     frozen: Callable[[Attestation], Thresholds] | None = None) -> list[str]:
    """Problems with the roster a signed ``reanchor`` entry founds: it must follow the
    family's registration it names (one naming no approver) or none where none came
    before it, come first (no registration or re-anchor before it named or founded
    approvers), be approved by the key it founds, and each entry must prove its key."""
    read = frozen or (lambda a: _frozen(source, a))
    founded = reanchor.predicate["roster_founded"]
    seq = _seq(reanchor)
    where = f"the roster founded at the re-anchor at entry {seq} (run {reanchor.run_id})"
    before = [a for a in source.attestations() if a.kind == "registration" and _seq(a) < seq]
    previous_id = founded.get("previous_registration_id")
    previous = next((a for a in before if a.run_id == previous_id), None)
    problems = []
    if previous_id is None and before:
        problems.append(f"{where}: it follows no registration, yet registrations "
                        f"{sorted(a.run_id for a in before)} came before it")
    elif previous_id is not None and previous is None:
        problems.append(f"{where}: the registration it follows ({previous_id}) has no verified "
                        "record before it in the family's log")
    elif previous is not None and _names_any(source, previous):
        problems.append(f"{where}: the registration it follows ({previous_id}) named approvers")
    if (past := earlier_naming(source, seq, read)) is not None and not problems:
        problems.append(f"{where}: the family was past its roster's first use ({past})")
    entries = founded.get("approvers")
    if not isinstance(entries, list) or not entries:
        return [*problems, f"{where}: it names no approver"]
    keyids = [x.get("keyid") if isinstance(x, dict) else None for x in entries]
    approved_by = reanchor.predicate.get("approver_keyid")
    if keyids != [approved_by]:
        problems.append(f"{where}: it founds keys {keyids}, the re-anchor was approved by "
                        f"key {approved_by}")
    for x in entries:
        try:
            approver = Approver.model_validate(x)
        except ValueError as err:
            problems.append(f"{where}: an unreadable approver entry ({' '.join(str(err).split())})")
            continue
        if (p := possession_problem(approver, source.family)) is not None:
            problems.append(f"{where}: {p}")
    return problems


def beyond_roster(old: Thresholds, new: Thresholds, loosened: list[str]) -> list[str]:
    """The loosenings of ``loosened`` (``old`` -> ``new``, bindings included) other than
    the approvers ``new`` adds to ``old``'s: what founding a roster cannot carry."""
    alone = old.model_copy(update={"approval": old.approval.model_copy(
        update={"approvers": [*old.approval.approvers, *new.approval.approvers]})})
    founds = set(loosenings(old, alone))
    keyids = [a.keyid for a in new.approval.approvers]
    repeated = ["approval.approvers: a keyid repeated"] if len(set(keyids)) != len(keyids) else []
    return [item for item in loosened if item not in founds] + repeated


def founding(source: EvidenceSource, previous: tuple[Attestation, Thresholds],
             thresholds: Thresholds, loosened: list[str], *, why: str, shown: str,
             revoked: Mapping[str, str]) -> dict | None:
    """What a registration of ``thresholds`` (``shown`` in messages), loosening
    ``previous`` by ``loosened`` after a rejection (``why``) and carrying no approval,
    signs as the roster it founds; None where ``previous`` has approvers (named, or
    founded at a re-anchor: :func:`approvers_of`; the ordinary rule applies).
    ``revoked``: key id -> how it was revoked (``lineage.signing.approvals.revocations``).

    Raises:
        LooseningRefused: ``previous`` has no approver, and this is no founding: it
            adds none, loosens more than approvers, comes after the first use, an added
            entry does not prove its key, or names a revoked key.
    """
    attestation, old = previous
    if approvers_of(source, previous):
        return None
    family = source.family
    registration_id = attestation.predicate["registration_id"]
    added = list(thresholds.approval.approvers)
    names = [a.name for a in added]
    others = beyond_roster(old, thresholds, loosened)
    head = f"{shown} loosens the family's previous registration {registration_id} after a rejection ({why})"
    if not added or others:
        also = (f"; it also adds approvers {names}, and a registration that founds the "
                "roster only adds approvers" if added else "")
        raise LooseningRefused(f"{head}: {'; '.join(others)}{also}. "
                               + no_roster_yet(registration_id, family))
    if (past := _past_first_use(source)) is not None:
        raise LooseningRefused(
            f"{head}: it adds approvers {names}, and a family's roster is founded on first use "
            f"once ({past}): adding approvers now needs an approval by one named in registration "
            f"{registration_id}, which names none")
    if (gone := revoked_key([a.keyid for a in added], revoked)) is not None:
        raise LooseningRefused(f"{shown} names the family's first approvers: {gone}")
    problems = [p for a in added if (p := possession_problem(a, family)) is not None]
    if problems:
        raise LooseningRefused(f"{shown} names the family's first approvers, and each entry "
                               "must prove its person holds its key: " + "; ".join(problems))
    return {"approvers": [{"name": a.name, "keyid": a.keyid} for a in added],
            "previous_registration_id": registration_id, "after": why,
            "trust": "on first use: no approver existed to sign it"}


def _recheck(source: EvidenceSource, registration: Attestation,
             registrations: dict[str, Attestation],
             frozen: Callable[[Attestation], Thresholds]) -> list[str]:
    """Problems with a signed founding, re-derived from the frozen thresholds (read
    through ``frozen``: the audit reads each registration's once)."""
    founded = registration.predicate["roster_founded"]
    where = f"the roster founded at registration {registration.run_id}"
    before = registrations.get(str(founded.get("previous_registration_id")))
    try:
        named = frozen(registration).approval.approvers
        old = frozen(before).approval.approvers if before else None
    except (PreregistrationError, ValueError) as err:
        return [f"{where}: {err}"]
    if old is None or old:
        return [f"{where}: the registration it follows ({founded.get('previous_registration_id')}) "
                + ("has no verified record" if old is None else "named approvers")]
    signed = [(a.get("name"), a.get("keyid")) for a in founded.get("approvers", [])]
    if signed != [(a.name, a.keyid) for a in named]:
        return [f"{where}: it signs approvers {signed}, its thresholds name "
                f"{[(a.name, a.keyid) for a in named]}"]
    return [f"{where}: {p}" for a in named if (p := possession_problem(a, source.family))]


def audit_roster(source: EvidenceSource) -> tuple[list[str], list[str]]:
    """``(notices, problems)`` of the family's roster as the audit shows them: each signed
    founding (who, which keys, by which pipeline key) as a notice on every audit, and
    what re-checking it from its frozen thresholds finds."""
    registrations = {a.run_id: a for a in source.attestations() if a.kind == "registration"}
    read: dict[str, Thresholds] = {}

    def frozen(registration: Attestation) -> Thresholds:
        if registration.run_id not in read:
            read[registration.run_id] = _frozen(source, registration)
        return read[registration.run_id]

    notices: list[str] = []
    problems: list[str] = []
    known: set[str] | None = set()
    for a in sorted(registrations.values(), key=lambda a: a.predicate.get("registered_at", "")):
        founded = a.predicate.get("roster_founded")
        known, named = _named_here(frozen, a, known)
        if named and not founded and not a.predicate.get("loosening_approval"):
            notices.append(_unapproved_naming(a, named, source.family))
        if not founded:
            continue
        who = ", ".join(f"{x.get('name')} (key {str(x.get('keyid'))[:12]})"
                        for x in founded.get("approvers", []))
        notices.append(f"approvers {who} first named at registration {a.run_id} by the pipeline "
                       f"key {a.keyid[:12]}, trust on first use: no approver existed to sign it "
                       f"(after: {founded.get('after')})")
        problems += _recheck(source, a, registrations, frozen)
    for r in sorted((a for a in source.attestations() if a.kind == "reanchor"
                     and a.predicate.get("roster_founded")), key=_seq):
        entries = r.predicate["roster_founded"].get("approvers") or []
        who = ", ".join(f"{x.get('name')} (key {str(x.get('keyid'))[:12]})"
                        for x in entries if isinstance(x, dict))
        notices.append(f"approvers {who} first named at the re-anchor at entry {_seq(r)} (run "
                       f"{r.run_id}) by the pipeline key {r.keyid[:12]}, trust on first use: no "
                       f"earlier approver's signature (the log was damaged before anyone was "
                       f"named: {r.predicate.get('reason')})")
        problems += recheck_reanchor(source, r, frozen)
    return notices, problems


def _named_here(frozen: Callable[[Attestation], Thresholds], registration: Attestation,
                known: set[str] | None) -> tuple[set[str] | None, list[Approver]]:
    """The approver key ids known after ``registration``, and the approvers it names that
    none before it did (``known`` None: an earlier registration could not be read, so
    nothing is said to be new)."""
    try:
        approvers = frozen(registration).approval.approvers
    except (PreregistrationError, ValueError, KeyError):
        return None, []  # the registration audit names an unreadable registration
    new = [] if known is None else [x for x in approvers if x.keyid not in known]
    return {x.keyid for x in approvers} | (known or set()), new


def _unapproved_naming(registration: Attestation, named: list[Approver], family: str) -> str:
    """The notice for approvers named by a registration no approver signed (before any
    rejection the file's writer may name anyone): who, and whether each proved the key."""
    who = "; ".join(f"{x.name} (key {x.keyid[:12]}: "
                    + ("proof of holding it checked"
                       if not possession_problem(x, family) else
                       "no valid proof that this person holds the key")
                    + ")" for x in named)
    return (f"approvers named at registration {registration.run_id} by the pipeline key "
            f"{registration.keyid[:12]} with no approver's signature (before any rejection, "
            f"as the thresholds file's writer chose): {who}")


def registration_lines(source: EvidenceSource) -> list[str]:
    """The family's registrations as the audit lists them, oldest first: profile,
    digest, and what each loosened, by whose approval or as the roster's founding."""
    out = []
    for a in sorted((a for a in source.attestations() if a.kind == "registration"),
                    key=lambda a: a.predicate.get("registered_at", "")):
        p = a.predicate
        line = (f"{p.get('registered_at')} {a.run_id} profile {p.get('profile')} sha256 "
                f"{str(p.get('thresholds_sha256'))[:12]}")
        approval = p.get("loosening_approval") or {}
        if p.get("roster_founded"):
            line += f"; ROSTER FOUNDED on first use {p.get('loosened')}"
        elif p.get("loosened"):
            line += (f"; LOOSENED {p['loosened']} approved by {approval.get('approver')}: "
                     f"{approval.get('reason')}" if approval else f"; loosened {p['loosened']}")
        out.append(line)
    return out
