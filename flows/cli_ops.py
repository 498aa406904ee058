"""Operations commands: Prefect notifications, and running a server until a signal."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
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
    from flows.notifications import create_notifications

    try:
        automations = create_notifications(webhook, allow_private_urls=allow_private_urls)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--webhook") from None
    for automation in automations:
        typer.echo(f"automation {automation.id}: {automation.name}")


def run_until_signalled(cmd: list[str], grace_s: float = 10.0) -> int:
    """Run ``cmd`` in a process group of its own until it exits, or until this process
    gets SIGINT or SIGTERM: then the whole group (the server and the workers it forked)
    gets SIGTERM, and SIGKILL after ``grace_s``, so nothing is left listening.
    Returns the command's exit code (0 when stopped by a signal)."""
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
    return 0 if stopping else code
