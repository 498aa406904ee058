"""Preregistration in MLflow: freeze a thresholds file before any evaluation, signed,
in an append-only chain per family.

:func:`preregister` validates the file, logs its exact bytes as the artifact
``thresholds/<file name>`` of a ``preregistration`` run, and signs a ``registration``
attestation naming the file's sha256, the UTC registration time and the family's
previous registration (so the chain shows every registration in order). A
registration that loosens any criterion of the previous one (``gates.loosening``) after
a candidate of the family was rejected or rolled back is refused unless a person named
in the previous registration's approval policy signed an approval of exactly that
loosening (``kernelgate approve-loosening``), or it only names the family's first
approvers, each proving their key (``lineage.records.roster``: trust on first use, signed as
``roster_founded`` and shown by every audit after); the audit shows the chain. The run id is
the registration id. The rules of a valid registration are ``gates.preregistration``'s.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gates.loosening import loosenings
from gates.preregistration import PreregistrationError, Registration, check_registration
from gates.thresholds import Thresholds, parse_thresholds
from lineage.log.family_log import read as read_log
from lineage.log.log_writer import append, current_damage, intact_log
from lineage.records.bindings import RolloutBindings, refuse_rebinding, whole_numbers
from lineage.records.bindings import changes as binding_changes
from lineage.records.loosening_approval import LooseningRefused, check_loosening_approval
from lineage.records.roster import approvers_of, founding
from lineage.signing.approvals import revocations
from lineage.signing.attestations import (
    Attestation,
    AttestationError,
    Signing,
)
from lineage.signing.sources import EvidenceSource, StoreSource, signed_artifact
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

__all__ = ["FrozenRegistration", "LooseningRefused", "PreregistrationError", "Registration",
           "frozen_registration", "had_rejection", "latest_registration", "load_registration",
           "preregister", "preregister_bytes", "registered_bytes", "registered_thresholds",
           "rejection_in_log", "thresholds_for_gate", "verify_registration"]


def _registration_of(attestation: Attestation) -> Registration:
    p = attestation.predicate
    return Registration(registration_id=p["registration_id"], family=p["family"],
                        profile=p["profile"], thresholds_sha256=p["thresholds_sha256"],
                        thresholds_artifact=p["thresholds_artifact"],
                        registered_at=datetime.fromisoformat(p["registered_at"]))


def latest_registration(source: EvidenceSource) -> tuple[Attestation, Thresholds] | None:
    """The family's newest verified registration and its thresholds, or None."""
    registrations = sorted((a for a in source.attestations() if a.kind == "registration"),
                           key=lambda a: a.predicate["registered_at"])
    if not registrations:
        return None
    newest = registrations[-1]
    return newest, registered_thresholds(source, _registration_of(newest))


def _rejects(a: Attestation) -> bool:
    """Whether a signed record says a candidate was found wanting: a gate that rejected, a
    shadow or canary step that breached, a production rollback, a rollout that ended
    rejected, timed out or rolled back. Not an inconclusive rollout (noise, no fresh
    calibration: no finding about the kernel), not an errored one (a crash), not one
    ending ``not_adopted`` (safe, but not worth adopting: a finding about its value, not
    a failure), and not the shadow/canary alias taken back when either ends (its outcome
    says why)."""
    p = a.predicate
    return ((a.kind == "decision" and p.get("verdict") == "reject")
            or (a.kind in ("shadow", "canary") and p.get("passed") is False)
            or (a.kind == "alias" and p.get("action") == "rollback"
                and p.get("alias") == "production")
            or (a.kind == "outcome" and not p.get("inconclusive")
                and p.get("result") in ("rejected", "timed_out", "rolled_back")))


def had_rejection(source: EvidenceSource) -> bool:
    """Whether any candidate of the family was rejected or rolled back (signed), or the
    family's signed log cannot say: see :func:`rejection_in_log`."""
    return rejection_in_log(source) is not None


def rejection_in_log(source: EvidenceSource, damage: list[str] | None = None) -> str | None:
    """Why a loosening needs a person's approval, read from the family's signed log (never
    from "what is still in the store"), or None: a rejection or rollback in the log; a
    missing entry (a deleted envelope may have been one), re-anchored or not; or a record
    signed before the log existed that rejects; ``damage``: what a writer found wrong with
    the log (``lineage.log.log_writer.damage``: it also sees a cut at the end)."""
    log = read_log(source)
    missing = sorted(set(log.gaps()) | set(log.acknowledged))
    if missing or log.problems or damage:
        return (f"the family's signed log is missing entries {missing or ''} or is damaged "
                f"({'; '.join(damage or log.problems) or 're-anchored'}): a rejection may have "
                "been deleted")
    found = [a for a in log.entries.values() if _rejects(a)]
    if found:
        first = min(found, key=lambda a: a.predicate["log"]["seq"])
        return f"a {first.kind} in run {first.run_id} rejected or rolled back a candidate"
    if any(_rejects(a) for a in source.attestations() if "log" not in a.predicate):
        return "a record signed before the log existed rejected or rolled back a candidate"
    return None


