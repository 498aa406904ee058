"""Approval, promotion and roll-back: the tasks that move aliases (or refuse to)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field, ValidationError

from flows.results import Confirmed, Evaluated, Gated, Promoted, RolloutContext
from flows.tasks import finish, run_logger, stage_clock, stage_task
from gates.adoption_decision import AdoptionVerdict, adoption_markdown
from gates.approval import (
    ApprovalInput,
    ApprovalRecord,
    record_answer,
    record_auto_approval,
    record_timeout,
)
from gates.approval_policy import Transition
from gates.approval_view import approval_markdown, signed_only_note
from gates.canary import CanaryStepResult
from lineage.rollout.rollout import RolloutOutcome
from lineage.signing.approvals import revocations, verify_approval
from lineage.signing.attestations import AttestationError
from lineage.store import tags

APPROVAL_POLL_S = 2


class ApprovalForm(RunInput, ApprovalInput):
    """The release manager's form in the Prefect UI: the decision (an explicit choice of
    ``approve`` or ``reject``, no default), approver and comment are required;
    ``signed_approval`` takes the output of ``kernelgate approve`` (an answer
    signed with the approver's own key)."""

    signed_approval: str = Field(
        "", description="Optional: paste the output of `kernelgate approve` to sign this answer.")


def pause_key(transition: str, attempt: int) -> str:
    """The Prefect pause key of one ask (a re-ask needs a new key: Prefect skips a pause
    whose key it has seen)."""
    return tags.approval_key(transition) + (f"-retry{attempt}" if attempt else "")


def _ask(context: RolloutContext, transition: Transition, gated: Gated,
         traffic: Sequence[CanaryStepResult], confirmed: Confirmed | None,
         adoption: AdoptionVerdict | None = None) -> ApprovalRecord:
    """Pause until a valid answer or the timeout; a bad answer is re-asked, never recorded
    as an approval."""
    policy = gated.thresholds.approval
    about = dict(transition=transition, family=context.record.family, version=gated.version)
    deadline = time.monotonic() + policy.timeout_s
    notice = ""
    for attempt in itertools.count():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return record_timeout(policy, **about)
        form = ApprovalForm.with_initial_data(
            description=notice + approval_markdown(
                transition, gated.version, gated.decision, traffic=list(traffic),
                confirmation=confirmed and confirmed.decision,
                adoption=adoption_evidence(gated, adoption),
                signed_only=signed_only_note(str(flow_run.get_id()),
                                             [a.name for a in policy.approvers])
                if policy.require_signed else None))
        try:
            given = pause_flow_run(wait_for_input=form, timeout=max(1, math.ceil(remaining)),
                                   poll_interval=APPROVAL_POLL_S, key=pause_key(transition, attempt))
        except FlowPauseTimeout:
            _running_again()
            return record_timeout(policy, **about)
        except ValidationError as err:  # the server took it; the form's own rules did not
            notice = _refused(transition, _errors(err))
            continue
        try:  # the form's rules, again: a client can resume with any JSON
            typed = ApprovalInput.model_validate(given.model_dump(include={"decision", "approver",
                                                                           "comment"}))
        except ValidationError as err:
            notice = _refused(transition, _errors(err))
            continue
        authenticated, how, kept = False, "unauthenticated: typed into the Prefect UI", None
        if given.signed_approval.strip():
            try:
                signed = verify_approval(given.signed_approval.encode(), policy,
                                         flow_run_id=str(flow_run.get_id()),
                                         transition=transition, approve=typed.approve,
                                         revoked=revocations(context.store.trust,
                                                             context.store.log().entries.values()))
            except AttestationError as err:
                notice = _refused(transition, f"the signed approval: {err}")
                continue
            # what the approver signed is the record: their name, their comment, their envelope
            typed = typed.model_copy(update={"approver": signed.approver,
                                             "comment": signed.comment})
            authenticated, how, kept = True, signed.authentication, given.signed_approval.strip()
        if policy.require_signed and not authenticated:
            notice = _refused(transition, "this policy requires a signed approval (an answer "
                              "typed into the form is not one): run `kernelgate approve "
                              f"{flow_run.get_id()} --key <your key>` and paste its output")
            continue
        return record_answer(typed, authenticated=authenticated, authentication=how,
                             signed_answer=kept, **about)
    raise AssertionError("unreachable")


def _refused(transition: str, why: str) -> str:
    """Say why an answer was refused where the release manager looks: a warning line in
    the flow run's log, and the notice atop the re-asked form (returned, markdown)."""
    run_logger().warning("the answer to %s was not accepted (%s); asking again", transition, why)
    return f"**Your answer was not accepted:** {why}. Answer again.\n\n"


def _running_again() -> None:
    """Set the flow run back to Running after its pause timed out: the server refuses every
    later transition out of an expired pause ("The flow was rolledback and never resumed"),
    so the run could not end in the state that says what the flow did next (RolledBack)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    run_id = flow_run.get_id()
    if run_id is None:
        return
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Running(message="approval timed out"), force=True)
    except Exception as err:  # noqa: BLE001 - the rollback is recorded either way
        run_logger().warning("could not set the flow run back to Running: %s", err)


def _errors(err: ValidationError) -> str:
    """The refused fields in words (a blank one said as blank: whitespace is not a name)."""
    def said(e) -> str:
        if e["type"] == "string_too_short":
            return "must not be blank (spaces alone are not an answer)"
        return e["msg"]
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {said(e)}" for e in err.errors())


def ask_approval(context: RolloutContext, transition: Transition, gated: Gated,
                 traffic: Sequence[CanaryStepResult] = (),
                 confirmed: Confirmed | None = None,
                 adoption: AdoptionVerdict | None = None) -> ApprovalRecord | None:
    """Ask a person (pause with a typed form showing the gate decision, the ``traffic``
    steps judged so far, the confirmation and, where the registration has ``decision:``,
    the ``adoption`` verdict) where the preregistered policy requires it; a timeout
    rejects. Whatever happens is logged as a signed approval run (its description says
    who, when, and whether signed) and linked from the version.
    Returns the answer, or None when the policy asks nobody for ``transition``.

    A flow-level step, not a task: Prefect pauses flow runs, not task runs.
    """
    logger = run_logger()
    policy = gated.thresholds.approval
    record = context.record
    if transition not in policy.required_for:
        return None
    if policy.auto_approve:
        answer = record_auto_approval(policy, transition=transition, family=record.family,
                                      version=gated.version)
        logger.info("approval %s auto-approved: %s", transition, policy.auto_approve_reason)
    else:
        logger.info("waiting up to %ss for a release manager to approve %s in the Prefect UI",
                    policy.timeout_s, transition)
    with stage_clock(context, "approval"):  # the wait for a person included
        if not policy.auto_approve:
            answer = _ask(context, transition, gated, traffic, confirmed, adoption)
        run_id = context.store.log_approval(
            answer, decision_run_id=gated.run_id, parent_run_id=record.rollout_run_id,
            person_envelope=answer.signed_answer and answer.signed_answer.encode())
    context.store.link_approval(gated.version, transition, run_id)
    logger.info("approval %s: %s by %s (%s; %s)", transition,
                "approved" if answer.approved else "rejected", answer.approver,
                answer.authentication, answer.comment)
    return answer


def approve(context: RolloutContext, transition: Transition, gated: Gated,
            traffic: Sequence[CanaryStepResult] = (),
            confirmed: Confirmed | None = None,
            adoption: AdoptionVerdict | None = None) -> RolloutOutcome | None:
    """The approval stage: None when ``transition`` may go ahead (approved, or nobody is
    asked); otherwise the candidate is rejected and the rollout closed — *Rejected* when
    a person said no (naming them, how they were identified, and their comment),
    *TimedOut* when nobody answered within the preregistered timeout. ``adoption``: the
    adoption verdict, shown in the form (a registration with ``decision:``)."""
    answer = ask_approval(context, transition, gated, traffic, confirmed, adoption)
    if answer is None or answer.approved:
        return None
    if answer.timed_out:
        result, who = "timed_out", "nobody: no answer within the preregistered timeout"
        reason = (f"no answer to {transition} within {gated.thresholds.approval.timeout_s:g} s; "
                  "the preregistered timeout rejects")
    else:
        result, who = "rejected", f"{answer.approver} ({answer.authentication})"
        reason = f"{transition} rejected by {answer.approver}: {answer.comment}"
    reject(context, gated, reason)
    return finish(context, result, "approval", reason, version=gated.version,
                  decision=gated.decision, decided_by=who, traffic=traffic)


@stage_task(name="enter-canary")
def enter_canary(context: RolloutContext, gated: Gated) -> None:
    """Point ``canary`` at the candidate (the registry checks its chain); this rollout owns it.

    Raises:
        PromotionRefused: the chain up to ``shadow->canary`` is incomplete.
    """
    context.store.assign_canary(gated.version, decision_run_id=gated.run_id,
                                owner_run_id=context.record.rollout_run_id)


@stage_task(name="promote")
def promote(context: RolloutContext, gated: Gated, evaluated: Evaluated) -> Promoted:
    """Move ``production`` to the candidate (the registry checks its complete chain, and
    that production still is what the candidate was ``evaluated`` against).

    Raises:
        PromotionRefused: the chain is incomplete, or production moved since.
    """
    change = context.store.promote(gated.version, decision_run_id=gated.run_id,
                                   expected_previous=evaluated.judged_against,
                                   parent_run_id=context.record.rollout_run_id)
    run_logger().info("promoted v%s to production (previous: %s)", gated.version,
                      change.previous_version)
    return Promoted(version=gated.version, previous_version=change.previous_version)


@stage_task(name="roll-back")
def reject(context: RolloutContext, gated: Gated, reason: str) -> None:
    """Record why the candidate stops here; its ``shadow``/``canary`` aliases are rolled back."""
    context.store.reject(gated.version, reason, parent_run_id=context.record.rollout_run_id)
    run_logger().warning("v%s rejected: %s", gated.version, reason)


def approvers(context: RolloutContext, gated: Gated) -> str:
    """Who decided a promotion: the preregistered criteria and plan, and each approval's
    approver (``(auto)`` where the policy auto-approves)."""
    asked = context.store.approvers(gated.version)
    people = "; ".join(f"{t}: {who}" for t, who in asked.items())
    return ("the gate, shadow, canary and confirmation (preregistered)"
            + (f"; approvals: {people}" if people else ""))


def adoption_evidence(gated: Gated, verdict: AdoptionVerdict | None) -> str | None:
    """The adoption evidence shown in the ``canary->production`` form and on the
    version's page (``gates.adoption_decision.adoption_markdown``); None where the
    registration has no ``decision:`` section (nothing is shown)."""
    plan = gated.thresholds.decision if verdict is not None else None
    return adoption_markdown(plan, verdict) if plan is not None else None


ADOPTION_DECIDER = "the adoption test (preregistered decision)"

DECIDERS = {"shadow": "the shadow analysis (preregistered plan)",
            "confirmation": "the confirmation split's gate (preregistered thresholds)",
            "adoption": ADOPTION_DECIDER}
"""Stage -> who decided a roll-back there (any other stage: a canary step or verdict)."""


def roll_back(context: RolloutContext, gated: Gated, stage: str, reason: str,
              traffic: Sequence[CanaryStepResult] = (), *,
              inconclusive: bool = False, evidence: str | None = None) -> RolloutOutcome:
    """Reject the candidate and close the rollout as rolled back at ``stage`` (a shadow,
    canary or confirmation breach; ``inconclusive``: the evidence could not decide —
    noise the plan could not power through, or no fresh calibration — which the signed
    outcome says, so it never counts against the family as a rejection), naming what
    decided it. ``evidence``: markdown for the version's page (the adoption test's)."""
    reject(context, gated, reason)
    decider = DECIDERS.get(stage, "the canary analysis (preregistered plan)")
    return finish(context, "rolled_back", stage, reason, version=gated.version,
                  decision=gated.decision, traffic=traffic, inconclusive=inconclusive,
                  decided_by=decider + (": inconclusive" if inconclusive else ""),
                  evidence=evidence)


def unless_adopted(context: RolloutContext, gated: Gated, verdict: AdoptionVerdict | None,
                   traffic: Sequence[CanaryStepResult] = ()) -> RolloutOutcome | None:
    """The end of a rollout whose registration's adoption test did not adopt, or None to
    go on (adopted, or no ``decision:`` section). *Not worth it*: its own end state
    (``not_adopted``): the candidate's aliases taken back, production unchanged, the
    version tagged as not adopted with the figures; no rejection of the kernel.
    *Inconclusive*: rolled back as an inconclusive canary is (not a verdict on the
    kernel, never promoted). *Unsafe*: rolled back (the canary's verdict failed). The
    version's page shows the adoption evidence (:func:`adoption_evidence`)."""
    if verdict is None or verdict.outcome == "adopted":
        return None
    if verdict.outcome == "not_worth_it":
        context.store.decline(gated.version, verdict.reason,
                              parent_run_id=context.record.rollout_run_id)
        run_logger().warning("v%s not adopted: %s", gated.version, verdict.reason)
        return finish(context, "not_adopted", "adoption", verdict.reason, version=gated.version,
                      decision=gated.decision, traffic=traffic, decided_by=ADOPTION_DECIDER,
                      evidence=adoption_evidence(gated, verdict))
    return roll_back(context, gated, "adoption", verdict.reason, traffic,
                     inconclusive=verdict.outcome == "inconclusive",
                     evidence=adoption_evidence(gated, verdict))
