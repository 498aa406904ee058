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
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = PROJECT_DIR / "stack.yaml"
STATE_FILE = "stack.json"
ACCOUNTS = ("pipeline", "auditor", "release-manager")


class StackError(RuntimeError):
    """A server did not start, a database could not be made, or a secret is missing."""


class Databases(BaseModel):
    """Database names on the PostgreSQL server (created when missing)."""

    model_config = ConfigDict(extra="forbid")

    prefect: str = Field("kernelgate_prefect", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    mlflow: str = Field("kernelgate_mlflow", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    mlflow_auth: str = Field("kernelgate_mlflow_auth", pattern=r"^[a-z_][a-z0-9_]{0,62}$")


class Secrets(BaseModel):
    """Names of the environment variables that hold each password."""

    model_config = ConfigDict(extra="forbid")

    prefect_auth: str = "KERNELGATE_PREFECT_AUTH"
    mlflow_admin: str = "KERNELGATE_MLFLOW_ADMIN_PASSWORD"
    pipeline: str = "KERNELGATE_MLFLOW_PIPELINE_PASSWORD"
    auditor: str = "KERNELGATE_MLFLOW_AUDITOR_PASSWORD"
    release_manager: str = "KERNELGATE_MLFLOW_RELEASE_MANAGER_PASSWORD"
    mlflow_flask_key: str = "KERNELGATE_MLFLOW_FLASK_SECRET_KEY"

    def value(self, field: str) -> str:
        """The secret's value from the environment.

        Raises:
            StackError: the variable is unset or empty (its name is in the message).
        """
        name = getattr(self, field)
        value = os.environ.get(name, "")
        if not value:
            raise StackError(f"set the environment variable {name} (the {field} secret); "
                             "secrets never live in stack.yaml or the repository")
        return value


class StackConfig(BaseModel):
    """``stack.yaml``: where the servers listen, their databases and state folder.

    Attributes:
        host: interface every server binds to.
        prefect_port, mlflow_port: TCP ports; 0 picks a free one at ``up``.
        postgres_url: a PostgreSQL account allowed to create databases
            (``postgresql://user@host:port/db``; a password, if any, from ``PGPASSWORD``).
        databases: the three databases (Prefect, MLflow runs and registry, MLflow accounts).
        state_dir: logs, ``stack.json``, the served artifact root and the worker's key folder.
        work_pool: the ``process`` work pool the deployments of ``prefect.yaml`` name.
        rollout_slot_lease_s: lease (seconds) of a rollout's slot in its family's global
            concurrency limit; a killed rollout's slot frees after it.
        heartbeat_s: flow-run heartbeat period (seconds, >= 30, Prefect's minimum); the
            automation marks a run crashed after ``3 * heartbeat_s`` without one.
        scheduler_loop_s: how often the server's scheduler creates scheduled runs (seconds).
        prefect_ui: serve the Prefect UI (where release managers approve).
        secrets: environment variables with the passwords.
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    prefect_port: int = Field(4200, ge=0, le=65535)
    mlflow_port: int = Field(5000, ge=0, le=65535)
    postgres_url: str = Field("postgresql://postgres@127.0.0.1:5432/postgres",
                              pattern=r"^postgresql://")
    databases: Databases = Databases()
    state_dir: Path = Path("~/.kernelgate/stack")
    work_pool: str = "kernelgate-process"
    rollout_slot_lease_s: float = Field(60, ge=60, le=86400)
    heartbeat_s: int = Field(30, ge=30, le=3600)
    scheduler_loop_s: int = Field(60, ge=1, le=3600)
    prefect_ui: bool = True
    secrets: Secrets = Secrets()

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CONFIG) -> StackConfig:
        """Read and validate a stack file.

        Raises:
            FileNotFoundError: no such file. pydantic.ValidationError: a bad field.
        """
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    def database_url(self, database: str, driver: str = "") -> str:
        """``postgres_url`` pointing at ``database`` (``driver``: e.g. ``asyncpg``)."""
        parts = urlsplit(self.postgres_url)
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return urlunsplit((scheme, parts.netloc, f"/{database}", parts.query, ""))


class Stack(BaseModel):
    """What ``up`` started (``<state_dir>/stack.json``)."""

    state_dir: Path
    prefect_api_url: str
    mlflow_url: str
    artifact_root: Path
    key_dir: Path
    pids: dict[str, int] = {}
    logs: dict[str, Path] = {}

    def client_env(self, account: str = "pipeline", config: StackConfig | None = None) -> dict[str, str]:
        """Environment for a client of this stack acting as ``account`` (passwords read
        from the environment variables the config names).

        Raises:
            StackError: a password variable is unset.
        """
        config = config or StackConfig()
        field = account.replace("-", "_")
        return {"PREFECT_API_URL": self.prefect_api_url,
                "PREFECT_API_AUTH_STRING": config.secrets.value("prefect_auth"),
                "MLFLOW_TRACKING_URI": self.mlflow_url,
                "MLFLOW_TRACKING_USERNAME": "admin" if account == "admin" else account,
                "MLFLOW_TRACKING_PASSWORD": config.secrets.value(
                    "mlflow_admin" if account == "admin" else field)}

    def save(self) -> Path:
        """Write ``stack.json`` in the state folder; returns its path."""
        path = self.state_dir / STATE_FILE
        path.write_text(self.model_dump_json(indent=1))
        return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def create_database(config: StackConfig, name: str) -> bool:
    """Create database ``name`` unless it exists; returns whether it was created.

    Raises:
        StackError: PostgreSQL cannot be reached or refuses.
    """
    import psycopg2

    try:
        conn = psycopg2.connect(config.postgres_url, connect_timeout=5)
    except psycopg2.Error as err:
        raise StackError(f"PostgreSQL at {config.postgres_url} does not answer: {err}") from err
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone():
                return False
            cur.execute(f'CREATE DATABASE "{name}"')
            return True
    finally:
        conn.close()


def drop_database(config: StackConfig, name: str) -> None:
    """Drop database ``name`` if it exists (closing other sessions on it first)."""
    import psycopg2

    conn = psycopg2.connect(config.postgres_url, connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


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


def prefect_server_env(config: StackConfig) -> dict[str, str]:
    """Environment of ``prefect server start``: the PostgreSQL database, the auth string,
    the scheduler period."""
    return {"PREFECT_API_DATABASE_CONNECTION_URL": config.database_url(config.databases.prefect,
                                                                      "asyncpg"),
            "PREFECT_SERVER_API_AUTH_STRING": config.secrets.value("prefect_auth"),
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": str(config.scheduler_loop_s),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": str(config.prefect_ui).lower()}


def mlflow_auth_ini(config: StackConfig) -> str:
    """The basic-auth app's configuration (``MLFLOW_AUTH_CONFIG_PATH``): accounts in
    PostgreSQL, default permission READ, the admin's password from the environment, a
    one-minute cache of verified passwords."""
    return "\n".join([
        "[mlflow]",
        "default_permission = READ",
        f"database_uri = {config.database_url(config.databases.mlflow_auth, 'psycopg2')}",
        "admin_username = admin",
        f"admin_password = {config.secrets.value('mlflow_admin')}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        # a verified password is remembered (HMAC-keyed, in memory) for a minute: without
        # it every request pays a password hash, about a second on a busy 2-core host
        "auth_cache_ttl_seconds = 60",
        ""])


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


def create_accounts(config: StackConfig, mlflow_url: str) -> None:
    """Create the ``pipeline``, ``auditor`` and ``release-manager`` accounts (idempotent).

    Raises:
        StackError: a password variable is unset.
        mlflow.exceptions.RestException: the server refused (e.g. a wrong admin password).
    """
    from mlflow.exceptions import RestException
    from mlflow.server import get_app_client

    passwords = {a: config.secrets.value(a.replace("-", "_")) for a in ACCOUNTS}
    old = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ["MLFLOW_TRACKING_USERNAME"] = "admin"
    os.environ["MLFLOW_TRACKING_PASSWORD"] = config.secrets.value("mlflow_admin")
    try:
        auth = get_app_client("basic-auth", tracking_uri=mlflow_url)
        for account, password in passwords.items():
            try:
                auth.create_user(account, password)
            except RestException as err:
                if "RESOURCE_ALREADY_EXISTS" not in str(err):
                    raise
                auth.update_user_password(account, password)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _prefect_cli(args: list[str], env: dict[str, str], timeout_s: float = 180) -> str:
    done = subprocess.run([_bin("prefect"), "--no-prompt", *args], env={**os.environ, **env},
                          cwd=PROJECT_DIR, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise StackError(f"prefect {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def heartbeat_automation(config: StackConfig):
    """The automation that marks a flow run CRASHED when its heartbeat stops (Prefect's
    documented pattern: a proactive trigger on ``prefect.flow-run.heartbeat``)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture

    return Automation(
        name="kernelgate-crash-zombie-flow-runs",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed",
                    "prefect.flow-run.Failed", "prefect.flow-run.Cancelled",
                    "prefect.flow-run.Crashed"},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=3 * config.heartbeat_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message="marked crashed: no heartbeat from its worker")],
    )


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


