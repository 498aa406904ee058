"""The server profile's configuration and command line, without starting servers (those
are ``tests/test_services.py``, marked ``services``)."""

from __future__ import annotations

import socket
from datetime import UTC

import pytest
import yaml
from typer.testing import CliRunner

from flows import stack as st
from flows import stack_config
from flows.cli import app
from tests import services as sv


def test_the_committed_stack_file_validates_and_holds_no_secret():
    config = st.StackConfig.load(sv.ROOT / "stack.yaml")
    assert config.work_pool == "kernelgate-process"
    text = (sv.ROOT / "stack.yaml").read_text().lower()
    assert "password:" not in text and "auth_string" not in text
    assert config.database_url("x", "asyncpg").startswith("postgresql+asyncpg://")


def test_stack_config_is_validated(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"prefect_port": 70000}))
    with pytest.raises(ValueError, match="prefect_port"):
        st.StackConfig.load(path)
    path.write_text(yaml.safe_dump({"rollout_slot_lease_s": 10}))  # Prefect's minimum is 60
    with pytest.raises(ValueError, match="rollout_slot_lease_s"):
        st.StackConfig.load(path)
    path.write_text(yaml.safe_dump({"databases": {"mlflow": "x; DROP DATABASE y"}}))
    with pytest.raises(ValueError, match="mlflow"):
        st.StackConfig.load(path)


def test_a_slot_lease_shorter_than_what_the_heartbeat_tolerates_is_refused(tmp_path):
    """A rollout stalled for up to two heartbeats is alive to the heartbeat automation, so
    its slot's lease must survive the same stall (Prefect cancels a rollout whose lease
    renewal fails); the shipped file and the default keep 75 s of slack against 60 s."""
    path = tmp_path / "stack.yaml"
    for lease, heartbeat in ((60, 30), (239, 30), (300, 60)):
        path.write_text(yaml.safe_dump({"rollout_slot_lease_s": lease, "heartbeat_s": heartbeat}))
        with pytest.raises(ValueError, match=rf"rollout_slot_lease_s {lease}\b.*heartbeat_s {heartbeat}"):
            st.StackConfig.load(path)
    path.write_text(yaml.safe_dump({"rollout_slot_lease_s": 240, "heartbeat_s": 30}))
    assert st.StackConfig.load(path).rollout_slot_lease_s == 240
    for config in (st.StackConfig(), st.StackConfig.load(sv.ROOT / "stack.yaml")):
        assert (1 - 0.75) * config.rollout_slot_lease_s >= 2 * config.heartbeat_s


def test_the_renewal_fraction_is_prefects():
    """The slack above is computed with Prefect's renewal fraction: an upgrade that renews
    later would shrink it unseen."""
    from prefect.concurrency import _leases

    from flows.stack_config import LEASE_RENEWAL_FRACTION

    assert _leases._RENEWAL_FRACTION == LEASE_RENEWAL_FRACTION == 0.75


def test_a_rollout_cancelled_by_prefect_says_so_in_its_record():
    """Prefect stops a run by raising ``CancelledError`` in it (a cancellation, or a slot
    lease it could not renew); the closed record names that instead of a bare class name."""
    import asyncio

    from prefect._internal.concurrency.cancellation import CancelledError
    from prefect.exceptions import TerminationSignal

    from flows.tasks import _reason

    for err in (asyncio.CancelledError(), CancelledError()):
        assert _reason(err).startswith("cancelled by Prefect") and "slot" in _reason(err)
    stopped = _reason(TerminationSignal(15))
    assert stopped.startswith("stopped by signal 15") and "slot" not in stopped
    assert _reason(ValueError("x")) == "ValueError: x"


def test_a_services_wait_that_fails_carries_the_runs_last_log_lines():
    """CI keeps only the services lane's output: a flow run that crashed must bring its own
    logs (here, the lease's line) into the failure, and a server that cannot give them must
    not hide the failure itself."""
    from datetime import datetime
    from types import SimpleNamespace

    from prefect.states import Crashed

    class Server:
        def __init__(self, logs):
            self.logs, self.asked = logs, None

        def read_flow_run(self, flow_run_id):
            return SimpleNamespace(state=Crashed(message="Execution was cancelled"))

        def read_logs(self, log_filter, limit, sort):
            self.asked = (log_filter.flow_run_id.any_, limit)
            if isinstance(self.logs, Exception):
                raise self.logs
            return self.logs

    at = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    newest_first = [SimpleNamespace(timestamp=at, level=40, message="Concurrency lease renewal "
                                    "failed - slots are no longer reserved"),
                    SimpleNamespace(timestamp=at.replace(second=1), level=20, message="holding")]
    server, run_id = Server(newest_first), "600bf9d9-36ff-4a73-8605-c3855e707cbd"
    with pytest.raises(AssertionError) as failed:
        sv.wait_state(server, run_id, {"COMPLETED"}, timeout_s=60, poll_s=0)
    text = str(failed.value)
    assert "ended Crashed" in text and server.asked[1] == 30
    assert [str(x) for x in server.asked[0]] == [run_id]
    assert text.index("12:00:01 INFO holding") < text.index("12:00:05 ERROR Concurrency lease")
    with pytest.raises(AssertionError, match=r"(?s)ended Crashed.*could not read them: OSError"):
        sv.wait_state(Server(OSError("down")), run_id, {"COMPLETED"}, timeout_s=60, poll_s=0)


