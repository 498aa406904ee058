"""The rollout's stages as plain, typed functions (no Prefect here).

``flows/rollout.py`` and ``flows/revalidate.py`` wrap these in Prefect tasks and
read like the stage list of the design notes; everything a stage decides or
measures is logged to MLflow through ``lineage`` so an auditor can follow it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import kernels
from evaluation.performance import BenchShape
from evaluation.report import EvaluationReport
from flows import serving
from gates.approval import ApprovalRecord
from gates.canary import CanaryStepResult, analyse_canary_step
from gates.decision import GateDecision, decide
from gates.preregistration import Registration, preregister, verify_registration
from gates.thresholds import CanaryStep, Thresholds, load_thresholds
from kernels.build import ExampleShapes
from lineage import registry, tags
from lineage import tracking as tr
from lineage.environment import collect_environment
from lineage.records import log_alias_change, log_approval, log_canary_step, log_decision
from lineage.tracking import Tracking

logger = logging.getLogger("kernelgate.rollout")

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-dry-run.yaml"

# Model-version tags that let serving resolve an alias to a callable kernel.
IMPLEMENTATION_TAG = "kernelgate.implementation"
CONFIG_TAG = "kernelgate.config"
REJECTION_TAG = "kernelgate.rejection_reason"

NATIVE_FAMILY = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cpu": "pallas_tpu"}
"""The flash kernel rolled out by default per backend. A CPU host has no flash kernel
of its own: it rolls out the TPU kernel in interpret mode (accuracy judged, speed
not assessed)."""

NATIVE_BASELINE = "xla"
"""What serves when a family has no ``production`` version (the recovery target of a
rollback with no earlier production): XLA's attention, native on every backend and
able to run every dtype and shape the serving model uses (cuDNN, for one, refuses
the model's float32)."""

OWNER_TAG = tags.ALIAS_OWNER + "{alias}"
"""Model-version tag: the rollout run that assigned ``shadow``/``canary`` to it."""
SOURCE_DRIFT_TAG = "kernelgate.source_drift.{alias}"


class RolloutSettings(BaseModel):
    """Everything a rollout needs; defaults are the embedded local dry run.

    Attributes:
        implementation: candidate kernel (registry name) or ``auto`` (the native flash
            kernel of this backend, ``NATIVE_FAMILY``).
        family: kernel family = MLflow experiment and registered model (default: the
            implementation's name).
        thresholds: the thresholds file to preregister (profile inside).
        config: block sizes for the candidate (``None``: kernel default / tuned table).
        testset_profile: ``ci`` (short sequences, CPU-friendly) or ``gpu``; ``auto`` picks by backend.
        testset_dir: test-set folder; default ``<store>/testsets/<profile>`` (built if missing).
        documents_dir: folder of real documents (``*.txt``/``*.md``); default: the
            long descriptions of installed Python distributions.
        store_dir: local store for MLflow (when ``MLFLOW_TRACKING_URI`` is unset) and work files.
        shadow_requests: recorded requests replayed in shadow.
        perf_repeats: timed repeats per implementation and shape in evaluation.
        perf_shapes: benchmark shapes of the evaluation (``None``: the platform's defaults).
        model_check: embed held-out documents with the candidate and float64 attention
            (the ``model.*`` metrics); a profile whose criteria use them needs it.
        stale_alias_after_s: lease of a running rollout on its ``shadow``/``canary`` alias.
    """

    model_config = ConfigDict(extra="forbid")

    implementation: str = "auto"
    family: str | None = None
    thresholds: Path = DEFAULT_THRESHOLDS
    config: kernels.BlockSizes | None = None
    testset_profile: Literal["auto", "ci", "gpu"] = "auto"
    testset_dir: Path | None = None
    documents_dir: Path | None = None
    store_dir: Path = Path(".kernelgate")
    shadow_requests: int = Field(24, ge=2)
    perf_repeats: int | None = Field(None, ge=1)
    perf_shapes: list[BenchShape] | None = None
    model_check: bool = True
    stale_alias_after_s: float = Field(6 * 3600, ge=0, description=(
        "a shadow/canary alias whose owning rollout run is still RUNNING after this many "
        "seconds is taken as left by a killed process and cleared"))


class RolloutContext(BaseModel):
    """Identity of one rollout: family, store and the parent MLflow run."""

    tracking: Tracking
    family: str
    implementation: str
    backend: str
    rollout_run_id: str
    work_dir: Path


class RolloutOutcome(BaseModel):
    """How a rollout ended (also the Prefect markdown artifact and the CLI's output)."""

    family: str
    version: str | None = None
    result: Literal["promoted", "rejected", "rolled_back", "failed", "built", "evaluated"]
    stage: str = Field(description="the stage that decided the result")
    reason: str
    decision_summary: str | None = None
    not_assessed_note: str | None = None
    aliases: dict[str, str] = Field(default_factory=dict)
    rollout_run_id: str
    tracking_uri: str
    ui_command: str

    def markdown(self) -> str:
        """A short markdown summary for the Prefect UI."""
        lines = [
            f"# kernelgate rollout: {self.family} v{self.version or '-'} — **{self.result}**",
            "",
            f"* decided at stage: `{self.stage}`",
            f"* reason: {self.reason}",
        ]
        if self.decision_summary:
            lines.append(f"* gate: {self.decision_summary}")
        if self.not_assessed_note and self.not_assessed_note not in (self.decision_summary or ""):
            lines.append(f"* not assessed: {self.not_assessed_note}")
        lines += [
            f"* aliases now: `{self.aliases}`",
            f"* MLflow rollout run: `{self.rollout_run_id}` ({self.tracking_uri})",
            f"* open the MLflow UI: `{self.ui_command}`",
        ]
        return "\n".join(lines)


# --- opening ---------------------------------------------------------------------------


def candidate_implementation(implementation: str, backend: str) -> str:
    """The registry name to roll out (``auto``: the native flash kernel of ``backend``).

    Raises:
        ValueError: unknown implementation.
    """
    name = NATIVE_FAMILY.get(backend, "pallas_tpu") if implementation == "auto" else implementation
    if name not in kernels.IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {name!r}; choose one of "
                         f"{sorted(kernels.IMPLEMENTATIONS)} or 'auto'")
    return name


