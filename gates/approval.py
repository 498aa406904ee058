"""Approval of a stage transition by a release manager (or by a stated auto-approval).

:class:`ApprovalInput` holds the form's fields as a plain pydantic model; ``flows/`` makes
the Prefect form from it (``class ApprovalForm(prefect.input.RunInput, ApprovalInput)``),
so this package never imports Prefect. Whatever happens — an answer, a timeout, or an
auto-approval the preregistered policy allows — becomes an :class:`ApprovalRecord`
that is logged to MLflow (``lineage.records.records.log_approval``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from gates.approval_policy import ApprovalPolicy, Transition

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
"""Non-blank text: Prefect's server checks the form's JSON schema (``minLength``), which
lets ``"   "`` through; the flow validates the answer again with this."""


Decision = Literal["approve", "reject"]
"""The release manager's explicit choice: required, no default (a checkbox that renders
unchecked let a filled-in form reject by omission)."""


class ApprovalInput(BaseModel):
    """The release manager's answer in the approval form: an explicit ``decision``
    (``"approve"`` or ``"reject"``, no default), the approver and a comment (both
    non-blank after stripping whitespace).

    Raises:
        pydantic.ValidationError: a missing or unknown decision, a blank approver or comment.
    """

    decision: Decision = Field(
        title="Decision",
        description="approve: the candidate goes on; reject: it stops here and is rolled back.")
    approver: Text = Field(description="Who decided (name or e-mail).")
    comment: Text = Field(description="Why; shown to auditors.")

    @property
    def approve(self) -> bool:
        """Whether the answer approves the transition."""
        return self.decision == "approve"


class ApprovalRecord(BaseModel):
    """The logged outcome of one approval request."""

    model_config = ConfigDict(frozen=True)

    transition: Transition
    family: str
    version: str
    approved: bool
    approver: str
    comment: str
    at: AwareDatetime
    timed_out: bool = False
    auto_approved: bool = False
    authenticated: bool = Field(
        default=False, description="the approver proved who they are (a signature by a key "
        "the registration's policy names); an answer typed into the UI is not")
    authentication: str = Field(
        default="none", description="how the approver was identified, in words")
    signed_answer: str | None = Field(default=None, description=(
        "the approver's own signed answer (the DSSE envelope `kernelgate approve` printed), "
        "kept so an auditor can verify it again with the registered approver keys; its "
        "comment is the comment recorded"))

    @model_validator(mode="after")
    def _consistent(self) -> ApprovalRecord:
        if self.timed_out and self.approved:
            raise ValueError("a timed-out approval request cannot be approved")
        return self


def record_answer(
    answer: ApprovalInput, *, transition: Transition, family: str, version: str,
    authenticated: bool = False,
    authentication: str = "unauthenticated: typed into the Prefect UI",
    signed_answer: str | None = None,
) -> ApprovalRecord:
    """The record of a person's answer (``at`` = now, UTC); ``authenticated`` only when
    the caller verified the approver's signature (``signed_answer``, kept)."""
    return ApprovalRecord(
        signed_answer=signed_answer,
        transition=transition,
        family=family,
        version=version,
        approved=answer.approve,
        approver=answer.approver,
        comment=answer.comment,
        at=datetime.now(UTC),
        authenticated=authenticated,
        authentication=authentication,
    )


def record_timeout(
    policy: ApprovalPolicy, *, transition: Transition, family: str, version: str
) -> ApprovalRecord:
    """The record of a request nobody answered within ``policy.timeout_s``: a rejection."""
    return ApprovalRecord(
        transition=transition,
        family=family,
        version=version,
        approved=False,
        approver="(nobody)",
        comment=f"no answer within {policy.timeout_s:g} s; timeout rejects",
        at=datetime.now(UTC),
        timed_out=True,
    )


def record_auto_approval(
    policy: ApprovalPolicy, *, transition: Transition, family: str, version: str
) -> ApprovalRecord:
    """An approval without a person, allowed only when the preregistered policy says so.

    Raises:
        PermissionError: the policy does not allow auto-approval.
    """
    if not policy.auto_approve:
        raise PermissionError(
            f"approval policy requires a person for {transition}; auto-approval is not allowed"
        )
    return ApprovalRecord(
        transition=transition,
        family=family,
        version=version,
        approved=True,
        approver="(auto)",
        comment=f"auto-approved by preregistered policy: {policy.auto_approve_reason}",
        at=datetime.now(UTC),
        auto_approved=True,
    )
