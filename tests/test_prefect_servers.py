"""The suite's isolation from Prefect's temporary servers: one started in a test process
is stopped when the session ends, even where the process then exits without running its
``atexit`` hooks (as an xdist worker killed at shutdown does)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _session(tmp_path: Path, plugin: bool) -> int:
    """A pytest session that starts the temporary server the way a refused command does
    and leaves through ``os._exit``; returns the server's pid."""
    tmp_path.mkdir()
    (tmp_path / "conftest.py").write_text("import os\n\ndef pytest_unconfigure(config):\n"
                                          "    os._exit(0)\n")
    (tmp_path / "test_starts.py").write_text(textwrap.dedent(f"""
        from pathlib import Path

        def test_a_command_starts_the_server_and_is_refused():
            from flows import prefect_server
            from prefect.server.api.server import SubprocessASGIServer

            assert prefect_server.start_early() is not None
            prefect_server.wait()
            (server,) = SubprocessASGIServer._instances.values()
            Path({str(tmp_path / "pid")!r}).write_text(str(server.server_process.pid))
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env["PYTHONPATH"] = str(ROOT)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--rootdir", str(tmp_path), str(tmp_path / "test_starts.py")]
    if plugin:
        args[3:3] = ["-p", "tests.prefect_servers"]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert (tmp_path / "pid").exists(), done.stdout[-2000:] + done.stderr[-2000:]
    return int((tmp_path / "pid").read_text())


def test_a_temporary_prefect_server_stops_with_the_session_however_the_process_exits(tmp_path):
    with_plugin = _session(tmp_path / "with", plugin=True)
    without = _session(tmp_path / "without", plugin=False)
    try:
        deadline = time.monotonic() + 10
        while _alive(with_plugin) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(with_plugin), "the session's fixture left the server running"
        # the planted fault: without the fixture the same exit orphans the server
        assert _alive(without), "the check cannot see an orphaned server"
    finally:
        for pid in (with_plugin, without):
            if _alive(pid):
                os.kill(pid, 9)