def open_rollout(settings: RolloutSettings, *, stage: tags.Stage = "rollout",
                 family: str | None = None, clear_stale_aliases: bool = False) -> RolloutContext:
    """Start the parent MLflow run and tag it with the environment.

    With ``clear_stale_aliases`` (a new rollout), a ``shadow``/``canary`` alias left by a
    rollout that did not finish is cleared and its version tagged with why. An alias
    whose owning rollout run is still RUNNING and younger than
    ``settings.stale_alias_after_s`` is left alone (that rollout is live).

    Raises:
        ValueError: unknown implementation.
    """
    backend = kernels.default_backend()
    implementation = candidate_implementation(settings.implementation, backend)
    family = family or settings.family or implementation
    tracking = (tr.default_tracking() if os.environ.get("MLFLOW_TRACKING_URI")
                else tr.local_tracking(settings.store_dir))
    run_id = tr.start_run(tracking, family, stage, run_name=f"{stage}-{implementation}")
    tr.set_tags(tracking, run_id, collect_environment(PROJECT_DIR).as_tags())
    work_dir = settings.store_dir / "runs" / run_id
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = RolloutContext(tracking=tracking, family=family, implementation=implementation,
                         backend=backend, rollout_run_id=run_id, work_dir=work_dir.resolve())
    if clear_stale_aliases:
        for alias in ("canary", "shadow"):
            _clear_if_stale(ctx, alias, settings.stale_alias_after_s)
    return ctx


def _clear_if_stale(ctx: RolloutContext, alias: str, lease_s: float) -> None:
    version = registry.alias_version(ctx.tracking, ctx.family, alias)
    if version is None:
        return
    owner = version_tags(ctx, version).get(OWNER_TAG.format(alias=alias))
    if owner:
        run = ctx.tracking.client().get_run(owner)
        age_s = time.time() - run.info.start_time / 1000
        if run.info.status == "RUNNING" and age_s < lease_s:
            logger.info("%s alias (v%s) belongs to rollout run %s, still running: left alone",
                        alias, version, owner)
            return
    reason = (f"left by rollout run {owner or '(unknown)'}, which did not finish; cleared by "
              f"{ctx.rollout_run_id}")
    registry.clear_stale(ctx.tracking, ctx.family, alias, reason=reason)
    logger.warning("cleared stale %s alias (was v%s): %s", alias, version, reason)
    change = registry.AliasChange(family=ctx.family, alias=alias, version=None,
                                  previous_version=version, at=datetime.now(UTC),
                                  action="clear", reason=reason)
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)


