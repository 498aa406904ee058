"""What a rollout's one-line summary says: the verdict and, in the same line, everything
that was not assessed.

A promotion whose speed and memory were never measured (an interpreted candidate under
a profile that lets that pass) must not read as "every criterion passed": the caveat
belongs in the headline a release manager and an auditor read first (the CLI's result
line, the rollout run's note, the version's description), not one click deeper.
"""

from __future__ import annotations

from collections.abc import Sequence

from gates.canary import SHADOW_NOT_LOOKED, CanaryStepResult
from gates.decision import GateDecision

ALL_PASSED = "every gate, shadow, canary and confirmation criterion passed"
"""The words used only when nothing was left unassessed."""


def _traffic_items(traffic: Sequence[CanaryStepResult]) -> list[str]:
    """The traffic stages whose latency or memory growth could not be judged, in words."""
    out = []
    latency = [t.step for t in traffic if not t.latency_assessed
               and t.latency_not_assessed_reason != SHADOW_NOT_LOOKED]
    if latency:
        out.append(f"latency not assessed in {', '.join(latency)}")
    memory = [t.step for t in traffic if t.memory_not_assessed_reason]
    if latency and latency == memory:  # said once for the same stages
        return [f"latency and memory growth not assessed in {', '.join(latency)}"]
    if memory:
        out.append(f"memory growth not assessed in {', '.join(memory)}")
    return out


def not_assessed(decision: GateDecision, traffic: Sequence[CanaryStepResult] = ()) -> list[str]:
    """What was not assessed, in words: the gate's criteria by kind (with the reason) and
    the traffic stages whose latency or memory could not be judged. Empty: everything was."""
    out = []
    names = [c for c in decision.criteria if c.status == "not_assessed"]
    if names:
        kinds = sorted({c.kind for c in names})
        why = decision.speed_not_assessed_reason or "the kernel did not run natively"
        out.append(f"{' and '.join(kinds)} not assessed at the gate ({len(names)} "
                   f"criteria: {why})")
    return out + _traffic_items(traffic)


def caveat(decision: GateDecision | None, traffic: Sequence[CanaryStepResult] = ()) -> str | None:
    """The short form of :func:`not_assessed` for a verdict line (a run name, a heading):
    ``"speed and memory not assessed at the gate; latency not assessed in canary-5pct"``,
    without the reasons. None when everything was assessed (or there was no decision)."""
    if decision is None:
        return None
    out = []
    kinds = sorted({c.kind for c in decision.criteria if c.status == "not_assessed"})
    if kinds:
        out.append(f"{' and '.join(kinds)} not assessed at the gate")
    return "; ".join(out + _traffic_items(traffic)) or None


def verdict_line(verdict: str, decision: GateDecision | None,
                 traffic: Sequence[CanaryStepResult] = ()) -> str:
    """``verdict`` and, in the same line, what was not assessed:
    ``"promoted; speed and memory not assessed at the gate"`` (just ``verdict`` when
    nothing was left unassessed)."""
    short = caveat(decision, traffic)
    return verdict if short is None else f"{verdict}; {short}"


def promotion_reason(decision: GateDecision, traffic: Sequence[CanaryStepResult] = ()) -> str:
    """The promoted rollout's reason: :data:`ALL_PASSED` only when nothing was left
    unassessed, else what passed and, in the same line, what was not assessed."""
    missing = not_assessed(decision, traffic)
    if not missing:
        return ALL_PASSED
    passed = sum(c.status == "pass" for c in decision.criteria)
    return (f"passed what was assessed ({passed} gate criteria, shadow, canary, confirmation); "
            + "; ".join(missing) + ": the promotion says nothing about those")
