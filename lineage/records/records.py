"""Gate decisions, approvals, shadow and canary stages and alias moves as MLflow runs,
each signed, and read back verified against its signature.

Each record is a run of its own stage (``gate``, ``approval``, ``shadow``, ``canary``,
``promotion``/``rollback``) in the family's experiment, a child of the rollout run when
one is given, with its pydantic record as a JSON artifact, the link tags of
:mod:`lineage.store.tags` (for people and the UI), and a signed attestation
(``lineage.signing.attestations``) whose predicate carries the same links and whose subjects are
the run's artifacts. Readers (:func:`load_decision`, :func:`load_approval`) trust the
signature, not the tags: a record whose artifact differs from its signed digest, or
whose run carries no verified attestation, is refused.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

from gates.approval import ApprovalRecord
from gates.canary import CanaryStepResult
from gates.decision import GateDecision
from kernels.errors import KernelgateError
from lineage.log.log_writer import append
from lineage.signing.attestations import AttestationError, Signing
from lineage.signing.sources import EvidenceSource, signed_artifact
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking


class LineageError(KernelgateError, RuntimeError):
    """A record is missing, of the wrong stage, inconsistent, or fails its signature."""


class DecisionRecord(BaseModel):
    """A gate decision as read back (verified), with the runs its signature links."""

    model_config = ConfigDict(frozen=True)

    decision_run_id: str
    build_run_id: str
    evaluation_run_id: str
    registration_id: str
    version: str | None
    decision: GateDecision


def log_decision(tracking: Tracking, family: str, decision: GateDecision, *, build_run_id: str,
                 evaluation_run_id: str, version: str | None, signing: Signing,
                 parent_run_id: str | None = None) -> str:
    """Log a gate decision as a ``gate`` run, signed; returns its run id."""
    run_tags = {
        tags.BUILD_RUN_ID: build_run_id, tags.EVALUATION_RUN_ID: evaluation_run_id,
        tags.REGISTRATION_ID: decision.registration_id,
        tags.THRESHOLDS_SHA256: decision.thresholds_sha256, tags.VERDICT: decision.verdict,
        tags.NOTE: decision.summary,
    }
    with tr.stage_run(tracking, family, "gate", parent_run_id=parent_run_id,
                      run_name=f"gate-{decision.verdict}", run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, decision, tags.DECISION_ARTIFACT)
        tr.log_metrics(tracking, run_id, {
            f"criteria.{status}": len(decision.by_status(status))
            for status in ("pass", "fail", "inconclusive", "not_assessed", "not_applicable")})
        append(tracking, run_id, "decision", {
            "family": family, "version": version, "build_run_id": build_run_id,
            "evaluation_run_id": evaluation_run_id, "registration_id": decision.registration_id,
            "verdict": decision.verdict, "scope": decision.scope,
            "decision_artifact": tags.DECISION_ARTIFACT, "tags": run_tags}, signing)
    return run_id


def load_decision(source: EvidenceSource, decision_run_id: str) -> DecisionRecord:
    """Read a gate decision back, verified against its signed attestation.

    Raises:
        LineageError: no such run, no verified decision attestation, the decision
            artifact differs from its signed digest, or the document disagrees with the
            signed predicate.
    """
    try:
        attestation, data = signed_artifact(source, decision_run_id, "decision",
                                            tags.DECISION_ARTIFACT)
    except AttestationError as exc:
        raise LineageError(str(exc)) from exc
    decision = GateDecision.model_validate_json(data)
    signed = attestation.predicate
    if signed.get("verdict") != decision.verdict or signed.get("registration_id") != decision.registration_id:
        raise LineageError(f"gate run {decision_run_id}: the decision document disagrees with "
                           "its signed attestation")
    return DecisionRecord(decision_run_id=decision_run_id, build_run_id=signed["build_run_id"],
                          evaluation_run_id=signed["evaluation_run_id"],
                          registration_id=signed["registration_id"],
                          version=signed.get("version"), decision=decision)


def _answer_word(record: ApprovalRecord) -> str:
    if record.timed_out:
        return "timed out"
    if record.auto_approved:
        return "auto-approved"
    return "approved" if record.approved else "rejected"


def approval_description(record: ApprovalRecord) -> str:
    """The approval run's description (MLflow's run note): what was answered, by whom,
    when, and whether the answer was signed: ``shadow->canary of v3: rejected by rm at
    2026-12-01 12:00:00 UTC (unauthenticated: typed into the Prefect UI) — "not this
    week"``."""
    how = ("signed: " if record.authenticated else "") + record.authentication
    if record.timed_out:
        who = "nobody answered"
    elif record.auto_approved:
        who = "no person (the preregistered policy auto-approves)"
    else:
        who = f"by {record.approver}"
    return (f"{record.transition} of v{record.version}: {_answer_word(record)} {who} at "
            f"{record.at:%Y-%m-%d %H:%M:%S %Z} ({how}) — \"{record.comment}\"")