def version_tags(ctx: RolloutContext, version: str) -> dict[str, str]:
    """The tags of one model version of this rollout's family."""
    return registry.version_tags(ctx.tracking, ctx.family, version)


def tag_version(ctx: RolloutContext, version: str, values: dict[str, str]) -> None:
    """Set tags on one model version of this rollout's family."""
    registry.tag_version(ctx.tracking, ctx.family, version, values)


def preregister_thresholds(ctx: RolloutContext, thresholds_path: Path) -> Registration:
    """Freeze the thresholds file in MLflow before anything is evaluated.

    Raises:
        ValueError: the file does not parse against the thresholds schema.
    """
    registration = preregister(thresholds_path, tracking=ctx.tracking, family=ctx.family,
                               parent_run_id=ctx.rollout_run_id)
    tr.set_tags(ctx.tracking, ctx.rollout_run_id, {tags.REGISTRATION_ID: registration.registration_id})
    return registration


# --- build -----------------------------------------------------------------------------

BUILD_SHAPES = ExampleShapes(batch=1, q_len=256, kv_len=256, num_heads=4, num_kv_heads=2,
                             head_dim=128)
"""The example shapes a build is compiled and exported for (GQA, head_dim 128)."""


def build_candidate(ctx: RolloutContext, config: kernels.BlockSizes | None) -> tuple[str, str]:
    """Compile and export the candidate, log the build run, register a model version.

    Returns:
        ``(build_run_id, version)``.
    """
    out = ctx.work_dir / "build"
    with tr.stage_run(ctx.tracking, ctx.family, "build", parent_run_id=ctx.rollout_run_id,
                      run_name=f"build-{ctx.implementation}") as run_id:
        build = kernels.build(ctx.implementation, config, BUILD_SHAPES,
                              causal=False, dtype="bfloat16", output_dir=out)
        tr.log_params(ctx.tracking, run_id, {"implementation": ctx.implementation,
                                             "config": (config.model_dump() if config else "default")})
        tr.set_tags(ctx.tracking, run_id, {
            **collect_environment(PROJECT_DIR).as_tags(),
            **{f"kernelgate.source_sha256/{name}": digest
               for name, digest in build.source_files.items()},
        })
        if build.local is not None:
            client = ctx.tracking.client()
            client.log_metric(run_id, "build.compile_time_s", build.local.compile_time_s)
            if build.local.memory.temp_bytes is not None:
                client.log_metric(run_id, "build.temp_bytes", build.local.memory.temp_bytes)
        tr.log_directory(ctx.tracking, run_id, out, "build")
    version = registry.register_build(ctx.tracking, ctx.family, run_id, artifact_path="build")
    tag_version(ctx, version, {IMPLEMENTATION_TAG: ctx.implementation,
                               CONFIG_TAG: config.model_dump_json() if config else "null"})
    logger.info("built %s: build run %s, registered as v%s", ctx.implementation, run_id, version)
    return run_id, version


# --- evaluation ------------------------------------------------------------------------


def testset_profile(settings: RolloutSettings, backend: str) -> str:
    """The test-set profile: ``ci`` on a CPU host, ``gpu`` on an accelerator, unless set."""
    return settings.testset_profile if settings.testset_profile != "auto" else (
        "ci" if backend == "cpu" else "gpu")


def prepare_testset(settings: RolloutSettings, backend: str, model=None) -> Path:
    """The test-set folder, built (content-addressed, deterministic) when missing."""
    from evaluation.testset import build_testset

    profile = testset_profile(settings, backend)
    folder = settings.testset_dir or settings.store_dir / "testsets" / profile
    if not (folder / "manifest.json").exists():
        logger.info("building the %s test set in %s", profile, folder)
        build_testset(folder, profile=profile, documents_dir=settings.documents_dir, model=model)
    return folder


