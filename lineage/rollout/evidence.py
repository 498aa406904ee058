"""The measured evidence of a rollout as MLflow runs: the build and the evaluations.

* build run (stage ``build``): params (implementation, resolved block sizes), environment
  tags, one ``kernelgate.source_sha256/<file>`` tag per kernels-package file, the code
  digest of the version's snapshot, compile metrics, the build folder
  (``kernel_build.json``, the ``jax.export`` artifacts) under ``build/``, and the version
  as an MLflow model under ``model/``;
* evaluation run (stage ``evaluation``): links to the build and the registration, the
  split, the test-set and weights dataset inputs, the report, plots and GX result under
  ``evaluation/``, the test-set manifest under ``testset/``, and the report's finite
  metrics.

Every artifact is logged through :mod:`lineage.store.tracking`, so its sha256 is recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from evaluation.model import MiniLM
from evaluation.report import REPORT_FILENAME, EvaluationReport
from evaluation.testset import MANIFEST_FILE, load_manifest
from kernels.build import KernelBuild
from kernels.shapes import AttentionShape
from lineage.log.log_writer import append
from lineage.records.environment import collect_environment
from lineage.rollout.rollout import PROJECT_DIR, RolloutRecord
from lineage.serving.versions import LoggedModel, build_params, log_version_model, register_version
from lineage.store import tags
from lineage.store import tracking as tr


def serving_shapes(encoder: MiniLM) -> list[AttentionShape]:
    """The attention shapes the serving model calls: one request (batch 1) at each length
    bucket, its heads and head_dim, in its attention dtype."""
    from evaluation.model import LENGTH_BUCKETS

    cfg = encoder.config
    return [AttentionShape(batch=1, q_len=n, kv_len=n, num_heads=cfg.num_heads,
                           num_kv_heads=cfg.num_heads, head_dim=cfg.head_dim,
                           dtype=cfg.attention_dtype, causal=False) for n in LENGTH_BUCKETS]


def log_build(record: RolloutRecord, build: KernelBuild, build_dir: Path,
              encoder: MiniLM, bench_shapes: Sequence[AttentionShape] = (),
              before_signing: Callable[[str], object] | None = None
              ) -> tuple[str, str, LoggedModel]:
    """Log a finished build as a ``build`` run of the rollout, with the build as an
    MLflow model of what serves (``lineage.serving.versions.log_version_model``), register it
    as a model version, and sign a ``build`` attestation (subjects: every file of the
    run, the model's code included; predicate: what serves and its version number).
    ``before_signing(run_id)`` logs what else the build vouches for (a dispatch
    build's policy: ``lineage.records.dispatch_record.log_policy``) before it is signed.
    Returns ``(run id, version, what was logged)``."""
    with tr.stage_run(record.tracking, record.family, "build",
                      parent_run_id=record.rollout_run_id,
                      run_name=f"build-{build.implementation}") as run_id:
        tr.log_params(record.tracking, run_id, build_params(build))
        run_tags = {
            **collect_environment(PROJECT_DIR).as_tags(),
            tags.SOURCE_SHA256: build.source_sha256,
            **{tags.SOURCE_FILE_PREFIX + name: digest
               for name, digest in build.source_files.items()},
        }
        tr.set_tags(record.tracking, run_id, run_tags)
        client = record.tracking.client()
        if build.local is not None:
            client.log_metric(run_id, "build.compile_time_s", build.local.compile_time_s)
            if build.local.memory.temp_bytes is not None:
                client.log_metric(run_id, "build.temp_bytes", build.local.memory.temp_bytes)
        tr.log_directory(record.tracking, run_id, build_dir, "build")
        if before_signing is not None:
            before_signing(run_id)
        logged = log_version_model(record.tracking, run_id, build, build_dir, encoder)
        client.log_metric(run_id, "model.log_seconds", logged.seconds)
        client.log_metric(run_id, "model.size_bytes", logged.size_bytes)
        tr.set_tags(record.tracking, run_id, {tags.CODE_SHA256: logged.code_sha256})
        version = register_version(record.tracking, record.family, run_id, build, logged,
                                   record.signing,
                                   run_tags={**run_tags, tags.CODE_SHA256: logged.code_sha256},
                                   shapes={"serving": serving_shapes(encoder),
                                           "benchmark": list(bench_shapes)})
    return run_id, version, logged


@contextlib.contextmanager
def evaluation_run(record: RolloutRecord, *, build_run_id: str, registration_id: str,
                   split: str, implementation: str) -> Iterator[str]:
    """An ``evaluation`` run of the rollout, open while the evaluation runs (the audit
    checks that the registration predates its creation); yields the run id."""
    run_tags = {tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration_id,
                tags.SPLIT: split}
    with tr.stage_run(record.tracking, record.family, "evaluation",
                      parent_run_id=record.rollout_run_id,
                      run_name=f"evaluation-{split}-{implementation}",
                      run_tags=run_tags) as run_id:
        yield run_id


def log_evaluation_inputs(record: RolloutRecord, run_id: str, *, testset_dir: Path, split: str,
                          model: MiniLM | None) -> None:
    """The test set (by digest) and the model weights as dataset inputs of the run."""
    manifest = load_manifest(testset_dir)
    source = str(Path(testset_dir).resolve())
    # MLflow keeps one dataset entity per (name, digest) with the first source it saw;
    # the source in the name makes a copy read from another folder a dataset of its own.
    where = hashlib.sha256(source.encode()).hexdigest()[:8]
    tr.log_dataset(record.tracking, run_id, name=f"kernelgate-testset-{manifest.profile}@{where}",
                   digest=manifest.digest, source_uri=source, context=split)
    if model is not None:
        tr.log_dataset(record.tracking, run_id, name="all-MiniLM-L6-v2-weights",
                       digest=model.weights_sha256, source_uri=str(model.path),
                       context="model-weights")
        tr.set_tags(record.tracking, run_id, {tags.MODEL_WEIGHTS_SHA256: model.weights_sha256})
        tr.set_tags(record.tracking, run_id, {tags.MODEL_WEIGHTS_PREFIX + k: v
                                              for k, v in model.weights_facts().items()})


def log_evaluation_files(record: RolloutRecord, run_id: str, *, out_dir: Path,
                         testset_dir: Path) -> None:
    """Whatever the evaluation wrote (report, plots, GX result) and the test-set manifest.
    Called also when the evaluation failed, so partial evidence is kept (and the run
    ends FAILED)."""
    if out_dir.exists():
        tr.log_directory(record.tracking, run_id, out_dir, "evaluation")
    tr.log_file(record.tracking, run_id, Path(testset_dir) / MANIFEST_FILE, "testset")


def log_evaluation_result(record: RolloutRecord, run_id: str, report: EvaluationReport,
                          *, build_run_id: str, registration_id: str, version: str | None,
                          production_implementation: str | None) -> None:
    """The report's finite metrics (MLflow metrics must be finite; the report JSON keeps
    the rest) and its status tags, then the signed ``evaluation`` attestation: subjects
    every file the run holds (report, plots, GX result, manifest), predicate the metrics
    and tags MLflow shows, so an edit to either is caught."""
    client = record.tracking.client()
    metrics = {name: float(value) for name, value in report.metrics.items()
               if math.isfinite(value)}
    tr.log_metrics(record.tracking, run_id, metrics)
    run_tags = {tags.SPEED_ASSESSED: str(report.speed_assessed).lower(),
                tags.EVALUATION_STATUS: report.status,
                tags.PRODUCTION_IMPLEMENTATION: production_implementation or "none",
                tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration_id,
                tags.SPLIT: report.split}
    tr.set_tags(record.tracking, run_id, run_tags)
    append(record.tracking, run_id, "evaluation", {
        "family": record.family, "version": version, "build_run_id": build_run_id,
        "registration_id": registration_id, "split": report.split,
        "split_digest": report.split_digest, "testset_digest": report.testset_digest,
        "started_at": report.started_at.isoformat(), "status": report.status,
        "speed_assessed": report.speed_assessed, "metrics": metrics,
        "report_artifact": f"evaluation/{REPORT_FILENAME}", "tags": run_tags,
        "datasets": tr.dataset_facts(client.get_run(run_id))},
        record.signing)


def log_traffic(record: RolloutRecord, path: Path) -> None:
    """The recorded request stream of the rollout (``traffic/<file>`` on the parent run)."""
    tr.log_file(record.tracking, record.rollout_run_id, path, "traffic")
