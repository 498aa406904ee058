"""Gate decisions, approvals and canary steps as MLflow runs, written and read back verified.

Each record is a run of its own stage (``gate``, ``approval``, ``canary``) in the family's
experiment, a child of the rollout run when one is given, with its pydantic record as a
JSON artifact (sha256 recorded) and the link tags of :mod:`lineage.tags`:

* gate run: ``kernelgate.build_run_id``, ``kernelgate.evaluation_run_id``,
  ``kernelgate.registration_id``, ``kernelgate.thresholds_sha256``, ``kernelgate.verdict``;
  artifact ``decisions/gate_decision.json``; the summary is the run description;
* approval run: ``kernelgate.decision_run_id``, ``kernelgate.transition``,
  ``kernelgate.approved``; artifact ``approvals/approval.json``;
* canary run: ``kernelgate.decision_run_id``; artifact ``canary/<step>.json`` and the
  step's statistics as metrics;
* shadow run: ``kernelgate.decision_run_id``, ``kernelgate.shadow_passed``; artifacts
  ``shadow/traffic.json`` and ``shadow/analysis.json``;
* promotion / rollback run: ``kernelgate.model_version``, ``kernelgate.decision_run_id``
  (promotion); artifact ``registry/alias_change.json`` (a ``lineage.registry.AliasChange``).

Readers (:func:`load_decision`, :func:`load_approval`) refuse records whose artifact no
longer matches its recorded digest, so nothing downstream acts on an altered record.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gates.approval import ApprovalRecord
from gates.canary import CanaryStepResult
from gates.decision import GateDecision
from lineage import tags
from lineage import tracking as tr
from lineage.tracking import ArtifactIntegrityError, Tracking


class LineageError(RuntimeError):
    """A record is missing, of the wrong stage, inconsistent, or fails its digest check."""


class DecisionRecord(BaseModel):
    """A gate decision as read back from MLflow, with the runs it links."""

    model_config = ConfigDict(frozen=True)

    decision_run_id: str
    build_run_id: str
    evaluation_run_id: str
    registration_id: str
    decision: GateDecision


def log_decision(
    tracking: Tracking,
    family: str,
    decision: GateDecision,
    *,
    build_run_id: str,
    evaluation_run_id: str,
    parent_run_id: str | None = None,
) -> str:
    """Log a gate decision as a ``gate`` run; returns its run id (the decision run id)."""
    run_tags = {
        tags.BUILD_RUN_ID: build_run_id,
        tags.EVALUATION_RUN_ID: evaluation_run_id,
        tags.REGISTRATION_ID: decision.registration_id,
        tags.THRESHOLDS_SHA256: decision.thresholds_sha256,
        tags.VERDICT: decision.verdict,
        tags.NOTE: decision.summary,
    }
    with tr.stage_run(
        tracking,
        family,
        "gate",
        parent_run_id=parent_run_id,
        run_name=f"gate-{decision.verdict}",
        run_tags=run_tags,
    ) as run_id:
        tr.log_model_json(tracking, run_id, decision, tags.DECISION_ARTIFACT)
        client = tracking.client()
        for status in ("pass", "fail", "inconclusive", "not_assessed", "not_applicable"):
            client.log_metric(run_id, f"criteria.{status}", len(decision.by_status(status)))
    return run_id


def _stage_tags(tracking: Tracking, run_id: str, stage: str) -> dict[str, str]:
    try:
        run = tracking.client().get_run(run_id)
    except Exception as exc:  # MlflowException for unknown ids; surfaced as a lineage break
        raise LineageError(f"{stage} run {run_id!r} not found") from exc
    if run.data.tags.get(tags.STAGE) != stage:
        raise LineageError(
            f"run {run_id} is not a {stage} run ({tags.STAGE}={run.data.tags.get(tags.STAGE)!r})"
        )
    return run.data.tags


def load_decision(tracking: Tracking, decision_run_id: str) -> DecisionRecord:
    """Read a gate decision back, verifying its artifact digest and link tags.

    Raises:
        LineageError: missing run, wrong stage, missing link tags, altered artifact, or a
            verdict tag that disagrees with the artifact.
    """
    run_tags = _stage_tags(tracking, decision_run_id, "gate")
    try:
        raw = tr.read_verified_artifact(tracking, decision_run_id, tags.DECISION_ARTIFACT)
    except ArtifactIntegrityError as exc:
        raise LineageError(str(exc)) from exc
    decision = GateDecision.model_validate_json(raw)
    if run_tags.get(tags.VERDICT) != decision.verdict:
        raise LineageError(f"gate run {decision_run_id}: verdict tag disagrees with the decision")
    missing = [
        k
        for k in (tags.BUILD_RUN_ID, tags.EVALUATION_RUN_ID, tags.REGISTRATION_ID)
        if k not in run_tags
    ]
    if missing:
        raise LineageError(f"gate run {decision_run_id} lacks link tags {missing}")
    if run_tags[tags.REGISTRATION_ID] != decision.registration_id:
        raise LineageError(f"gate run {decision_run_id}: registration tag disagrees with decision")
    return DecisionRecord(
        decision_run_id=decision_run_id,
        build_run_id=run_tags[tags.BUILD_RUN_ID],
        evaluation_run_id=run_tags[tags.EVALUATION_RUN_ID],
        registration_id=run_tags[tags.REGISTRATION_ID],
        decision=decision,
    )


def log_approval(
    tracking: Tracking,
    record: ApprovalRecord,
    *,
    decision_run_id: str,
    parent_run_id: str | None = None,
) -> str:
    """Log an approval (or rejection/timeout) as an ``approval`` run; returns its run id."""
    run_tags = {
        tags.DECISION_RUN_ID: decision_run_id,
        tags.TRANSITION: record.transition,
        tags.APPROVED: str(record.approved).lower(),
        tags.APPROVER: record.approver,
        tags.MODEL_VERSION: record.version,
    }
    with tr.stage_run(
        tracking,
        record.family,
        "approval",
        parent_run_id=parent_run_id,
        run_name=f"approval-{'approved' if record.approved else 'rejected'}",
        run_tags=run_tags,
    ) as run_id:
        tr.log_model_json(tracking, run_id, record, tags.APPROVAL_ARTIFACT)
    return run_id


def load_approval(tracking: Tracking, approval_run_id: str) -> tuple[ApprovalRecord, str]:
    """Read an approval back, verified; returns ``(record, decision_run_id)``.

    Raises:
        LineageError: missing run, wrong stage, altered artifact or missing decision link.
    """
    run_tags = _stage_tags(tracking, approval_run_id, "approval")
    try:
        raw = tr.read_verified_artifact(tracking, approval_run_id, tags.APPROVAL_ARTIFACT)
    except ArtifactIntegrityError as exc:
        raise LineageError(str(exc)) from exc
    if tags.DECISION_RUN_ID not in run_tags:
        raise LineageError(f"approval run {approval_run_id} lacks {tags.DECISION_RUN_ID}")
    return ApprovalRecord.model_validate_json(raw), run_tags[tags.DECISION_RUN_ID]


def log_canary_step(
    tracking: Tracking,
    family: str,
    result: CanaryStepResult,
    *,
    decision_run_id: str,
    parent_run_id: str | None = None,
) -> str:
    """Log one canary step's analysis as a ``canary`` run; returns its run id."""
    with tr.stage_run(
        tracking,
        family,
        "canary",
        parent_run_id=parent_run_id,
        run_name=result.step,
        run_tags={
            tags.DECISION_RUN_ID: decision_run_id,
            tags.CANARY_PASSED: str(result.passed).lower(),
        },
    ) as run_id:
        tr.log_model_json(tracking, run_id, result, f"canary/{result.step}.json")
        client = tracking.client()
        for name in (
            "traffic_fraction",
            "p_value",
            "common_language_effect",
            "median_latency_ratio",
            "output_drift_max",
            "memory_growth_bytes",
            "error_count",
            "nan_count",
        ):
            client.log_metric(run_id, f"canary.{name}", float(getattr(result, name)))
    return run_id