def version_kernel(ctx: RolloutContext, version: str) -> tuple[str, kernels.BlockSizes | None]:
    """``(implementation, block sizes)`` a model version was built with."""
    mv_tags = version_tags(ctx, version)
    raw = mv_tags.get(CONFIG_TAG, "null")
    return mv_tags[IMPLEMENTATION_TAG], (None if raw == "null"
                                         else kernels.BlockSizes.model_validate_json(raw))


def production_implementation(ctx: RolloutContext
                              ) -> tuple[str | None, str | None, kernels.BlockSizes | None]:
    """``(version, implementation, block sizes)`` behind ``production``, or Nones."""
    version = registry.alias_version(ctx.tracking, ctx.family, "production")
    if version is None:
        return None, None, None
    return (version, *version_kernel(ctx, version))


def source_drift(ctx: RolloutContext, version: str) -> str | None:
    """Why the checked-out kernel source differs from what ``version`` was built from
    (sha256 per file, recorded on its build run), or None when it is the same.

    Serving and evaluation run kernels from the checkout, so a difference means the
    code behind an alias is not the code that was evaluated for it.
    """
    from kernels.build import source_digests

    implementation, _ = version_kernel(ctx, version)
    build_run = ctx.tracking.client().get_run(version_tags(ctx, version)[tags.BUILD_RUN_ID])
    prefix = "kernelgate.source_sha256/"
    built = {k[len(prefix):]: v for k, v in build_run.data.tags.items() if k.startswith(prefix)}
    now = source_digests(implementation)
    changed = sorted(f for f in set(built) | set(now) if built.get(f) != now.get(f))
    return f"source of v{version} changed since its build: {changed}" if changed else None


def evaluate_build(ctx: RolloutContext, settings: RolloutSettings, *, registration: Registration,
                   build_run_id: str, testset_dir: Path, implementation: str | None = None,
                   config: kernels.BlockSizes | None = None, compare_production: bool = True,
                   model=None, stage: tags.Stage = "evaluation", split: str = "heldout",
                   measure_speed: bool = True) -> tuple[EvaluationReport, str]:
    """Evaluate a build on one split (default ``heldout``) against naive (and production)
    and log the report, plots, GX validation result and test-set dataset to an
    evaluation run.

    Raises:
        FileNotFoundError: no test set in ``testset_dir``.
        ValueError: unknown implementation or split.

    Returns:
        ``(report, evaluation_run_id)``.
    """
    from evaluation.evaluate import evaluate_candidate
    from evaluation.testset import load_manifest

    implementation = implementation or ctx.implementation
    _, production, production_config = (production_implementation(ctx) if compare_production
                                         else (None, None, None))
    out = ctx.work_dir / f"{stage}-{split}"
    manifest = load_manifest(testset_dir)
    run_tags = {tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration.registration_id,
                "kernelgate.split": split}
    with tr.stage_run(ctx.tracking, ctx.family, stage, parent_run_id=ctx.rollout_run_id,
                      run_name=f"{stage}-{split}-{implementation}", run_tags=run_tags) as run_id:
        tr.log_dataset(ctx.tracking, run_id, name=f"kernelgate-testset-{manifest.profile}",
                       digest=manifest.digest, source_uri=str(Path(testset_dir).resolve()),
                       context=split)
        if model is not None:
            tr.log_dataset(ctx.tracking, run_id, name="all-MiniLM-L6-v2-weights",
                           digest=model.weights_sha256, source_uri=str(model.path),
                           context="model-weights")
            tr.set_tags(ctx.tracking, run_id, {"kernelgate.model_weights_sha256": model.weights_sha256})
        try:
            report = evaluate_candidate(implementation, testset_dir=testset_dir, out_dir=out,
                                        split=split, production=production, config=config,
                                        measure_speed=measure_speed,
                                        production_config=production_config,
                                        model=model if settings.model_check else None,
                                        repeats=settings.perf_repeats,
                                        perf_shapes=settings.perf_shapes)
        finally:
            if out.exists():
                tr.log_directory(ctx.tracking, run_id, out, "evaluation")
            tr.log_file(ctx.tracking, run_id, Path(testset_dir) / "manifest.json", "testset")
        client = ctx.tracking.client()
        for name, value in report.metrics.items():
            if math.isfinite(value):  # MLflow metrics are finite; the report keeps the rest
                client.log_metric(run_id, name, float(value))
        tr.set_tags(ctx.tracking, run_id, {
            "kernelgate.speed_assessed": str(report.speed_assessed).lower(),
            "kernelgate.evaluation_status": report.status,
            "kernelgate.production_implementation": production or "none",
        })
    return report, run_id


