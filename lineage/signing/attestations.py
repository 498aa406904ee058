"""Signed stage attestations: in-toto Statements in DSSE envelopes.

MLflow is where people look, not what they must trust: anyone who can write to the
store can edit a tag, a metric or an artifact together with its digest tag. So each
stage also writes an in-toto Statement v1 (``in_toto_attestation``) whose subjects are
the sha256 digests of the stage's artifacts and whose predicate is the stage's record,
wrapped in a DSSE envelope (``securesystemslib.dsse``) signed by the pipeline's key,
which lives outside the store (``lineage.signing.keys``). The envelope is logged with the run
as ``attestations/<kind>.dsse.json``. The auditor verifies envelopes with the public
keys *they* trust (``TrustPolicy``), never with a key found in the store.

Anchors: in-toto attestation framework (https://github.com/in-toto/attestation),
DSSE (https://github.com/secure-systems-lab/dsse), SLSA provenance, Sigstore's
model-signing. Nothing here is hand-rolled cryptography: signing and verification are
``securesystemslib``'s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement
from pydantic import BaseModel, ConfigDict, Field, model_validator
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import Signer, SSlibKey

from kernels.errors import KernelgateError
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_PREFIX = "https://kernelgate.dev/attestation/"
ATTESTATION_DIR = "attestations"

KINDS = ("registration", "build", "evaluation", "decision", "approval", "shadow", "canary",
         "alias", "outcome", "loosening", "checkpoint", "reanchor", "reanchor-approval",
         "calibration", "key_change", "reference", "approver-key")
"""What is attested: a preregistration, a build, an evaluation, a gate decision (held-out
or confirmation), an approval, a shadow stage, a canary step, an alias move (assign,
promote, rollback, clear; numbered per family), a rollout's outcome, an approval to
loosen thresholds, a checkpoint of the family's log (``lineage.log.checkpoints``), a re-anchor
of a damaged log and a person's approval of it (``lineage.aliases.reanchor``), an A/A calibration
of the canary judge, a key change (rotation, revocation, approver key:
``lineage.aliases.key_changes``), a cached float64 reference's seal (``lineage.signing.reference_seal``;
beside the array, in no run), and a person's proof that they hold their approver key
(``lineage.records.roster``; inside a thresholds file's approvers entry, in no run)."""


class AttestationError(KernelgateError, RuntimeError):
    """An envelope is malformed, unsigned, or signed by no trusted (unrevoked) key."""


class TrustPolicy(BaseModel):
    """The public keys an auditor (or the pipeline itself) accepts, and revoked ones.

    Several keys may be trusted at once (rotation: signatures by the old key still
    verify while it is listed); a revoked key's signatures never verify.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    public_keys: dict[str, SSlibKey]
    revoked: set[str] = Field(default_factory=set)
    revoked_at: dict[str, datetime] = Field(
        default_factory=dict, description="keys revoked from a position: a statement they "
        "signed verifies only when it was attested before it")

    def usable(self) -> list[SSlibKey]:
        """The trusted keys that are not revoked from the start."""
        return [k for keyid, k in self.public_keys.items() if keyid not in self.revoked]

    def signs_now(self, keyid: str) -> bool:
        """Whether a new statement signed by ``keyid`` would verify."""
        return (keyid in self.public_keys and keyid not in self.revoked
                and keyid not in self.revoked_at)


class Attestation(BaseModel):
    """A verified statement, as read back from a run."""

    kind: str
    run_id: str
    path: str = Field(description="artifact path of the envelope in the run")
    subjects: dict[str, str] = Field(description="subject name -> sha256")
    predicate: dict[str, Any]
    keyid: str = Field(description="the trusted key that signed it")
    envelope_sha256: str = Field(description="sha256 of the envelope bytes as stored")


def subject_name(run_id: str, artifact_path: str) -> str:
    """How an artifact is named as a subject: ``<run id>/<artifact path>``."""
    return f"{run_id}/{artifact_path}"


def _finite(value: Any) -> Any:
    """JSON-able, with only finite numbers (a predicate is a protobuf Struct): a
    non-finite float becomes its string (``"inf"``, ``"nan"``)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def make_envelope(kind: str, subjects: Mapping[str, str], predicate: Mapping[str, Any],
                  signer: Signer) -> bytes:
    """A signed DSSE envelope (JSON bytes) of an in-toto Statement v1.

    Args:
        kind: one of ``KINDS`` (the predicate type is ``PREDICATE_PREFIX + kind + "/v1"``).
        subjects: subject name -> sha256 hex (artifacts of the stage).
        predicate: the stage's record (JSON-able; non-finite floats become strings).
        signer: the pipeline's (or a person's) signer.

    Raises:
        ValueError: unknown kind, or a digest that is not 64 hex characters.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown attestation kind {kind!r}; one of {KINDS}")
    descriptors = []
    for name, digest in sorted(subjects.items()):
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"subject {name!r}: sha256 must be 64 hex characters, got {digest!r}")
        descriptors.append(ResourceDescriptor(name=name, digest={"sha256": digest}).pb)
    body = {"kind": kind, "attested_at": datetime.now(UTC).isoformat(), **predicate}
    statement = Statement(descriptors, f"{PREDICATE_PREFIX}{kind}/v1", _finite(body))
    statement.validate()
    payload = json.dumps(json_format.MessageToDict(statement.pb), sort_keys=True).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True).encode()


def verify_envelope(data: bytes, trust: TrustPolicy, *, run_id: str = "", path: str = ""
                    ) -> Attestation:
    """Verify an envelope with the trusted, unrevoked keys and parse its statement.

    Raises:
        AttestationError: not a DSSE envelope of an in-toto statement, not signed by a
            trusted key, or signed only by a revoked key (the message says which).
    """
    try:
        envelope = Envelope.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as err:
        raise AttestationError(f"{run_id}/{path}: not a DSSE envelope ({err})") from err
    if envelope.payload_type != PAYLOAD_TYPE:
        raise AttestationError(f"{run_id}/{path}: payload type {envelope.payload_type!r}")
    signed_by = set(envelope.signatures)
    revoked = signed_by & trust.revoked
    try:
        if not trust.usable():
            raise VerificationError("no trusted key that is not revoked")
        accepted = envelope.verify(trust.usable(), 1)
    except VerificationError as err:
        why = (f"signed only by revoked key(s) {sorted(revoked)}" if revoked
               else f"no valid signature by a trusted key (signed by {sorted(signed_by)})")
        raise AttestationError(f"{run_id}/{path}: {why}") from err
    try:
        statement = json.loads(envelope.payload)
        predicate = statement["predicate"]
        subjects = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    except (ValueError, KeyError, TypeError) as err:
        raise AttestationError(f"{run_id}/{path}: not an in-toto statement ({err})") from err
    accepted = _before_revocation(accepted, predicate, trust, f"{run_id}/{path}")
    return Attestation(kind=predicate.get("kind", ""), run_id=run_id, path=path,
                       subjects=subjects, predicate=predicate, keyid=sorted(accepted)[0],
                       envelope_sha256=hashlib.sha256(data).hexdigest())


def _before_revocation(accepted, predicate: Mapping[str, Any], trust: TrustPolicy,
                       where: str) -> set[str]:
    """The accepting keys whose revocation (if any) comes after the statement's signed
    time. Raises AttestationError when none is left."""
    try:
        at = datetime.fromisoformat(str(predicate.get("attested_at")))
    except ValueError:
        at = None
    kept = {k for k in accepted if k not in trust.revoked_at
            or (at is not None and at < trust.revoked_at[k])}
    if not kept:
        positions = {k: trust.revoked_at[k].isoformat() for k in sorted(accepted)}
        raise AttestationError(f"{where}: signed at {predicate.get('attested_at')} by key(s) "
                               f"revoked before that: {positions}")
    return kept


def attest(tracking: Tracking, run_id: str, kind: str, predicate: Mapping[str, Any],
           signer: Signer, *, subjects: Mapping[str, str] | None = None,
           name: str | None = None,
           before_logging: Callable[[str], None] | None = None) -> Attestation:
    """Sign ``predicate`` with the run's artifacts as subjects and log the envelope.

    Subjects default to every artifact the run holds now, with the sha256 recorded when
    each was logged (this process wrote them moments ago). The envelope is logged as
    ``attestations/<name or kind>.dsse.json``; the parsed attestation is returned.
    ``before_logging`` is called with the envelope's sha256 once it is signed and before
    it is logged (the family log's claim of its position); what it raises propagates and
    nothing is logged.
    """
    if subjects is None:
        subjects = {subject_name(run_id, path): digest
                    for path, digest in tr.recorded_digests(tracking, run_id).items()
                    if not path.startswith(f"{ATTESTATION_DIR}/")}
    data = make_envelope(kind, subjects, {"run_id": run_id, **predicate}, signer)
    path = f"{ATTESTATION_DIR}/{name or kind}.dsse.json"
    if before_logging is not None:
        before_logging(hashlib.sha256(data).hexdigest())
    tr.log_bytes(tracking, run_id, data, path)
    return Attestation(kind=kind, run_id=run_id, path=path, subjects=dict(subjects),
                       predicate=json.loads(_payload(data))["predicate"],
                       keyid=signer.public_key.keyid,
                       envelope_sha256=hashlib.sha256(data).hexdigest())


def _payload(data: bytes) -> bytes:
    return Envelope.from_dict(json.loads(data)).payload


def check_subjects(attestation: Attestation, artifacts: Iterable[tuple[str, bytes]]) -> list[str]:
    """Problems where stored artifact bytes differ from the signed subject digests
    (``artifacts``: (subject name, bytes)); a subject with no stored bytes is missing."""
    stored = {name: hashlib.sha256(data).hexdigest() for name, data in artifacts}
    problems = []
    for name, digest in sorted(attestation.subjects.items()):
        if name not in stored:
            problems.append(f"{name}: signed by the {attestation.kind} attestation but missing")
        elif stored[name] != digest:
            problems.append(f"{name}: bytes differ from the signed digest (altered after signing)")
    return problems


def tag_values(attestation: Attestation) -> dict[str, str]:
    """The run tags an attestation's predicate vouches for (``predicate['tags']``)."""
    return {str(k): str(v) for k, v in attestation.predicate.get("tags", {}).items()}


__all__ = ["ATTESTATION_DIR", "KINDS", "Attestation", "AttestationError", "Signing", "TrustPolicy",
           "attest", "check_subjects", "make_envelope", "subject_name",
           "tag_values", "verify_envelope"]


class Signing(BaseModel):
    """Who signs the pipeline's records, and whom the pipeline trusts when it reads its
    own records back (its current and retired keys, minus revoked ones)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    signer: Signer
    trust: TrustPolicy
    key_dir: Path | None = None
    """The pipeline's key folder, where its checkpoints of each family's log live
    (``lineage.log.checkpoints``); None: none are written or read."""
    sequencer: Any = None
    """A ``lineage.log.log_sequence.LogSequencer`` (on a tracking server: Prefect variables):
    every log append claims its position there first (a compare-and-swap) and the
    pipeline's checkpoint is kept there too; None: appends are not claimed (the embedded
    profile, where ``lineage.rollout.rollout.family_lock`` serialises a family's writers)."""

    @model_validator(mode="after")
    def _pipeline_role(self) -> Signing:
        keyid = self.signer.public_key.keyid
        if not self.trust.signs_now(keyid):
            raise ValueError(f"key {keyid} is not a pipeline-role key of this trust (not the "
                             "pipeline's current key, or revoked): the pipeline's records and "
                             "alias moves are signed only by a pipeline key")
        return self
