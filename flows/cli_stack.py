"""``kernelgate stack up|down|status``: the server profile of ``stack.yaml`` (flows/stack.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

stack_app = typer.Typer(help="The server profile: Prefect and MLflow servers on PostgreSQL, a "
                             "process work pool, a worker, the deployments (stack.yaml).",
                        no_args_is_help=True)

Config = Annotated[Path, typer.Option(help="the stack file", exists=True, dir_okay=False)]


def _load(config: Path | None, *, stopping: bool = False):
    """The validated stack file. A file that fails validation ends ``up`` with one line per
    bad field (exit 2); ``down`` and ``status`` warn and go on with its ``state_dir`` alone,
    so that a stack started under an older, now refused file can still be seen and stopped."""
    import yaml
    from pydantic import ValidationError

    from flows import stack as st

    path = config or st.DEFAULT_CONFIG
    try:
        return st.StackConfig.load(path)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}"
                             for e in err.errors())
        if not stopping:
            typer.echo(f"error: {path}: {problems}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"warning: {path}: {problems}; using its state_dir only", err=True)
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return st.StackConfig.model_construct(
            state_dir=Path(raw.get("state_dir", st.StackConfig.model_fields["state_dir"].default)))


@stack_app.command()
def up(config: Config = None,
       worker: Annotated[bool, typer.Option(help="also start a worker on this host")] = True) -> None:
    """Start the servers, create the accounts and the work pool, deploy prefect.yaml and a
    worker; prints the URLs. Passwords come from the environment variables stack.yaml names."""
    from flows import stack as st

    cfg = _load(config)
    try:
        running = st.up(cfg, worker=worker)
    except st.StackError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(st.describe(running))
    typer.echo(f"clients: export PREFECT_API_URL={running.prefect_api_url} "
               f"MLFLOW_TRACKING_URI={running.mlflow_url} (and PREFECT_API_AUTH_STRING, "
               "MLFLOW_TRACKING_USERNAME/PASSWORD for your account)")


@stack_app.command()
def down(config: Config = None) -> None:
    """Stop what `stack up` started (worker first); the databases and artifacts stay."""
    from flows import stack as st

    cfg = _load(config, stopping=True)
    stopped = st.down(cfg.state_dir)
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@stack_app.command()
def status(config: Config = None) -> None:
    """Print what `stack up` recorded (URLs, process ids, logs)."""
    from flows import stack as st

    cfg = _load(config, stopping=True)
    try:
        typer.echo(st.describe(st.load_stack(cfg.state_dir)))
    except FileNotFoundError:
        typer.echo("no stack is running")
        raise typer.Exit(1) from None
