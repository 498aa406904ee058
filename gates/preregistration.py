"""What a preregistration is, and when results may be judged by it (pure logic).

A registration freezes a thresholds file before any candidate is evaluated: its exact
bytes' sha256 and the registration time. :func:`check_registration` refuses with
:class:`PreregistrationError` when the thresholds in hand are not the registered bytes,
or when the evaluation started before the registration — results seen before the
thresholds were frozen cannot be judged by them. Writing and reading registrations
(MLflow) is ``lineage.records.registration``'s job.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict

from kernels.errors import KernelgateError


class PreregistrationError(KernelgateError, RuntimeError):
    """The thresholds or the evaluation do not match a valid preregistration."""


class Registration(BaseModel):
    """A frozen thresholds file: what was registered, when, and where to find it."""

    model_config = ConfigDict(frozen=True)

    registration_id: str  # the MLflow run id of the preregistration run
    family: str
    profile: str
    thresholds_sha256: str
    thresholds_artifact: str  # artifact path inside the registration run
    registered_at: AwareDatetime  # UTC


def check_registration(
    registration: Registration, thresholds_sha256: str | None, evaluation_started_at: datetime
) -> None:
    """Refuse thresholds that are not the registered bytes, or an evaluation that predates them.

    Args:
        thresholds_sha256: sha256 of the thresholds file in hand (``Thresholds.source_sha256``).
        evaluation_started_at: timezone-aware start of the evaluation.

    Raises:
        PreregistrationError: hash mismatch (or unknown), or evaluation started first.
        ValueError: ``evaluation_started_at`` is naive (no timezone).
    """
    if evaluation_started_at.tzinfo is None:
        raise ValueError("evaluation_started_at must be timezone-aware (UTC)")
    if thresholds_sha256 != registration.thresholds_sha256:
        raise PreregistrationError(
            f"thresholds sha256 {thresholds_sha256} differs from the one frozen by registration "
            f"{registration.registration_id} ({registration.thresholds_sha256}): the thresholds "
            "changed after preregistration; the gate refuses"
        )
    if evaluation_started_at < registration.registered_at:
        raise PreregistrationError(
            f"evaluation started at {evaluation_started_at.isoformat()}, before registration "
            f"{registration.registration_id} at {registration.registered_at.isoformat()}; "
            "results seen before the thresholds were frozen cannot be gated"
        )
