"""A session fixture that stops the Prefect temporary servers a test process started.

A command run in the test process (``typer.testing.CliRunner``) starts Prefect's temporary
server (``flows.prefect_server.start_early``: a uvicorn process in a session of its own)
and may be refused before any flow runs, so nothing stops the server until the process
exits, through Prefect's ``atexit`` hook. An xdist worker that does not exit that way
(killed 10 s after it reported its end while still busy) leaves the server orphaned
(parent pid 1) on the host, slowing whatever runs next. Stopping them when the session's
fixtures end does not depend on how the process exits."""

from __future__ import annotations

import sys

import pytest


def stop_temporary_servers() -> None:
    """Stop every ``SubprocessASGIServer`` of this process. Imports nothing: a process
    that never loaded Prefect's server module has none."""
    module = sys.modules.get("prefect.server.api.server")
    if module is not None:
        for server in list(module.SubprocessASGIServer._instances.values()):
            server.stop()


@pytest.fixture(scope="session", autouse=True)
def _temporary_prefect_servers_stop_with_the_session():
    yield
    stop_temporary_servers()
