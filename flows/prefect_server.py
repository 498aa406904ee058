"""Prefect's temporary server started while the command still imports and checks.

With no ``PREFECT_API_URL``, Prefect starts a temporary server (a uvicorn process) on a
flow's first call and waits for it: 10-20 s on a 2-core host, after the 20-30 s the CLI
spends importing JAX, MLflow and Prefect and checking its arguments. Started from a
thread as soon as the arguments are known, the server comes up on the other core
meanwhile; the flow then finds it running (Prefect keeps one instance per process,
``SubprocessASGIServer``), and ``wait`` joins the thread first, so no flow call races a
server that is not yet healthy.
"""

from __future__ import annotations

import logging
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

            SubprocessASGIServer().start()
        except BaseException as err:  # noqa: BLE001 - see the class docstring
            self.error = err

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            logger.warning("Prefect's temporary server did not start early (%s); the flow "
                           "starts it", self.error)


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