def test_stack_refuses_to_start_without_its_secrets(tmp_path, monkeypatch):
    config = sv.test_config(tmp_path)
    for name, value in st.random_secrets(config).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(config.secrets.pipeline)
    with pytest.raises(st.StackError, match=config.secrets.pipeline):
        st.up(config)
    assert not (tmp_path / st.STATE_FILE).exists()


def test_a_password_mlflow_would_refuse_stops_the_stack_before_anything_starts(tmp_path,
                                                                               monkeypatch):
    """MLflow's basic-auth refuses passwords under 12 characters only when ``up`` creates
    the account, with the servers already started; ``up`` checks it with the others."""
    config = sv.test_config(tmp_path)
    for name, value in st.random_secrets(config).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(config.secrets.auditor, "x" * 11)
    with pytest.raises(st.StackError, match=rf"{config.secrets.auditor} .*11 characters.*12"):
        st.up(config)
    assert not (tmp_path / st.STATE_FILE).exists() and not (tmp_path / "logs").exists()
    monkeypatch.setenv(config.secrets.auditor, "x" * 12)
    assert config.secrets.value("auditor") == "x" * 12
    monkeypatch.setenv(config.secrets.prefect_auth, "a:b")  # not an MLflow password
    assert config.secrets.value("prefect_auth") == "a:b"


def test_mlflow_accounts_default_to_read_only(tmp_path, monkeypatch):
    config = sv.test_config(tmp_path)
    monkeypatch.setenv(config.secrets.mlflow_admin, "admin-secret")
    ini = st.mlflow_auth_ini(config)
    assert "default_permission = READ" in ini and "admin_password = admin-secret" in ini
    assert f"/{config.databases.mlflow_auth}" in ini and "auth_cache_ttl_seconds" in ini


def test_stack_commands_without_a_running_stack(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state")}))
    status = CliRunner().invoke(app, ["stack", "status", "--config", str(path)])
    assert status.exit_code == 1 and "no stack is running" in status.output
    down = CliRunner().invoke(app, ["stack", "down", "--config", str(path)])
    assert down.exit_code == 0 and "nothing was running" in down.output


def test_a_refused_stack_file_stops_up_in_one_line_but_not_down(tmp_path):
    """A file written under an older rule (the 60 s lease once shipped): ``up`` refuses it
    naming the field, without a traceback; ``status`` and ``down`` still reach the stack
    its ``state_dir`` records, so it can be stopped before the file is mended."""
    state = tmp_path / "state"
    state.mkdir()
    (state / st.STATE_FILE).write_text(st.Stack(
        state_dir=state, prefect_api_url="http://127.0.0.1:1/api", mlflow_url="http://127.0.0.1:2",
        artifact_root=state / "artifacts", key_dir=state / "keys").model_dump_json())
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(state), "rollout_slot_lease_s": 60}))
    up = CliRunner().invoke(app, ["stack", "up", "--config", str(path)])
    assert up.exit_code == 2, up.output
    assert "rollout_slot_lease_s 60" in up.output and "Traceback" not in up.output
    assert not (tmp_path / "state" / "logs").exists()  # nothing was started
    status = CliRunner().invoke(app, ["stack", "status", "--config", str(path)])
    assert status.exit_code == 0 and "warning:" in status.output
    assert "http://127.0.0.1:1/api" in status.output
    down = CliRunner().invoke(app, ["stack", "down", "--config", str(path)])
    assert down.exit_code == 0 and not (state / st.STATE_FILE).exists()


def test_a_free_port_for_a_server_is_below_the_ephemeral_range_and_bindable():
    low, high = stack_config.ephemeral_port_range()
    assert 1024 < low <= high <= 65535
    for _ in range(20):  # bind(0) would hand out ports from [low, high], where clients take them
        port = stack_config.free_port()
        assert not low <= port <= high, (port, low, high)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


class _Scripted:
    """An rng whose ``randrange`` returns the given ports in turn."""

    def __init__(self, ports):
        self.ports = list(ports)

    def randrange(self, start, stop):
        port = self.ports.pop(0)
        assert start <= port < stop
        return port


def test_a_port_a_listener_holds_is_passed_over():
    with socket.socket() as held:
        taken = stack_config.free_port()
        held.bind(("127.0.0.1", taken))
        held.listen()
        other = stack_config.free_port()
        assert stack_config.free_port(rng=_Scripted([taken, other])) == other
        # every try taken: the OS's own choice, still a port one can listen on
        fallback = stack_config.free_port(rng=_Scripted([taken] * 3), tries=3)
        assert fallback != taken
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", fallback))
