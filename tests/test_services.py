"""The server profile for real: Prefect server and MLflow tracking server (basic-auth)
on PostgreSQL, started by ``flows.stack.up`` on ephemeral ports and databases of their
own, rollouts run by a worker from ``prefect deployment run``, accounts, load, the
nightly schedule, backup and restore. The fault drills that kill or restart things are
in ``test_services_faults.py`` (run alongside, or after this module on the same stack in
one process: ``tests.services_fixtures`` makes one stack per test process).

Run with ``make test-services`` (figures into ``reliability/services.json``). Kernels
are tiny (XLA on one 128-token shape): these tests are about the servers.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from typer.testing import CliRunner

from flows import stack as st
from lineage.aliases import registered_model, registry
from lineage.store import tags
from tests import services as sv
from tests.services import RUN_TIMEOUT_S
from tests.services_fixtures import as_account, env, prefect, stack, testset  # noqa: F401 - fixtures

pytestmark = pytest.mark.services


def test_servers_run_on_postgresql_with_accounts(stack):
    config, running, up_s = stack
    for url in (running.prefect_api_url + "/health", running.mlflow_url + "/health"):
        assert requests.get(url, timeout=5).status_code == 200
    # Prefect refuses a client without the auth string; MLflow a client without an account.
    assert requests.get(running.prefect_api_url + "/flow_runs/filter", timeout=5).status_code in (401, 405)
    assert requests.post(running.prefect_api_url + "/flow_runs/filter", json={},
                         timeout=5).status_code == 401
    assert requests.get(running.mlflow_url + "/api/2.0/mlflow/experiments/search",
                        params={"max_results": 1}, timeout=5).status_code == 401
    import psycopg2

    with psycopg2.connect(config.database_url(config.databases.mlflow)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'")
        assert cur.fetchone()[0] == 1
    sv.report("stack_up", {"seconds": round(up_s, 1)})


def test_rollouts_through_the_worker(stack, env, prefect, testset, tmp_path_factory, as_account):
    """Two families at once; two of one family queued by its concurrency limit (the second
    judged against what the first promoted); approval through the server's API."""
    from prefect.flow_runs import resume_flow_run

    config, running, _ = stack
    store = tmp_path_factory.mktemp("worker-store")
    tracking = as_account("auditor")
    approval = store / "approval.yaml"
    data = yaml.safe_load(sv.THRESHOLDS.read_text())
    data["approval"].update(required_for=["canary->production"], timeout_s=600)
    approval.write_text(yaml.safe_dump(data))

    started = time.monotonic()
    first = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout",
                              sv.tiny_settings("svc-a", testset, store))
    other = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout",
                              sv.tiny_settings("svc-b", testset, store, thresholds=approval))
    # the second of svc-a once the first holds the family's slot (its rollout run exists)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not sv.rollout_runs(tracking, "svc-a"):
        assert time.monotonic() < deadline, "the first rollout never opened its record"
        time.sleep(1)
    second = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout",
                               sv.tiny_settings("svc-a", testset, store))

    paused = sv.wait_state(prefect, other, {"PAUSED"}, timeout_s=RUN_TIMEOUT_S)
    assert paused.state.state_details.pause_key.startswith("approval-canary-to-production")
    resume_flow_run(other, run_input={"decision": "approve", "approver": "release manager",
                                      "comment": "approved through the Prefect API"})
    for run_id in (first, second, other):
        sv.wait_state(prefect, run_id, {"COMPLETED"}, timeout_s=RUN_TIMEOUT_S)
    wall_s = time.monotonic() - started

    a1, a2 = sv.rollout_runs(tracking, "svc-a")
    (b,) = sv.rollout_runs(tracking, "svc-b")
    for run in (a1, a2, b):
        assert run.data.tags[tags.RESULT] == "promoted", run.data.tags
    # svc-b ran alongside the first svc-a; the second svc-a only after the first ended
    assert b.info.start_time < a1.info.end_time and a1.info.start_time < b.info.end_time
    assert a2.info.start_time >= a1.info.end_time
    outcomes = [json.loads(Path(tracking.client().download_artifacts(
        run.info.run_id, tags.OUTCOME_ARTIFACT, str(store / f"dl-{run.info.run_id}"))).read_text())
        for run in (a1, a2)]
    v1, v2 = (o["version"] for o in outcomes)
    assert v1 != v2 and registered_model.alias_version(tracking, "svc-a", "production") == v2
    # the second was judged against what the first promoted: its evaluation compared with
    # v1's kernel, and the promotion's compare-and-swap expected v1
    name = registered_model.registered_model_name("svc-a")
    assert tracking.client().get_registered_model(name).tags[tags.PREVIOUS_PRODUCTION] == v1
    def compared_with(parent) -> set[str]:
        return {r.data.tags.get(tags.PRODUCTION_IMPLEMENTATION) for r in
                tracking.client().search_runs(
                    [parent.info.experiment_id],
                    filter_string=(f"tags.`{tags.STAGE}` = 'evaluation' and "
                                   f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"))}
    # (the evaluation names what it compared with as "<implementation>@v<version>")
    assert compared_with(a1) == {"none"} and f"xla@v{v1}" in compared_with(a2)
    # results landed on the MLflow server; its artifact root holds them
    assert len(list(running.artifact_root.rglob("outcome.json"))) >= 3
    sv.report("rollouts", {"flow_runs": 3, "families": 2, "wall_s": round(wall_s, 1),
                           "svc_b_overlapped_svc_a": True, "second_waited_s": round(
                               (a2.info.start_time - a1.info.start_time) / 1000, 1),
                           "approval": "resumed through the Prefect API"})


def _denied(call) -> str:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as err:
        call()
    text = str(err.value)
    assert err.value.get_http_status_code() == 403 or "PERMISSION_DENIED" in text, text
    return text


def test_auditor_reads_everything_and_changes_nothing(stack, as_account, signing):
    from lineage.rollout import rollout

    tracking = as_account("auditor")
    client = tracking.client()
    name = registered_model.registered_model_name("svc-a")
    production = registered_model.alias_version(tracking, "svc-a", "production")
    assert production is not None  # the auditor reads the registry
    (run, *_) = sv.rollout_runs(tracking, "svc-a")
    before = (client.get_run(run.info.run_id).data.tags, registered_model.aliases(tracking, "svc-a"))
    denied = [
        _denied(lambda: client.set_registered_model_alias(name, "production", "1")),
        _denied(lambda: client.delete_registered_model_alias(name, "production")),
        _denied(lambda: client.set_tag(run.info.run_id, tags.RESULT, "rejected")),
        _denied(lambda: client.set_model_version_tag(name, production, tags.NOTE, "edited")),
        _denied(lambda: client.delete_run(run.info.run_id)),
    ]
    # the pipeline cannot be run with the auditor's credentials: its first write is refused
    runs_before = len(sv.rollout_runs(tracking, "svc-a"))
    denied.append(_denied(lambda: rollout.open_rollout(
        tracking, family="svc-a", implementation="xla", backend="cpu",
        work_root=Path(stack[1].state_dir / "auditor-work"), signing=signing)))
    assert len(sv.rollout_runs(tracking, "svc-a")) == runs_before
    after = (client.get_run(run.info.run_id).data.tags, registered_model.aliases(tracking, "svc-a"))
    assert after == before
    assert client.get_run(run.info.run_id).info.lifecycle_stage == "active"

    manager = as_account("release-manager").client()
    assert manager.get_registered_model(name).name == name  # reads
    denied.append(_denied(lambda: manager.set_registered_model_alias(name, "production", "1")))
    sv.report("accounts", {"auditor_refused_writes": 6, "release_manager_refused_writes": 1,
                           "all_403": len(denied) == 7})


def test_stale_promotion_is_refused_when_the_queue_is_bypassed(stack, as_account):
    """A promotion judged against an older production (as a rollout that skipped the
    family's queue would make) is refused by the registry's compare-and-swap."""
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    tracking = as_account("pipeline")
    key_dir = stack[1].key_dir  # the worker host's key: this process stands in for a worker
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(key_dir)),
                      trust=keys.folder_trust(key_dir))
    production = registered_model.alias_version(tracking, "svc-a", "production")
    older = str(int(production) - 1)
    decision = tracking.client().get_model_version(
        registered_model.registered_model_name("svc-a"), older).tags.get(tags.DECISION_RUN_ID, "")
    with pytest.raises(registry.PromotionRefused, match="judged against"):
        registry.promote(tracking, "svc-a", older, decision_run_id=decision,
                         expected_previous=None, signing=signing)
    assert registered_model.alias_version(tracking, "svc-a", "production") == production
    sv.report("stale_promotion", {"refused": True, "production_unchanged": True})


def test_twenty_runs_log_concurrently_without_loss(stack, as_account):
    """20 evaluation-like runs log metrics and tags at once against the MLflow server;
    every one is read back."""

    tracking = as_account("pipeline")
    client = tracking.client()
    experiment = client.create_experiment(f"kernelgate-load-{uuid.uuid4().hex[:8]}")
    runs, metrics, steps, tag_count = 20, 10, 5, 10

    def one(i: int) -> str:
        run = client.create_run(experiment, run_name=f"load-{i}")
        rid = run.info.run_id
        for step in range(steps):
            for m in range(metrics):
                client.log_metric(rid, f"m{m}", i * 1000 + m * 10 + step, step=step)
        for t in range(tag_count):
            client.set_tag(rid, f"t{t}", f"{i}-{t}")
        client.set_terminated(rid)
        return rid

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(runs) as pool:
        ids = list(pool.map(one, range(runs)))
    took = time.monotonic() - started
    points = written_tags = 0
    for i, rid in enumerate(ids):
        run = client.get_run(rid)
        for m in range(metrics):
            history = client.get_metric_history(rid, f"m{m}")
            assert sorted(p.value for p in history) == [i * 1000 + m * 10 + s for s in range(steps)]
            points += len(history)
        got = {k: v for k, v in run.data.tags.items() if k.startswith("t")}
        assert got == {f"t{t}": f"{i}-{t}" for t in range(tag_count)}
        written_tags += len(got)
        assert run.info.status == "FINISHED"
    assert points == runs * metrics * steps and written_tags == runs * tag_count
    sv.report("load", {"runs": runs, "metric_points_written": runs * metrics * steps,
                       "metric_points_read_back": points, "tags_written": runs * tag_count,
                       "tags_read_back": written_tags, "seconds": round(took, 1)})


def test_nightly_schedule_fires_on_the_server(stack, env, prefect, testset, tmp_path_factory,
                                              as_account):
    """The nightly deployment's schedule, overridden to fire once in a few seconds, makes
    the server create a run that the worker executes (re-validation of production)."""
    from prefect.client.schemas.schedules import RRuleSchedule

    store = tmp_path_factory.mktemp("nightly-store")
    deployment = prefect.read_deployment_by_name("kernelgate-nightly-revalidation/nightly-revalidation")
    assert [s.schedule.cron for s in deployment.schedules] == ["0 2 * * *"]
    settings = sv.tiny_settings("svc-a", testset, store)
    settings.pop("family"), settings.pop("implementation")
    # the schedule's run carries the deployment's parameters: point them at this test's
    # family (without `families` it re-judges every family in production)
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    prefect.update_deployment(deployment.id, DeploymentUpdate(
        parameters={"settings": settings, "families": ["svc-a"]}))
    at = time.time() + 20
    prefect.create_deployment_schedules(deployment.id, [(RRuleSchedule(
        rrule=f"DTSTART:{time.strftime('%Y%m%dT%H%M%S', time.gmtime(at))}\nRRULE:FREQ=DAILY;COUNT=1",
        timezone="UTC"), True)])
    deadline = time.monotonic() + 120
    while True:  # this schedule's run only: near 02:00 UTC the deployment's own fires too
        runs = [r for r in prefect.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
            if r.auto_scheduled and at - 2 <= r.expected_start_time.timestamp() < at + 60]
        if runs:
            break
        assert time.monotonic() < deadline, "the scheduler created no run"
        time.sleep(2)
    run = sv.wait_state(prefect, runs[0].id, {"COMPLETED"}, timeout_s=RUN_TIMEOUT_S)
    tracking = as_account("auditor")
    revalidations = tracking.client().search_runs(
        [sv.rollout_runs(tracking, "svc-a")[0].info.experiment_id],
        filter_string=f"tags.`{tags.STAGE}` = 'revalidation'")
    assert revalidations and revalidations[0].data.tags.get(tags.RESULT), revalidations
    sv.report("nightly", {"scheduled_run": str(run.id), "state": run.state.type.value,
                          "result": revalidations[0].data.tags.get(tags.RESULT)})


def test_backup_and_restore_drill(stack, as_account, tmp_path, monkeypatch):
    """pg_dump both databases and archive the artifact root; drop MLflow's database and
    artifacts; restore; the audit of production passes again."""
    from flows.cli import app

    config, running, _ = stack
    tracking = as_account("auditor")
    before = registered_model.aliases(tracking, "svc-a")
    dumps = {}
    dumped_after = time.time()  # Prefect's scheduler may add runs after the dump: not compared
    for db in (config.databases.prefect, config.databases.mlflow, config.databases.mlflow_auth):
        dumps[db] = tmp_path / f"{db}.dump"
        subprocess.run(["pg_dump", "-Fc", "-f", str(dumps[db]),
                        config.database_url(db)], check=True, timeout=120)
    archive = shutil.make_archive(str(tmp_path / "artifacts"), "gztar", running.artifact_root)

    st.stop_process(running.pids["mlflow-server"])
    st.drop_database(config, config.databases.mlflow)
    shutil.rmtree(running.artifact_root)
    st.create_database(config, config.databases.mlflow)
    subprocess.run(["pg_restore", "--no-owner", "-d", config.database_url(config.databases.mlflow),
                    str(dumps[config.databases.mlflow])], check=True, timeout=120)
    shutil.unpack_archive(archive, running.artifact_root)
    pid, log, url = st.start_mlflow_server(config, running.state_dir,
                                           int(running.mlflow_url.rsplit(":", 1)[1]),
                                           running.artifact_root)
    running.pids["mlflow-server"] = pid
    running.save()
    assert registered_model.aliases(tracking, "svc-a") == before
    # the Prefect dump restores too (into a scratch database: the server keeps running)
    scratch = f"{config.databases.prefect}_drill"
    st.create_database(config, scratch)
    try:
        subprocess.run(["pg_restore", "--no-owner", "-d", config.database_url(scratch),
                        str(dumps[config.databases.prefect])], check=True, timeout=120)
        import psycopg2

        counts = []
        for db in (config.databases.prefect, scratch):
            with psycopg2.connect(config.database_url(db)) as conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM flow_run WHERE created < to_timestamp(%s)",
                            (dumped_after,))
                counts.append(cur.fetchone()[0])
        assert counts[0] == counts[1] > 0
    finally:
        st.drop_database(config, scratch)
    result = CliRunner().invoke(app, ["audit", "production", "--family", "svc-a",
                                      "--key-dir", str(running.key_dir), "--no-load-model"])
    assert result.exit_code == 0, result.output
    sv.report("backup_restore", {"databases_dumped": 3, "artifact_archive_bytes":
                                 Path(archive).stat().st_size, "audit_exit_code": result.exit_code,
                                 "aliases_after_restore": before, "prefect_flow_runs": counts[0]})
