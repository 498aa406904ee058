"""Every tag name of the record, in one place: how MLflow runs and registry entries link.

An auditor starts at an alias and follows these tags (see ``lineage/audit/audit.py``)::

    alias production ──> model version ──run_id / kernelgate.build_run_id──> build run
    model version ──kernelgate.decision_run_id──> gate run (stage "gate")
    gate run ──kernelgate.evaluation_run_id──> evaluation run ──kernelgate.build_run_id──> build run
    gate run / evaluation run ──kernelgate.registration_id──> preregistration run
    model version ──kernelgate.approval_run_id.<transition>──> approval run
    model version ──kernelgate.confirmation_decision_run_id──> gate run (confirmation split)

Every run carries ``kernelgate.stage`` and ``kernelgate.family``; runs of one rollout
share a parent (``mlflow.parentRunId``) so the MLflow UI shows the rollout as one tree.
Every artifact logged through :mod:`lineage.store.tracking` has its sha256 recorded as the run
tag ``kernelgate.sha256/<artifact path>``. ARCHITECTURE.md's record table lists which run
carries which tag.
"""

from __future__ import annotations

from typing import Final, Literal

Stage = Literal[
    "rollout",
    "preregistration",
    "build",
    "evaluation",
    "gate",
    "shadow",
    "approval",
    "canary",
    "promotion",
    "rollback",
    "revalidation",
    "reanchor",
    "calibration",
    "key_change",
]
STAGES: tuple[Stage, ...] = Stage.__args__  # type: ignore[attr-defined]

# MLflow's own tags
EXPERIMENT_KIND: Final = "mlflow.experimentKind"  # experiment tag: which UI view opens
UI_VIEW_QUERY: Final = "workflowType=machine_learning"
"""The query MLflow 3's UI reads to pick its model-training views over the GenAI ones.
Read in MLflow 3.17's bundle (``mlflow/server/js/build/static/js/main.*.js``): the
workflow type is the ``workflowType`` query parameter (``genai`` or
``machine_learning``), else the browser's local-storage key ``mlflow.workflowType``,
else ``genai``; with the workflow switcher on, the experiment's kind is derived from
that, not from the ``mlflow.experimentKind`` tag. Every link for people carries it."""
CLASSIC_EXPERIMENT: Final = "custom_model_development"  # runs and models, not GenAI traces
PARENT: Final = "mlflow.parentRunId"
NOTE: Final = "mlflow.note.content"  # run / version description shown in the UI

# on every run
STAGE: Final = "kernelgate.stage"
FAMILY: Final = "kernelgate.family"

# links between runs (run tags) and from a model version to runs (version tags)
BUILD_RUN_ID: Final = "kernelgate.build_run_id"
EVALUATION_RUN_ID: Final = "kernelgate.evaluation_run_id"
REGISTRATION_ID: Final = "kernelgate.registration_id"
DECISION_RUN_ID: Final = "kernelgate.decision_run_id"
CONFIRMATION_RUN_ID: Final = "kernelgate.confirmation_decision_run_id"
APPROVAL_RUN_ID: Final = "kernelgate.approval_run_id"  # + "." + approval key per transition

# links from a model version to the traffic stages of the rollout that judged it
ROLLOUT_RUN_ID: Final = "kernelgate.rollout_run_id"
SHADOW_RUN_ID: Final = "kernelgate.shadow_run_id"
CANARY_RUN_IDS: Final = "kernelgate.canary_run_ids"  # JSON list, in step order
ALIAS_OWNER: Final = "kernelgate.alias_owner."  # + alias: the rollout run that assigned it
SHADOW_PASSED: Final = "kernelgate.shadow_passed"
CANARY_PASSED: Final = "kernelgate.canary_passed"

# what a model version serves
IMPLEMENTATION: Final = "kernelgate.implementation"
CONFIG: Final = "kernelgate.config"  # the config asked for (the kernel's own fields; older versions: the shared block-size shape) as JSON, "null": the kernel's choice
SOURCE_SHA256: Final = "kernelgate.source_sha256"  # combined digest of the kernels package
SOURCE_FILE_PREFIX: Final = "kernelgate.source_sha256/"  # + file path (build run)
CODE_SHA256: Final = "kernelgate.code_sha256"  # the version's code snapshot (build run)

# preregistration run
THRESHOLDS_SHA256: Final = "kernelgate.thresholds_sha256"
THRESHOLDS_ARTIFACT: Final = "kernelgate.thresholds_artifact"
REGISTERED_AT: Final = "kernelgate.registered_at"
PROFILE: Final = "kernelgate.profile"

