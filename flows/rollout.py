"""Prefect flows: the governed ``rollout``, and ``build_kernel``/``evaluate_candidate``
that run only its first stages.

The rollout's body is the stage list of the design notes: preregister → build →
evaluate → gate → shadow → approval → canary steps → canary verdict → (adoption, where the
registration has ``decision:``) → confirm → promote, or roll back (or, safe but not worth
adopting, end *NotAdopted*).
Each stage is a task (``flows.judge``, ``flows.traffic``, ``flows.promotion``) calling
plain functions of the packages below; it returns what it established as a typed result
(``flows.results``), which the flow passes on to the stages that need it. Every
decision is logged to MLflow, and the registry enforces what makes a promotion legal
whoever calls it.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.states import State

from evaluation.report import EvaluationReport
from flows.end_states import outcome_of, rollout_end_state
from flows.errored import errored_outcome, errored_state
from flows.judge import build, confirm, evaluate, gate
from flows.plan import NothingToRollOut, RolloutPlan
from flows.promotion import (
    adoption_evidence,
    approve,
    approvers,
    enter_canary,
    promote,
    reject,
    roll_back,
    unless_adopted,
)
from flows.results import RolloutContext
from flows.settings import RolloutSettings
from flows.tasks import (
    end_state,
    finish,
    prepare_testset,
    preregister,
    rollout_session,
    tag_result,
)
from flows.traffic import (
    adoption_verdict,
    canary_calibration,
    canary_step,
    canary_verdict,
    settle,
    shadow,
)
from flows.traffic_plan import record_traffic
from gates.canary_latency import another_look
from gates.decision import short_reason as gate_reason
from gates.headline import promotion_reason
from lineage.rollout.rollout import RolloutOutcome


@flow(name="kernelgate-rollout", log_prints=True)
def rollout(settings: RolloutSettings | None = None,
            plan: RolloutPlan | None = None) -> RolloutOutcome:
    """Governed rollout of one candidate kernel under ``plan`` (``flows.plan``; None: the
    one ``settings`` resolve to). Ends in a state named for what happened (*Promoted*,
    *Rejected*, *TimedOut*, *RolledBack*, *NotAdopted*, typed by ``flows.end_states``), or
    *Errored* (``flows.errored``), or *NothingToRollOut* (:func:`_ended_early`). A call returns
    a promotion's outcome, raises any other's (``RolloutNotPromoted``, ``RolloutErrored``);
    :func:`run_rollout` returns them all."""
    try:
        with rollout_session(settings or RolloutSettings(), plan, new_version=True) as context:
            outcome = _stages(context)
    except Exception as err:
        return _ended_early(err)
    return rollout_end_state(outcome)


def _ended_early(err: Exception) -> State:
    """The final state of a rollout that raised ``err`` before its stages ended:
    *NothingToRollOut* (Completed-type; nothing was opened or written) where ``auto``
    resolved to its own family's production policy, as a deployment's default settings do
    once a policy is promoted; *Errored* where the record was open (``flows.errored``).

    Raises:
        Exception: ``err`` itself, raised before the record opened (a bad plan).
    """
    if isinstance(err, NothingToRollOut):
        return end_state("nothing_to_roll_out", str(err), None)
    if (errored := errored_outcome(err)) is None:
        raise err
    tag_result("errored")
    return errored_state(errored, err)


def _stages(ctx: RolloutContext) -> RolloutOutcome:
    """The stage list; returns the outcome at the first stage that stops the candidate."""
    preregistered = preregister(ctx)
    built = build(ctx, preregistered)
    testset = prepare_testset(ctx)
    evaluated = evaluate(ctx, preregistered, built, testset, split="heldout")
    gated = gate(ctx, preregistered, built, evaluated)
    if not gated.passed:
        reject(ctx, gated, why := gate_reason(gated.decision))
        return finish(ctx, "rejected", "gate", why, version=built.version, decision=gated.decision,
                      decided_by="the gate (preregistered thresholds)")
    calibration, cited = canary_calibration(ctx, gated, evaluated)  # before anyone is asked
    if cited.startswith("no fresh"):
        return roll_back(ctx, gated, "canary", f"canary: {cited}", inconclusive=True)
    traffic = record_traffic(ctx, preregistered, gated)
    if (stopped := approve(ctx, "candidate->shadow", gated)) is not None:
        return stopped  # Rejected (a person said no) or TimedOut
    judged = [result := shadow(ctx, gated, evaluated, traffic.shadow_look())]  # shown in the forms
    if not result.passed:
        return roll_back(ctx, gated, "shadow", f"shadow: {'; '.join(result.breaches)}", judged)
    if (stopped := approve(ctx, "shadow->canary", gated, judged)) is not None:
        return stopped
    enter_canary(ctx, gated)
    for step, requests in traffic.looks():
        if not another_look(gated.thresholds.canary, judged[1:]):
            break  # an extension's extra look, not needed: the verdict is not inconclusive
        judged.append(result := canary_step(ctx, gated, evaluated, step, requests, judged[1:]))
        if not result.passed:
            return roll_back(ctx, gated, step.name, f"{step.name}: {'; '.join(result.breaches)}",
                             judged)
    if stop := settle(gated, verdict := canary_verdict(ctx, gated, judged[1:], calibration)):
        return roll_back(ctx, gated, "canary", f"canary: {stop.reason}", judged,
                         inconclusive=stop.inconclusive)
    adoption = adoption_verdict(ctx, gated, judged[1:], verdict)  # None without decision:
    if ended := unless_adopted(ctx, gated, adoption, judged):
        return ended  # not worth it (NotAdopted) or inconclusive; adopted goes on
    if not (confirmed := confirm(ctx, preregistered, built, testset)).passed:
        return roll_back(ctx, gated, "confirmation",
                         f"confirmation split: {gate_reason(confirmed.decision)}", judged)
    if stopped := approve(ctx, "canary->production", gated, judged, confirmed, adoption):
        return stopped  # the form shows the adoption evidence, where there is a decision:
    promote(ctx, gated, evaluated)
    return finish(ctx, "promoted", "promotion", promotion_reason(gated.decision, judged),
                  version=built.version, decision=gated.decision, traffic=judged,
                  decided_by=approvers(ctx, gated), evidence=adoption_evidence(gated, adoption))


@flow(name="kernelgate-build-kernel")
def build_kernel(settings: RolloutSettings | None = None,
                 plan: RolloutPlan | None = None) -> str:
    """Build, export and register the candidate (no evaluation); returns the model version."""
    with rollout_session(settings or RolloutSettings(), plan, stage="build",
                         clear_stale_aliases=False) as ctx:
        built = build(ctx)
        outcome = finish(ctx, "built", "build",
                         "built and registered only; not evaluated, no alias moved",
                         version=built.version)
    return end_state(outcome.result, outcome.reason, built.version)


@flow(name="kernelgate-evaluate-candidate")
def evaluate_candidate(settings: RolloutSettings | None = None,
                       report_path: Path | None = None,
                       plan: RolloutPlan | None = None) -> EvaluationReport:
    """Preregister, build and evaluate a candidate and log the gate decision, without
    moving any alias. The version is registered (it is the record of what was built),
    and tagged as rejected when the gate says so."""
    with rollout_session(settings or RolloutSettings(), plan, clear_stale_aliases=False) as ctx:
        preregistered = preregister(ctx)
        built = build(ctx, preregistered)
        testset = prepare_testset(ctx)
        evaluated = evaluate(ctx, preregistered, built, testset, split="heldout")
        gated = gate(ctx, preregistered, built, evaluated)
        outcome = finish(ctx, "evaluated", "evaluation",
                         f"evaluation only (gate said {gated.decision.verdict}); no alias moved",
                         version=built.version, decision=gated.decision)
    if report_path:
        evaluated.report.write(report_path)
    return end_state(outcome.result, outcome.summary(), evaluated.report)


def run_rollout(settings: RolloutSettings | None = None,
                plan: RolloutPlan | None = None) -> RolloutOutcome:
    """Run :func:`rollout` and return its signed outcome however it ended (promoted,
    rejected, timed out, rolled back, errored), read from its final state.

    Raises:
        KeyboardInterrupt: the rollout was interrupted (its ``interrupted`` outcome, where
            the record was open, on the exception; ``flows.errored.OUTCOME_ATTRIBUTE``).
        Exception: what the run raised before its record opened.
    """
    return outcome_of(rollout(settings, plan, return_state=True))