# --- gate ------------------------------------------------------------------------------


def gate(ctx: RolloutContext, report: EvaluationReport, *, thresholds_path: Path,
         registration: Registration, build_run_id: str,
         evaluation_run_id: str) -> tuple[GateDecision, str, Thresholds]:
    """Decide against the preregistered thresholds and log the decision.

    Raises:
        PreregistrationError: the thresholds file changed since registration, or the
            evaluation started before it.
    """
    verify_registration(registration.registration_id, thresholds_path, report.started_at,
                        tracking=ctx.tracking)
    thresholds = load_thresholds(thresholds_path)
    decision = decide(report, thresholds, registration)
    decision_run_id = log_decision(ctx.tracking, ctx.family, decision, build_run_id=build_run_id,
                                   evaluation_run_id=evaluation_run_id,
                                   parent_run_id=ctx.rollout_run_id)
    logger.info("gate: %s — %s", decision.verdict, decision.summary)
    return decision, decision_run_id, thresholds


CONFIRMATION_TAG = "kernelgate.confirmation_decision_run_id"


def confirm(ctx: RolloutContext, settings: RolloutSettings, version: str, *,
            registration: Registration, build_run_id: str, testset_dir: Path,
            config: kernels.BlockSizes | None, model=None) -> tuple[GateDecision, str]:
    """Judge the candidate once on the ``confirmation`` split, kept back until now.

    Accuracy criteria only (speed was judged on held-out data and in canary), under
    the same preregistered thresholds. The decision is logged as a gate run and linked
    from the version (``kernelgate.confirmation_decision_run_id``).

    Returns:
        ``(decision, decision_run_id)``.
    """
    report, evaluation_run_id = evaluate_build(
        ctx, settings, registration=registration, build_run_id=build_run_id,
        testset_dir=testset_dir, config=config, compare_production=False,
        model=model if settings.model_check else None, split="confirmation",
        measure_speed=False)
    verify_registration(registration.registration_id, settings.thresholds, report.started_at,
                        tracking=ctx.tracking)
    decision = decide(report, load_thresholds(settings.thresholds), registration,
                      kinds={"accuracy"})
    decision_run_id = log_decision(ctx.tracking, ctx.family, decision, build_run_id=build_run_id,
                                   evaluation_run_id=evaluation_run_id,
                                   parent_run_id=ctx.rollout_run_id)
    tag_version(ctx, version, {CONFIRMATION_TAG: decision_run_id})
    logger.info("confirmation split: %s — %s", decision.verdict, decision.summary)
    return decision, decision_run_id


def reject(ctx: RolloutContext, version: str, reason: str) -> None:
    """Record why a version stops here; aliases pointing at it are removed (rollback)."""
    tag_version(ctx, version, {REJECTION_TAG: reason})
    for alias in ("shadow", "canary"):
        if registry.alias_version(ctx.tracking, ctx.family, alias) == version:
            change = registry.rollback(ctx.tracking, ctx.family, reason=reason, alias=alias)
            log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)
    logger.warning("v%s rejected: %s", version, reason)


# --- traffic: shadow and canary --------------------------------------------------------


def endpoint_for(ctx: RolloutContext, model, alias: str, *,
                 expect_version: str | None = None) -> serving.Endpoint:
    """The serving endpoint behind an alias; ``NATIVE_BASELINE`` when the alias points
    at nothing. A source drift (``source_drift``) is logged and tagged on the run.

    Raises:
        RuntimeError: ``expect_version`` is given and the alias no longer points at it
            (another run moved it): stop rather than judge the wrong kernel.
    """
    version = registry.alias_version(ctx.tracking, ctx.family, alias)
    if expect_version is not None and version != expect_version:
        raise RuntimeError(f"{alias} alias of {ctx.family} points at v{version}, not at the "
                           f"v{expect_version} this rollout is judging; another run moved it")
    if version is None:
        return serving.Endpoint(f"{NATIVE_BASELINE} (native baseline)",
                                kernels.get_attention_fn(NATIVE_BASELINE), model)
    drift = source_drift(ctx, version)
    if drift:
        logger.warning("%s: serving from the checkout although %s", alias, drift)
        tr.set_tags(ctx.tracking, ctx.rollout_run_id, {SOURCE_DRIFT_TAG.format(alias=alias): drift})
    implementation, config = version_kernel(ctx, version)
    return serving.Endpoint(f"{implementation}@v{version}",
                            kernels.get_attention_fn(implementation, config), model)


