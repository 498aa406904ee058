"""Prefect flows: ``build_kernel``, ``evaluate_candidate`` and the governed ``rollout``.

The rollout reads like the stage list in the design notes:
preregister → build → evaluate → gate → shadow → approval → canary steps →
promote or roll back. Each stage is a task calling a plain function of
``flows.stages``; every decision is logged to MLflow.
"""

from __future__ import annotations

import math
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from evaluation.report import EvaluationReport
from flows import stages
from flows.stages import RolloutContext, RolloutOutcome, RolloutSettings
from gates.approval import ApprovalInput, record_answer, record_auto_approval, record_timeout
from gates.decision import GateDecision
from gates.thresholds import ApprovalPolicy
from lineage import tags

# Arguments include models and clients that do not hash; results are logged to MLflow.
stage_task = task(cache_policy=NO_CACHE, persist_result=False)


class ApprovalForm(RunInput, ApprovalInput):
    """The release manager's form in the Prefect UI: approve, approver, comment."""


open_rollout = stage_task(stages.open_rollout, name="open")
preregister = stage_task(stages.preregister_thresholds, name="preregister")
build = stage_task(stages.build_candidate, name="build")
prepare_testset = stage_task(stages.prepare_testset, name="prepare-testset")
evaluate = stage_task(stages.evaluate_build, name="evaluate")
gate = stage_task(stages.gate, name="gate")
confirm = stage_task(stages.confirm, name="confirm")
shadow = stage_task(stages.run_shadow, name="shadow")
canary_step = stage_task(stages.run_canary_step, name="canary-step")
enter_canary = stage_task(stages.enter_canary, name="enter-canary")
promote = stage_task(stages.promote_version, name="promote")
reject = stage_task(stages.reject, name="roll-back")


def _progress(label: str):
    logger = get_run_logger()
    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 4) == 0:
            logger.info("%s: %d/%d requests", label, done, total)
    return report


def decision_markdown(decision: GateDecision, version: str, transition: str) -> str:
    """The gate decision as markdown, shown above the approval form."""
    rows = "\n".join(
        f"| {c.name} | {c.status} | {c.observed if c.observed is not None else '-'} "
        f"| {c.op} {c.threshold:g} | {c.reason} |" for c in decision.criteria)
    note = f"\n\n**Not assessed:** {decision.not_assessed_note}" if decision.not_assessed_note else ""
    return (f"## Approve `{transition}` for v{version}?\n\n"
            f"Gate verdict: **{decision.verdict}** — {decision.summary}{note}\n\n"
            "| criterion | status | observed | threshold | reason |\n|---|---|---|---|---|\n"
            f"{rows}\n")


APPROVAL_POLL_S = 2


def approval_key(transition: str) -> str:
    """The pause key of an approval; its form schema is stored under
    ``paused-<key>-schema`` in the flow run's inputs."""
    return f"approval-{transition.replace('->', '-to-')}"


def request_approval(ctx: RolloutContext, policy: ApprovalPolicy, transition: str, version: str,
                     decision: GateDecision, decision_run_id: str) -> tuple[bool, str | None]:
    """Ask a person (pause with a typed form) where the preregistered policy requires it.

    Returns ``(approved, approval_run_id)``; ``approval_run_id`` is None when the
    policy does not list the transition. A timeout rejects.
    """
    logger = get_run_logger()
    if transition not in policy.required_for:
        return True, None
    if policy.auto_approve:
        record = record_auto_approval(policy, transition=transition, family=ctx.family, version=version)
        logger.info("approval %s auto-approved: %s", transition, policy.auto_approve_reason)
    else:
        logger.info("waiting up to %ss for a release manager to approve %s in the Prefect UI",
                    policy.timeout_s, transition)
        form = ApprovalForm.with_initial_data(
            description=decision_markdown(decision, version, transition),
            approve=False, approver="", comment="")
        try:
            answer = pause_flow_run(wait_for_input=form, timeout=max(1, math.ceil(policy.timeout_s)),
                                    poll_interval=APPROVAL_POLL_S,
                                    key=approval_key(transition))
            record = record_answer(answer, transition=transition, family=ctx.family, version=version)
        except FlowPauseTimeout:
            record = record_timeout(policy, transition=transition, family=ctx.family, version=version)
    run_id = stages.log_approval_record(ctx, record, decision_run_id)
    stages.tag_version(ctx, version, {f"{tags.APPROVAL_RUN_ID}.{approval_key(transition)}": run_id})
    logger.info("approval %s: %s by %s (%s)", transition,
                "approved" if record.approved else "rejected", record.approver, record.comment)
    return record.approved, run_id


