"""Helpers of the ``services`` tests: a whole server profile (``flows.stack``) on its own
databases and ephemeral ports, tiny rollout parameters, and waiting on flow runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from flows import stack as st
from tests.flow_thresholds import untimed_flow_test

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = untimed_flow_test()  # tests.flow_thresholds: these rollouts do not time the host
TINY_SHAPE = {"batch": 1, "q_len": 128, "kv_len": 128, "num_heads": 4, "num_kv_heads": 4,
              "head_dim": 32, "dtype": "float32", "causal": False}
RUN_TIMEOUT_S = 1200
"""How long a tiny rollout through the worker may take: under a minute alone on the 2-core
host, several when it shares the cores with other rollouts, the servers and ``make test``."""
CLAIMED = "atk-claimed"
"""The family the shared stack's ``up`` claims for the pipeline (``StackConfig.families``;
the squatting attack checks the auditor cannot write it)."""
REPORT_ENV = "KERNELGATE_SERVICES_REPORT"
"""When set, the services tests write their figures (RELIABILITY.md "Servers") there."""


def test_config(state_dir: Path, postgres_url: str = "postgresql://postgres@127.0.0.1:5432/postgres",
                **overrides) -> st.StackConfig:
    """A stack on ephemeral ports with databases of its own (``kgsvc_<random>_*``)."""
    tag = uuid.uuid4().hex[:10]
    return st.StackConfig(
        prefect_port=0, mlflow_port=0, postgres_url=postgres_url, state_dir=state_dir,
        databases=st.Databases(prefect=f"kgsvc_{tag}_prefect", mlflow=f"kgsvc_{tag}_mlflow",
                               mlflow_auth=f"kgsvc_{tag}_auth"),
        scheduler_loop_s=5, heartbeat_s=30, prefect_ui=False,
        **overrides)


def create_from(config: st.StackConfig, name: str, template: str) -> None:
    """``CREATE DATABASE name TEMPLATE template`` (``flows.stack_config.create_database``);
    a test's copy must be new, so an existing ``name`` fails the test."""
    if not st.create_database(config, name, template=template):
        raise AssertionError(f"database {name} exists: a test's copy must be its own")


def tiny_settings(family: str, testset_dir: Path, store_dir: Path, thresholds: Path = THRESHOLDS,
                  **extra) -> dict:
    """Rollout parameters (``RolloutSettings`` as JSON) with the XLA kernel on tiny shapes."""
    return {"implementation": "xla", "family": family, "thresholds": str(thresholds),
            "testset_dir": str(testset_dir), "store_dir": str(store_dir), "shadow_requests": 8,
            "perf_repeats": 3, "model_check": False, "perf_shapes": [TINY_SHAPE], **extra}


def rollout_runs(tracking, family: str) -> list:
    """The family's rollout (parent) runs, oldest first; ``[]`` when it has no experiment.
    ``tracking`` is a ``lineage.store.tracking.Tracking``."""
    from lineage.store import tags
    from lineage.store import tracking as tr

    experiment = tracking.client().get_experiment_by_name(tr.experiment_name(family))
    if experiment is None:
        return []
    return tracking.client().search_runs([experiment.experiment_id],
                                         filter_string=f"tags.`{tags.STAGE}` = 'rollout'",
                                         order_by=["attributes.start_time ASC"])


def prefect_cli(env: dict[str, str], *args: str, timeout_s: float = 120) -> str:
    """Run the ``prefect`` CLI as a client of the stack; returns stdout.

    Raises:
        AssertionError: it exited non-zero (its output in the message).
    """
    done = subprocess.run([str(Path(sys.executable).with_name("prefect")), "--no-prompt", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)
    assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def deployment_run(env: dict[str, str], deployment: str, settings: dict) -> str:
    """``prefect deployment run <deployment> --params ...``; returns the flow run id."""
    out = prefect_cli(env, "deployment", "run", deployment, "--params",
                      json.dumps({"settings": settings}))
    for line in out.splitlines():
        if "UUID:" in line:
            return line.split("UUID:")[1].strip()
    raise AssertionError(out)


def wait_state(client, flow_run_id: str, states: set[str], timeout_s: float, poll_s: float = 1.0):
    """Poll the flow run until its state type is one of ``states`` (e.g. ``{"COMPLETED"}``);
    returns the run.

    Raises:
        AssertionError: it did not get there in ``timeout_s`` seconds, or ended elsewhere;
            the message holds the run's last log lines (:func:`run_log_tail`).
    """
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.read_flow_run(flow_run_id)
        kind = run.state.type.value if run.state else None
        if kind in states or (run.state and run.state.name.upper() in states):
            return run
        if kind in final or time.monotonic() >= deadline:
            where = "ended" if kind in final else f"after {timeout_s:g} s still"
            raise AssertionError(f"flow run {flow_run_id} {where} {run.state}; its last log "
                                 f"lines:\n{run_log_tail(client, flow_run_id)}")
        time.sleep(poll_s)


def run_log_tail(client, flow_run_id: str, lines: int = 30) -> str:
    """The flow run's last ``lines`` log lines on the Prefect server, oldest first, so that a
    failed services test says why in CI's output (CI keeps nothing else of the stack)."""
    import logging

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    try:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                limit=lines, sort=LogSort.TIMESTAMP_DESC)
    except Exception as err:  # the failure being reported matters more than its logs
        return f"  (could not read them: {type(err).__name__}: {err})"
    return "\n".join(f"  {log.timestamp:%H:%M:%S} {logging.getLevelName(log.level)} "
                     f"{log.message[:400]}" for log in reversed(logs)) or "  (none)"


