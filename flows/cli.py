"""Governed rollout of flash-attention kernels: build, evaluate, gate, shadow, canary, promote.

Defaults are the embedded local setup: Prefect's temporary server, MLflow on SQLite
under .kernelgate/, the pipeline's signing key in ~/.kernelgate/keys (created on first
use), whatever device JAX sees. Point at shared servers with PREFECT_API_URL and
MLFLOW_TRACKING_URI. Exit codes: 0 the command did its job (a rejection or rollback is
a result, printed), 1 an error or a failed audit, 2 bad arguments or a re-validation
that rolled back, 3 a rollout that errored (a stage crashed; signed, outcome printed) or an
audit with nothing to audit (no version behind the alias), 4 a rollout whose candidate was
safe but not worth adopting (its registration's decision).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

# (importing flows set what Prefect, MLflow and tqdm read at import: flows/__init__.py)
from flows import prefect_server
from flows.cli_approvals import approve, approve_loosening
from flows.cli_args import StoreDir, check_known_family
from flows.cli_calibrate import calibrate
from flows.cli_history import timeline
from flows.cli_keys import KeyDir, check_name, keys_app
from flows.cli_log import CheckpointFiles, reanchor, witnessing
from flows.cli_ops import notifications_app, ui
from flows.cli_plan import plan_arguments
from flows.cli_revalidate import revalidate
from flows.cli_stack import stack_app
from flows.cli_store import existing_family, open_store
from flows.log_noise import route_to_debug_log

# Prefect attaches its handlers to the extra loggers but leaves their level at the
# root's WARNING; the stage summaries are INFO.
for _name in os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"].split(","):
    logging.getLogger(_name.strip()).setLevel(logging.INFO)

# Heavy imports (JAX, MLflow, Prefect) happen inside the commands: `--help` stays fast.

# Plain (click) help and errors, not rich's tables: readable at 80 columns, and rich is
# never imported for a --help or a refusal.
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None, pretty_exceptions_enable=False)

Implementation = Annotated[str, typer.Option(
    help="candidate kernel: auto (the store's production dispatch policy when its signed record "
         "audits and it was measured on this backend; else the flash kernel of this device, on "
         "a CPU host the TPU kernel, interpreted; it says which and why), native (the head of "
         "this host's fallback order: xla on a CPU host), or "
         "any name of the kernel registry (kernels.registry: pallas_tpu, pallas_gpu, "
         "pallas_mosaic_gpu, xla, cudnn, naive, ...; an unknown name is refused with the list)")]
Thresholds = Annotated[Path | None, typer.Option(
    help="thresholds file to preregister; default: thresholds/local-dry-run.yaml, or "
         "thresholds/local-interpreted.yaml when the kernel runs interpreted here (it says which)",
    exists=True, dir_okay=False)]
Family = Annotated[str | None, typer.Option(
    help="kernel family (MLflow experiment and registered model); default: the kernel's name")]
DispatchPolicyFile = Annotated[Path | None, typer.Option(
    dir_okay=False, help="with --implementation dispatch: the dispatch policy (JSON, from "
    "kernels.tools.dispatch_evidence or dispatch_merge) the version serves; audited first")]
BlockQ = Annotated[int | None, typer.Option(min=1, help="query block size (tokens)")]
BlockKV = Annotated[int | None, typer.Option(min=1, help="key/value block size (tokens)")]

app.add_typer(keys_app, name="keys")
app.add_typer(notifications_app, name="notifications")
app.command()(ui)

app.command()(approve)
app.command(name="approve-loosening")(approve_loosening)
app.command()(reanchor)

app.add_typer(stack_app, name="stack")
app.command()(calibrate)
app.command()(revalidate)
app.command()(timeline)


ROLLOUT_EXIT_CODES = ("Exit codes: 0 a signed verdict (promoted, rejected, timed out or rolled "
                      "back: the last lines say which); 3 errored (a stage crashed); 4 not "
                      "adopted (safe, not worth adopting); 130 interrupted (Ctrl-C, signed); "
                      "1 a failure before the record opened; 2 bad arguments, or nothing to "
                      "roll out (auto resolves to the policy its family has in production).")
"""``kernelgate rollout --help``'s last paragraph (README, "End states and exit codes")."""


