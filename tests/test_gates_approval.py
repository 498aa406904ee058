"""Approval records: answers, timeouts and policy-bound auto-approval."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gates.approval import (
    ApprovalInput,
    ApprovalRecord,
    record_answer,
    record_auto_approval,
    record_timeout,
)
from gates.approval_policy import ApprovalPolicy

IDS = dict(transition="canary->production", family="pallas_tpu", version="3")


def test_answer_is_recorded_as_given():
    record = record_answer(ApprovalInput(decision="reject", approver="rm", comment="p99 worse"), **IDS)
    assert (record.approved, record.approver, record.comment) == (False, "rm", "p99 worse")
    assert record.at.utcoffset() is not None and not record.timed_out
    assert ApprovalRecord.model_validate_json(record.model_dump_json()) == record


def test_timeout_rejects():
    record = record_timeout(
        ApprovalPolicy(required_for=["canary->production"], timeout_s=30), **IDS
    )
    assert record.timed_out and not record.approved and "30 s" in record.comment
    with pytest.raises(ValidationError, match="timed-out"):
        ApprovalRecord.model_validate(record.model_dump() | {"approved": True})


def test_auto_approval_needs_policy_and_reason():
    strict = ApprovalPolicy(required_for=["canary->production"], timeout_s=30)
    assert strict.requires_person("canary->production")
    with pytest.raises(PermissionError, match="requires a person"):
        record_auto_approval(strict, **IDS)
    with pytest.raises(ValidationError, match="auto_approve_reason"):
        ApprovalPolicy(timeout_s=30, auto_approve=True, auto_approve_reason="  ")
    lenient = ApprovalPolicy(
        required_for=["canary->production"],
        timeout_s=30,
        auto_approve=True,
        auto_approve_reason="dry run",
    )
    assert not lenient.requires_person("canary->production")
    record = record_auto_approval(lenient, **IDS)
    assert record.approved and record.auto_approved and "dry run" in record.comment


def test_form_requires_an_approver():
    with pytest.raises(ValidationError, match="approver"):
        ApprovalInput(decision="approve", approver="", comment="")


def test_form_decision_is_an_explicit_required_choice_without_default():
    """The decision is a required choice of exactly "approve" / "reject" (no default, so
    a form filled in without choosing cannot reject by omission); anything else is refused."""
    schema = ApprovalInput.model_json_schema()
    decision = schema["properties"]["decision"]
    assert "decision" in schema["required"] and "default" not in decision
    assert sorted(decision["enum"]) == ["approve", "reject"]
    with pytest.raises(ValidationError, match="decision"):
        ApprovalInput.model_validate({"approver": "rm", "comment": "ok"})
    with pytest.raises(ValidationError, match="decision"):
        ApprovalInput.model_validate({"decision": True, "approver": "rm", "comment": "ok"})
    assert ApprovalInput(decision="approve", approver="rm", comment="ok").approve
    assert not ApprovalInput(decision="reject", approver="rm", comment="ok").approve