def log_approval(tracking: Tracking, record: ApprovalRecord, *, decision_run_id: str,
                 signing: Signing, parent_run_id: str | None = None,
                 person_envelope: bytes | None = None) -> str:
    """Log an approval (or rejection/timeout) as an ``approval`` run, signed by the
    pipeline; a person's own signed approval (``person_envelope``) is kept beside it.
    Returns the run id."""
    run_tags = {tags.DECISION_RUN_ID: decision_run_id, tags.TRANSITION: record.transition,
                tags.APPROVED: str(record.approved).lower(), tags.APPROVER: record.approver,
                tags.MODEL_VERSION: record.version, tags.NOTE: approval_description(record)}
    with tr.stage_run(tracking, record.family, "approval", parent_run_id=parent_run_id,
                      run_name=f"approval {record.transition} — {_answer_word(record)}",
                      run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, record, tags.APPROVAL_ARTIFACT)
        if person_envelope is not None:
            tr.log_bytes(tracking, run_id, person_envelope, tags.PERSON_APPROVAL_ARTIFACT)
        append(tracking, run_id, "approval", {
            "family": record.family, "version": record.version, "decision_run_id": decision_run_id,
            "record": json.loads(record.model_dump_json()), "tags": run_tags}, signing)
    return run_id


def load_approval(source: EvidenceSource, approval_run_id: str) -> tuple[ApprovalRecord, str]:
    """Read an approval back, verified; returns ``(record, decision_run_id)``.

    Raises:
        LineageError: no verified approval attestation, or an altered record.
    """
    try:
        attestation, data = signed_artifact(source, approval_run_id, "approval",
                                            tags.APPROVAL_ARTIFACT)
    except AttestationError as exc:
        raise LineageError(str(exc)) from exc
    return ApprovalRecord.model_validate_json(data), attestation.predicate["decision_run_id"]


def log_canary_step(tracking: Tracking, family: str, result: CanaryStepResult, *, version: str,
                    decision_run_id: str, signing: Signing, parent_run_id: str | None = None) -> str:
    """Log one canary step's analysis as a ``canary`` run, signed; returns its run id."""
    run_tags = {tags.DECISION_RUN_ID: decision_run_id,
                tags.CANARY_PASSED: str(result.passed).lower(), tags.MODEL_VERSION: version}
    with tr.stage_run(tracking, family, "canary", parent_run_id=parent_run_id,
                      run_name=result.step, run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, result, f"canary/{result.step}.json")
        metrics = {f"canary.{name}": float(getattr(result, name)) for name in (
            "traffic_fraction", "p_value", "common_language_effect", "median_latency_ratio",
            "output_drift_max", "memory_growth_bytes", "error_count", "nan_count")}
        tr.log_metrics(tracking, run_id, metrics)
        append(tracking, run_id, "canary", {
            "family": family, "version": version, "decision_run_id": decision_run_id,
            "step": result.step, "passed": result.passed, "breaches": result.breaches,
            "metrics": metrics, "tags": run_tags}, signing)
    return run_id


def log_shadow(tracking: Tracking, family: str, version: str, traffic: BaseModel,
               result: CanaryStepResult, *, decision_run_id: str, signing: Signing,
               parent_run_id: str | None = None) -> str:
    """Log the shadow stage (mirrored traffic and its analysis) as a ``shadow`` run, signed."""
    run_tags = {tags.DECISION_RUN_ID: decision_run_id,
                tags.SHADOW_PASSED: str(result.passed).lower(), tags.MODEL_VERSION: version}
    with tr.stage_run(tracking, family, "shadow", parent_run_id=parent_run_id,
                      run_name=f"shadow-v{version}", run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, traffic, "shadow/traffic.json")
        tr.log_model_json(tracking, run_id, result, "shadow/analysis.json")
        append(tracking, run_id, "shadow", {
            "family": family, "version": version, "decision_run_id": decision_run_id,
            "passed": result.passed, "breaches": result.breaches, "tags": run_tags},
            signing)
    return run_id


def log_alias_change(tracking: Tracking, change: BaseModel, *, signing: Signing,
                     sequence: int, previous_envelope: str | None,
                     chain: dict | None = None, parent_run_id: str | None = None,
                     log_seq: int | None = None) -> str:
    """Log an alias move (``lineage.aliases.registry.AliasChange``) as a signed ``promotion`` or
    ``rollback`` run — before the alias moves (the signed intent).

    Args:
        sequence: this move's number in the family's signed alias history (1, 2, ...).
        previous_envelope: sha256 of the previous move's envelope (a hash chain: a
            deleted move leaves a gap the audit sees).
        chain: for a promotion, the signed links of the evidence it rests on.
        log_seq: the family-log position the move was prepared for (its ``sequence`` and
            ``previous_envelope`` were read after the log's length); another is refused.

    Raises:
        lineage.log.log_sequence.SequenceTaken: another writer took the log position first
            (this run ends FAILED, unsigned; the caller signs the move again from the new
            head: ``lineage.aliases.registry``).
    """
    data = change.model_dump(mode="json")
    stage = "rollback" if data["action"] == "rollback" else "promotion"
    run_tags = {tags.ALIAS: data["alias"],
                tags.MODEL_VERSION: str(data["version"] or data["previous_version"]),
                tags.NOTE: data.get("reason") or f"{data['action']} {data['alias']}"}
    if data.get("decision_run_id"):
        run_tags[tags.DECISION_RUN_ID] = data["decision_run_id"]
    with tr.stage_run(tracking, data["family"], stage, parent_run_id=parent_run_id,
                      run_name=f"{data['action']}-{data['alias']}", run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, change, tags.ALIAS_CHANGE_ARTIFACT)
        # the rollout run it belongs to, signed: the audit's scope follows this link, not
        # MLflow's editable parent tag
        append(tracking, run_id, "alias", {
            **data, "sequence": sequence, "previous_envelope": previous_envelope,
            "chain": chain or {}, "tags": run_tags, "parent_run_id": parent_run_id},
            signing, retry=False, expect_seq=log_seq)
    return run_id
