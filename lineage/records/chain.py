"""What a complete chain of evidence is: the one definition promotion and the audit share.

For a model version to hold ``canary`` or ``production``, the signed record must show,
for that version's build and under one registration:

1. a passing gate decision on the held-out split (its registration intact, frozen
   before the evaluation started);
2. a passed shadow stage linked to that decision;
3. every approval the registration's policy requires for the transitions so far, each
   approving this version and this decision (auto-approval only where the policy
   allows it; a signature by a named approver where the policy requires one);
4. for ``production`` also: one passed canary run per step of the registered canary
   plan, and a passing confirmation decision (accuracy criteria on a confirmation split
   no earlier rollout of the family used) under the same registration.

Evidence is read only from verified attestations (``lineage.signing.attestations``): tags help
find runs, never decide what counts. :func:`collect` reads what the store holds for a
version; :func:`problems` lists, in words, what is missing or wrong for a transition.
``lineage.aliases.registry`` refuses an alias move with any problem, and ``lineage.audit.audit``
reports the same problems.
"""

from __future__ import annotations

from pydantic import BaseModel

from gates.approval import ApprovalRecord
from gates.approval_policy import Transition
from gates.preregistration import PreregistrationError, Registration
from gates.thresholds import Thresholds
from lineage.records.records import DecisionRecord, LineageError, load_approval, load_decision
from lineage.records.registration import load_registration, registered_thresholds
from lineage.signing.attestations import Attestation
from lineage.signing.sources import EvidenceSource

TRANSITIONS: tuple[Transition, ...] = ("candidate->shadow", "shadow->canary", "canary->production")


class StageEvidence(BaseModel):
    """A traffic stage (shadow or one canary step) as signed."""

    run_id: str
    name: str
    passed: bool
    decision_run_id: str | None


class ApprovalEvidence(BaseModel):
    """An approval as signed: the record and the decision it answered."""

    run_id: str
    record: ApprovalRecord
    decision_run_id: str


class ChainEvidence(BaseModel):
    """Everything the signed record holds for one version (``None``/empty where absent),
    and the problems met while reading it."""

    family: str
    version: str
    build: Attestation | None = None
    build_run_id: str | None = None
    decision: DecisionRecord | None = None
    registration: Registration | None = None
    thresholds: Thresholds | None = None
    confirmation: DecisionRecord | None = None
    confirmation_split_digest: str | None = None
    confirmation_reused_by: list[str] = []
    shadow: StageEvidence | None = None
    canary: list[StageEvidence] = []
    approvals: dict[str, ApprovalEvidence] = {}
    stopped: list[str] = []
    read_problems: list[str] = []


def _latest(items: list[Attestation]) -> Attestation | None:
    return max(items, key=lambda a: a.predicate.get("attested_at", "")) if items else None


def collect(source: EvidenceSource, version: str, *,
            decision_run_id: str | None = None) -> ChainEvidence:
    """Read the signed evidence of ``version`` (``decision_run_id`` picks the held-out
    decision; default: the build's first passing one). Never raises on bad lineage:
    what cannot be read is a ``read_problems`` entry."""
    evidence = ChainEvidence(family=source.family, version=version)
    problems = evidence.read_problems
    version_run = source.version_run(version)
    if version_run is None:
        problems.append(f"kernelgate-{source.family} has no version {version}")
        return evidence
    found = source.attestations()
    builds = [a for a in found if a.kind == "build" and str(a.predicate.get("version")) == version]
    if not builds:
        problems.append(f"no signed build attestation for v{version}")
        return evidence
    evidence.build = builds[0]
    evidence.build_run_id = evidence.build.run_id
    evidence.stopped = _stopped(found, version)
    if version_run != evidence.build_run_id:
        problems.append(f"v{version} points at run {version_run}, its signed build is "
                        f"{evidence.build_run_id}")
    decisions = [a for a in found if a.kind == "decision"
                 and a.predicate.get("build_run_id") == evidence.build_run_id]
    held_out = [a for a in decisions if not a.predicate.get("scope")]
    if decision_run_id is None:
        passing = [a for a in held_out if a.predicate.get("verdict") == "promote"]
        chosen = min(passing or held_out, key=lambda a: a.predicate.get("attested_at", ""),
                     default=None)
        decision_run_id = chosen.run_id if chosen else None
    if decision_run_id is not None:
        try:
            evidence.decision = load_decision(source, decision_run_id)
        except LineageError as exc:
            problems.append(f"gate decision {decision_run_id} not usable: {exc}")
    if evidence.decision is not None:
        _registration(source, evidence)
        _traffic_and_approvals(source, evidence, found)
        _confirmation(source, evidence, decisions, found)
    return evidence


