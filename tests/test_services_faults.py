"""Faults on the server profile: the MLflow server down at start, the worker killed
mid-canary (the heartbeat automation marks the run crashed; the next rollout cleans up),
and PostgreSQL restarted under a running rollout. On the test process's stack
(``tests.services_fixtures``): ``make test-services`` runs them alongside
``test_services.py`` (a process and a stack each), CI after it in one process (one stack).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import stack as st
from lineage.aliases import registered_model
from lineage.store import tags
from lineage.store.tracking import Tracking
from tests import services as sv
from tests.services import RUN_TIMEOUT_S
from tests.services_fixtures import as_account, env, prefect, stack, testset  # noqa: F401 - fixtures

pytestmark = pytest.mark.services


def test_mlflow_server_down_at_start_fails_within_seconds_naming_it(tmp_path, monkeypatch):
    from flows.cli import app

    uri = f"http://127.0.0.1:{st.free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    result = CliRunner().invoke(app, ["rollout", "--implementation", "xla",
                                      "--store-dir", str(tmp_path / "store")])
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert uri in result.output and "does not answer" in result.output
    assert took < 10
    assert not (tmp_path / "store").exists()
    sv.report("mlflow_down_at_start", {"exit_code": result.exit_code, "seconds": round(took, 2)})


def _kill_tree(pid: int) -> list[int]:
    victims = [pid, *st.descendants(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    return victims


def test_worker_killed_mid_canary(stack, env, prefect, testset, tmp_path_factory, as_account):
    """SIGKILL the worker (and its flow-run process) while the canary runs: the heartbeat
    automation marks the run crashed, production is unchanged, and the next rollout of
    the family clears what it left, saying why."""
    config, running, _ = stack
    store = tmp_path_factory.mktemp("kill-store")
    tracking = as_account("auditor")
    # a production version for the killed rollout to leave alone: svc-a's where this
    # process's stack has one (test_services.py ran first in it, as in CI's one process:
    # a rollout saved), else one rollout of a family of its own
    family = "svc-k"
    if registered_model.alias_version(tracking, "svc-a", "production") is not None and all(
            r.info.status == "FINISHED" for r in sv.rollout_runs(tracking, "svc-a")):
        family = "svc-a"
    else:
        first = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout",
                                  sv.tiny_settings(family, testset, store))
        sv.wait_state(prefect, first, {"COMPLETED"}, timeout_s=RUN_TIMEOUT_S)
    production = registered_model.alias_version(tracking, family, "production")
    assert production is not None
    slow = dict(sv.tiny_settings(family, testset, store), shadow_requests=8)
    victim = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout", slow)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while registered_model.alias_version(tracking, family, "canary") is None:
        run = prefect.read_flow_run(victim)
        assert not run.state.is_final(), f"the rollout ended before its canary: {run.state}"
        assert time.monotonic() < deadline
        time.sleep(0.3)
    canary = registered_model.alias_version(tracking, family, "canary")
    killed_at = time.monotonic()
    _kill_tree(running.pids["worker"])
    crashed = sv.wait_state(prefect, victim, {"CRASHED"}, timeout_s=300, poll_s=2)
    crashed_after = time.monotonic() - killed_at
    assert "heartbeat" in (crashed.state.message or ""), crashed.state
    assert registered_model.alias_version(tracking, family, "production") == production
    dead = [r for r in sv.rollout_runs(tracking, family) if r.info.status == "RUNNING"]
    assert len(dead) == 1  # the killed rollout's record is still open

    st.start_worker(config, running)
    nxt = sv.deployment_run(env, "kernelgate-rollout/candidate-rollout",
                            sv.tiny_settings(family, testset, store))
    sv.wait_state(prefect, nxt, {"COMPLETED"}, timeout_s=RUN_TIMEOUT_S)
    closed = tracking.client().get_run(dead[0].info.run_id)
    assert closed.info.status == "KILLED"
    assert "closed as KILLED" in closed.data.tags[tags.NOTE]
    name = registered_model.registered_model_name(family)
    left = tracking.client().get_model_version(name, canary)
    assert "canary" not in left.aliases or registered_model.alias_version(tracking, family, "canary") != canary
    assert tags.STALE_REASON in left.tags and "did not finish" in left.tags[tags.STALE_REASON]
    assert registered_model.alias_version(tracking, family, "production") != canary
    sv.report("worker_killed_mid_canary", {
        "crashed_after_s": round(crashed_after, 1), "crash_message": crashed.state.message,
        "production_unchanged": True, "killed_run_closed_as": closed.info.status,
        "stale_canary_reason": left.tags[tags.STALE_REASON], "family": family})


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of this test's own (initdb in a temporary folder, an ephemeral
    port, run as ``nobody`` when we are root), so that it can be restarted."""
    pg_bin = Path("/usr/lib/postgresql/15/bin")
    if not (pg_bin / "initdb").exists():
        pytest.skip("PostgreSQL 15 server binaries not installed")
    # not under pytest's 0700 temporary folders: `nobody` must reach it
    folder = Path(tempfile.mkdtemp(prefix="kgsvc-pg-"))
    user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if user:
        shutil.chown(folder, "nobody")
    port = st.free_port()
    data = folder / "data"

    def ctl(*args: str) -> None:
        subprocess.run([*user, str(pg_bin / "pg_ctl"), "-D", str(data), "-w", "-t", "60", *args],
                       check=True, capture_output=True, timeout=90)

    subprocess.run([*user, str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                    "--no-sync"], check=True, capture_output=True, timeout=120)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    ctl("-l", str(folder / "log"), "-o", options, "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", lambda: ctl(
            "-l", str(folder / "log"), "-o", options, "-m", "fast", "restart")
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            ctl("-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_restarted_under_a_running_rollout(stack, env, prefect, testset, private_postgres,
                                                    tmp_path_factory, monkeypatch):
    """The worker's rollout writes to an MLflow server whose PostgreSQL restarts in the
    middle: the rollout retries or fails clearly, and nothing is half-written (no run left
    RUNNING, no alias on an unfinished version, production only with its whole chain)."""
    from flows.cli import app

    config, running, _ = stack
    url, restart = private_postgres
    store = tmp_path_factory.mktemp("pg-restart-store")
    own = sv.test_config(store / "stack", postgres_url=url)
    own.state_dir.mkdir(parents=True)
    for name in own.databases.model_dump().values():
        st.create_database(own, name)
    pid, _, mlflow_url = st.start_mlflow_server(own, own.state_dir, st.free_port(),
                                                own.state_dir / "artifacts")
    try:
        st.create_accounts(own, mlflow_url)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "auditor")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", own.secrets.value("auditor"))
        tracking = Tracking(tracking_uri=mlflow_url)
        out = sv.prefect_cli(env, "deployment", "run", "kernelgate-rollout/candidate-rollout",
                             "--params", json.dumps({"settings": sv.tiny_settings(
                                 "svc-pg", testset, store)}),
                             "--job-variable", "env=" + json.dumps({"MLFLOW_TRACKING_URI": mlflow_url}))
        run_id = next(line.split("UUID:")[1].strip() for line in out.splitlines() if "UUID:" in line)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:  # restart once the evaluation is being written
            runs = sv.rollout_runs(tracking, "svc-pg")
            if runs and tracking.client().search_runs(
                    [runs[0].info.experiment_id], filter_string=f"tags.`{tags.STAGE}` = 'evaluation'"):
                break
            assert time.monotonic() < deadline and not prefect.read_flow_run(run_id).state.is_final()
            time.sleep(0.5)
        restarted = time.monotonic()
        restart()
        restart_s = time.monotonic() - restarted
        final = sv.wait_state(prefect, run_id, {"COMPLETED", "FAILED", "CRASHED"}, timeout_s=RUN_TIMEOUT_S)
        (parent,) = sv.rollout_runs(tracking, "svc-pg")
        experiment = parent.info.experiment_id
        assert not tracking.client().search_runs([experiment],
                                                 filter_string="attributes.status = 'RUNNING'")
        aliases = registered_model.aliases(tracking, "svc-pg")
        result = parent.data.tags.get(tags.RESULT)
        assert "canary" not in aliases and "shadow" not in aliases
        if result == "promoted":
            assert final.state.is_completed()
            monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_url)
            audit = CliRunner().invoke(app, ["audit", "production", "--family", "svc-pg",
                                             "--key-dir", str(running.key_dir), "--no-load-model"])
            assert audit.exit_code == 0, audit.output
        else:
            assert result == "failed" and "production" not in aliases, (result, aliases)
            assert parent.data.tags.get(tags.NOTE), "a failure names its cause"
        summary = (f"PostgreSQL restarted ({restart_s:.1f} s) during the evaluation; the rollout "
                   f"{'retried and was promoted, audit clean' if result == 'promoted' else 'failed clearly: ' + parent.data.tags.get(tags.NOTE, '')[:120]}"
                   "; no run left RUNNING, no shadow/canary alias left")
        sv.report("postgres_restart", {"result": result, "flow_run_state": final.state.type.value,
                                       "restart_s": round(restart_s, 1), "summary": summary})
    finally:
        st.stop_process(pid)
