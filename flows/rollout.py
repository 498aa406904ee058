"""Prefect flows: the governed ``rollout``, and ``build_kernel``/``evaluate_candidate``
that run only its first stages.

The rollout's body is the stage list of the design notes: preregister → build →
evaluate → gate → shadow → approval → canary steps → confirm → promote, or roll back.
Each stage is a task (``flows.judge``, ``flows.traffic``, ``flows.promotion``) calling
plain functions of the packages below; every decision is logged to MLflow, and the
registry enforces what makes a promotion legal whoever calls it.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from evaluation.report import EvaluationReport
from flows.judge import build, confirm, evaluate, gate
from flows.promotion import approve, enter_canary, promote, reject, roll_back
from flows.settings import RolloutSettings, RolloutState
from flows.tasks import end_state, finish, prepare_testset, preregister, rollout_session
from flows.traffic import canary_step, record_traffic, shadow
from gates.decision import short_reason as gate_reason
from lineage.rollout import RolloutOutcome


@flow(name="kernelgate-rollout", log_prints=True)
def rollout(settings: RolloutSettings | None = None) -> RolloutOutcome:
    """Governed rollout of one candidate kernel; the run ends in a state named for what
    happened (*Promoted*, *Rejected* or *RolledBack*) and returns the outcome."""
    with rollout_session(settings or RolloutSettings()) as state:
        outcome = _stages(state)
    return end_state(outcome.result, outcome.reason, outcome)


def _stages(state: RolloutState) -> RolloutOutcome:
    """The stage list; returns the outcome at the first stage that stops the candidate."""
    preregister(state)
    build(state)
    prepare_testset(state)
    evaluate(state, split="heldout")
    if not gate(state, thresholds_path=state.settings.thresholds).passed:
        why = gate_reason(state.decision)
        reject(state, why)
        return finish(state, "rejected", "gate", why)
    traffic = record_traffic(state)
    if not approve(state, "candidate->shadow"):
        return roll_back(state, "approval", "approval for candidate->shadow rejected or timed out")
    state.traffic_results.append(result := shadow(state, traffic.shadow))  # shown in the form
    if not result.passed:
        return roll_back(state, "shadow", f"shadow: {'; '.join(result.breaches)}")
    if not approve(state, "shadow->canary"):
        return roll_back(state, "approval", "approval for shadow->canary rejected or timed out")
    enter_canary(state)
    for step, requests in traffic.canary:
        state.traffic_results.append(result := canary_step(state, step, requests))
        if not result.passed:
            return roll_back(state, step.name, f"{step.name}: {'; '.join(result.breaches)}")
    state.confirmation = confirmation = confirm(state)
    if not confirmation.passed:
        return roll_back(state, "confirmation",
                         f"confirmation split: {gate_reason(confirmation)}")
    if not approve(state, "canary->production"):
        return roll_back(state, "approval", "approval for canary->production rejected or timed out")
    promote(state)
    return finish(state, "promoted", "promotion",
                  "every gate, shadow, canary and confirmation criterion passed")


@flow(name="kernelgate-build-kernel")
def build_kernel(settings: RolloutSettings | None = None) -> str:
    """Build, export and register the candidate (no evaluation); returns the model version."""
    with rollout_session(settings or RolloutSettings(), stage="build",
                         clear_stale_aliases=False) as state:
        version = build(state)
        outcome = finish(state, "built", "build",
                         "built and registered only; not evaluated, no alias moved")
    return end_state(outcome.result, outcome.reason, version)


@flow(name="kernelgate-evaluate-candidate")
def evaluate_candidate(settings: RolloutSettings | None = None,
                       report_path: Path | None = None) -> EvaluationReport:
    """Preregister, build and evaluate a candidate and log the gate decision, without
    moving any alias. The version is registered (it is the record of what was built),
    and tagged as rejected when the gate says so."""
    with rollout_session(settings or RolloutSettings(), clear_stale_aliases=False) as state:
        preregister(state)
        build(state)
        prepare_testset(state)
        evaluate(state, split="heldout")
        decision = gate(state, thresholds_path=state.settings.thresholds)
        outcome = finish(state, "evaluated", "evaluation",
                         f"evaluation only (gate said {decision.verdict}); no alias moved")
    if report_path:
        state.report.write(report_path)
    return end_state(outcome.result, outcome.reason, state.report)