@app.command(epilog=ROLLOUT_EXIT_CODES)
def rollout(implementation: Implementation = "auto",
            thresholds: Thresholds = None,
            store_dir: StoreDir = Path(".kernelgate"),
            family: Family = None,
            new_family: Annotated[bool, typer.Option(help="allow --family to name a new family")] = False,
            testset_profile: Annotated[str, typer.Option(help="auto, ci or gpu (minimal: the flow tests' own)")] = "auto",
            documents_dir: Annotated[Path | None, typer.Option(
                help="folder of real documents (*.txt, *.md); default: installed packages' descriptions")] = None,
            block_q: BlockQ = None, block_kv: BlockKV = None, key_dir: KeyDir = None,
            dispatch_policy: DispatchPolicyFile = None,
            loosening_approval: Annotated[Path | None, typer.Option(
                exists=True, dir_okay=False,
                help="a signed approval of looser thresholds (kernelgate approve-loosening)")] = None) -> None:
    """Run a full governed rollout (preregister, build, evaluate, gate, shadow, approval, canary, confirm, then promote or roll back)."""
    settings, plan = plan_arguments(implementation, thresholds, store_dir, block_q, block_kv, family,
                           new_family, key_dir, dispatch_policy, testset_profile=testset_profile,
                           documents_dir=documents_dir, loosening_approval=loosening_approval)
    from flows.plan import NothingToRollOut, something_to_roll_out

    try:  # auto: production's own policy again
        something_to_roll_out(implementation, plan)
    except NothingToRollOut as err:
        raise typer.BadParameter(str(err), param_hint="--implementation") from None
    debug_log = route_to_debug_log(store_dir / "logs" / "third-party.log")
    typer.echo(f"third-party log lines (MLflow, Great Expectations, warnings): {debug_log}",
               err=True)
    from flows.errored import EXIT_CODES, OUTCOME_ATTRIBUTE
    from flows.rollout import run_rollout

    prefect_server.wait()
    try:  # every signed end, a crash's errored one included: printed, not a traceback
        outcome = run_rollout(settings, plan)
    except KeyboardInterrupt as err:  # Ctrl-C: the session signed it as interrupted
        outcome = getattr(err, OUTCOME_ATTRIBUTE, None)
        if outcome is None:
            typer.echo("interrupted before the rollout's record opened: nothing written",
                       err=True)
            raise typer.Exit(130) from None
    typer.echo("\n" + outcome.markdown().replace("**", ""))
    raise typer.Exit(EXIT_CODES.get(outcome.result, 1))


@app.command()
def evaluate(implementation: Implementation = "auto",
             thresholds: Thresholds = None,
             store_dir: StoreDir = Path(".kernelgate"),
             family: Family = None,
             new_family: Annotated[bool, typer.Option(help="allow --family to name a new family")] = False,
             report: Annotated[Path | None, typer.Option(help="also write the report JSON here")] = None,
             block_q: BlockQ = None, block_kv: BlockKV = None, key_dir: KeyDir = None,
             dispatch_policy: DispatchPolicyFile = None) -> None:
    """Preregister, build and evaluate a candidate and log the gate decision. It registers the build as a model version (the record of what was judged) and moves no alias."""
    settings, plan = plan_arguments(implementation, thresholds, store_dir, block_q, block_kv, family,
                           new_family, key_dir, dispatch_policy)
    from flows.rollout import evaluate_candidate

    prefect_server.wait()
    result = evaluate_candidate(settings, report_path=report, plan=plan)
    typer.echo(json.dumps({k: v for k, v in sorted(result.metrics.items())}, indent=1))


@app.command()
def audit(target: Annotated[str, typer.Argument(help="alias (production, canary, shadow) or version number")] = "production",
          family: Family = None,
          store_dir: StoreDir = Path(".kernelgate"),
          trusted_key: Annotated[list[Path] | None, typer.Option(
              exists=True, dir_okay=False, help="a public key (*.pub.json) you trust; repeat for several "
              "(default: the pipeline's key folder, said so)")] = None,
          revoked_key: Annotated[list[Path] | None, typer.Option(
              exists=True, dir_okay=False, help="a public key whose signatures never count")] = None,
          export: Annotated[Path | None, typer.Option(
              help="also write a self-contained bundle to this (new) folder for offline checking")] = None,
          bundle: Annotated[Path | None, typer.Option(
              exists=True, file_okay=False, help="audit an exported bundle instead of the store")] = None,
          load_model: Annotated[bool, typer.Option(
              help="load the version's model in its own process and check its code")] = True,
          recheck_reference: Annotated[int, typer.Option(
              min=0, help="recompute this many cached float64 references of the held-out "
              "evaluation with NumPy here (0: skip)")] = 2,
          key_dir: KeyDir = None, checkpoint: CheckpointFiles = None) -> None:
    """Re-derive why a version is where it is: verify every signed attestation, the family's signed log (against the pipeline's checkpoint, yours, and the head this audit remembered), the complete chain, each decision and every artifact (exit 1 on any problem; 3 when the target names no version and the log agrees)."""
    if bundle is None:
        check_known_family(family, store_dir)
        tracking = open_store(store_dir, must_exist=True)  # refused before anything is said
    from flows.cli_store import add_ownership_findings
    from lineage.audit.audit import audit as run_audit
    from lineage.audit.bundle import BundleSource, export_bundle
    from lineage.signing import keys

    try:
        if trusted_key:
            trust = keys.trust_from_files(list(trusted_key), list(revoked_key or []))
            trust_files = list(trusted_key)
        else:
            folder = key_dir or keys.default_key_dir()
            trust = keys.folder_trust(folder)
            if revoked_key:
                trust.revoked |= {keys.load_public_key(p).keyid for p in revoked_key}
            trust_files = keys.pipeline_public_files(folder)
            typer.echo(f"trusting the pipeline role's public keys in {folder} ({len(trust.public_keys)}; "
                       "never approver keys); pass --trusted-key to choose your own", err=True)
    except keys.KeyFileError as err:
        raise typer.BadParameter(str(err)) from None
    if bundle is not None:
        source = BundleSource(bundle, trust)
        result = run_audit(None, check_name(family or source.family), target, source=source, witnessing=witnessing(key_dir, checkpoint, bundle))
    else:
        fam = existing_family(tracking, family)
        result = run_audit(tracking, fam, target, trust=trust, load_model=load_model,
                           recheck_reference=recheck_reference, witnessing=witnessing(key_dir, checkpoint, None))
        add_ownership_findings(tracking, fam, result)  # the servers profile: squatted?
        if export is not None:
            typer.echo(f"bundle written to {export_bundle(tracking, fam, result, trust_files, export, key_dir or keys.default_key_dir())}")
    typer.echo(result.render())
    raise typer.Exit(result.exit_code)