def _finish(ctx: RolloutContext, **kwargs) -> RolloutOutcome:
    outcome = stages.close_rollout(ctx, **kwargs)
    try:
        create_markdown_artifact(outcome.markdown(), key=f"rollout-{ctx.family.replace('_', '-')}",
                                 description=f"kernelgate rollout of {ctx.family}")
    except Exception as err:  # the MLflow record is complete; the UI summary is a courtesy
        get_run_logger().warning("could not write the Prefect summary artifact: %s", err)
    get_run_logger().info("rollout %s: %s at %s — %s", ctx.family, outcome.result, outcome.stage,
                          outcome.reason)
    return outcome


@flow(name="kernelgate-rollout", log_prints=True)
def rollout(settings: RolloutSettings | None = None) -> RolloutOutcome:
    """Governed rollout of one candidate kernel; ends promoted, rejected or rolled back."""
    settings = settings or RolloutSettings()
    ctx = open_rollout(settings, clear_stale_aliases=True)
    state = {"version": None, "decision": None, "promoted": False}
    try:
        return _rollout_stages(ctx, settings, state)
    except BaseException as err:
        reason = f"{type(err).__name__}: {err}"
        if state["promoted"]:
            # Production moved after every check passed; only bookkeeping failed after it.
            stages.close_rollout(ctx, result="promoted", stage="promotion", version=state["version"],
                                 reason=f"promoted; a step after the promotion failed: {reason}",
                                 decision=state["decision"])
            raise
        try:
            if state["version"] is not None:
                # Leave no alias on an unfinished version; production is untouched.
                stages.reject(ctx, state["version"], f"rollout failed: {reason}")
        finally:
            stages.close_rollout(ctx, result="failed", stage="error", reason=reason,
                                 version=state["version"], decision=state["decision"])
        raise


