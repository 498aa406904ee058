"""Prefect's temporary server started while the command still imports and checks.

With no ``PREFECT_API_URL``, Prefect starts a temporary server (a uvicorn process) on a
flow's first call and waits for it: 10-20 s on a 2-core host, after the 20-30 s the CLI
spends importing JAX, MLflow and Prefect and checking its arguments. Started from a
thread as soon as the arguments are known, the server comes up on the other core
meanwhile; the flow then finds it running (Prefect keeps one instance per process,
``SubprocessASGIServer``), and ``wait`` joins the thread first, so no flow call races a
server that is not yet healthy.

The server runs in a session of its own (:func:`own_session`): a terminal's Ctrl-C goes to
the foreground process group, which held the server too, so the server died first and the
interrupted rollout then spent minutes retrying its state updates against it (2 min 32 s
and about 120 lines of ``httpx.ConnectError``, seen on a fresh clone). Now only the
command gets the interrupt; it ends the rollout's record and the server stops at exit.
"""

from __future__ import annotations

import logging
import subprocess
import threading

logger = logging.getLogger(__name__)


class EarlyServer:
    """The thread starting the server, and what it raised (the flow's own start then
    tries again and reports it the usual way)."""

    def __init__(self):
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="prefect-server", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            from prefect.server.api.server import SubprocessASGIServer

            own_session()
            SubprocessASGIServer().start()
        except BaseException as err:  # noqa: BLE001 - see the class docstring
            self.error = err

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            logger.warning("Prefect's temporary server did not start early (%s); the flow "
                           "starts it", self.error)


class _OwnSessionSubprocess:
    """The ``subprocess`` module as Prefect's server module sees it: ``Popen`` starts the
    child in a session of its own; everything else is the module's."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 - the name Prefect calls
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(*args, **kwargs)


def own_session() -> None:
    """Make Prefect's temporary server (``SubprocessASGIServer``, one ``Popen`` of uvicorn)
    start in a session of its own, out of the terminal's process group (idempotent)."""
    from prefect.server.api import server

    if not isinstance(server.subprocess, _OwnSessionSubprocess):
        server.subprocess = _OwnSessionSubprocess()


_EARLY: list[EarlyServer] = []


def start_early() -> EarlyServer | None:
    """Start the temporary server in a thread when this process will use one (no API
    URL, the ephemeral server enabled); None otherwise."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if _EARLY or PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    _EARLY.append(server := EarlyServer())
    return server


def wait() -> None:
    """Join the early start, if one was made (before the first flow call)."""
    while _EARLY:
        _EARLY.pop().wait()
