"""Where a rollout's time went, read back from the MLflow store.

Each rollout is a parent run whose children are its stage runs (``lineage.store.tags``). A
stage run is created when the stage has its result, so MLflow's own start and end times
say how long *logging* took, not the stage: the flow records each stage's wall-clock
start and end (:func:`record_stage_time`) into the runs the stage created (tags
``kernelgate.stage_started_at`` / ``kernelgate.stage_ended_at``), and on the rollout
run for a stage that creates none (``kernelgate.stage_time.<stage>``). No Prefect here:
an auditor without the Prefect server reads them from MLflow. :func:`rollout_timelines`
turns a family's runs into one record per rollout (result, version, wall time, each
stage's seconds), the JSON that BENCHMARKS.md quotes (``kernelgate timeline --json``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from lineage.store import tags
from lineage.store.store import Tracking

STAGE_TIME_PREFIX = tags.STAGE_TIME_PREFIX
"""Rollout-run tag per stage that created no run of its own: ``[start, end]`` (Unix s)."""


class StageTime(BaseModel):
    """One stage of a rollout: its run (``run_name``; ``-`` for a stage without one) and
    its wall time (the stage's own start and end where the flow recorded them, else the
    run's)."""

    run_name: str
    stage: str
    status: str = Field(description="MLflow run status: FINISHED, FAILED, KILLED, RUNNING")
    started_at: datetime
    seconds: float | None = Field(description="end - start, seconds (None while running)")
    measured: bool = Field(default=False, description=(
        "the stage's own wall time (recorded by the flow); False: the run's logging time"))


def record_stage_time(tracking: Tracking, rollout_run_id: str, stage: str, started_s: float,
                      ended_s: float) -> list[str]:
    """Record a stage's wall-clock ``started_s``..``ended_s`` (Unix seconds) into the
    child runs of ``rollout_run_id`` it created (those started since ``started_s`` and
    not yet timed), or on the rollout run when it created none. Returns the run ids
    tagged."""
    client = tracking.client()
    experiment_id = client.get_run(rollout_run_id).info.experiment_id
    runs = client.search_runs([experiment_id], filter_string=(
        f"tags.`{tags.PARENT}` = '{rollout_run_id}' and "
        f"attributes.start_time >= {int(started_s * 1000) - 1}"), max_results=1000)
    fresh = [r for r in runs if tags.STAGE_STARTED_AT not in r.data.tags]
    values = {tags.STAGE_STARTED_AT: _iso(started_s), tags.STAGE_ENDED_AT: _iso(ended_s)}
    for run in fresh:
        for key, value in values.items():
            client.set_tag(run.info.run_id, key, value)
    if not fresh:
        client.set_tag(rollout_run_id, STAGE_TIME_PREFIX + stage,
                       json.dumps([round(started_s, 3), round(ended_s, 3)]))
        return [rollout_run_id]
    return [r.info.run_id for r in fresh]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _stage_time(run) -> StageTime:
    t = run.data.tags
    if tags.STAGE_STARTED_AT in t and tags.STAGE_ENDED_AT in t:
        start = datetime.fromisoformat(t[tags.STAGE_STARTED_AT])
        end = datetime.fromisoformat(t[tags.STAGE_ENDED_AT])
        return StageTime(run_name=run.info.run_name or "", stage=t.get(tags.STAGE, "?"),
                         status=run.info.status, started_at=start,
                         seconds=(end - start).total_seconds(), measured=True)
    return StageTime(run_name=run.info.run_name or "", stage=t.get(tags.STAGE, "?"),
                     status=run.info.status, started_at=_time(run.info.start_time),
                     seconds=_seconds(run.info))


def _runless_stages(parent) -> list[StageTime]:
    out = []
    for key, value in parent.data.tags.items():
        if key.startswith(STAGE_TIME_PREFIX):
            start, end = json.loads(value)
            out.append(StageTime(run_name="-", stage=key.removeprefix(STAGE_TIME_PREFIX),
                                 status="FINISHED", started_at=datetime.fromtimestamp(start, UTC),
                                 seconds=end - start, measured=True))
    return out


def _one_row_per_span(stages: list[StageTime]) -> list[StageTime]:
    """One row per measured span: the runs one stage created (the shadow's alias move and
    its shadow run; a rollback's two alias moves) carry the same start and end, and as
    rows of their own they read as stages run one after the other, their time counted
    twice. Merged, the row names every run and stage."""
    out: list[StageTime] = []
    for stage in stages:
        last = out[-1] if out else None
        if (last is not None and stage.measured and last.measured
                and (stage.started_at, stage.seconds) == (last.started_at, last.seconds)):
            names = dict.fromkeys(last.stage.split("/") + [stage.stage])
            out[-1] = last.model_copy(update={
                "stage": "/".join(names), "run_name": f"{last.run_name}, {stage.run_name}",
                "status": last.status if last.status == stage.status
                else f"{last.status}/{stage.status}"})
        else:
            out.append(stage)
    return out


class RolloutTimeline(BaseModel):
    """One rollout (or revalidation / evaluate-only) parent run and its stage runs."""

    run_id: str
    run_name: str
    family: str = ""
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
        kids = children.get(run.info.run_id, [])
        stages = _one_row_per_span(sorted([_stage_time(c) for c in kids] + _runless_stages(run),
                                          key=lambda s: s.started_at))
        version = t.get(tags.MODEL_VERSION) or next(
            (c.data.tags[tags.MODEL_VERSION] for c in kids if tags.MODEL_VERSION in c.data.tags),
            None)
        out.append(RolloutTimeline(
            run_id=run.info.run_id, run_name=run.info.run_name or "", family=family,
            kind=t.get(tags.STAGE, "?"), result=t.get(tags.RESULT),
            decided_at_stage=t.get(tags.DECIDED_AT_STAGE), version=version,
            started_at=_time(run.info.start_time), seconds=_seconds(run.info), stages=stages))
    return out


TIMELINE_COLUMN_MAX = 40
"""The widest a column of :func:`render`'s stage table grows (characters); a longer value
is cut to this width, its last character an ellipsis."""


def _cell(value: str) -> str:
    """``value``, or its first ``TIMELINE_COLUMN_MAX - 1`` characters and an ellipsis."""
    return value if len(value) <= TIMELINE_COLUMN_MAX else value[:TIMELINE_COLUMN_MAX - 1] + "…"


def render(timelines: list[RolloutTimeline]) -> str:
    """A plain-text table: one block per rollout, one line per stage (seconds). Each
    column is as wide as its widest value in the whole table, at most
    ``TIMELINE_COLUMN_MAX`` (a longer value ends in an ellipsis), so the columns stay
    aligned across every block whatever the names."""
    rows = [(_cell(s.stage), _cell(s.run_name), _cell(s.status),
             "-" if s.seconds is None else f"{s.seconds:.1f} s",
             "" if s.measured else " (logging only)") for t in timelines for s in t.stages]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    lines, stage_rows = [], iter(rows)
    for t in timelines:
        total = "running" if t.seconds is None else f"{t.seconds:.1f} s"
        lines.append(f"{t.started_at:%Y-%m-%d %H:%M:%S} {t.family} {t.run_name} [{t.kind}] v{t.version or '-'} "
                     f"{t.result or '-'}{f' at {t.decided_at_stage}' if t.decided_at_stage else ''}: {total}")
        for stage, run_name, status, seconds, note in (next(stage_rows) for _ in t.stages):
            lines.append(f"    {stage:<{widths[0]}} {run_name:<{widths[1]}} "
                         f"{status:<{widths[2]}} {seconds:>{widths[3]}}{note}".rstrip())
    return "\n".join(lines)