def _rollout_stages(ctx: RolloutContext, settings: RolloutSettings, state: dict) -> RolloutOutcome:
    from evaluation.model import MiniLM

    registration = preregister(ctx, settings.thresholds)
    build_run_id, version = build(ctx, settings.config)
    state["version"] = version
    model = MiniLM.load()
    testset_dir = prepare_testset(settings, ctx.backend, model)
    report: EvaluationReport
    report, evaluation_run_id = evaluate(ctx, settings, registration=registration,
                                         build_run_id=build_run_id, testset_dir=testset_dir,
                                         config=settings.config, model=model)
    decision, decision_run_id, thresholds = gate(
        ctx, report, thresholds_path=settings.thresholds, registration=registration,
        build_run_id=build_run_id, evaluation_run_id=evaluation_run_id)
    state["decision"] = decision
    if not decision.passed:
        reject(ctx, version, f"gate: {decision.summary}")
        return _finish(ctx, result="rejected", stage="gate", reason=decision.summary,
                       version=version, decision=decision)

    def stop(stage: str, reason: str) -> RolloutOutcome:
        reject(ctx, version, reason)
        return _finish(ctx, result="rolled_back", stage=stage, reason=reason, version=version,
                       decision=decision)

    def approved(transition: str) -> tuple[bool, str | None]:
        return request_approval(ctx, thresholds.approval, transition, version, decision,
                                decision_run_id)

    plan = thresholds.canary
    traffic = stages.recorded_traffic(
        ctx, settings, settings.shadow_requests + sum(s.requests for s in plan.steps))
    segments = _segments(traffic, [settings.shadow_requests, *(s.requests for s in plan.steps)])

    ok, _ = approved("candidate->shadow")
    if not ok:
        return stop("approval", "approval for candidate->shadow rejected or timed out")
    shadow_result = shadow(ctx, version, model=model, traffic=segments[0], thresholds=thresholds,
                           report=report, decision_run_id=decision_run_id,
                           progress=_progress("shadow"))
    if not shadow_result.passed:
        return stop("shadow", f"shadow: {'; '.join(shadow_result.breaches)}")

    ok, approval_run_id = approved("shadow->canary")
    if not ok:
        return stop("approval", "approval for shadow->canary rejected or timed out")
    enter_canary(ctx, version, decision_run_id=decision_run_id, approval_run_id=approval_run_id)
    for step, requests in zip(plan.steps, segments[1:], strict=True):
        result = canary_step(ctx, version, step, model=model, traffic=requests,
                             thresholds=thresholds, report=report,
                             decision_run_id=decision_run_id, progress=_progress(step.name))
        if not result.passed:
            return stop(step.name, f"{step.name}: {'; '.join(result.breaches)}")

    confirmation, _ = confirm(ctx, settings, version, registration=registration,
                              build_run_id=build_run_id, testset_dir=testset_dir,
                              config=settings.config, model=model)
    if not confirmation.passed:
        return stop("confirmation", f"confirmation split: {confirmation.summary}")

    ok, approval_run_id = approved("canary->production")
    if not ok:
        return stop("approval", "approval for canary->production rejected or timed out")
    promote(ctx, version, decision_run_id=decision_run_id, approval_run_id=approval_run_id)
    state["promoted"] = True
    return _finish(ctx, result="promoted", stage="promotion",
                   reason="every gate, shadow, canary and confirmation criterion passed", version=version,
                   decision=decision)


def _segments(traffic, sizes: list[int]):
    """Consecutive, disjoint slices of the recorded stream (shadow, then each canary step)."""
    out, start = [], 0
    for n in sizes:
        out.append(traffic.model_copy(update={"requests": traffic.requests[start:start + n]}))
        start += n
    return out


@flow(name="kernelgate-build-kernel")
def build_kernel(settings: RolloutSettings | None = None) -> str:
    """Build, export and register the candidate (no evaluation); returns the model version."""
    settings = settings or RolloutSettings()
    ctx = open_rollout(settings, stage="build")
    _, version = build(ctx, settings.config)
    stages.close_rollout(ctx, result="built", stage="build", version=version,
                         reason="built and registered only; not evaluated, no alias moved")
    return version


@flow(name="kernelgate-evaluate-candidate")
def evaluate_candidate(settings: RolloutSettings | None = None,
                       report_path: Path | None = None) -> EvaluationReport:
    """Preregister, build and evaluate a candidate and log the gate decision, without
    moving any alias (a dry look at the evidence)."""
    from evaluation.model import MiniLM

    settings = settings or RolloutSettings()
    ctx = open_rollout(settings, stage="rollout")
    registration = preregister(ctx, settings.thresholds)
    build_run_id, version = build(ctx, settings.config)
    model = MiniLM.load()
    testset_dir = prepare_testset(settings, ctx.backend, model)
    report, evaluation_run_id = evaluate(ctx, settings, registration=registration,
                                         build_run_id=build_run_id, testset_dir=testset_dir,
                                         config=settings.config, model=model)
    decision, _, _ = gate(ctx, report, thresholds_path=settings.thresholds,
                          registration=registration, build_run_id=build_run_id,
                          evaluation_run_id=evaluation_run_id)
    _finish(ctx, result="evaluated", stage="evaluation",
            reason=f"evaluation only (gate said {decision.verdict}); no alias moved",
            version=version, decision=decision)
    if report_path:
        report.write(report_path)
    return report