def recorded_traffic(ctx: RolloutContext, settings: RolloutSettings, n_requests: int,
                     *, seed: int = 0) -> serving.RecordedTraffic:
    """The recorded request stream (held-out documents only), logged to the rollout run."""
    from evaluation.documents import assign_splits, load_documents

    documents = assign_splits(load_documents(settings.documents_dir))["heldout"]
    traffic = serving.record_traffic(documents, n_requests, seed=seed)
    path = traffic.write(ctx.work_dir / "traffic" / f"requests-{seed}.json")
    tr.log_file(ctx.tracking, ctx.rollout_run_id, path, "traffic")
    return traffic


def not_assessed_reasons(report: EvaluationReport) -> dict[str, str | None]:
    """Latency and memory in traffic are judged only where the candidate is native."""
    reason = None if report.speed_assessed else report.speed_not_assessed_reason
    return {"latency_not_assessed_reason": reason, "memory_not_assessed_reason": reason}


def _judge_traffic(result: serving.TrafficResult, step: CanaryStep, plan,
                   report: EvaluationReport) -> CanaryStepResult:
    judged = analyse_canary_step(
        step, result.latencies("candidate"), result.latencies("production"), result.drifts(),
        result.errors("candidate"), result.nan_count("candidate"), result.memory_start_bytes,
        result.memory_end_bytes, plan, **not_assessed_reasons(report))
    failed_production = result.errors("production")
    if failed_production:
        # Without production's outputs nothing was compared: the step cannot pass.
        breach = f"production endpoint failed {failed_production} request(s); nothing to compare"
        judged = judged.model_copy(update={"breaches": [*judged.breaches, breach], "passed": False})
    return judged


def run_shadow(ctx: RolloutContext, version: str, *, model, traffic: serving.RecordedTraffic,
               thresholds: Thresholds, report: EvaluationReport, decision_run_id: str,
               progress=None) -> CanaryStepResult:
    """Shadow stage: production serves, the candidate (alias ``shadow``) is mirrored.

    Judged with the canary plan's limits (drift, errors, NaN, latency where native).
    """
    change = registry.assign_shadow(ctx.tracking, ctx.family, version)
    tag_version(ctx, version, {OWNER_TAG.format(alias="shadow"): ctx.rollout_run_id,
                                tags.ROLLOUT_RUN_ID: ctx.rollout_run_id})
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)
    production = endpoint_for(ctx, model, "production")
    candidate = endpoint_for(ctx, model, "shadow", expect_version=version)
    # Compile both endpoints for every request size before measuring anything.
    serving.warm_up(traffic.requests, production, candidate)
    result = serving.replay_shadow(traffic.requests, production, candidate, progress=progress)
    # The candidate sees every shadow request (mirrored) but serves none of them.
    step = CanaryStep(name="shadow", traffic_fraction=1.0, requests=len(traffic.requests))
    judged = _judge_traffic(result, step, thresholds.canary, report)
    with tr.stage_run(ctx.tracking, ctx.family, "shadow", parent_run_id=ctx.rollout_run_id,
                      run_name=f"shadow-v{version}",
                      run_tags={tags.DECISION_RUN_ID: decision_run_id,
                                tags.SHADOW_PASSED: str(judged.passed).lower()}) as run_id:
        tr.log_model_json(ctx.tracking, run_id, result, "shadow/traffic.json")
        tr.log_model_json(ctx.tracking, run_id, judged, "shadow/analysis.json")
    tag_version(ctx, version, {tags.SHADOW_RUN_ID: run_id})
    logger.info("shadow: %s", serving.traffic_summary(result))
    return judged