def report(section: str, figures: dict) -> None:
    """Merge ``figures`` under ``section`` into the JSON report (when ``REPORT_ENV`` is set).
    Two test processes write it at once, so the read-modify-write holds a file lock."""
    from filelock import FileLock

    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        data = json.loads(target.read_text()) if target.exists() else {}
        data[section] = figures
        target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def table(data: dict) -> str:
    """RELIABILITY.md's "Servers" table from the report ``make test-services`` writes."""
    rows = []

    def row(name: str, text: str) -> None:
        rows.append(f"| {name} | {text} |")

    if s := data.get("stack_up"):
        row("`stack up` (both servers, accounts, pool, automation, deploy, worker)",
            f"{s['seconds']} s")
    if s := data.get("rollouts"):
        row("rollouts through the worker", f"{s['flow_runs']} flow runs of {s['families']} families "
            f"in {s['wall_s']} s; the other family overlapped the first: "
            f"{s['svc_b_overlapped_svc_a']}; the second of one family opened its record "
            f"{s['second_waited_s']} s after the first (queued), judged against its promotion; "
            f"approval {s['approval']}")
    if s := data.get("nightly"):
        row("nightly schedule (overridden to fire once)", f"run by the worker: {s['state']}, "
            f"re-validation {s['result']}")
    if s := data.get("accounts"):
        row("accounts", f"auditor: {s['auditor_refused_writes']} writes refused, release manager: "
            f"{s['release_manager_refused_writes']}, every refusal a 403: {s['all_403']}")
    if s := data.get("stale_promotion"):
        row("promotion bypassing the queue", f"refused by the compare-and-swap: {s['refused']}, "
            f"production unchanged: {s['production_unchanged']}")
    if s := data.get("worker_killed_mid_canary"):
        row("worker killed mid-canary", f"marked crashed {s['crashed_after_s']} s after the kill "
            f"(\"{s['crash_message']}\"); production unchanged: {s['production_unchanged']}; "
            f"next rollout closed the run as {s['killed_run_closed_as']} and cleared the canary "
            "(reason on the version)")
    if s := data.get("backup_restore"):
        row("backup and restore drill", f"{s['databases_dumped']} databases dumped, artifact "
            f"archive {s['artifact_archive_bytes']} bytes; MLflow database dropped and restored, "
            f"aliases equal, `kernelgate audit` exit {s['audit_exit_code']}; Prefect dump "
            f"restored with {s['prefect_flow_runs']} flow runs")
    if s := data.get("postgres_restart"):
        row("PostgreSQL restarted under a rollout", s["summary"])
    if s := data.get("mlflow_down_at_start"):
        row("MLflow server down at start", f"exit {s['exit_code']} naming the URI in "
            f"{s['seconds']} s")
    if s := data.get("load"):
        row("load: concurrent runs", f"{s['runs']} runs at once: {s['metric_points_written']} "
            f"metric points written, {s['metric_points_read_back']} read back; "
            f"{s['tags_written']} tags written, {s['tags_read_back']} read back "
            f"({s['seconds']} s)")
    if s := data.get("attack_concurrent_moves"):
        row("attack: concurrent alias moves (`tests/test_services_attacks.py`)",
            f"{s['moves']} moves of `shadow` at once from {s['processes']} processes: every move "
            f"signed once: {s['signed_once']}, signed history and log intact: "
            f"{s['history_intact']} ({s['seconds']} s)")
    if s := data.get("attack_older_backup"):
        row("attack: an older backup of the MLflow database restored",
            f"log {s['entries_before']} -> {s['entries_after_restore']} entries; detected as a cut "
            f"log by {s['detected_by']}; the next alias move refused: {s['next_move_refused']}")
    if s := data.get("attack_unsigned_approval"):
        row("attack: unsigned production approval (typed answer through the Prefect API)",
            f"{s['typed_answers']} typed `approve` in a named approver's name refused: "
            f"{s['refused']} (the message says to run `kernelgate approve … --key`); approved: "
            f"{s['approved']}; ended as the {s['ended']} ({s['seconds']} s)")
    if s := data.get("attack_rollback_during_rollout"):
        row("attack: `kernelgate rollback` while a rollout holds the family's slot",
            f"waited the {s['waited_s']} s the stand-in rollout held the slot, then rolled back: "
            f"{s['rolled_back_after_release']}; history of {s['moves']} moves intact: "
            f"{s['history_intact']}")
    if s := data.get("attack_squatting"):
        row("attack: the auditor creates `kernelgate-<family>` first (squatting)",
            f"the pipeline's write refused naming the family as another account's: "
            f"{s['refused']}; `stack up` names the owner ({s['owner_named_at_stack_up']}), "
            f"so does `kernelgate audit` ({s.get('owner_named_by_audit', 'not run')}); "
            f"handed back by the admin, then written: {s['handed_back_by_admin']}; a family "
            f"claimed at `stack up` read-only to the auditor: {s['claimed_at_stack_up']}")
    return "| drill | result |\n|---|---|\n" + "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