def preregister(path: str | Path, *, tracking: Tracking, family: str, signing: Signing,
                parent_run_id: str | None = None,
                loosening_approval: bytes | None = None,
                bindings: RolloutBindings | None = None) -> Registration:
    """Freeze the thresholds file at ``path`` in MLflow, signed; return its registration
    (:func:`preregister_bytes` of the file's bytes under its name).

    Raises:
        FileNotFoundError: no such file; otherwise as :func:`preregister_bytes`.
    """
    path = Path(path)
    return preregister_bytes(path.read_bytes(), path.name, tracking=tracking, family=family,
                             signing=signing, parent_run_id=parent_run_id,
                             loosening_approval=loosening_approval, bindings=bindings,
                             source=str(path))


def preregister_bytes(data: bytes, name: str, *, tracking: Tracking, family: str,
                      signing: Signing, parent_run_id: str | None = None,
                      loosening_approval: bytes | None = None,
                      bindings: RolloutBindings | None = None,
                      source: str | None = None) -> Registration:
    """Freeze the thresholds ``data`` (a file's exact bytes, registered as
    ``thresholds/<name>``) in MLflow, signed; return its registration. ``source`` names
    the bytes in error messages (default ``name``).

    Call it before the candidate is evaluated: the gate later refuses evaluations that
    started before ``registered_at``.

    Raises:
        ValueError: the bytes are not a valid thresholds file (nothing is registered then).
        LooseningRefused: they loosen the family's previous registration after a
            rejection, and no valid approval of that loosening was given (a changed
            binding counts as a loosening then).
        lineage.records.bindings.BindingsRefused: the same thresholds file as the family's newest
            registration, with other ``bindings`` (the rollout settings it signs).
    """
    path = Path(source or name)
    thresholds = parse_thresholds(data, source=str(path))  # never freeze an invalid file
    digest = hashlib.sha256(data).hexdigest()
    source = StoreSource(tracking, family, signing.trust)
    previous = latest_registration(source)
    loosened = loosenings(previous[1], thresholds) if previous else []
    if previous and bindings is not None:
        bound = previous[0].predicate.get("bindings")
        if previous[0].predicate.get("thresholds_sha256") == digest:
            refuse_rebinding(previous[0].predicate["registration_id"], bound, bindings)
        loosened += [f"binding {change}" for change in binding_changes(bound, bindings)]
    approved = founded = None
    why = rejection_in_log(source, current_damage(source, signing)) if loosened else None
    revoked = revocations(signing.trust, read_log(source).entries.values()) if why else {}
    if why is not None and loosening_approval is None:
        founded = founding(source, previous, thresholds, loosened, why=why, shown=str(path),
                           revoked=revoked)
        if founded is None:
            raise LooseningRefused(
                f"{path} loosens the family's previous registration "
                f"{previous[0].predicate['registration_id']} after a rejection ({why}): "
                + "; ".join(loosened)
                + ". A person named in that registration's approval policy must approve it "
                "(kernelgate approve-loosening), or keep the thresholds")
    elif why is not None:
        approved = check_loosening_approval(loosening_approval, previous, family, digest,
                                             loosened, bindings, source, revoked,
                                             approvers_of(source, previous))
    intact_log(source, signing)  # a damaged log takes no new registration (LogDamaged)
    artifact = f"thresholds/{Path(name).name}"
    with tr.stage_run(tracking, family, "preregistration", parent_run_id=parent_run_id,
                      run_name=f"preregistration-{thresholds.profile}") as run_id:
        tr.log_bytes(tracking, run_id, data, artifact)
        if loosening_approval is not None and approved is not None:
            tr.log_bytes(tracking, run_id, loosening_approval, "thresholds/loosening-approval.dsse.json")
        registered_at = datetime.now(UTC)
        run_tags = {tags.THRESHOLDS_SHA256: digest, tags.THRESHOLDS_ARTIFACT: artifact,
                    tags.REGISTERED_AT: registered_at.isoformat(), tags.PROFILE: thresholds.profile}
        tr.set_tags(tracking, run_id, run_tags)
        append(tracking, run_id, "registration", {
            "registration_id": run_id, "family": family, "profile": thresholds.profile,
            "thresholds_sha256": digest, "thresholds_artifact": artifact,
            "registered_at": registered_at.isoformat(),
            "previous_registration_id": previous[0].predicate["registration_id"] if previous else None,
            "previous_envelope": previous[0].envelope_sha256 if previous else None,
            "loosened": loosened, "loosening_approval": approved, "tags": run_tags,
            "bindings": None if bindings is None else bindings.model_dump(mode="json"),
            **({"roster_founded": founded} if founded else {})},
            signing)
    return Registration(registration_id=run_id, family=family, profile=thresholds.profile,
                        thresholds_sha256=digest, thresholds_artifact=artifact,
                        registered_at=registered_at)


