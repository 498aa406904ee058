"""How a rollout's end shows in Prefect: a state named for its result (*Promoted*,
*Rejected*, *TimedOut*, *RolledBack*) whose *type* says whether the candidate reached
production, so the Prefect UI (which colours runs by type: Completed green, Failed red,
Cancelled grey) never shows a refused candidate like a promoted one.

- *Promoted*: Completed-type: the rollout did what it was run for.
- *Rejected*, *TimedOut*, *RolledBack* after a breach: Failed-type. Each is a verdict
  against the candidate — the gate's preregistered criteria, a named person, the
  preregistered timeout (which rejects), or a shadow, canary or confirmation finding —
  and each counts as a rejection for the family's loosening rule
  (``lineage.records.registration``). The run did not achieve its purpose, for a reason about
  the kernel: that is what Failed means to someone reading the runs list.
- *RolledBack* when inconclusive (a canary too noisy for its power, no fresh
  calibration): Cancelled-type. The rollout was called off for want of evidence, with no
  finding about the kernel, and it does not count as a rejection: Failed would claim a
  verdict that was never reached, Completed a success that did not happen.
- *NotAdopted* (a registration with ``decision:``: safe, but the preregistered superiority
  claim did not hold): Cancelled-type. Production is unchanged and nothing was found
  wrong with the kernel, so it is no rejection either; it is not the success the run was
  for, so not green.

The names are unchanged, so the automations keyed on them (``prefect.flow-run.RolledBack``,
``prefect.flow-run.TimedOut``; ``flows.notifications``), the ``kernelgate-result:<result>``
tag and the CLI's exit codes (``flows.errored.EXIT_CODES``) are too. A crash is the
Failed-type *Errored* (``flows.errored``).

Prefect raises a Failed or Cancelled state's result when the flow is called as a
function, so these states carry a :class:`RolloutNotPromoted` holding the outcome:
calling ``rollout(...)`` raises it, and :func:`outcome_of` reads the outcome from the
state of ``rollout(..., return_state=True)`` for every end (what
``flows.rollout.run_rollout`` does). The rollout flow must never be given Prefect
retries: a Failed-type verdict would be run again.
"""

from __future__ import annotations

from prefect.states import Cancelled, Completed, Failed, State

from flows.tasks import STATE_NAMES, tag_result
from kernels.errors import KernelgateError
from lineage.rollout.rollout import RolloutOutcome


class RolloutNotPromoted(KernelgateError):
    """A rollout ended without promoting its candidate (rejected, timed out or rolled
    back); ``outcome`` is its signed record. Raised by calling the rollout flow as a
    function; :func:`outcome_of` reads the outcome without raising."""

    def __init__(self, outcome: RolloutOutcome):
        super().__init__(f"rollout of {outcome.family} ended {outcome.result} at "
                         f"{outcome.stage}: {outcome.reason}")
        self.outcome = outcome

    def __reduce__(self):
        """Pickle with the outcome (a persisted result is unpickled through ``__init__``)."""
        return type(self), (self.outcome,)


def rollout_end_state(outcome: RolloutOutcome) -> State:
    """The rollout flow run's final state for ``outcome`` (module docstring): named for
    its result, its message the verdict line; Completed-type with the outcome as its
    result when promoted, else Failed-type (a verdict against the candidate) or
    Cancelled-type (inconclusive, or safe but not adopted: no verdict against it) with a :class:`RolloutNotPromoted` as its
    result. Also tags the flow run ``kernelgate-result:<result>``. Return it from the flow."""
    tag_result(outcome.result)
    name = STATE_NAMES.get(outcome.result, "Completed")
    message = outcome.summary()[:500]
    if outcome.result == "promoted":
        return Completed(name=name, message=message, data=outcome)
    kind = Cancelled if outcome.inconclusive or outcome.result == "not_adopted" else Failed
    return kind(name=name, message=message, data=RolloutNotPromoted(outcome))


def outcome_of(state: State) -> RolloutOutcome:
    """The outcome a rollout's final state carries, whichever way it ended: promoted,
    rejected, timed out or rolled back (:func:`rollout_end_state`) or errored
    (``flows.errored``, whose :class:`~flows.errored.RolloutErrored` holds it too).

    Raises:
        BaseException: what the run raised when it ended without a signed outcome (a
            failure before the record opened, or Prefect's own error).
    """
    result = state.result(raise_on_failure=False)
    if isinstance(result, RolloutOutcome):
        return result
    if isinstance(getattr(result, "outcome", None), RolloutOutcome):
        return result.outcome
    if isinstance(result, BaseException):
        raise result
    raise TypeError(f"the run ended {state.name} without a rollout outcome: {result!r}")
