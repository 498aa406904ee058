"""Governed rollout of flash-attention kernels: build, evaluate, gate, shadow, canary, promote.

Defaults are the embedded local setup: Prefect's temporary server, MLflow on SQLite
under .kernelgate/, whatever device JAX sees. Point at shared servers with
PREFECT_API_URL and MLFLOW_TRACKING_URI. Exit codes: 0 the command did its job (a
rejection or rollback is a result, printed), 1 an error, 2 bad arguments or a
re-validation that rolled back.
"""

from __future__ import annotations

import os

# Show the packages' own log lines in Prefect's run logs (must precede importing Prefect).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS",
                      "kernelgate,kernels,evaluation,gates,lineage,flows")

import json  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated  # noqa: E402

import typer  # noqa: E402

from flows.settings import DEFAULT_THRESHOLDS, RolloutSettings  # noqa: E402

# Prefect attaches its handlers to the extra loggers but leaves their level at the
# root's WARNING; the stage summaries are INFO.
for _name in os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"].split(","):
    logging.getLogger(_name.strip()).setLevel(logging.INFO)

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)

Implementation = Annotated[str, typer.Option(
    help="candidate kernel: auto (native flash kernel of this device), pallas_tpu, pallas_gpu, "
         "pallas_mosaic_gpu (Hopper, bf16/f16), "
         "xla, cudnn, naive")]
Thresholds = Annotated[Path, typer.Option(help="thresholds file to preregister",
                                          exists=True, dir_okay=False)]
StoreDir = Annotated[Path, typer.Option(help="local store: MLflow SQLite, artifacts, test sets")]
BlockQ = Annotated[int | None, typer.Option(help="query block size (tokens)")]
BlockKV = Annotated[int | None, typer.Option(help="key/value block size (tokens)")]


def _settings(implementation: str, thresholds: Path, store_dir: Path, block_q: int | None,
              block_kv: int | None, **extra) -> RolloutSettings:
    import kernels
    from gates.thresholds import load_thresholds

    # Fail on bad arguments before anything is logged or evaluated.
    try:
        name = kernels.native_flash_kernel(implementation, kernels.default_backend())
        load_thresholds(thresholds)
        config = None
        if block_q is not None or block_kv is not None:
            config = kernels.BlockSizes(block_q=block_q, block_kv=block_kv)
        kernels.IMPLEMENTATIONS[name].check_config(config)
    except ValueError as err:
        raise typer.BadParameter(f"{err}") from None
    return RolloutSettings(implementation=implementation, thresholds=thresholds.resolve(),
                           store_dir=store_dir, config=config, **extra)


@app.command()
def rollout(implementation: Implementation = "auto",
            thresholds: Thresholds = DEFAULT_THRESHOLDS,
            store_dir: StoreDir = Path(".kernelgate"),
            testset_profile: Annotated[str, typer.Option(help="auto, ci or gpu")] = "auto",
            documents_dir: Annotated[Path | None, typer.Option(
                help="folder of real documents (*.txt, *.md); default: installed packages' descriptions")] = None,
            block_q: BlockQ = None, block_kv: BlockKV = None) -> None:
    """Run a full governed rollout (preregister, build, evaluate, gate, shadow, approval, canary, confirm, then promote or roll back)."""
    from flows.rollout import rollout as rollout_flow

    settings = _settings(implementation, thresholds, store_dir, block_q, block_kv,
                         testset_profile=testset_profile, documents_dir=documents_dir)
    outcome = rollout_flow(settings)
    typer.echo("\n" + outcome.markdown().replace("**", ""))
    raise typer.Exit(0 if outcome.result in ("promoted", "rejected", "rolled_back") else 1)