STOPPING_RESULTS = ("rejected", "timed_out", "rolled_back", "not_adopted", "errored", "failed")


def _stopped(found: list[Attestation], version: str) -> list[str]:
    """What the signed record says ended this version's way: a rollout outcome that
    rejected, rolled back or failed it, or an alias rolled back away from it."""
    out = [f"its rollout ended {a.predicate.get('result')} at {a.predicate.get('stage')} "
           f"(run {a.run_id}): {a.predicate.get('reason')}"
           for a in found if a.kind == "outcome" and str(a.predicate.get("version")) == version
           and a.predicate.get("result") in STOPPING_RESULTS]
    out += [f"{a.predicate.get('alias')} was rolled back from it (run {a.run_id}): "
            f"{a.predicate.get('reason')}"
            for a in found if a.kind == "alias" and a.predicate.get("action") == "rollback"
            and str(a.predicate.get("previous_version")) == version]
    return out


def _registration(source: EvidenceSource, evidence: ChainEvidence) -> None:
    registration_id = evidence.decision.registration_id
    try:
        evidence.registration = load_registration(source, registration_id)
        evidence.thresholds = registered_thresholds(source, evidence.registration)
    except (PreregistrationError, ValueError) as exc:
        evidence.read_problems.append(f"registration {registration_id} not usable: {exc}")


def _traffic_and_approvals(source: EvidenceSource, evidence: ChainEvidence,
                           found: list[Attestation]) -> None:
    decision_run_id = evidence.decision.decision_run_id

    def mine(kind: str) -> list[Attestation]:
        return [a for a in found if a.kind == kind
                and str(a.predicate.get("version")) == evidence.version
                and a.predicate.get("decision_run_id") == decision_run_id]

    shadow = _latest(mine("shadow"))
    if shadow is not None:
        evidence.shadow = StageEvidence(run_id=shadow.run_id, name="shadow",
                                        passed=shadow.predicate.get("passed") is True,
                                        decision_run_id=decision_run_id)
    evidence.canary = [StageEvidence(run_id=a.run_id, name=a.predicate.get("step", "?"),
                                     passed=a.predicate.get("passed") is True,
                                     decision_run_id=decision_run_id)
                       for a in sorted(mine("canary"),
                                       key=lambda a: a.predicate.get("attested_at", ""))]
    for transition in TRANSITIONS:
        answers = [a for a in mine("approval")
                   if a.predicate.get("record", {}).get("transition") == transition]
        latest = _latest(answers)
        if latest is None:
            continue
        try:
            record, answered = load_approval(source, latest.run_id)
            evidence.approvals[transition] = ApprovalEvidence(run_id=latest.run_id, record=record,
                                                              decision_run_id=answered)
        except LineageError as exc:
            evidence.read_problems.append(f"approval {transition} {latest.run_id} not usable: {exc}")


def spent_confirmation_digests(source: EvidenceSource) -> set[str]:
    """Split digests of every confirmation split (or draw) the family has been evaluated
    on, from its signed evaluation attestations: these are spent for the family."""
    return {str(a.predicate.get("split_digest")) for a in source.attestations()
            if a.kind == "evaluation" and str(a.predicate.get("split", "")).startswith("confirmation")}


