"""What a complete chain of evidence is: the one definition promotion and the audit share.

For a model version to hold ``canary`` or ``production``, the record must show, for
that version's build and under one registration:

1. a passing gate decision on the held-out split (its registration intact, frozen
   before the evaluation started);
2. a passed shadow stage linked to that decision;
3. every approval the registration's policy requires for the transitions so far,
   each approving this version and this decision (auto-approval only where the policy
   allows it);
4. for ``production`` also: one passed canary run per step of the registered canary
   plan, and a passing confirmation decision (accuracy criteria on the confirmation
   split) under the same registration.

:func:`collect` reads what the store holds for a version; :func:`problems` lists, in
words, what is missing or wrong for a transition. ``lineage.registry`` refuses an alias
move with any problem, and ``lineage.audit`` reports the same problems.
"""

from __future__ import annotations

import json

from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from gates.approval import ApprovalRecord
from gates.preregistration import PreregistrationError, Registration
from gates.thresholds import Thresholds, Transition
from lineage import tags
from lineage.records import DecisionRecord, LineageError, load_approval, load_decision
from lineage.registration import load_registration, registered_thresholds
from lineage.tracking import Tracking, experiment_name

TRANSITIONS: tuple[Transition, ...] = ("candidate->shadow", "shadow->canary", "canary->production")


class StageEvidence(BaseModel):
    """A traffic stage run (shadow or one canary step) as recorded."""

    run_id: str
    name: str
    passed: bool
    decision_run_id: str | None


class ApprovalEvidence(BaseModel):
    """An approval run as recorded: the record and the decision it answered."""

    run_id: str
    record: ApprovalRecord
    decision_run_id: str


class ChainEvidence(BaseModel):
    """Everything the store holds for one version (``None``/empty where absent), and
    the problems found while reading it."""

    family: str
    version: str
    build_run_id: str | None = None
    decision: DecisionRecord | None = None
    registration: Registration | None = None
    thresholds: Thresholds | None = None
    confirmation: DecisionRecord | None = None
    shadow: StageEvidence | None = None
    canary: list[StageEvidence] = []
    approvals: dict[str, ApprovalEvidence] = {}
    read_problems: list[str] = []


def _stage_run(tracking: Tracking, run_id: str, stage: str, passed_tag: str) -> StageEvidence:
    run = tracking.client().get_run(run_id)
    if run.data.tags.get(tags.STAGE) != stage:
        raise LineageError(f"run {run_id} is not a {stage} run")
    return StageEvidence(run_id=run_id, name=run.info.run_name or stage,
                         passed=run.data.tags.get(passed_tag) == "true",
                         decision_run_id=run.data.tags.get(tags.DECISION_RUN_ID))


def collect(tracking: Tracking, family: str, version: str, *,
            decision_run_id: str | None = None) -> ChainEvidence:
    """Read the evidence of ``version`` (links from its version tags; ``decision_run_id``
    overrides the gate-decision link). Never raises on bad lineage: what cannot be read
    is a ``read_problems`` entry."""
    evidence = ChainEvidence(family=family, version=version)
    problems = evidence.read_problems
    try:
        mv = tracking.client().get_model_version(experiment_name(family), version)
    except MlflowException:
        problems.append(f"{experiment_name(family)} has no version {version}")
        return evidence
    evidence.build_run_id = mv.run_id
    vtags = mv.tags
    decision_run_id = decision_run_id or vtags.get(tags.DECISION_RUN_ID)
    for name, run_id, target in (("gate decision", decision_run_id, "decision"),
                                 ("confirmation decision", vtags.get(tags.CONFIRMATION_RUN_ID),
                                  "confirmation")):
        if run_id is None:
            continue
        try:
            setattr(evidence, target, load_decision(tracking, run_id))
        except LineageError as exc:
            problems.append(f"{name} {run_id} not usable: {exc}")
    if evidence.decision is not None:
        try:
            evidence.registration = load_registration(evidence.decision.registration_id,
                                                      tracking=tracking)
            evidence.thresholds = registered_thresholds(evidence.registration, tracking=tracking)
        except (PreregistrationError, ValueError) as exc:
            problems.append(f"registration {evidence.decision.registration_id} not usable: {exc}")
    try:
        if tags.SHADOW_RUN_ID in vtags:
            evidence.shadow = _stage_run(tracking, vtags[tags.SHADOW_RUN_ID], "shadow",
                                         tags.SHADOW_PASSED)
        evidence.canary = [_stage_run(tracking, run_id, "canary", tags.CANARY_PASSED)
                           for run_id in json.loads(vtags.get(tags.CANARY_RUN_IDS, "[]"))]
    except (MlflowException, LineageError, json.JSONDecodeError) as exc:
        problems.append(f"traffic stage record not usable: {exc}")
    for transition in TRANSITIONS:
        run_id = vtags.get(tags.approval_run_id(transition))
        if run_id is None:
            continue
        try:
            record, answered = load_approval(tracking, run_id)
            evidence.approvals[transition] = ApprovalEvidence(run_id=run_id, record=record,
                                                              decision_run_id=answered)
        except LineageError as exc:
            problems.append(f"approval {transition} {run_id} not usable: {exc}")
    return evidence


