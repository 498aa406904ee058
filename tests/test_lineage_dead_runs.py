"""A dead rollout, sealed by the next one, names the version it built and the stage it died
in: on the H100 four rollouts died in the held-out evaluation after their build had
registered a version, and the timeline showed them as "v- interrupted at unknown". The
version is found through the dead run's build child, the run the registry records for it
(a run that died before its build has none); the stage is that of the stage run that was
still RUNNING, which died with it."""

from __future__ import annotations

import json

from lineage.aliases.registered_model import register_build
from lineage.records.timeline import rollout_timelines
from lineage.rollout.dead_runs import built_version, close_dead_runs
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr

FAMILY = "deadfam"


def _dead_rollout(tracking, *, built: bool) -> tuple[str, str | None]:
    """A rollout run left RUNNING (its process gone), with a registered build child if
    ``built``: ``(run id, version or None)``."""
    run = tr.start_run(tracking, FAMILY, "rollout", run_name="doomed")
    if not built:
        return run, None
    build = tr.start_run(tracking, FAMILY, "build", parent_run_id=run)
    version = register_build(tracking, FAMILY, build, implementation="xla", config=None)
    tr.end_run(tracking, build)
    return run, version


def _interrupted(tracking, run_id: str, trust) -> tuple[dict, dict]:
    """The signed outcome's predicate and the interruption record of ``run_id``."""
    (outcome,) = [a for a in StoreSource(tracking, FAMILY, trust).attestations()
                  if a.kind == "outcome" and a.run_id == run_id]
    record = json.loads(tr.read_artifact(tracking, run_id, tags.INTERRUPTED_ARTIFACT))
    return outcome.predicate, record


def test_a_rollout_that_died_after_its_build_is_sealed_with_its_version(tmp_path, signing):
    tracking = tr.local_tracking(tmp_path)
    # an earlier rollout's version, finished: "the family's first version" is not the answer
    finished, earlier = _dead_rollout(tracking, built=True)
    tr.end_run(tracking, finished)
    doomed, version = _dead_rollout(tracking, built=True)
    assert version != earlier
    closed = close_dead_runs(tracking, FAMILY, alive_run_id="", lease_s=3600,
                             owner_is_dead=True, signing=signing)
    assert doomed in closed
    predicate, record = _interrupted(tracking, doomed, signing.trust)
    assert predicate["version"] == record["version"] == version
    (row,) = [t for t in rollout_timelines(tracking, FAMILY) if t.run_id == doomed]
    assert (row.version, row.result) == (version, "interrupted")
    # its build finished before it died: no stage run died with it
    assert predicate["stage"] == row.decided_at_stage == "unknown"


def test_a_rollout_that_died_in_a_stage_names_that_stage(tmp_path, signing):
    tracking = tr.local_tracking(tmp_path)
    doomed, version = _dead_rollout(tracking, built=True)
    tr.start_run(tracking, FAMILY, "evaluation", parent_run_id=doomed)  # died with it
    close_dead_runs(tracking, FAMILY, alive_run_id="", lease_s=3600, owner_is_dead=True,
                    signing=signing)
    predicate, _ = _interrupted(tracking, doomed, signing.trust)
    assert (predicate["version"], predicate["stage"]) == (version, "evaluation")
    (row,) = [t for t in rollout_timelines(tracking, FAMILY) if t.run_id == doomed]
    assert row.decided_at_stage == "evaluation"


def test_a_rollout_that_died_before_its_build_names_no_version(tmp_path, signing):
    tracking = tr.local_tracking(tmp_path)
    doomed, _ = _dead_rollout(tracking, built=False)
    assert built_version(tracking, FAMILY, doomed) is None
    close_dead_runs(tracking, FAMILY, alive_run_id="", lease_s=3600, owner_is_dead=True,
                    signing=signing)
    predicate, record = _interrupted(tracking, doomed, signing.trust)
    assert predicate["version"] is None and record["version"] is None
