"""Notifications: the automations ``kernelgate notifications create`` makes fire on a
real Prefect server and post to a webhook (a local receiver here)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prefect import flow
from prefect.flow_runs import pause_flow_run
from prefect.testing.utilities import prefect_test_harness
from typer.testing import CliRunner

from flows.cli import app
from flows.notifications import NIGHTLY_FLOW, ROLLOUT_FLOW
from flows.tasks import end_state
from tests.shared_builds import HARNESS_STARTUP_S


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def webhook():
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Receiver.received
    server.shutdown()


def _wait_for(received: list[dict], needle: str, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in received:
            if needle in message.get("body", ""):
                return message
        time.sleep(0.5)
    raise AssertionError(f"no notification containing {needle!r}; got {received}")


@flow(name=ROLLOUT_FLOW)
def _rolled_back_rollout(label: str):
    return end_state("rolled_back", f"canary-25pct: latency ({label})", None)


@flow(name=ROLLOUT_FLOW)
def _paused_rollout(label: str):
    pause_flow_run(timeout=2, key=f"approval-test-{label}")


@flow(name=NIGHTLY_FLOW)
def _failing_nightly(label: str):
    raise RuntimeError(f"nightly broke ({label})")


@flow(name="some-other-flow")
def _other(label: str):
    raise RuntimeError(f"not ours ({label})")


def test_pause_rollback_and_nightly_failure_are_notified(webhook):
    url, received = webhook
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        result = CliRunner().invoke(app, ["notifications", "create", "--webhook", "ftp://x"])
        assert result.exit_code == 2, result.output
        result = CliRunner().invoke(app, ["notifications", "create", "--webhook", url,
                                          "--allow-private-urls"])
        assert result.exit_code == 0, result.output
        from flows.notifications import RULES

        assert result.output.count("automation ") == len(RULES) == 4
        # created twice: replaced, not duplicated
        result = CliRunner().invoke(app, ["notifications", "create", "--webhook", url,
                                          "--allow-private-urls"])
        assert result.exit_code == 0, result.output
        time.sleep(5)  # the trigger service loads the automations

        state = _rolled_back_rollout("r1", return_state=True)
        assert state.name == "RolledBack"
        message = _wait_for(received, "r1")
        assert "RolledBack" in message["body"] and message["subject"] == "kernelgate: rolled back"

        with pytest.raises(Exception):  # noqa: B017 - the pause times out
            _paused_rollout("p1")
        message = _wait_for(received, "Paused")
        assert "waits for your approval" in message["subject"]

        _other("o1", return_state=True)
        _failing_nightly("n1", return_state=True)
        message = _wait_for(received, "n1")
        assert "nightly" in message["subject"] and "Failed" in message["body"]
        assert not [m for m in received if "o1" in m.get("body", "")]
        assert sum("r1" in m.get("body", "") for m in received) == 1  # one automation, once


def test_creating_them_without_a_server_is_refused_before_anything_is_written(monkeypatch):
    """Without PREFECT_API_URL Prefect would create the automations in a throwaway local
    database and report success: the command refuses instead, naming the variable."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = CliRunner().invoke(app, ["notifications", "create", "--webhook",
                                          "https://hooks.example.com/kernelgate"])
    assert result.exit_code == 2, result.output
    assert "PREFECT_API_URL is not set" in result.output
    assert "automation " not in result.output
