"""Where a rollout's time went, read back from the MLflow store.

Each rollout is a parent run whose children are its stage runs (``lineage.tags``); their
start and end times are MLflow's own. :func:`rollout_timelines` turns them into one
record per rollout (result, version, wall time, each stage's seconds), the JSON that
BENCHMARKS.md quotes (``kernelgate timeline --json``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from lineage import tags
from lineage.store import Tracking


class StageTime(BaseModel):
    """One stage run of a rollout."""

    run_name: str
    stage: str
    status: str = Field(description="MLflow run status: FINISHED, FAILED, KILLED, RUNNING")
    started_at: datetime
    seconds: float | None = Field(description="end - start, seconds (None while running)")


class RolloutTimeline(BaseModel):
    """One rollout (or revalidation / evaluate-only) parent run and its stage runs."""

    run_id: str
    run_name: str
    kind: str = Field(description="the parent run's kernelgate.stage (rollout, revalidation, ...)")
    result: str | None
    decided_at_stage: str | None
    version: str | None
    started_at: datetime
    seconds: float | None = Field(description="the parent run's wall time, seconds")
    stages: list[StageTime]


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _seconds(info) -> float | None:
    return None if info.end_time is None else (info.end_time - info.start_time) / 1000


def rollout_timelines(tracking: Tracking, family: str) -> list[RolloutTimeline]:
    """Every parent run of ``family``'s experiment, oldest first, with its stage runs.

    Raises:
        ValueError: the family has no experiment in this store.
    """
    client = tracking.client()
    experiment = client.get_experiment_by_name(f"kernelgate-{family}")
    if experiment is None:
        raise ValueError(f"no experiment kernelgate-{family} in {tracking.tracking_uri}")
    runs = client.search_runs([experiment.experiment_id], max_results=5000,
                              order_by=["attributes.start_time ASC"])
    children: dict[str, list] = {}
    for run in runs:
        if parent := run.data.tags.get(tags.PARENT):
            children.setdefault(parent, []).append(run)
    out = []
    for run in runs:
        if tags.PARENT in run.data.tags:
            continue
        t = run.data.tags
        out.append(RolloutTimeline(
            run_id=run.info.run_id, run_name=run.info.run_name or "",
            kind=t.get(tags.STAGE, "?"), result=t.get(tags.RESULT),
            decided_at_stage=t.get(tags.DECIDED_AT_STAGE), version=t.get(tags.MODEL_VERSION),
            started_at=_time(run.info.start_time), seconds=_seconds(run.info),
            stages=[StageTime(run_name=c.info.run_name or "", stage=c.data.tags.get(tags.STAGE, "?"),
                              status=c.info.status, started_at=_time(c.info.start_time),
                              seconds=_seconds(c.info))
                    for c in children.get(run.info.run_id, [])]))
    return out


def render(timelines: list[RolloutTimeline]) -> str:
    """A plain-text table: one block per rollout, one line per stage (seconds)."""
    lines = []
    for t in timelines:
        total = "running" if t.seconds is None else f"{t.seconds:.1f} s"
        lines.append(f"{t.started_at:%Y-%m-%d %H:%M:%S} {t.run_name} [{t.kind}] v{t.version or '-'} "
                     f"{t.result or '-'}{f' at {t.decided_at_stage}' if t.decided_at_stage else ''}: {total}")
        lines += [f"    {s.stage:<16} {s.run_name:<40} {s.status:<9} "
                  f"{'-' if s.seconds is None else f'{s.seconds:8.1f} s'}" for s in t.stages]
    return "\n".join(lines)
