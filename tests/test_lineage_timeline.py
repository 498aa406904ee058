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
