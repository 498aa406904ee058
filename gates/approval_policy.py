"""The preregistered approval policy: which transitions need a person, who may sign.

Part of the thresholds schema (``gates.thresholds``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from gates.directions import Looser as L
from gates.directions import limit
from gates.schema_base import _KEY, _N, Finite, _Strict

Transition = Literal["candidate->shadow", "shadow->canary", "canary->production"]
MAX_TIMEOUT_S = 30 * 24 * 3600
"""An approval can wait at most 30 days: a pause longer than that is not a decision."""


class Approver(_Strict):
    """A person who may approve with their own key (``kernelgate approve``)."""

    name: str = limit(_N, why="a display name; the key is what is trusted", min_length=1)
    keyid: str = limit(_N, why=_KEY, pattern=r"^[0-9a-f]{64}$")
    public_key: dict = limit(L.ANY_CHANGE,
                             description="securesystemslib key dict: keytype, scheme, keyval")
    proof: dict | None = limit(
        _N, why="evidence that the person holds the key, checked where a family's first "
        "approvers are named (lineage.records.roster); it changes what no candidate needs to pass",
        default=None, description="The DSSE envelope `kernelgate keys entry --family F` "
        "prints: the person's own signature over the family, their name and key id. "
        "Needed where it names a family's first approvers after a rejection.")


class ApprovalPolicy(_Strict):
    """Which stage transitions need a person, and how long to wait for one."""

    required_for: list[Transition] = limit(L.FEWER, default_factory=list)
    timeout_s: Finite = limit(
        _N, why="a timeout rejects: its length changes how long a rollout waits for a person, "
        "never what passes without one", gt=0, le=MAX_TIMEOUT_S,
        description="Seconds to wait (at most 30 days); a timeout rejects.")
    auto_approve: bool = limit(L.FALSE_TO_TRUE, default=False)
    auto_approve_reason: str | None = limit(_N, why="words kept with auto_approve", default=None)
    require_signed: bool = limit(
        L.TRUE_TO_FALSE, default=False, description="Only an approval signed with one of "
        "`approvers`' keys counts; an answer typed into the Prefect UI is recorded and refused.")
    approvers: list[Approver] = limit(L.MORE, key="keyid", default_factory=list,
                                      description="People whose signed approvals are trusted.")

    @model_validator(mode="after")
    def _reason_for_auto(self) -> ApprovalPolicy:
        if self.auto_approve and not (self.auto_approve_reason or "").strip():
            raise ValueError("auto_approve: true needs a non-empty auto_approve_reason")
        return self

    def requires_person(self, transition: Transition) -> bool:
        """True when ``transition`` needs a release manager (and auto-approval is off)."""
        return transition in self.required_for and not self.auto_approve


