"""Configuration of the server profile (``stack.yaml``): ports, PostgreSQL databases,
state folder, the names of the environment variables that hold the secrets; what ``up``
started (``stack.json``); and the PostgreSQL and port helpers ``flows.stack`` uses."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.paths import PROJECT_DIR
from kernels.errors import KernelgateError

DEFAULT_CONFIG = PROJECT_DIR / "stack.yaml"
STATE_FILE = "stack.json"
LEASE_RENEWAL_FRACTION = 0.75
"""Prefect renews a held concurrency lease this fraction of its duration after the last
renewal (``prefect.concurrency._leases._RENEWAL_FRACTION``, Prefect 3.x)."""


class StackError(KernelgateError, RuntimeError):
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
            StackError: the variable is unset or empty, or an MLflow account's password is
                under MLflow's 12 characters; the variable's name is in the message.
        """
        name = getattr(self, field)
        value = os.environ.get(name, "")
        if not value:
            raise StackError(f"set the environment variable {name} (the {field} secret); "
                             "secrets never live in stack.yaml or the repository")
        if field in MLFLOW_PASSWORDS and len(value) < MLFLOW_PASSWORD_MIN:
            raise StackError(f"{name} (the {field} password) has {len(value)} characters; "
                             f"MLflow's basic-auth needs at least {MLFLOW_PASSWORD_MIN}")
        return value


MLFLOW_PASSWORDS = frozenset({"mlflow_admin", "pipeline", "auditor", "release_manager"})
MLFLOW_PASSWORD_MIN = 12  # MLflow refuses shorter ones, but only once the servers are up


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
            concurrency limit: a killed rollout's slot frees this long (+ the server's 15 s
            scan) after its last renewal; a live one renewing later loses it and Prefect
            cancels it, so ``(1 - LEASE_RENEWAL_FRACTION) * lease >= 2 * heartbeat_s``.
        heartbeat_s: flow-run heartbeat period (seconds, >= 30, Prefect's minimum); the
            automation marks a run crashed after ``3 * heartbeat_s`` without one, so a
            run survives any stall of up to ``2 * heartbeat_s``.
        scheduler_loop_s: how often the server's scheduler creates scheduled runs (seconds).
        prefect_ui: serve the Prefect UI (where release managers approve).
        secrets: environment variables with the passwords.
        families: kernel families whose experiment and registered model ``up`` creates
            as the pipeline account, so that no other account can create them first and
            lock the pipeline out (MLflow's basic-auth has no permission for creating).
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
    rollout_slot_lease_s: float = Field(300, ge=60, le=86400)
    heartbeat_s: int = Field(30, ge=30, le=3600)
    scheduler_loop_s: int = Field(60, ge=1, le=3600)
    prefect_ui: bool = True
    secrets: Secrets = Secrets()
    families: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _lease_outlasts_what_the_heartbeat_tolerates(self) -> StackConfig:
        slack_s = (1 - LEASE_RENEWAL_FRACTION) * self.rollout_slot_lease_s
        if slack_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"rollout_slot_lease_s {self.rollout_slot_lease_s:g} leaves a renewal "
                f"{slack_s:g} s of slack, less than the {2 * self.heartbeat_s} s stall "
                f"(2 x heartbeat_s {self.heartbeat_s}) the heartbeat automation lets a run "
                f"survive: such a run would lose its family's slot and be cancelled; set "
                f"rollout_slot_lease_s >= {2 * self.heartbeat_s / (1 - LEASE_RENEWAL_FRACTION):g}")
        return self

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


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000  # below: well-known services' habitual ports (5000, 5432, 8080)


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections, inclusive: Linux's
    ``ip_local_port_range``; elsewhere IANA's dynamic range, 49152-65535 (RFC 6335)."""
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    return low, high


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None,
              tries: int = 64) -> int:
    """A TCP port free for a server to listen on ``host``, chosen below the ephemeral range.

    ``bind(0)`` would return a port from the ephemeral range, which outgoing connections
    draw from too: between this call and the server's own bind (seconds, while it imports
    and loads a model) any client connection on the host could take it, and the server
    died with "address already in use" (seen in CI: ``mlflow models serve`` on port 40047
    beside the test workers' connections). Below the range only another listener can take
    it, and a random choice among some 20,000 ports makes two at once unlikely.

    Falls back to the OS's choice when the range leaves no room below it, or when
    ``tries`` random ports are all taken.
    """
    low, _ = ephemeral_port_range()
    rng = rng or random.SystemRandom()
    if low - LISTEN_PORTS_FROM >= 1000:
        for _ in range(tries):
            port = rng.randrange(LISTEN_PORTS_FROM, low)
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _admin_cursor(config: StackConfig):
    """An autocommit cursor on the config's PostgreSQL maintenance database (``CREATE`` and
    ``DROP DATABASE`` cannot run inside a transaction).

    Raises:
        StackError: PostgreSQL cannot be reached.
    """
    import psycopg2

    try:
        conn = psycopg2.connect(config.postgres_url, connect_timeout=5)
    except psycopg2.Error as err:
        raise StackError(f"PostgreSQL at {config.postgres_url} does not answer: {err}") from err
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def create_database(config: StackConfig, name: str, template: str | None = None) -> bool:
    """Create database ``name`` unless it exists (a copy of ``template`` when given: the
    template must have no open sessions); returns whether it was created.

    Raises:
        StackError: PostgreSQL cannot be reached.
        psycopg2.Error: PostgreSQL refuses (e.g. the template is in use).
    """
    with _admin_cursor(config) as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if cur.fetchone():
            return False
        copy = f' TEMPLATE "{template}"' if template else ""
        cur.execute(f'CREATE DATABASE "{name}"{copy}')
        return True


def drop_database(config: StackConfig, name: str) -> None:
    """Drop database ``name`` if it exists (closing other sessions on it first)."""
    with _admin_cursor(config) as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def random_secrets(config: StackConfig) -> dict[str, str]:
    """Fresh random values for every secret the config names (for tests and a first
    ``stack up``; print them into your own secret store, never the repository)."""
    values = {name: secrets.token_urlsafe(18) for name in
              (config.secrets.mlflow_admin, config.secrets.pipeline, config.secrets.auditor,
               config.secrets.release_manager, config.secrets.mlflow_flask_key)}
    values[config.secrets.prefect_auth] = f"kernelgate:{secrets.token_urlsafe(18)}"
    return values


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


def load_stack(state_dir: Path) -> Stack:
    """The stack recorded in ``<state_dir>/stack.json``.

    Raises:
        FileNotFoundError: no stack was started there.
    """
    return Stack.model_validate_json((Path(state_dir).expanduser() / STATE_FILE).read_text())


def describe(stack: Stack) -> str:
    """A few lines for people: URLs, processes, logs."""
    return json.dumps({"prefect_api_url": stack.prefect_api_url, "mlflow_url": stack.mlflow_url,
                       "pids": stack.pids, "logs": {k: str(v) for k, v in stack.logs.items()}},
                      indent=1)


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
