"""`kernelgate timeline` reads each stage's own wall time from MLflow: a stage run is
created when the stage has its result, so MLflow's run times say only how long the
logging took; the flow stamps the stage's start and end on the runs it created."""

from __future__ import annotations

import time

from lineage.records.timeline import record_stage_time, render, rollout_timelines
from lineage.store import tags
from lineage.store import tracking as tr


def test_stage_wall_times_and_versions_are_read_back_from_the_store(tmp_path):
    tracking = tr.local_tracking(tmp_path)
    parent = tr.start_run(tracking, "fam", "rollout", run_name="rollout x v7 — promoted")
    t0 = time.time()
    started, stage_s = t0 - 0.001, 37.5  # the stage ran 37.5 s; its run is created at the end
    run = tr.start_run(tracking, "fam", "shadow", parent_run_id=parent,
                       run_tags={tags.MODEL_VERSION: "7"})
    tr.end_run(tracking, run)
    assert record_stage_time(tracking, parent, "shadow", started, started + stage_s) == [run]
    # a stage that created no run of its own is kept on the rollout run
    late = time.time() + 1
    assert record_stage_time(tracking, parent, "prepare-testset", late, late + 2.25) == [parent]
    tr.end_run(tracking, parent)

    (timeline,) = rollout_timelines(tracking, "fam")
    assert timeline.version == "7"  # from the stage runs when the rollout run has none
    by_stage = {s.stage: s for s in timeline.stages}
    assert abs(by_stage["shadow"].seconds - stage_s) < 1e-2 and by_stage["shadow"].measured
    assert abs(by_stage["prepare-testset"].seconds - 2.25) < 1e-2
    text = render([timeline])
    assert "v7" in text and "37.5 s" in text and "(logging only)" not in text


def test_the_runs_of_one_stage_are_one_row_its_time_counted_once(tmp_path):
    """The shadow stage creates its alias move and its shadow run, a rollback two alias
    moves: each pair one row naming both runs, not two rows of the same 35.9 s."""
    tracking = tr.local_tracking(tmp_path)
    parent = tr.start_run(tracking, "fam", "rollout", run_name="rollout x v1 — rolled back")
    started = time.time() - 0.001
    for stage, name in (("promotion", "assign-shadow"), ("shadow", "shadow-v1")):
        tr.end_run(tracking, tr.start_run(tracking, "fam", stage, parent_run_id=parent,
                                          run_name=name))
    record_stage_time(tracking, parent, "shadow", started, started + 35.9)
    later = time.time() + 0.5
    time.sleep(0.6)
    for name in ("rollback-shadow", "rollback-canary"):
        tr.end_run(tracking, tr.start_run(tracking, "fam", "rollback", parent_run_id=parent,
                                          run_name=name))
    record_stage_time(tracking, parent, "rollback", later, later + 0.25)
    tr.end_run(tracking, parent)

    (timeline,) = rollout_timelines(tracking, "fam")
    rows = [(s.stage, s.run_name, round(s.seconds, 2)) for s in timeline.stages]
    assert rows == [("promotion/shadow", "assign-shadow, shadow-v1", 35.9),
                    ("rollback", "rollback-shadow, rollback-canary", 0.25)], rows
    assert render([timeline]).count("35.9 s") == 1


def test_a_closed_rollout_names_its_verdict_caveat_version_and_next_commands(tmp_path, signing):
    """The rollout run's name carries the verdict with what was not assessed; the
    outcome's last lines give the audit command, `kernelgate ui` and the run's address
    in MLflow's model-training view; the timeline prints the version."""
    from lineage.rollout.rollout import close_rollout, open_rollout

    tracking = tr.local_tracking(tmp_path / "store")
    record = open_rollout(tracking, family="fam", implementation="pallas_tpu", backend="cpu",
                          work_root=tmp_path / "runs", signing=signing)
    caveat = "memory and speed not assessed at the gate"
    outcome = close_rollout(record, result="promoted", stage="promotion", reason="passed what "
                            "was assessed", version="4", decided_by="the gate",
                            not_assessed=caveat)
    run = tracking.client().get_run(record.rollout_run_id)
    assert run.info.run_name.endswith(f"promoted; {caveat}")
    assert run.data.tags[tags.DECIDED_BY] == "the gate"
    text = outcome.markdown()
    assert f"**promoted; {caveat}**" in text.splitlines()[0]
    assert "audit 4 --family fam --store-dir" in text and "ui --store-dir" in text
    assert f"runs/{record.rollout_run_id}?{tags.UI_VIEW_QUERY}" in outcome.run_link
    (timeline,) = rollout_timelines(tracking, "fam")
    assert timeline.version == "4" and timeline.result == "promoted"


def test_the_stage_table_is_as_wide_as_its_content_and_cuts_a_long_value_visibly():
    """A stage name longer than any before it widens its column for every row (the
    columns after it stay aligned); a value longer than TIMELINE_COLUMN_MAX ends in an
    ellipsis at that width instead of pushing the row out."""
    from datetime import UTC, datetime

    from lineage.records.timeline import TIMELINE_COLUMN_MAX, RolloutTimeline, StageTime

    at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    long_stage, long_run = "canary-step-after-warm-up-traffic", "r" * (TIMELINE_COLUMN_MAX + 20)
    stages = [StageTime(run_name="gate x v7", stage="gate", status="FINISHED", started_at=at,
                        seconds=1.5, measured=True),
              StageTime(run_name=long_run, stage=long_stage, status="KILLED", started_at=at,
                        seconds=12345.25, measured=True),
              StageTime(run_name="-", stage="shadow", status="RUNNING", started_at=at,
                        seconds=None)]
    timeline = RolloutTimeline(run_id="r1", run_name="rollout x", family="fam", kind="rollout",
                               result="promoted", decided_at_stage=None, version="7",
                               started_at=at, seconds=12400.0, stages=stages)
    rows = render([timeline]).splitlines()[1:]
    assert len(rows) == 3
    statuses = [row.index(s.status) for row, s in zip(rows, stages, strict=True)]
    assert len(set(statuses)) == 1, "\n".join(rows)
    assert long_stage in rows[1] and long_run not in rows[1]
    shown = rows[1].split()[1]
    assert shown.endswith("…") and len(shown) == TIMELINE_COLUMN_MAX, shown
    assert "12345.2 s" in rows[1] and "1.5 s" in rows[0]
