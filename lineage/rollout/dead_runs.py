"""A crashed rollout's leftovers, closed by the next rollout of its family.

A rollout killed mid-way (SIGKILL, a segfault in a device plugin, a lost machine) leaves
its parent run RUNNING and its files unsigned. The next rollout of the family, holding the
family's lock (:func:`lineage.rollout.rollout.family_lock`), knows every other RUNNING
run is dead: it ends them KILLED with the reason, and signs a dead rollout run's
``interrupted`` outcome over what it left, so the audit reads it as a record of a crash
rather than files added with no signature.
"""

from __future__ import annotations

import json
import time

from lineage.log.log_writer import append
from lineage.signing.attestations import Signing
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking


def close_dead_runs(tracking: Tracking, family: str, *, alive_run_id: str, lease_s: float,
                    owner_is_dead: bool, signing: Signing | None = None) -> list[str]:
    """End the RUNNING runs a crashed rollout of ``family`` left behind as KILLED, with
    the reason as their description. With ``owner_is_dead`` (the caller holds the
    family's lock) every other RUNNING run is dead; otherwise only those older than
    ``lease_s`` seconds. With ``signing``, a dead rollout run gets its signed
    ``interrupted`` outcome (:func:`sign_interrupted`). Returns their ids."""
    experiment = tracking.client().get_experiment_by_name(tr.experiment_name(family))
    if experiment is None:
        return []
    runs = tracking.client().search_runs([experiment.experiment_id],
                                         filter_string="attributes.status = 'RUNNING'",
                                         max_results=1000)
    # the stage runs a dead rollout left RUNNING died with it: they say where it was
    dying = {}
    for run in runs:
        if parent := run.data.tags.get(tags.PARENT):
            dying.setdefault(parent, []).append(run)
    closed = []
    for run in runs:
        if run.info.run_id == alive_run_id:
            continue
        age_s = time.time() - run.info.start_time / 1000
        if not owner_is_dead and age_s < lease_s:
            continue
        why = ("its rollout died (the family's lock was free)" if owner_is_dead
               else f"RUNNING for {age_s:.0f} s, past the {lease_s:.0f} s lease")
        note = f"closed as KILLED by {alive_run_id}: {why}"
        if signing is not None and run.data.tags.get(tags.STAGE) == "rollout":
            sign_interrupted(tracking, family, run.info.run_id, note, signing,
                             stage=stage_died_in(dying.get(run.info.run_id, [])))
        else:
            tr.set_tags(tracking, run.info.run_id, {tags.NOTE: note})
        tr.end_run(tracking, run.info.run_id, "KILLED")
        closed.append(run.info.run_id)
    return closed


def stage_died_in(stage_runs: list) -> str:
    """The stage of the newest of a dead rollout's stage runs that were still RUNNING
    (they died with it), or ``"unknown"``: it died between stage runs or in a stage that
    keeps none."""
    if not stage_runs:
        return "unknown"
    newest = max(stage_runs, key=lambda r: r.info.start_time)
    return newest.data.tags.get(tags.STAGE, "unknown")


def sign_interrupted(tracking: Tracking, family: str, run_id: str, reason: str,
                     signing: Signing, *, stage: str = "unknown") -> None:
    """Sign the ``interrupted`` outcome of the dead rollout run ``run_id``, unless an
    outcome is signed there already. Its subjects are the run's files as found (the
    traffic and canary verdict a rollout killed after its production move logged but
    never signed), listed as ``orphans``: signed as what the dead run left, not as a
    verdict, so the audit of the version it promoted no longer finds files "added after
    signing" with no tamperer, and a later change to them is still caught. A record of
    the interruption (``tags.INTERRUPTED_ARTIFACT``: reason and orphans) is logged first
    and signed with them, so a run that died before logging a file of its own still
    gets a statement with a subject (in-toto refuses one without)."""
    files = tr.list_artifact_files(tracking, run_id)
    if any(f.startswith("attestations/outcome") for f in files):
        return
    run_tags = {tags.RESULT: "interrupted", tags.DECIDED_AT_STAGE: stage, tags.NOTE: reason}
    version = (tracking.client().get_run(run_id).data.tags.get(tags.MODEL_VERSION)
               or built_version(tracking, family, run_id))
    if version is not None:  # the timeline and the run page then name it
        run_tags[tags.MODEL_VERSION] = version
    tr.set_tags(tracking, run_id, run_tags)
    orphans = sorted(f for f in files if not f.startswith("attestations/"))
    tr.log_text(tracking, run_id, json.dumps({"family": family, "version": version,
                                              "reason": reason, "orphans": orphans}, indent=1),
                tags.INTERRUPTED_ARTIFACT)
    append(tracking, run_id, "outcome",
           {"family": family, "version": version, "result": "interrupted", "stage": stage,
            "reason": reason, "decided_by": None, "inconclusive": False,
            "orphans": orphans, "tags": run_tags}, signing)


def built_version(tracking: Tracking, family: str, run_id: str) -> str | None:
    """The version a rollout run registered through its ``build`` child run, or None (it
    died before its build registered one). A rollout tags its own run with the version only
    when it closes, so a dead one is found by its build run, as the registry records it."""
    client = tracking.client()
    experiment = client.get_experiment_by_name(tr.experiment_name(family))
    if experiment is None:
        return None
    builds = client.search_runs([experiment.experiment_id], filter_string=(
        f"tags.`{tags.PARENT}` = '{run_id}' and tags.`{tags.STAGE}` = 'build'"))
    for build in builds:
        for found in client.search_model_versions(f"run_id = '{build.info.run_id}'"):
            return str(found.version)
    return None