def _user_name() -> str | None:
    """This process's user name ($LOGNAME, $USER, ..., else the password database), or
    None when none can be read (a container without either)."""
    import getpass

    try:
        return getpass.getuser() or None
    except (KeyError, OSError):
        return None


@app.command(name="rollback")
def rollback_cmd(reason: Annotated[str, typer.Option(help="why; recorded, signed, shown to auditors")],
                 to: Annotated[int | None, typer.Option(
                     "--to", min=1, help="earlier production version to restore (default: the "
                     "newest earlier usable one)")] = None,
                 requested_by: Annotated[str | None, typer.Option(
                     help="who asks (default: this process's user name)")] = None,
                 family: Family = None, store_dir: StoreDir = Path(".kernelgate"),
                 key_dir: KeyDir = None) -> None:
    """Roll production back by hand (signed and recorded like any rollback; the Prefect UI's `manual-rollback` deployment does the same)."""
    if len(reason.strip()) < 3:
        raise typer.BadParameter("a rollback needs a reason", param_hint="--reason")
    requester = requested_by or _user_name()
    if not requester:
        raise typer.BadParameter("no user name could be read from this environment ($USER, "
                                 "$LOGNAME, the password database): say who asks",
                                 param_hint="--requested-by")
    check_known_family(family, store_dir)
    tracking = open_store(store_dir, must_exist=True, writes=True)
    fam = existing_family(tracking, family)
    from flows.rollback import check_manual_rollback, manual_rollback
    from lineage.aliases.registry import PromotionRefused
    from lineage.log.family_log import LogDamaged

    try:  # refused in a line before the flow starts; the flow checks again under the lock
        check_manual_rollback(to, fam, str(store_dir), None if key_dir is None else str(key_dir))
        change = manual_rollback(reason=reason, requested_by=requester, to_version=to,
                                 family=fam, store_dir=str(store_dir),
                                 key_dir=None if key_dir is None else str(key_dir))
    except (ValueError, PromotionRefused) as err:
        typer.echo(f"refused: {err}", err=True)
        raise typer.Exit(2) from None
    except LogDamaged as err:  # nothing moved; `kernelgate reanchor` is the way on
        typer.echo(f"refused: the family's signed log is damaged, nothing moved: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"production of {fam}: v{change.previous_version} -> "
               f"{'v' + change.version if change.version else 'none (native baseline)'}")


TESTSET_PROFILES = ("ci", "gpu", "minimal")
"""The test set's generation profiles (``evaluation.testset``'s, named here so the
command refuses another before importing it)."""


@app.command()
def testset(out: Annotated[Path, typer.Option(help="output folder")] = Path(".kernelgate/testsets/ci"),
            profile: Annotated[str, typer.Option(help="ci (short sequences), gpu (up to 16384) or minimal (the flow tests' 17 cases a split)")] = "ci",
            documents_dir: Annotated[Path | None, typer.Option(help="folder of documents")] = None) -> None:
    """Build (or rebuild) the content-addressed held-out test set and validate it with GX."""
    if profile not in TESTSET_PROFILES:  # before the imports: a typo answers in a second
        raise typer.BadParameter(f"{profile!r}: one of {list(TESTSET_PROFILES)}",
                                 param_hint="--profile")
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

    from flows.revalidate import nightly_revalidation
    from flows.rollout import rollout as rollout_flow

    prefect_serve(
        nightly_revalidation.to_deployment(name="nightly-revalidation", cron="0 2 * * *"),
        rollout_flow.to_deployment(name="candidate-rollout"),
    )


if __name__ == "__main__":
    app()