def _confirmation(source: EvidenceSource, evidence: ChainEvidence, decisions: list[Attestation],
                  found: list[Attestation]) -> None:
    confirmations = [a for a in decisions if a.predicate.get("scope") == ["accuracy"]
                     and a.predicate.get("registration_id") == evidence.decision.registration_id]
    latest = _latest(confirmations)
    if latest is None:
        return
    try:
        evidence.confirmation = load_decision(source, latest.run_id)
    except LineageError as exc:
        evidence.read_problems.append(f"confirmation decision {latest.run_id} not usable: {exc}")
        return
    evaluations = {a.run_id: a for a in found if a.kind == "evaluation"}
    mine = evaluations.get(evidence.confirmation.evaluation_run_id)
    if mine is None:
        evidence.read_problems.append("the confirmation decision's evaluation is not signed")
        return
    digest = mine.predicate.get("split_digest")
    evidence.confirmation_split_digest = digest
    evidence.confirmation_reused_by = sorted(
        str(a.predicate.get("build_run_id")) for a in evaluations.values()
        if a.predicate.get("split", "").startswith("confirmation")
        and a.predicate.get("split_digest") == digest
        and a.predicate.get("build_run_id") != evidence.build_run_id
        and a.predicate.get("attested_at", "") < mine.predicate.get("attested_at", ""))


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


def _approval_problems(evidence: ChainEvidence, needed: str) -> list[str]:
    policy = evidence.thresholds.approval
    found = evidence.approvals.get(needed)
    if found is None:
        return [f"approval for {needed} missing (the registered policy requires one)"]
    approval = found.record
    decision_id = evidence.decision.decision_run_id
    bad = [(not approval.approved, "it does not approve"),
           (found.decision_run_id != decision_id, "it answers another decision"),
           (approval.timed_out, "it timed out"),
           (approval.transition != needed, f"it is for {approval.transition}"),
           (approval.version != evidence.version, f"it is for version {approval.version}"),
           (approval.auto_approved and not policy.auto_approve,
            "it was auto-approved but the policy requires a person"),
           (policy.require_signed and not approval.auto_approved and not approval.authenticated,
            "the policy requires a signed approval; this one was typed unauthenticated")]
    return [f"approval {needed} ({found.run_id}): {why}" for cond, why in bad if cond]


def problems(evidence: ChainEvidence, transition: Transition) -> list[str]:
    """What is missing or wrong for ``evidence.version`` to make ``transition``
    (``shadow->canary``: enter canary; ``canary->production``: be promoted). Empty when
    the chain is complete."""
    out = list(evidence.read_problems)
    out += [f"v{evidence.version} was rolled back or rejected: {why}; it needs a new rollout"
            for why in evidence.stopped]
    out += _decision_problems(evidence, evidence.decision, "gate decision", scope=None)
    if evidence.registration is None or evidence.thresholds is None:
        out.append("no usable registration: the required approvals and canary plan are unknown")
        return out
    if evidence.shadow is None:
        out.append("no shadow stage recorded")
    elif not evidence.shadow.passed:
        out.append(f"shadow run {evidence.shadow.run_id} did not pass")
    upto = TRANSITIONS[: TRANSITIONS.index(transition) + 1]
    for needed in (t for t in upto if t in evidence.thresholds.approval.required_for):
        out += _approval_problems(evidence, needed)
    if transition == "canary->production":
        plan = evidence.thresholds.canary
        passed = [c.name for c in evidence.canary if c.passed]
        if len(passed) != len(evidence.canary) or not plan.is_look_sequence(passed):
            out.append(f"canary steps passed {passed}, the registered plan has "
                       f"{[s.name for s in plan.looks()]}")
        out += _decision_problems(evidence, evidence.confirmation, "confirmation decision",
                                  scope=["accuracy"])
        if evidence.confirmation_reused_by:
            out.append(f"the confirmation split {str(evidence.confirmation_split_digest)[:12]} was "
                       f"already used by build(s) {evidence.confirmation_reused_by}: a held-out set "
                       "used twice is no longer held out")
    return out