# evaluation run
SPLIT: Final = "kernelgate.split"
SPEED_ASSESSED: Final = "kernelgate.speed_assessed"
EVALUATION_STATUS: Final = "kernelgate.evaluation_status"
PRODUCTION_IMPLEMENTATION: Final = "kernelgate.production_implementation"
MODEL_WEIGHTS_SHA256: Final = "kernelgate.model_weights_sha256"
MODEL_WEIGHTS_PREFIX: Final = "kernelgate.model_weights."  # + name, package, package_version,
# size_bytes, sha256, path: what the serving model's weights are, for people

# gate / approval / alias-change runs
VERDICT: Final = "kernelgate.verdict"
APPROVED: Final = "kernelgate.approved"
APPROVER: Final = "kernelgate.approver"
TRANSITION: Final = "kernelgate.transition"
MODEL_VERSION: Final = "kernelgate.model_version"
ALIAS: Final = "kernelgate.alias"

# rollout / revalidation (parent) runs
RESULT: Final = "kernelgate.result"
DECIDED_AT_STAGE: Final = "kernelgate.decided_at_stage"
DECIDED_BY: Final = "kernelgate.decided_by"
TILING_RULE: Final = "kernelgate.tiling_rule"  # version: how its block sizes are chosen
TILING: Final = "kernelgate.tiling"  # version: JSON, shape -> block sizes (serving, benchmark)
PREFECT_FLOW_RUN_ID: Final = "kernelgate.prefect_flow_run_id"
STAGE_STARTED_AT: Final = "kernelgate.stage_started_at"
STAGE_ENDED_AT: Final = "kernelgate.stage_ended_at"
STAGE_TIME_PREFIX: Final = "kernelgate.stage_time."  # rollout run: + stage without a run of its own

# long-document benchmark runs (lineage.tools.longdoc_log; their own experiment, no family)
WORKLOAD: Final = "kernelgate.workload"  # the workload spec's name
WORKLOAD_SHA256: Final = "kernelgate.workload_sha256"  # sha256 of the spec file's bytes
WORKLOAD_WEIGHTS_SHA256: Final = "kernelgate.workload_weights_sha256"  # the seeded encoder's
BENCH_BASELINE: Final = "kernelgate.bench_baseline"
BENCH_CANDIDATE: Final = "kernelgate.bench_candidate"
LONGDOC_ARTIFACT_DIR: Final = "longdoc"

# model version and registered model
PROMOTED_AT: Final = "kernelgate.promoted_at"
REJECTION_REASON: Final = "kernelgate.rejection_reason"
ROLLED_BACK_AT: Final = "kernelgate.rolled_back_at"
ROLLBACK_REASON: Final = "kernelgate.rollback_reason"
NOT_ADOPTED_REASON: Final = "kernelgate.not_adopted_reason"  # safe, not worth adopting
STALE_REASON: Final = "kernelgate.stale_reason"
PREVIOUS_PRODUCTION: Final = "kernelgate.previous_production_version"
PRODUCTION_HISTORY: Final = "kernelgate.production_history"  # for people in the UI; never read

# artifact digests: DIGEST_PREFIX + artifact path -> sha256 hex
DIGEST_PREFIX: Final = "kernelgate.sha256/"

# environment facts (lineage.records.environment): ENV_PREFIX + field name
ENV_PREFIX: Final = "kernelgate.env."

# dataset input tags
DATASET_CONTEXT: Final = "mlflow.data.context"
DATASET_SHA256: Final = "kernelgate.sha256"

# well-known artifact paths
DECISION_ARTIFACT: Final = "decisions/gate_decision.json"
APPROVAL_ARTIFACT: Final = "approvals/approval.json"
PERSON_APPROVAL_ARTIFACT: Final = "approvals/person.dsse.json"  # a person's own signature
ALIAS_CHANGE_ARTIFACT: Final = "registry/alias_change.json"
OUTCOME_ARTIFACT: Final = "rollout/outcome.json"
# a dead rollout run's record of its interruption, written by the rollout that closed it
INTERRUPTED_ARTIFACT: Final = "rollout/interrupted.json"
ADOPTION_ARTIFACT: Final = "adoption/decision.json"  # rollout run; signed with the outcome
REVALIDATION_ARTIFACT: Final = "revalidation/outcome.json"


def alias_owner(alias: str) -> str:
    """Version tag naming the rollout run that assigned ``alias`` to it."""
    return ALIAS_OWNER + alias


def approval_key(transition: str) -> str:
    """A transition as a key fit for tags and Prefect pause keys:
    ``canary->production`` -> ``approval-canary-to-production``."""
    return f"approval-{transition.replace('->', '-to-')}"


def approval_run_id(transition: str) -> str:
    """Version tag naming the approval run of ``transition``."""
    return f"{APPROVAL_RUN_ID}.{approval_key(transition)}"
