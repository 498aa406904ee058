"""What a person's approval of a loosening signs, and when a registration accepts it.

A registration that loosens the family's previous one after a rejection needs a person
named in that registration's approval policy to sign exactly that loosening
(``kernelgate approve-loosening``). The approval is bound to what it approves, so it is no
bearer token: the registration it loosens (id and envelope digest: an old approval cannot
re-loosen the family after a later registration), the thresholds file's sha256, the rollout
settings it binds (``lineage.records.bindings``: another test-set profile cannot ride along), an
expiry, and a nonce spent by the one registration that carries it; an approver key revoked
in the pipeline's key folder or in the family's signed log signs nothing any more.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gates.approval_policy import Approver
from gates.preregistration import PreregistrationError
from gates.thresholds import Thresholds, parse_thresholds
from lineage.records.bindings import RolloutBindings, whole_numbers
from lineage.signing.approvals import approvers_trust, revoked_key
from lineage.signing.attestations import (
    Attestation,
    AttestationError,
    make_envelope,
    verify_envelope,
)
from lineage.signing.sources import EvidenceSource


class LooseningRefused(PreregistrationError):
    """A registration loosens thresholds after a rejection without a valid named approval."""


LOOSENING_VALID_S = 7 * 24 * 3600
"""How long a signed loosening approval stays usable by default (seconds)."""


def no_roster_yet(registration_id: str, family: str) -> str:
    """Why no loosening approval of ``registration_id`` can exist (it names no approver),
    and the two steps that lead past it (``lineage.records.roster``)."""
    return (f"registration {registration_id} names no approver, so no loosening approval "
            "can exist yet. Two steps: first roll out a thresholds file that only adds "
            "approvers to approval.approvers, each entry as `kernelgate keys entry --key "
            f"KEY.pem --family {family}` prints it (the person's signature shows they hold "
            "the key): a family's first approvers are accepted on first use, and every audit "
            "says so; then one of them signs the loosening (kernelgate approve-loosening) "
            "and the rollout passes it with --loosening-approval")


def unnamed(previous: Attestation, thresholds: Thresholds, keyids: set[str],
            family: str, approvers: Sequence[Approver] | None = None) -> str | None:
    """Why keys ``keyids`` cannot approve a loosening of the registration ``previous``
    (whose thresholds are ``thresholds``), or None: one of them is named there. The same
    words for ``kernelgate approve-loosening`` (before it signs) and the rollout.
    ``approvers``: the registration's approvers where a re-anchor founded them
    (``lineage.records.roster.approvers_of``; default: those its thresholds name)."""
    registration_id = previous.predicate["registration_id"]
    named = {a.keyid: a.name for a in (thresholds.approval.approvers if approvers is None
                                       else approvers)}
    if not named:
        return no_roster_yet(registration_id, family)
    if keyids & set(named):
        return None
    shown = ", ".join(sorted(k[:12] for k in keyids)) or "(none)"
    return (f"key {shown} is not an approver of registration {registration_id} (it names "
            f"{sorted(named.values())})")


def check_loosening_approval(envelope: bytes, previous: tuple[Attestation, Thresholds],
                              family: str, thresholds_sha256: str, loosened: list[str],
                              bindings: RolloutBindings | None, source: EvidenceSource,
                              revoked: Mapping[str, str],
                              approvers: Sequence[Approver] | None = None) -> dict:
    """A person's signed approval of exactly this loosening: by a key the previous
    registration's policy names (or ``approvers``: those a re-anchor founded for it,
    ``lineage.records.roster.approvers_of``) and that is not revoked (``revoked``: key id
    -> how, ``lineage.signing.approvals.revocations``), of this family's newest
    registration (its id and envelope digest), of this file and these ``bindings``, not
    expired and not used before (its nonce is spent by the registration that carries
    it). Returns its predicate.

    Raises:
        LooseningRefused: naming what does not match.
    """
    policy = list(previous[1].approval.approvers if approvers is None else approvers)
    named = {a.keyid: a for a in policy}
    names = sorted(a.name for a in named.values())
    try:
        claimed = {str(k) for k in (s.get("keyid") for s in json.loads(envelope)["signatures"])}
    except (ValueError, KeyError, TypeError, AttributeError):
        claimed = set()
    if (claimed or not named) and (why := unnamed(previous[0], previous[1], claimed, family,
                                                     policy)) is not None:
        raise LooseningRefused(f"loosening approval not accepted: {why}")
    if (gone := revoked_key(claimed & set(named), revoked)) is not None:
        raise LooseningRefused(f"loosening approval not accepted: {gone}")
    trust, left_out = approvers_trust(policy, revoked)
    try:
        approval = verify_envelope(envelope, trust, path="loosening approval")
    except AttestationError as err:
        raise LooseningRefused(f"loosening approval not accepted: {err} (the previous "
                               f"registration trusts {names or 'no approver keys'}"
                               + "".join(f"; {why}" for why in left_out) + ")") from err
    p = approval.predicate
    if (approval.kind != "loosening" or p.get("family") != family
            or p.get("thresholds_sha256") != thresholds_sha256 or not str(p.get("reason", "")).strip()):
        raise LooseningRefused("the loosening approval is for another family or file, or gives "
                               "no reason")
    newest = previous[0].predicate["registration_id"]
    if (p.get("previous_registration_id"), p.get("previous_envelope")) != (
            newest, previous[0].envelope_sha256):
        raise LooseningRefused(
            f"the loosening approval approves a loosening of registration "
            f"{p.get('previous_registration_id') or '(none named)'}; the family's newest is "
            f"{newest}: an approval binds the registration it loosens (sign a new one with "
            "kernelgate approve-loosening)")
    try:
        expires = datetime.fromisoformat(str(p.get("expires_at")))
    except ValueError:
        raise LooseningRefused("the loosening approval names no expiry") from None
    if expires.tzinfo is None or datetime.now(UTC) > expires:
        raise LooseningRefused(f"the loosening approval expired at {p.get('expires_at')}")
    nonce = str(p.get("nonce") or "")
    spent = [a.run_id for a in source.attestations() if a.kind == "registration"
             and (a.predicate.get("loosening_approval") or {}).get("nonce") == nonce]
    if not nonce or spent:
        raise LooseningRefused(f"the loosening approval was used already (registration "
                               f"{spent[0] if spent else '?'}): an approval is good for one "
                               "registration")
    asked = None if bindings is None else whole_numbers(bindings.model_dump(mode="json"))
    approved = whole_numbers(p.get("bindings"))
    if asked != approved:
        differ = sorted(k for k in set(asked or {}) | set(approved or {})
                        if (asked or {}).get(k) != (approved or {}).get(k))
        raise LooseningRefused(
            "the loosening approval approves other rollout settings than this rollout binds: "
            + "; ".join(f"{k}: approved {(approved or {}).get(k)!r}, this rollout "
                        f"{(asked or {}).get(k)!r}" for k in differ))
    return {**p, "approver": named[approval.keyid].name, "keyid": approval.keyid,
            "loosened": loosened}


def loosening_predicate(family: str, thresholds_path: Path, reason: str, *,
                        previous: Attestation, bindings: dict | None,
                        valid_for_s: float = LOOSENING_VALID_S, nonce: str | None = None) -> dict:
    """What a person signs to approve a loosening (``kernelgate approve-loosening``): this
    thresholds file for ``family``, as a loosening of exactly the registration ``previous``
    (its id and envelope digest), with these rollout ``bindings`` (``lineage.records.bindings``, as
    JSON), good until ``valid_for_s`` seconds from now and for one registration (``nonce``,
    random when None)."""
    import secrets

    data = Path(thresholds_path).read_bytes()
    expires = datetime.now(UTC) + timedelta(seconds=valid_for_s)
    return {"family": family, "thresholds_sha256": hashlib.sha256(data).hexdigest(),
            "reason": reason, "file": Path(thresholds_path).name,
            "thresholds": json.loads(json.dumps(parse_thresholds(data).model_dump(mode="json"))),
            "previous_registration_id": previous.predicate["registration_id"],
            "previous_envelope": previous.envelope_sha256, "bindings": bindings,
            "expires_at": expires.isoformat(), "nonce": nonce or secrets.token_hex(16)}


def sign_loosening(signer, family: str, thresholds_path: Path, reason: str, *,
                   previous: Attestation, bindings: dict | None,
                   valid_for_s: float = LOOSENING_VALID_S) -> bytes:
    """A person's signed approval of exactly this thresholds file for ``family``, as a
    loosening of the registration ``previous`` with ``bindings``
    (:func:`loosening_predicate`); the file's bytes are its subject."""
    predicate = loosening_predicate(family, thresholds_path, reason, previous=previous,
                                    bindings=bindings, valid_for_s=valid_for_s)
    return make_envelope("loosening", {f"thresholds/{Path(thresholds_path).name}":
                                       predicate["thresholds_sha256"]}, predicate, signer)