@app.command()
def evaluate(implementation: Implementation = "auto",
             thresholds: Thresholds = DEFAULT_THRESHOLDS,
             store_dir: StoreDir = Path(".kernelgate"),
             report: Annotated[Path | None, typer.Option(help="also write the report JSON here")] = None,
             block_q: BlockQ = None, block_kv: BlockKV = None) -> None:
    """Preregister, build and evaluate a candidate and log the gate decision; moves no alias."""
    from flows.rollout import evaluate_candidate

    result = evaluate_candidate(_settings(implementation, thresholds, store_dir, block_q, block_kv),
                                report_path=report)
    typer.echo(json.dumps({k: v for k, v in sorted(result.metrics.items())}, indent=1))


@app.command()
def revalidate(family: Annotated[str, typer.Option(help="kernel family (auto: native flash kernel)")] = "auto",
               store_dir: StoreDir = Path(".kernelgate")) -> None:
    """Re-evaluate what `production` points at; roll back on failure (the nightly job)."""
    from flows.revalidate import revalidate_production

    outcome = revalidate_production(family, RolloutSettings(store_dir=store_dir))
    typer.echo(outcome.model_dump_json(indent=1))
    raise typer.Exit(0 if outcome.result != "rolled_back" else 2)


@app.command()
def audit(target: Annotated[str, typer.Argument(help="alias (production, canary, shadow) or version number")] = "production",
          family: Annotated[str, typer.Option(help="kernel family (auto: native flash kernel)")] = "auto",
          store_dir: StoreDir = Path(".kernelgate")) -> None:
    """Print the lineage chain of a version and re-verify every logged artifact's sha256 (exit 1 on any mismatch or broken link)."""
    import kernels
    from lineage import tracking as tr
    from lineage.audit import audit as run_audit

    if not os.environ.get("MLFLOW_TRACKING_URI") and not (store_dir / "mlflow.db").exists():
        raise typer.BadParameter(f"no MLflow store at {store_dir.resolve()} (run a rollout first, "
                                 "or pass --store-dir / set MLFLOW_TRACKING_URI)")
    if family == "auto":
        family = kernels.native_flash_kernel("auto", kernels.default_backend())
    tracking = tr.tracking_for(store_dir)
    result = run_audit(tracking, family, target)
    typer.echo(result.render())
    raise typer.Exit(result.exit_code)


@app.command()
def ui(store_dir: StoreDir = Path(".kernelgate"),
       port: Annotated[int, typer.Option(help="port of the MLflow UI")] = 5000) -> None:
    """Open the MLflow UI on the local store (for the Prefect UI run `prefect server start`)."""
    from lineage import tracking as tr

    tracking = tr.local_tracking(store_dir)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking.tracking_uri,
           "--default-artifact-root", tracking.artifact_root or "", "--port", str(port),
           "--workers", "1"]
    typer.echo(f"MLflow UI on http://127.0.0.1:{port}  ({' '.join(cmd)})")
    raise typer.Exit(subprocess.call(cmd))


@app.command()
def testset(out: Annotated[Path, typer.Option(help="output folder")] = Path(".kernelgate/testsets/ci"),
            profile: Annotated[str, typer.Option(help="ci (short sequences) or gpu (up to 16384)")] = "ci",
            documents_dir: Annotated[Path | None, typer.Option(help="folder of documents")] = None) -> None:
    """Build (or rebuild) the content-addressed held-out test set and validate it with GX."""
    from evaluation.testset import build_testset, describe
    from evaluation.validation import validate_testset

    manifest = build_testset(out, profile=profile, documents_dir=documents_dir)
    for split in manifest.splits:
        validate_testset(out, split)
    typer.echo(describe(manifest))


@app.command()
def serve() -> None:
    """Serve the deployments from this process: nightly re-validation (02:00 UTC) and on-demand rollout (needs `prefect server start`)."""
    from prefect import serve as prefect_serve

    from flows.revalidate import revalidate_production
    from flows.rollout import rollout as rollout_flow

    prefect_serve(
        revalidate_production.to_deployment(name="nightly-revalidation", cron="0 2 * * *"),
        rollout_flow.to_deployment(name="candidate-rollout"),
    )


if __name__ == "__main__":
    app()
