"""Fixtures of the ``services`` test modules: one whole server profile per module
(``flows.stack.up`` on ephemeral ports and databases of its own), clients of it, and a
tiny test set. Imported by name into each module, so each module gets a stack of its own
and ``make test-services`` runs the modules side by side (``--dist loadfile``)."""

from __future__ import annotations

import os
import time

import pytest

from flows import stack as st
from lineage.tracking import Tracking
from tests import services as sv


@pytest.fixture(scope="module")
def testset(tmp_path_factory):
    from evaluation.testset import build_testset

    folder = tmp_path_factory.mktemp("svc-testset")
    build_testset(folder, profile="ci")
    return folder


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The whole profile, up for the module; stopped and its databases dropped after."""
    config = sv.test_config(tmp_path_factory.mktemp("stack"))
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