def _registration_attestation(source: EvidenceSource, registration_id: str) -> Attestation:
    signed = [a for a in source.attestations()
              if a.run_id == registration_id and a.kind == "registration"]
    if not signed:
        gone = " (its run was deleted)" if registration_id in source.deleted() else ""
        raise PreregistrationError(f"registration {registration_id}: no verified registration "
                                   f"attestation{gone}")
    return signed[-1]


def load_registration(source: EvidenceSource, registration_id: str) -> Registration:
    """A registration as its signed attestation says, its thresholds bytes intact.

    Raises:
        PreregistrationError: no verified registration attestation in that run (or it
            names another run), or the stored thresholds differ from the signed digest.
    """
    registration = _registration_of(_registration_attestation(source, registration_id))
    if registration.registration_id != registration_id:
        raise PreregistrationError(f"registration {registration_id}: its attestation names "
                                   f"{registration.registration_id}")
    registered_thresholds(source, registration)  # the frozen bytes must be intact
    return registration


def registered_bytes(source: EvidenceSource, registration: Registration) -> bytes:
    """The thresholds file's bytes exactly as frozen (checked against the signed digest).

    Raises:
        PreregistrationError: the stored bytes are not the registered ones.
    """
    try:
        _, data = signed_artifact(source, registration.registration_id, "registration",
                                  registration.thresholds_artifact)
    except AttestationError as exc:
        raise PreregistrationError(str(exc)) from exc
    if hashlib.sha256(data).hexdigest() != registration.thresholds_sha256:
        raise PreregistrationError(
            f"registration {registration.registration_id}: stored thresholds were altered")
    return data


def registered_thresholds(source: EvidenceSource, registration: Registration) -> Thresholds:
    """Parse the thresholds exactly as frozen (:func:`registered_bytes`).

    Raises:
        PreregistrationError: the stored bytes are not the registered ones.
    """
    return parse_thresholds(registered_bytes(source, registration),
                            source=f"registration {registration.registration_id}")


class FrozenRegistration(BaseModel):
    """A registration as the gate and every later stage read it: the signed registration,
    its thresholds file's frozen bytes and their parse, and the bindings it signed (None
    for a registration made before bindings existed)."""

    model_config = ConfigDict(frozen=True)

    registration: Registration
    thresholds_bytes: bytes = Field(repr=False)
    thresholds: Thresholds = Field(repr=False)
    bindings: RolloutBindings | None = None


def frozen_registration(source: EvidenceSource, registration_id: str) -> FrozenRegistration:
    """The registration ``registration_id`` read back from its signed attestation: the
    thresholds bytes checked against the signed digest, parsed, and its bindings.

    Raises:
        PreregistrationError: no verified registration attestation in that run, or the
            stored thresholds differ from the signed digest.
    """
    attestation = _registration_attestation(source, registration_id)
    registration = _registration_of(attestation)
    if registration.registration_id != registration_id:
        raise PreregistrationError(f"registration {registration_id}: its attestation names "
                                   f"{registration.registration_id}")
    data = registered_bytes(source, registration)
    bound = attestation.predicate.get("bindings")
    return FrozenRegistration(
        registration=registration, thresholds_bytes=data,
        thresholds=parse_thresholds(data, source=f"registration {registration_id}"),
        bindings=RolloutBindings.model_validate(whole_numbers(dict(bound))) if bound else None)


def verify_registration(source: EvidenceSource, registration_id: str,
                        thresholds_path: str | Path, evaluation_started_at: datetime) -> Registration:
    """Load a registration and check the file at ``thresholds_path`` and the evaluation time.

    Raises:
        PreregistrationError: see :func:`load_registration` and
            ``gates.preregistration.check_registration``.
    """
    registration = load_registration(source, registration_id)
    try:
        digest = hashlib.sha256(Path(thresholds_path).read_bytes()).hexdigest()
    except OSError as exc:
        raise PreregistrationError(f"thresholds file {thresholds_path} unreadable: {exc}") from exc
    check_registration(registration, digest, evaluation_started_at)
    return registration


def thresholds_for_gate(source: EvidenceSource, registration: Registration,
                        planned_sha256: str, evaluation_started_at: datetime) -> Thresholds:
    """The thresholds a gate judges by: the registered bytes, read back and checked
    against the signature; the session's plan (``planned_sha256``: the sha256 of the
    bytes it parsed when it opened) still the registered bytes; the evaluation started
    after the registration.

    Raises:
        PreregistrationError: any of those fails (a refusal to judge, not a verdict).
    """
    registration = load_registration(source, registration.registration_id)
    check_registration(registration, planned_sha256, evaluation_started_at)
    return registered_thresholds(source, registration)