def load_stack(state_dir: Path) -> Stack:
    """The stack recorded in ``<state_dir>/stack.json``.

    Raises:
        FileNotFoundError: no stack was started there.
    """
    return Stack.model_validate_json((Path(state_dir).expanduser() / STATE_FILE).read_text())


def stop_process(pid: int, timeout_s: float = 15, sig: int = signal.SIGTERM) -> None:
    """Stop a process started by ``up`` and its whole session (its children too):
    ``sig``, then SIGKILL after ``timeout_s`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
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


def random_secrets(config: StackConfig) -> dict[str, str]:
    """Fresh random values for every secret the config names (for tests and a first
    ``stack up``; print them into your own secret store, never the repository)."""
    values = {name: secrets.token_urlsafe(18) for name in
              (config.secrets.mlflow_admin, config.secrets.pipeline, config.secrets.auditor,
               config.secrets.release_manager, config.secrets.mlflow_flask_key)}
    values[config.secrets.prefect_auth] = f"kernelgate:{secrets.token_urlsafe(18)}"
    return values


def describe(stack: Stack) -> str:
    """A few lines for people: URLs, processes, logs."""
    return json.dumps({"prefect_api_url": stack.prefect_api_url, "mlflow_url": stack.mlflow_url,
                       "pids": stack.pids, "logs": {k: str(v) for k, v in stack.logs.items()}},
                      indent=1)