def _decision_problems(evidence: ChainEvidence, record: DecisionRecord | None, name: str,
                       *, scope: list[str] | None) -> list[str]:
    if record is None:
        return [f"no {name}"]
    out = []
    decision = record.decision
    if decision.verdict != "promote":
        out.append(f"{name} {record.decision_run_id} rejects the candidate")
    if record.build_run_id != evidence.build_run_id:
        out.append(f"{name} {record.decision_run_id} judged build {record.build_run_id}, "
                   f"not this version's build {evidence.build_run_id}")
    if decision.scope != scope:
        out.append(f"{name} {record.decision_run_id} judged criteria {decision.scope or 'all'}, "
                   f"expected {scope or 'all'}")
    registration = evidence.registration
    if registration is not None:
        if record.registration_id != registration.registration_id:
            out.append(f"{name} {record.decision_run_id} is under registration "
                       f"{record.registration_id}, not {registration.registration_id}")
        if decision.thresholds_sha256 != registration.thresholds_sha256:
            out.append(f"{name} {record.decision_run_id}: thresholds hash differs from the registration's")
        if decision.evaluation_started_at < registration.registered_at:
            out.append(f"{name} {record.decision_run_id}: evaluation predates the registration")
    return out


def problems(evidence: ChainEvidence, transition: Transition) -> list[str]:
    """What is missing or wrong for ``evidence.version`` to make ``transition``
    (``shadow->canary``: enter canary; ``canary->production``: be promoted). Empty when
    the chain is complete."""
    out = list(evidence.read_problems)
    out += _decision_problems(evidence, evidence.decision, "gate decision", scope=None)
    if evidence.registration is None or evidence.thresholds is None:
        out.append("no usable registration: the required approvals and canary plan are unknown")
        return out
    if evidence.shadow is None:
        out.append("no shadow stage recorded")
    elif not evidence.shadow.passed:
        out.append(f"shadow run {evidence.shadow.run_id} did not pass")
    elif evidence.decision and evidence.shadow.decision_run_id != evidence.decision.decision_run_id:
        out.append(f"shadow run {evidence.shadow.run_id} judged another decision")
    upto = TRANSITIONS[: TRANSITIONS.index(transition) + 1]
    policy = evidence.thresholds.approval
    for needed in (t for t in upto if t in policy.required_for):
        if needed not in evidence.approvals:
            out.append(f"approval for {needed} missing (the registered policy requires one)")
            continue
        found = evidence.approvals[needed]
        approval, run_id = found.record, found.run_id
        decision_id = evidence.decision.decision_run_id if evidence.decision else None
        bad = [(not approval.approved, "it does not approve"),
               (found.decision_run_id != decision_id, "it answers another decision"),
               (approval.timed_out, "it timed out"),
               (approval.transition != needed, f"it is for {approval.transition}"),
               (approval.version != evidence.version, f"it is for version {approval.version}"),
               (approval.auto_approved and not policy.auto_approve,
                "it was auto-approved but the policy requires a person")]
        out += [f"approval {needed} ({run_id}): {why}" for cond, why in bad if cond]
    if transition == "canary->production":
        steps = [s.name for s in evidence.thresholds.canary.steps]
        passed = [c.name for c in evidence.canary if c.passed]
        if passed != steps:
            out.append(f"canary steps passed {passed}, the registered plan has {steps}")
        out += _decision_problems(evidence, evidence.confirmation, "confirmation decision",
                                  scope=["accuracy"])
    return out
