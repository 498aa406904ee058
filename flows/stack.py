"""The server profile: upstream Prefect server and MLflow tracking server on PostgreSQL,
a ``process`` work pool, a worker and the deployments of ``prefect.yaml``, started and
stopped with their own command lines (``kernelgate stack up`` / ``stack down``).

We write configuration, not servers: every process here is an upstream CLI
(``prefect server start``, ``mlflow server --app-name basic-auth``, ``prefect deploy``,
``prefect worker start``). The configuration is ``stack.yaml`` (:class:`StackConfig`);
passwords come from environment variables it names, never from the repository. What
was started is written to ``<state_dir>/stack.json`` (process ids, URLs, log files), so
``stack down`` stops exactly those processes.

Accounts on the MLflow server (basic-auth app, default permission READ):

- ``pipeline``: creates the family experiments and registered models, and so holds
  MANAGE on them (writes runs, moves aliases). Its password is given to workers only.
- ``auditor`` and ``release-manager``: READ on everything (the default); every write is
  refused with 403.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flows.stack_accounts import ACCOUNTS, claim_families, create_accounts  # noqa: F401
from flows.stack_config import (  # noqa: F401 - re-exported: one module for callers
    DEFAULT_CONFIG,
    PROJECT_DIR,
    STATE_FILE,
    Databases,
    Secrets,
    Stack,
    StackConfig,
    StackError,
    create_database,
    describe,
    drop_database,
    free_port,
    heartbeat_automation,
    load_stack,
    mlflow_auth_ini,
    prefect_server_env,
    random_secrets,
)


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _start(name: str, cmd: list[str], env: dict[str, str], state_dir: Path) -> tuple[int, Path]:
    log = state_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=PROJECT_DIR)
    return proc.pid, log


def _wait_http(url: str, pid: int, log: Path, timeout_s: float) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).status_code == 200:
                return
        if not _alive(pid):
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise StackError(f"{url} did not answer within {timeout_s:.0f}s (log {log}):\n{tail}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as dead
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def start_prefect_server(config: StackConfig, state_dir: Path, port: int, *,
                         wait: bool = True) -> tuple[int, Path, str]:
    """``prefect server start`` on PostgreSQL; waits for ``/api/health`` (180 s) unless
    ``wait`` is False (then call ``wait_ready``).

    Returns:
        (pid, log file, API URL).

    Raises:
        StackError: it did not answer in time (the log's tail in the message).
    """
    env = {**prefect_server_env(config), "PREFECT_HOME": str(state_dir / "prefect-server")}
    pid, log = _start("prefect-server", [_bin("prefect"), "server", "start", "--host", config.host,
                                          "--port", str(port)], env, state_dir)
    url = f"http://{config.host}:{port}/api"
    if wait:
        wait_ready(url, pid, log)
    return pid, log, url


def start_mlflow_server(config: StackConfig, state_dir: Path, port: int,
                        artifact_root: Path, *, wait: bool = True) -> tuple[int, Path, str]:
    """``mlflow server --app-name basic-auth`` on PostgreSQL with served artifacts;
    waits for ``/health`` (180 s) unless ``wait`` is False (then call ``wait_ready``).

    Returns:
        (pid, log file, tracking URL).

    Raises:
        StackError: it did not answer in time (the log's tail in the message).
    """
    ini = state_dir / "mlflow-auth.ini"
    ini.write_text(mlflow_auth_ini(config))
    ini.chmod(0o600)
    artifact_root.mkdir(parents=True, exist_ok=True)
    cmd = [_bin("mlflow"), "server", "--backend-store-uri",
           config.database_url(config.databases.mlflow, "psycopg2"),
           "--artifacts-destination", artifact_root.as_uri(), "--serve-artifacts",
           "--host", config.host, "--port", str(port), "--workers", "1",
           "--app-name", "basic-auth"]
    pid, log = _start("mlflow-server", cmd, {"MLFLOW_AUTH_CONFIG_PATH": str(ini),
                               # MLflow's GenAI job runner: unused here
                               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                               "MLFLOW_FLASK_SERVER_SECRET_KEY": config.secrets.value("mlflow_flask_key")}, state_dir)
    url = f"http://{config.host}:{port}"
    if wait:
        wait_ready(url, pid, log)
    return pid, log, url


def wait_ready(url: str, pid: int, log: Path, timeout_s: float = 180) -> None:
    """Wait until ``<url>/health`` answers 200.

    Raises:
        StackError: the process exited or ``timeout_s`` seconds passed (the log's tail in
            the message).
    """
    _wait_http(url.rstrip("/") + "/health", pid, log, timeout_s)


def _prefect_cli(args: list[str], env: dict[str, str], timeout_s: float = 180) -> str:
    done = subprocess.run([_bin("prefect"), "--no-prompt", *args], env={**os.environ, **env},
                          cwd=PROJECT_DIR, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise StackError(f"prefect {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def worker_env(config: StackConfig, stack: Stack) -> dict[str, str]:
    """Environment of a worker host: the pipeline's MLflow account, the Prefect API, the
    checkout (``KERNELGATE_HOME``), the signing key folder (on this host only)."""
    return {**stack.client_env("pipeline", config),
            "KERNELGATE_HOME": str(PROJECT_DIR),
            "KERNELGATE_KEY_DIR": str(stack.key_dir),
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(config.heartbeat_s),
            "KERNELGATE_ROLLOUT_SLOT_LEASE_S": str(config.rollout_slot_lease_s),
            "PREFECT_WORKER_QUERY_SECONDS": "2",
            "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", ""),
            }


def start_worker(config: StackConfig, stack: Stack, name: str = "worker") -> int:
    """``prefect worker start`` on the work pool, as the pipeline; returns its pid (also
    recorded in ``stack.json`` under ``name``)."""
    env = {k: v for k, v in worker_env(config, stack).items() if v}
    pid, log = _start(name, [_bin("prefect"), "worker", "start", "--pool", config.work_pool,
                             "--name", f"kernelgate-{name}-{os.getpid()}", "--type", "process"],
                      env, stack.state_dir)
    stack.pids[name], stack.logs[name] = pid, log
    stack.save()
    return pid


def up(config: StackConfig, *, worker: bool = True, deploy: bool = True) -> Stack:
    """Start the whole profile: databases, Prefect server, MLflow server, accounts, work
    pool, the heartbeat automation, ``prefect deploy --all`` and a worker.

    On a failure whatever was started is stopped again before the error propagates.

    Raises:
        StackError: PostgreSQL unreachable, a secret unset, or a server not answering.
    """
    state_dir = config.state_dir.expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    for field in Secrets.model_fields:
        config.secrets.value(field)  # every secret is set, before anything starts
    for name in config.databases.model_dump().values():
        create_database(config, name)
    key_dir = state_dir / "keys"
    key_dir.mkdir(mode=0o700, exist_ok=True)
    stack = Stack(state_dir=state_dir, prefect_api_url="", mlflow_url="",
                  artifact_root=state_dir / "artifacts", key_dir=key_dir)
    try:  # both servers start at once; the deployments go in while MLflow starts
        pid, log, stack.prefect_api_url = start_prefect_server(
            config, state_dir, config.prefect_port or free_port(config.host), wait=False)
        stack.pids["prefect-server"], stack.logs["prefect-server"] = pid, log
        pid, log, stack.mlflow_url = start_mlflow_server(
            config, state_dir, config.mlflow_port or free_port(config.host), stack.artifact_root,
            wait=False)
        stack.pids["mlflow-server"], stack.logs["mlflow-server"] = pid, log
        stack.save()
        wait_ready(stack.prefect_api_url, stack.pids["prefect-server"], stack.logs["prefect-server"])
        env = stack.client_env("pipeline", config)
        _create_pool_and_automation(config, stack)
        if deploy:
            _prefect_cli(["deploy", "--all"], {**env, "KERNELGATE_HOME": str(PROJECT_DIR)})
        wait_ready(stack.mlflow_url, stack.pids["mlflow-server"], stack.logs["mlflow-server"])
        create_accounts(config, stack.mlflow_url)
        claim_families(config, stack.mlflow_url)
        if worker:
            start_worker(config, stack)
    except BaseException:
        down(state_dir)
        raise
    return stack


def _create_pool_and_automation(config: StackConfig, stack: Stack) -> None:
    """The ``process`` work pool (the process worker's own base job template: ``prefect
    work-pool create`` would ask the server for the collection registry on the internet)
    and the heartbeat automation; both left alone when they exist."""
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    with temporary_settings({PREFECT_API_URL: stack.prefect_api_url,
                             PREFECT_API_AUTH_STRING: config.secrets.value("prefect_auth")}):
        with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(
                name=config.work_pool, type="process",
                base_job_template=ProcessWorker.get_default_base_job_template()))
        automation = heartbeat_automation(config)
        try:
            Automation.read(name=automation.name)
        except ValueError:
            automation.create()


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc; a flow run the process worker
    started sits in a session of its own, out of reach of the worker's process group)."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent:
                    found.append(int(entry.name))
                    frontier.append(int(entry.name))
    return found


def stop_process(pid: int, timeout_s: float = 15, sig: int = signal.SIGTERM) -> None:
    """Stop a process started by ``up``, its whole session and every descendant (flow
    runs a worker started included): ``sig``, then SIGKILL after ``timeout_s`` seconds."""
    family = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.1)


def down(state_dir: Path) -> list[str]:
    """Stop every process ``up`` recorded (worker first, servers last); returns their
    names. The databases and the artifact root stay (``drop_database`` removes one)."""
    try:
        stack = load_stack(state_dir)
    except FileNotFoundError:
        return []
    order = sorted(stack.pids, key=lambda n: n in ("prefect-server", "mlflow-server"))
    for name in order:
        stop_process(stack.pids[name])
    (Path(state_dir).expanduser() / STATE_FILE).unlink(missing_ok=True)
    return order