def log_shadow(
    tracking: Tracking,
    family: str,
    version: str,
    traffic: BaseModel,
    result: CanaryStepResult,
    *,
    decision_run_id: str,
    parent_run_id: str | None = None,
) -> str:
    """Log the shadow stage (mirrored traffic and its analysis) as a ``shadow`` run."""
    with tr.stage_run(
        tracking,
        family,
        "shadow",
        parent_run_id=parent_run_id,
        run_name=f"shadow-v{version}",
        run_tags={
            tags.DECISION_RUN_ID: decision_run_id,
            tags.SHADOW_PASSED: str(result.passed).lower(),
        },
    ) as run_id:
        tr.log_model_json(tracking, run_id, traffic, "shadow/traffic.json")
        tr.log_model_json(tracking, run_id, result, "shadow/analysis.json")
    return run_id


def log_alias_change(
    tracking: Tracking, change: BaseModel, *, parent_run_id: str | None = None
) -> str:
    """Log an alias move (``lineage.registry.AliasChange``) as a ``promotion`` or ``rollback`` run.

    Assignments and clearings are logged as ``promotion`` runs (they move an alias forward
    or tidy it); rollbacks as ``rollback`` runs with the reason as the run description.
    """
    data = change.model_dump(mode="json")
    stage = "rollback" if data["action"] == "rollback" else "promotion"
    run_tags = {
        tags.ALIAS: data["alias"],
        tags.MODEL_VERSION: str(data["version"] or data["previous_version"]),
        tags.NOTE: data.get("reason") or f"{data['action']} {data['alias']}",
    }
    if data.get("decision_run_id"):
        run_tags[tags.DECISION_RUN_ID] = data["decision_run_id"]
    with tr.stage_run(
        tracking,
        data["family"],
        stage,
        parent_run_id=parent_run_id,
        run_name=f"{data['action']}-{data['alias']}",
        run_tags=run_tags,
    ) as run_id:
        tr.log_model_json(tracking, run_id, change, tags.ALIAS_CHANGE_ARTIFACT)
    return run_id
