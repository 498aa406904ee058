"""The evaluation report: everything that decided an evaluation, as versioned JSON.

Gates read only the flat dictionaries ``metrics``, ``baseline_metrics`` and
``production_metrics`` (names in ARCHITECTURE.md); the rest is evidence for people
and for the lineage record.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from evaluation.accuracy import AccuracyResult
from evaluation.model_check import ModelAccuracy
from evaluation.performance import PerformanceResult
from evaluation.profiling import ProfileTrace
from evaluation.reference_cache import ReferenceSummary

SCHEMA_VERSION = 1
REPORT_FILENAME = "evaluation_report.json"


class ImplementationInfo(BaseModel):
    """What was evaluated in one role (candidate, baseline or production)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["candidate", "baseline", "production"]
    name: str = Field(description="registry name, or the callable's qualified name")
    implementation: str | None = Field(None, description="registry name; None for a plain callable")
    config: dict[str, Any] | None = Field(None, description="the kernel's config, its set fields")
    resolution: dict[str, Any] | None = Field(None, description="kernels.Resolution as a dict")
    native: bool = Field(description="compiled natively on this device (not interpreted)")
    target_platform: str = Field(description="tpu/gpu/cpu: where the implementation is native")
    float32_matmul_precision: str | None = Field(
        None, description="jax.lax.Precision of its float32 matrix products as the registry "
                          "declares it ('highest' = full float32); None: runs no float32 call, "
                          "or a plain callable")
    runtime_fallbacks: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="call shape -> {implementation auto skipped: why}, for calls whose "
                    "compile ran out of a device resource (kernels.dispatch)")


class ValidationSummary(BaseModel):
    """Outcome of the test set's Great Expectations validation."""

    model_config = ConfigDict(extra="forbid")

    success: bool
    result_path: str | None = Field(None, description="where the GX validation result was written")
    reason: str | None = Field(None, description="why it failed (readable), None on success")
    testset_digest: str | None = Field(None, description="digest over all splits (manifest)")
    split_digest: str | None = Field(None, description="digest of the validated split")


class EvaluationReport(BaseModel):
    """One candidate evaluated on one split, against the naive baseline and production.

    ``status`` is ``completed``, or ``validation_failed`` when the test set failed its
    Great Expectations suite (then ``failure_reason`` says why and no metric exists, so
    every gate criterion is missing and fails). Timestamps are UTC; latencies in
    seconds; memory in bytes. Speed metrics are absent (not NaN) from ``metrics`` when
    ``speed_assessed`` is False.
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    schema_version: Literal[1] = SCHEMA_VERSION
    status: Literal["completed", "validation_failed"] = "completed"
    failure_reason: str | None = None

    candidate: ImplementationInfo
    baseline: ImplementationInfo
    production: ImplementationInfo | None = None

    split: str
    testset_dir: str
    testset_digest: str | None = Field(None, description="digest of the whole test set (manifest)")
    split_digest: str | None = Field(None, description="digest of the evaluated split (manifest)")
    manifest_path: str | None = None
    started_at: AwareDatetime
    finished_at: AwareDatetime | None = None

    target_platform: str = Field(description="where the candidate is native: tpu/gpu/cpu")
    device_platform: str = Field(description="where it ran: tpu/gpu/cpu")
    device_kind: str
    device_count: int = 1
    jax_version: str

    validation: ValidationSummary
    accuracy: dict[str, AccuracyResult] = Field(default_factory=dict, description="role -> result")
    model_accuracy: dict[str, ModelAccuracy] = Field(default_factory=dict, description="role -> result")
    performance: PerformanceResult | None = None
    speedups: dict[str, float] = Field(
        default_factory=dict, description="role -> geometric-mean speedup over naive at p50 (x)")
    reference: ReferenceSummary | None = Field(
        None, description="where the float64 reference came from (evaluation.reference_cache)")
    profile: ProfileTrace | None = Field(
        None, description="jax.profiler trace of the in-process kernels (native hardware)")
    serving: str | None = Field(None, description="the registration's serving contract the "
                                "cases were drawn by (None: every case)")
    not_drawn: dict[str, str] = Field(default_factory=dict, description="case_id -> why it is "
                                      "outside the serving contract (not evaluated)")
    refused: dict[str, str] = Field(default_factory=dict, description="case_id (or 'model:"
                                    "minilm') -> why the candidate refused it inside the contract")
    speed_assessed: bool = False
    speed_not_assessed_reason: str | None = None
    interpreters: dict[str, str] | None = Field(
        None, description="phase ('accuracy', 'model_check') -> the Pallas interpreter an "
        "interpreted Pallas TPU kernel ran under (kernels.interpreters: 'tpu_interpret' or "
        "'generic_interpret'; accuracy is always 'tpu_interpret'); None: the candidate "
        "ran natively, or is a kernel that ignores the choice (pallas_gpu interpreted on a "
        "CPU always runs the generic lowering; kernels.interpreters.takes_the_choice)")

    metrics: dict[str, float] = Field(default_factory=dict)
    baseline_metrics: dict[str, float] = Field(default_factory=dict)
    production_metrics: dict[str, float] | None = None
    plots: list[str] = Field(default_factory=list, description="PNG paths")

    def write(self, path: str | os.PathLike) -> Path:
        """Write the report as JSON atomically (temp file + rename, so a reader never
        sees half a report). Non-finite floats are written as ``Infinity``/``NaN``
        (Python's ``json`` reads them back). Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.model_dump_json(indent=2))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> EvaluationReport:
        """Read and validate a report written by ``write``.

        Raises:
            FileNotFoundError: no such file.
            pydantic.ValidationError: not a report of this schema version.
        """
        return cls.model_validate_json(Path(path).read_text())


def utc_now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)
