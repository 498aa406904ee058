"""The parent run of a rollout (or re-validation) and how it ends.

A rollout is one parent run in the family's experiment (stage ``rollout``, or
``revalidation`` for the nightly job) tagged with the environment; every stage run is
its child. :func:`close_rollout` writes the :class:`RolloutOutcome` as the artifact
``rollout/outcome.json``, tags the result and ends the run (FAILED for a failure,
FINISHED otherwise).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lineage import registry, tags
from lineage import tracking as tr
from lineage.environment import collect_environment
from lineage.tracking import Tracking

PROJECT_DIR = Path(__file__).resolve().parents[1]

Result = Literal["promoted", "rejected", "rolled_back", "failed", "built", "evaluated"]


class RolloutRecord(BaseModel):
    """Identity of one rollout's record: store, family, kernel, parent run, work folder."""

    model_config = ConfigDict(frozen=True)

    tracking: Tracking
    family: str
    implementation: str = Field(description="the registry name being rolled out")
    backend: str = Field(description="cpu / gpu / tpu: where this process runs")
    rollout_run_id: str
    work_dir: Path = Field(description="local folder for this run's files before logging")


def open_rollout(tracking: Tracking, *, family: str, implementation: str, backend: str,
                 work_root: Path, stage: tags.Stage = "rollout") -> RolloutRecord:
    """Start the parent run (status RUNNING) tagged with the environment facts.

    Raises:
        ValueError: ``family`` is not a valid family name.
    """
    run_id = tr.start_run(tracking, family, stage, run_name=f"{stage}-{implementation}")
    tr.set_tags(tracking, run_id, collect_environment(PROJECT_DIR).as_tags())
    work_dir = (Path(work_root) / run_id).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    return RolloutRecord(tracking=tracking, family=family, implementation=implementation,
                         backend=backend, rollout_run_id=run_id, work_dir=work_dir)


def link(record: RolloutRecord, values: dict[str, str]) -> None:
    """Tag the parent run (links to stage runs, source-drift notes)."""
    tr.set_tags(record.tracking, record.rollout_run_id, values)


class RolloutOutcome(BaseModel):
    """How a rollout ended (also the Prefect markdown artifact and the CLI's output)."""

    family: str
    version: str | None = None
    result: Result
    stage: str = Field(description="the stage that decided the result")
    reason: str
    decision_summary: str | None = None
    not_assessed_note: str | None = None
    aliases: dict[str, str] = Field(default_factory=dict)
    rollout_run_id: str
    tracking_uri: str
    ui_command: str

    def markdown(self) -> str:
        """A short markdown summary for the Prefect UI."""
        lines = [
            f"# kernelgate rollout: {self.family} v{self.version or '-'} — **{self.result}**",
            "",
            f"* decided at stage: `{self.stage}`",
            f"* reason: {self.reason}",
        ]
        if self.decision_summary:
            lines.append(f"* gate: {self.decision_summary}")
        if self.not_assessed_note and self.not_assessed_note not in (self.decision_summary or ""):
            lines.append(f"* not assessed: {self.not_assessed_note}")
        lines += [
            f"* aliases now: `{self.aliases}`",
            f"* MLflow rollout run: `{self.rollout_run_id}` ({self.tracking_uri})",
            f"* open the MLflow UI: `{self.ui_command}`",
        ]
        return "\n".join(lines)


def close_rollout(record: RolloutRecord, *, result: Result, stage: str, reason: str,
                  version: str | None, decision_summary: str | None = None,
                  not_assessed_note: str | None = None) -> RolloutOutcome:
    """End the parent run with the outcome and write it as a JSON artifact."""
    outcome = RolloutOutcome(
        family=record.family, version=version, result=result, stage=stage, reason=reason,
        decision_summary=decision_summary, not_assessed_note=not_assessed_note,
        aliases=registry.aliases(record.tracking, record.family),
        rollout_run_id=record.rollout_run_id, tracking_uri=record.tracking.tracking_uri,
        ui_command=(f"{Path(sys.prefix) / 'bin' / 'mlflow'} ui --backend-store-uri "
                    f"{record.tracking.tracking_uri}"),
    )
    tr.log_model_json(record.tracking, record.rollout_run_id, outcome, tags.OUTCOME_ARTIFACT)
    link(record, {tags.RESULT: result, tags.DECIDED_AT_STAGE: stage, tags.NOTE: reason})
    tr.end_run(record.tracking, record.rollout_run_id, "FAILED" if result == "failed" else "FINISHED")
    return outcome