def run_canary_step(ctx: RolloutContext, version: str, step: CanaryStep, *, model,
                    traffic: serving.RecordedTraffic, thresholds: Thresholds,
                    report: EvaluationReport, decision_run_id: str,
                    progress=None) -> CanaryStepResult:
    """One canary step: ``step.traffic_fraction`` of the step's requests served by the
    candidate (alias ``canary``), then analysed against the preregistered plan."""
    production = endpoint_for(ctx, model, "production")
    candidate = endpoint_for(ctx, model, "canary", expect_version=version)
    serving.warm_up(traffic.requests, production, candidate)
    result = serving.replay_canary_step(traffic.requests, step.traffic_fraction, production,
                                        candidate, salt=f"{ctx.rollout_run_id}:{step.name}",
                                        progress=progress)
    judged = _judge_traffic(result, step, thresholds.canary, report)
    run_id = log_canary_step(ctx.tracking, ctx.family, judged, decision_run_id=decision_run_id,
                             parent_run_id=ctx.rollout_run_id)
    runs = json.loads(version_tags(ctx, version).get(tags.CANARY_RUN_IDS, "[]"))
    tag_version(ctx, version, {tags.CANARY_RUN_IDS: json.dumps([*runs, run_id])})
    logger.info("%s: %s -> %s", step.name, serving.traffic_summary(result),
                "pass" if judged.passed else f"breach: {judged.breaches}")
    return judged


# --- approval, promotion, rollback -----------------------------------------------------


def log_approval_record(ctx: RolloutContext, record: ApprovalRecord, decision_run_id: str) -> str:
    """Log an approval, rejection or timeout; returns the approval run id."""
    return log_approval(ctx.tracking, record, decision_run_id=decision_run_id,
                        parent_run_id=ctx.rollout_run_id)


def enter_canary(ctx: RolloutContext, version: str, *, decision_run_id: str,
                 approval_run_id: str | None) -> None:
    """Point ``canary`` at ``version`` (verified decision and approval); this rollout owns it.

    Raises:
        PromotionRefused: no passing decision for this build, or a missing approval.
    """
    change = registry.assign_canary(ctx.tracking, ctx.family, version,
                                    decision_run_id=decision_run_id, approval_run_id=approval_run_id)
    tag_version(ctx, version, {OWNER_TAG.format(alias="canary"): ctx.rollout_run_id})
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)


def promote_version(ctx: RolloutContext, version: str, *, decision_run_id: str,
                    approval_run_id: str | None) -> None:
    """Move ``production`` (verified decision and approval; the version's ``shadow`` and
    ``canary`` aliases retire with it).

    Raises:
        PromotionRefused: no passing, intact decision for this build, or a missing approval.
    """
    change = registry.promote(ctx.tracking, ctx.family, version, decision_run_id=decision_run_id,
                              approval_run_id=approval_run_id)
    log_alias_change(ctx.tracking, change, parent_run_id=ctx.rollout_run_id)
    logger.info("promoted v%s to production (previous: %s)", version, change.previous_version)


def close_rollout(ctx: RolloutContext, *, result: str, stage: str, reason: str,
                  version: str | None, decision: GateDecision | None = None) -> RolloutOutcome:
    """End the parent run with the outcome and write it as a JSON artifact."""
    outcome = RolloutOutcome(
        family=ctx.family, version=version, result=result, stage=stage, reason=reason,
        decision_summary=decision.summary if decision else None,
        not_assessed_note=decision.not_assessed_note if decision else None,
        aliases=registry.aliases(ctx.tracking, ctx.family), rollout_run_id=ctx.rollout_run_id,
        tracking_uri=ctx.tracking.tracking_uri,
        ui_command=(f"{Path(sys.prefix) / 'bin' / 'mlflow'} ui --backend-store-uri "
                    f"{ctx.tracking.tracking_uri}"),
    )
    tr.log_model_json(ctx.tracking, ctx.rollout_run_id, outcome, "rollout/outcome.json")
    tr.set_tags(ctx.tracking, ctx.rollout_run_id, {"kernelgate.result": result,
                                                   "kernelgate.decided_at_stage": stage,
                                                   "mlflow.note.content": reason})
    tr.end_run(ctx.tracking, ctx.rollout_run_id, "FINISHED" if result != "failed" else "FAILED")
    return outcome
