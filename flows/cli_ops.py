"""Operations commands: Prefect notifications, and ``kernelgate ui``: running a server until
a signal (a server that stops by itself failed to serve)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

notifications_app = typer.Typer(help="Prefect automations that tell people what happened.",
                                no_args_is_help=True)


@notifications_app.command("create")
def notifications_create(
        webhook: Annotated[str, typer.Option(help="URL that receives a JSON POST {subject, body}")],
        allow_private_urls: Annotated[bool, typer.Option(
            help="allow a webhook on localhost or a private network")] = False) -> None:
    """Create the automations (needs PREFECT_API_URL): a rollout paused for approval, a rollout or production rolled back, a nightly run crashed or failed."""
    from prefect.settings import PREFECT_API_URL

    from flows.notifications import create_notifications

    if not PREFECT_API_URL.value():
        # without it Prefect would write them to a throwaway local database and succeed
        raise typer.BadParameter("PREFECT_API_URL is not set: automations live on the Prefect "
                                 "server your rollouts report to (start one with `prefect "
                                 "server start`, then export PREFECT_API_URL="
                                 "http://127.0.0.1:4200/api)", param_hint="PREFECT_API_URL")
    try:
        automations = create_notifications(webhook, allow_private_urls=allow_private_urls)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--webhook") from None
    for automation in automations:
        typer.echo(f"automation {automation.id}: {automation.name}")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port`` (a bind there fails)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def run_until_signalled(cmd: list[str], grace_s: float = 10.0) -> int:
    """Run ``cmd`` (a server) in a process group of its own until it exits, or until this
    process gets SIGINT or SIGTERM: then the whole group (the server and the workers it
    forked) gets SIGTERM, and SIGKILL after ``grace_s``, so nothing is left listening.
    Returns 0 when stopped by a signal; a server that exits by itself failed to serve
    (some print an error and exit 0): its exit code, or 1 for 0."""
    import signal

    child = subprocess.Popen(cmd, start_new_session=True)
    stopping: list[int] = []

    def stop(signum, _frame):
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        killed_at = None
        while (code := child.poll()) is None:
            time.sleep(0.1)
            if stopping and killed_at is None:
                killed_at = time.monotonic() + grace_s
            if killed_at is not None and time.monotonic() > killed_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(ProcessLookupError):  # workers that outlived the server
            os.killpg(child.pid, signal.SIGTERM)
    return 0 if stopping else (code or 1)


def ui(store_dir: Annotated[Path, typer.Option(help="local store: MLflow SQLite, artifacts")] = Path(".kernelgate"),
       port: Annotated[int, typer.Option(help="port of the MLflow UI")] = 5000) -> None:
    """Open the MLflow UI on the local store (for the Prefect UI run `prefect server start`)."""
    from flows.cli_args import check_store_dir

    check_store_dir(store_dir, writes=False)  # a file there: one line, not a traceback
    if port_in_use(port):
        raise typer.BadParameter(f"port {port} is in use on 127.0.0.1 (another MLflow UI or "
                                 "server?); pass a free one", param_hint="--port")
    from lineage.store import tracking as tr

    tracking = tr.local_tracking(store_dir)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking.tracking_uri,
           "--default-artifact-root", tracking.artifact_root or "", "--port", str(port),
           "--workers", "1"]
    from lineage.store.tags import UI_VIEW_QUERY

    typer.echo(f"MLflow UI on http://127.0.0.1:{port}  ({' '.join(cmd)})\n"
               f"registered models (model-training view, not GenAI): "
               f"http://127.0.0.1:{port}/#/models?{UI_VIEW_QUERY}")
    code = run_until_signalled(cmd)
    if code:
        typer.echo(f"the MLflow UI stopped by itself (exit {code}): it is not serving", err=True)
    raise typer.Exit(code)
