"""The run-linking scheme: tag names that tie MLflow runs and registry entries together.

An auditor starts at an alias and follows these tags (see ``lineage/audit.py``)::

    alias production ──> model version ──run_id / kernelgate.build_run_id──> build run
    model version ──kernelgate.decision_run_id──> gate run (stage "gate")
    gate run ──kernelgate.evaluation_run_id──> evaluation run ──kernelgate.build_run_id──> build run
    gate run / evaluation run ──kernelgate.registration_id──> preregistration run
    model version ──kernelgate.approval_run_id──> approval run (stage "approval")

Every run carries ``kernelgate.stage`` and ``kernelgate.family``; runs of one rollout
share a parent (``mlflow.parentRunId``) so the MLflow UI shows the rollout as one tree.
Every artifact logged through :mod:`lineage.tracking` has its sha256 recorded as the run
tag ``kernelgate.sha256/<artifact path>``: tags live in the tracking database, artifacts
in the artifact store, so an edit to one is caught by the other.
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
]

STAGE: Final = "kernelgate.stage"
FAMILY: Final = "kernelgate.family"
PARENT: Final = "mlflow.parentRunId"

# links between runs (run tags) and from a model version to runs (version tags)
BUILD_RUN_ID: Final = "kernelgate.build_run_id"
EVALUATION_RUN_ID: Final = "kernelgate.evaluation_run_id"
REGISTRATION_ID: Final = "kernelgate.registration_id"
DECISION_RUN_ID: Final = "kernelgate.decision_run_id"
APPROVAL_RUN_ID: Final = "kernelgate.approval_run_id"

# links from a model version to the traffic stages of the rollout that judged it
ROLLOUT_RUN_ID: Final = "kernelgate.rollout_run_id"
SHADOW_RUN_ID: Final = "kernelgate.shadow_run_id"
CANARY_RUN_IDS: Final = "kernelgate.canary_run_ids"  # JSON list, in step order
ALIAS_OWNER: Final = "kernelgate.alias_owner."  # + alias: the rollout run that assigned it
SHADOW_PASSED: Final = "kernelgate.shadow_passed"
CANARY_PASSED: Final = "kernelgate.canary_passed"

# preregistration run
THRESHOLDS_SHA256: Final = "kernelgate.thresholds_sha256"
THRESHOLDS_ARTIFACT: Final = "kernelgate.thresholds_artifact"
REGISTERED_AT: Final = "kernelgate.registered_at"

# gate / approval runs
VERDICT: Final = "kernelgate.verdict"
APPROVED: Final = "kernelgate.approved"
TRANSITION: Final = "kernelgate.transition"

# model version and registered model
PROMOTED_AT: Final = "kernelgate.promoted_at"
ROLLED_BACK_AT: Final = "kernelgate.rolled_back_at"
ROLLBACK_REASON: Final = "kernelgate.rollback_reason"
STALE_REASON: Final = "kernelgate.stale_reason"
PREVIOUS_PRODUCTION: Final = "kernelgate.previous_production_version"
PRODUCTION_HISTORY: Final = "kernelgate.production_history"

# artifact digests: DIGEST_PREFIX + artifact path -> sha256 hex
DIGEST_PREFIX: Final = "kernelgate.sha256/"

# environment facts (lineage.environment): ENV_PREFIX + field name
ENV_PREFIX: Final = "kernelgate.env."

# well-known artifact paths
DECISION_ARTIFACT: Final = "decisions/gate_decision.json"
APPROVAL_ARTIFACT: Final = "approvals/approval.json"
