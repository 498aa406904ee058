"""`kernelgate timeline` reads each stage's own wall time from MLflow: a stage run is
created when the stage has its result, so MLflow's run times say only how long the
logging took; the flow stamps the stage's start and end on the runs it created."""

from __future__ import annotations

import time

from lineage import tags
from lineage import tracking as tr
from lineage.timeline import record_stage_time, render, rollout_timelines


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
