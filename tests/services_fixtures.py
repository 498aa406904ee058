"""Fixtures of the ``services`` test modules: one whole server profile per test process
(``flows.stack.up`` on ephemeral ports and databases of its own), shared by the modules
that process runs, clients of it, a tiny test set, and pristine copies of its MLflow
databases for the attacks. Imported by name into each module; ``make test-services``
runs the modules one process each side by side (``--dist loadfile``: a stack per
process), CI in one process (one stack for the three modules: each ``stack up`` is
30 s on a quiet 2-core host, 2 min beside ``make test``). The modules do not disturb
each other's families: each names its own (``svc-a``/``svc-b``, ``svc-k``/``svc-pg``,
``atk-*``), and a drill that stops a server starts it again on its port."""

from __future__ import annotations

import os
import time

import pytest

from flows import stack as st
from lineage.store.tracking import Tracking
from tests import services as sv

_SHARED: dict[str, object] = {}
"""The values made once per test process (a pytest fixture imported into several modules
is one fixture per module, so ``scope="session"`` would still make one per module)."""


def _shared(request, name: str, make):
    """``make()``'s (a generator's) first value, made once per test process; the rest of
    the generator (its teardown) runs when the session's last test has run (a finalizer
    of the session node, last made first). Not ``config.add_cleanup``: that runs after
    an xdist worker has reported its end, and xdist kills a worker still busy 10 s later
    (``EXIT_TIMEOUT``), so stopping the stack's servers (up to 15 s each) was cut off and
    left them running, with their pids in the stack's state file."""
    if name not in _SHARED:
        made = make()
        _SHARED[name] = next(made)

        def finish() -> None:
            _SHARED.pop(name, None)
            next(made, None)
        request.session.addfinalizer(finish)
    return _SHARED[name]


@pytest.fixture(scope="module")
def testset(request, tmp_path_factory):
    def make():
        from evaluation.testset import build_testset

        folder = tmp_path_factory.mktemp("svc-testset")
        build_testset(folder, profile="ci")
        yield folder
    return _shared(request, "testset", make)


def _stack(tmp_path_factory):
    config = sv.test_config(tmp_path_factory.mktemp("stack"), families=[sv.CLAIMED])
    values = st.random_secrets(config)
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    started = time.monotonic()
    try:
        running = st.up(config)
        running_s = time.monotonic() - started
        yield config, running, running_s
    finally:
        st.down(config.state_dir)
        for name in config.databases.model_dump().values():
            st.drop_database(config, name)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    """The whole profile, up once for the test process: ``(config, running, up_s)``;
    stopped and its databases dropped when pytest ends. ``up`` claims ``sv.CLAIMED`` for
    the pipeline (the squatting attack's family claimed at ``stack up``)."""
    return _shared(request, "stack", lambda: _stack(tmp_path_factory))


def _templates(stack):
    config, running, _ = stack
    templates = {"mlflow": config.databases.mlflow + "_t",
                 "mlflow_auth": config.databases.mlflow_auth + "_t"}
    port = int(running.mlflow_url.rsplit(":", 1)[1])
    st.stop_process(running.pids["mlflow-server"])
    try:
        for field, name in templates.items():
            sv.create_from(config, name, getattr(config.databases, field))
    finally:
        running.pids["mlflow-server"] = st.start_mlflow_server(
            config, running.state_dir, port, running.artifact_root)[0]
        running.save()
    try:
        yield templates
    finally:
        for name in templates.values():
            st.drop_database(config, name)


@pytest.fixture(scope="module")
def mlflow_templates(request, stack):
    """Copies of the stack's MLflow databases (runs and registry, accounts) to create each
    attack's own from with ``CREATE DATABASE … TEMPLATE``: ``{"mlflow": name,
    "mlflow_auth": name}``. Taken once per process, when first asked for — the MLflow
    server stopped (a template has no sessions), copied, started again on its port — so
    they hold the accounts, the claimed family and whatever the process's earlier modules
    logged in families of their own; those families' artifacts stay in the stack's
    artifact root, which no copy is served from. Dropped when pytest ends."""
    return _shared(request, "mlflow_templates", lambda: _templates(stack))


@pytest.fixture(scope="module")
def env(stack):
    config, running, _ = stack
    return running.client_env("pipeline", config)


@pytest.fixture(scope="module")
def prefect(stack):
    """A Prefect client of the stack's server (with its auth string)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    config, running, _ = stack
    with temporary_settings({PREFECT_API_URL: running.prefect_api_url,
                             PREFECT_API_AUTH_STRING: config.secrets.value("prefect_auth")}), \
            get_client(sync_client=True) as client:
        yield client


@pytest.fixture
def as_account(stack, monkeypatch):
    """Switch this process's MLflow credentials to an account; returns its Tracking."""
    config, running, _ = stack

    def use(account: str) -> Tracking:
        for key, value in running.client_env(account, config).items():
            monkeypatch.setenv(key, value)
        return Tracking(tracking_uri=running.mlflow_url)
    return use
