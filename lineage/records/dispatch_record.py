"""A dispatch policy in the signed record: logged with a dispatch build, audited by
re-deriving every bucket from the signed evidence, handed to ``auto`` pinned.

A dispatch kernel's version serves a policy (``kernels.dispatch_policy``); its config is
the policy's fingerprint (``kernels.dispatch_kernel.DispatchConfig``). :func:`log_policy`
logs the policy's JSON as the build run's artifact ``dispatch/policy.json`` (its sha256
recorded, ``lineage.store.tracking``) before the run's ``build`` attestation is signed, so the
policy's bytes are a subject of that attestation and its fingerprint is in the signed
config. :func:`audit_dispatch_build` reads it back only through the signed record
(``lineage.signing.sources.signed_artifact``: bytes equal to the signed digest) and then holds it
to the signed fingerprint and derives every bucket's choice again from the evidence the
policy carries (``kernels.dispatch_audit.audit_policy``): a bucket's evidence edited after
signing fails the digest (and the stored file, read as it is, is re-derived too, so
the problem names the bucket whose evidence no longer derives its choice or summary);
one edited before signing without its choice derived again
fails the re-derivation, naming the bucket. :func:`serving_environment` gives ``auto`` an
audited policy (``kernels.dispatch_serving``: the file and its fingerprint), e.g. that
of a ``dispatch`` family's production version.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from kernels.dispatch_audit import PolicyError, audit_policy
from kernels.dispatch_policy import DispatchPolicy
from kernels.dispatch_serving import POLICY_ENV, SHA256_ENV
from kernels.errors import KernelgateError
from lineage.signing.attestations import AttestationError
from lineage.signing.sources import EvidenceSource, signed_artifact
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

POLICY_ARTIFACT = "dispatch/policy.json"
"""Where a dispatch build run keeps the policy its version serves."""


class DispatchRecordError(KernelgateError, RuntimeError):
    """A dispatch build whose signed policy cannot be served (its audit's problems named)."""


class DispatchAudit(BaseModel):
    """The audit of one dispatch build run: the signed policy's fingerprint (``None``:
    unreadable), its buckets and the kernels they may serve by, and every problem found
    (empty: none)."""

    run_id: str
    policy_sha256: str | None = None
    buckets: int = 0
    kernels: list[str] = []
    problems: list[str] = []


def log_policy(tracking: Tracking, run_id: str, policy: DispatchPolicy) -> str:
    """Log ``policy`` as ``dispatch/policy.json`` of the build run ``run_id`` (call it
    before the run's ``build`` attestation is signed); returns the file's sha256."""
    return tr.log_bytes(tracking, run_id, policy.model_dump_json(indent=1).encode(),
                        POLICY_ARTIFACT)


def _signed_fingerprint(predicate: dict) -> str | None:
    config = predicate.get("config")
    return config.get("policy_sha256") if isinstance(config, dict) else None


def _as_stored(source: EvidenceSource, run_id: str) -> str:
    """What the stored policy file says of itself when it is not the signed one: the
    bucket whose recorded choice or summary its evidence no longer derives (a hand edit
    of one bucket's evidence), so the audit names it. Only a diagnosis: the file is
    refused by its digest either way. ``""`` when it cannot be read or parsed."""
    try:
        policy = DispatchPolicy.model_validate_json(source.artifact(run_id, POLICY_ARTIFACT))
    except Exception:  # noqa: BLE001 - missing or unparsable: the digest's problem says so
        return ""
    try:
        audit_policy(policy)
    except PolicyError as err:
        return f"; read as stored, {err}"
    return "; read as stored, every bucket still derives from its evidence"


def audit_dispatch_build(source: EvidenceSource, run_id: str
                         ) -> tuple[DispatchAudit, DispatchPolicy | None]:
    """The audit of the dispatch build run ``run_id`` and its policy (``None`` when it
    cannot be read from the signed record). Problems: no verified ``build`` attestation,
    the policy not a subject of it, missing, or bytes other than signed; not a valid
    policy; the signed config naming no fingerprint or another one; a bucket whose
    recorded choice or summary is not what its evidence derives (named)."""
    audit = DispatchAudit(run_id=run_id)
    try:
        attestation, data = signed_artifact(source, run_id, "build", POLICY_ARTIFACT)
    except AttestationError as err:
        return audit.model_copy(update={"problems": [f"{err}{_as_stored(source, run_id)}"]}), None
    try:
        policy = DispatchPolicy.model_validate_json(data)
    except ValidationError as err:
        why = f"run {run_id}: {POLICY_ARTIFACT} is not a dispatch policy: {err.errors()[0]}"
        return audit.model_copy(update={"problems": [why]}), None
    audit = audit.model_copy(update={"policy_sha256": policy.fingerprint(),
                                     "buckets": len(policy.buckets),
                                     "kernels": list(policy.kernels())})
    signed = _signed_fingerprint(attestation.predicate)
    if signed is None:
        return audit.model_copy(update={"problems": [
            f"run {run_id}: its signed build config names no policy_sha256"]}), policy
    try:
        audit_policy(policy, signed)
    except PolicyError as err:
        return audit.model_copy(update={"problems": [f"run {run_id}: {err}"]}), policy
    return audit, policy


def version_problems(source: EvidenceSource, build_run_id: str | None,
                     build_predicate: dict | None) -> list[str]:
    """The dispatch audit's problems for a version's signed build (``[]`` for a build of
    another implementation, or none): the one call a family audit makes for a version
    (``lineage.audit``, after the chain is walked)."""
    if build_run_id is None or (build_predicate or {}).get("implementation") != "dispatch":
        return []
    return audit_dispatch_build(source, build_run_id)[0].problems


def serving_environment(source: EvidenceSource, run_id: str, folder: Path) -> dict[str, str]:
    """The environment under which ``auto`` serves the audited policy of the dispatch
    build ``run_id``: the policy written to ``folder/policy-<fingerprint>.json`` and its
    variables (``KERNELGATE_DISPATCH_POLICY``, ``KERNELGATE_DISPATCH_POLICY_SHA256``).

    Raises:
        DispatchRecordError: the audit found a problem (each named).
    """
    audit, policy = audit_dispatch_build(source, run_id)
    if audit.problems or policy is None:
        raise DispatchRecordError(f"dispatch build {run_id} is not served: "
                                  + "; ".join(audit.problems))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"policy-{audit.policy_sha256}.json"
    path.write_text(policy.model_dump_json(indent=1))
    return {POLICY_ENV: str(path), SHA256_ENV: audit.policy_sha256}
