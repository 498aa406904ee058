"""*Errored*: how a crash ends a rollout — a fact, signed, never a gate verdict.

A kernel refusing a case of its serving contract is recorded and judged (the gate's
coverage criterion: *Rejected*, the refused cases named). Anything else a stage raises
is a crash: the session (``flows.tasks.rollout_session``) closes the record as
``errored`` — the outcome signed by the existing outcome attestation, with the stage
and the reason; the candidate's version rejected (no alias on it); production
untouched — and the flow run ends in a Failed-type state named *Errored* whose result
is :class:`RolloutErrored` (carrying that outcome). Calling the flow raises it; the CLI
prints the outcome and exits 3 (README, "Exit codes").
"""

from __future__ import annotations

import contextlib

from prefect.states import Failed, State

from kernels.errors import KernelgateError
from lineage.rollout.rollout import RolloutOutcome

STAGE_ATTRIBUTE = "kernelgate_stage"
"""Set on an exception by the stage task it escaped (``flows.tasks.StageTask``)."""
OUTCOME_ATTRIBUTE = "kernelgate_outcome"
"""Set on an exception by the session once it closed the record for it."""


EXIT_CODES = {"promoted": 0, "rejected": 0, "timed_out": 0, "rolled_back": 0, "errored": 3,
              "not_adopted": 4, "interrupted": 130}
"""``kernelgate rollout``: result -> exit code (anything else: 1; README, "Exit codes")."""


class RolloutErrored(KernelgateError):
    """A rollout crashed in a stage; ``outcome`` is its signed *errored* record."""

    def __init__(self, outcome: RolloutOutcome):
        super().__init__(f"rollout of {outcome.family} errored at {outcome.stage}: "
                         f"{outcome.reason}")
        self.outcome = outcome


def stage_of(err: BaseException) -> str:
    """The stage an exception escaped from (``"error"`` when none said)."""
    return getattr(err, STAGE_ATTRIBUTE, None) or "error"


def mark_stage(err: BaseException, stage: str) -> None:
    """Remember the innermost stage ``err`` escaped from (an exception may lack room)."""
    if getattr(err, STAGE_ATTRIBUTE, None) is None:
        with contextlib.suppress(AttributeError):
            setattr(err, STAGE_ATTRIBUTE, stage)


def errored_outcome(err: BaseException) -> RolloutOutcome | None:
    """The errored outcome the session recorded for ``err``, or None (the record was
    closed otherwise, e.g. as promoted, or never opened): the caller re-raises then."""
    outcome = getattr(err, OUTCOME_ATTRIBUTE, None)
    return outcome if outcome is not None and outcome.result == "errored" else None


def errored_state(outcome: RolloutOutcome, cause: BaseException) -> State:
    """The flow run's final state for a crash: Failed-type, named *Errored*, its message
    the reason, its result a :class:`RolloutErrored` (raised when the flow is called)."""
    error = RolloutErrored(outcome)
    error.__cause__ = cause
    return Failed(name="Errored", message=error.args[0][:500], data=error)
