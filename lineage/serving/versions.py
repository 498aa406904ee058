"""Versions that serve: each build logged as an MLflow model and registered.

At build time :func:`log_version_model` saves the build as a pyfunc model
(``lineage.model.KernelgateEncoder``) with its code snapshot, block config, exported
artifacts, weights reference, signature, input example and pinned requirements, and
logs it as the artifact folder ``model/`` of the build run (every file's sha256
recorded); the registered version's source is ``runs:/<build run>/model``, so
``models:/kernelgate-<family>@<alias>`` loads the thing itself.

:mod:`lineage.serving.version_runners` runs a registered version's own code.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema, TensorSpec
from pydantic import BaseModel, Field

from evaluation.model import MiniLM
from kernels.build import KernelBuild
from kernels.shapes import AttentionShape
from lineage import model as version_model
from lineage.aliases import registered_model
from lineage.log.log_writer import append
from lineage.serving import model_files, tiling
from lineage.signing.attestations import AttestationError, Signing
from lineage.signing.sources import EvidenceSource, signed_artifact
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

MODEL_ARTIFACT = "model"
KERNEL_JSON = f"{MODEL_ARTIFACT}/artifacts/kernel.json"
INPUT_EXAMPLE = ["Flash attention computes exact attention by tiling.",
                 "A release manager approves the canary."]
SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string", "text")]),
                           outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, 384))]))

"""What serves when a family has no ``production`` version (the recovery target of a
rollback with no earlier production): XLA's attention, native on every backend and
able to run every dtype and shape the serving model uses (cuDNN, for one, refuses
the model's float32)."""


class LoggedModel(BaseModel):
    """What :func:`log_version_model` logged: where, its code identity, its cost."""

    artifact_path: str
    code_sha256: str
    files: int
    size_bytes: int
    seconds: float
    manifest: dict[str, str] = Field(
        default_factory=dict, description="every file of the model folder -> sha256 (signed "
        "in the build as ``model_files``; ``lineage.serving.model_files``)")


def _requirements() -> list[str]:
    # Pinned to what built the version: a load under another JAX says so (describe()).
    pins = ["jax", "jaxlib", "numpy", "pandas", "safetensors", "tokenizers", "pydantic",
            version_model.WEIGHTS_PACKAGE]
    out = [f"{name}=={importlib.metadata.version(name)}" for name in pins]
    mlflow_dist = "mlflow" if _installed("mlflow") else "mlflow-skinny"
    return [*out, f"{mlflow_dist}=={importlib.metadata.version(mlflow_dist)}"]


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def this_process_code() -> tuple[str, dict[str, str]]:
    """``(code digest, file digests)`` of the snapshot files this process runs."""
    files = version_model.snapshot_digests(version_model.loaded_code_root())
    return version_model.code_digest(files), files


def log_version_model(tracking: Tracking, run_id: str, build: KernelBuild, build_dir: Path,
                      encoder: MiniLM) -> LoggedModel:
    """Save ``build`` as a pyfunc model and log it under ``model/`` of the build run.

    Raises:
        importlib.metadata.PackageNotFoundError: the weights package is not installed.
    """
    start = time.perf_counter()
    code_sha256, code_files = this_process_code()
    root = version_model.loaded_code_root()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        staged = tmp / "code"
        for name, path in version_model.snapshot_files(root).items():
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, staged / name)
        kernel = {"implementation": build.implementation,
                  "config": serving_config(build),
                  "build_config": build.config.model_dump() if build.config else None,
                  "jax_version": build.jax_version, "jaxlib_version": build.jaxlib_version,
                  "source_sha256": build.source_sha256, "code_sha256": code_sha256,
                  "code_files": code_files, "third_party": build.third_party}
        weights = {"package": version_model.WEIGHTS_PACKAGE,
                   "version": importlib.metadata.version(version_model.WEIGHTS_PACKAGE),
                   "sha256": encoder.weights_sha256, "file": "model/model.safetensors",
                   "size_bytes": (encoder.path / "model.safetensors").stat().st_size}
        (tmp / "kernel.json").write_text(json.dumps(kernel, indent=2))
        (tmp / "weights.json").write_text(json.dumps(weights, indent=2))
        out = tmp / MODEL_ARTIFACT
        mlflow.pyfunc.save_model(
            str(out), python_model=version_model.KernelgateEncoder(),
            code_paths=[str(staged / package) for package in version_model.SNAPSHOT_PACKAGES],
            artifacts={version_model.KERNEL_ARTIFACT: str(tmp / "kernel.json"),
                       version_model.WEIGHTS_ARTIFACT: str(tmp / "weights.json"),
                       version_model.BUILD_ARTIFACT: str(build_dir)},
            signature=SIGNATURE, input_example=pd.DataFrame({"text": INPUT_EXAMPLE}),
            pip_requirements=_requirements())
        files = [p for p in out.rglob("*") if p.is_file()]
        manifest = model_files.folder_manifest(out)
        tr.log_directory(tracking, run_id, out, MODEL_ARTIFACT)
        size = sum(p.stat().st_size for p in files)
    return LoggedModel(artifact_path=MODEL_ARTIFACT, code_sha256=code_sha256, files=len(files),
                       size_bytes=size, seconds=time.perf_counter() - start, manifest=manifest)


def serving_config(build: KernelBuild) -> dict | None:
    """The block sizes the version serves with: the ones asked for (``None``: the
    kernel's per-call choice, e.g. the measured GPU table for each shape). The tiling
    the build resolved for its example shape is evidence, not a setting for every
    shape: a bf16 head_dim-128 tiling does not fit a float32 call or suit a head_dim-32
    one."""
    return build.requested_config.model_dump(exclude_none=True) if build.requested_config else None


def build_params(build: KernelBuild) -> dict:
    """The params a build run logs (and its signed build vouches for)."""
    return {"implementation": build.implementation,
            "config": build.config.model_dump() if build.config else "untiled",
            "shape": build.shape.model_dump()}


def tiling_tags(build: KernelBuild, shapes: dict[str, Sequence[AttentionShape]]) -> dict[str, str]:
    """The version tags saying its tiling: the rule and, per shape of each group
    (``{"serving": [...], "benchmark": [...]}``), the block sizes it resolves to."""
    resolved = {f"{group}: {label}": blocks for group, group_shapes in shapes.items()
                for label, blocks in tiling.resolved_tiling(
                    build.implementation, build.requested_config, group_shapes).items()}
    return {tags.TILING_RULE: tiling.tiling_rule(build.implementation, build.requested_config),
            tags.TILING: json.dumps(resolved)}


def register_version(tracking: Tracking, family: str, run_id: str, build: KernelBuild,
                     logged: LoggedModel, signing: Signing,
                     run_tags: dict[str, str] | None = None,
                     shapes: dict[str, Sequence[AttentionShape]] | None = None) -> str:
    """Register the logged model as a version and sign the ``build`` attestation: its
    subjects are every file of the build run (the model's code included), its predicate
    what serves, the version number, every file of the model folder by sha256
    (``model_files``, checked wherever the version is loaded: ``lineage.serving.model_files``)
    and the build run's ``run_tags`` (environment and code facts the UI shows, which the
    audit compares). Returns the version."""
    config = serving_config(build)
    tiled = tiling_tags(build, shapes) if shapes else {}
    version = registered_model.register_build(tracking, family, run_id,
                                      implementation=build.implementation,
                                      config=build.requested_config,
                                      artifact_path=logged.artifact_path, extra_tags=tiled)
    append(tracking, run_id, "build", {
        "family": family, "version": version, "build_run_id": run_id,
        "implementation": build.implementation, "config": config,
        "build_config": build.config.model_dump() if build.config else None,
        "shape": build.shape.model_dump(), "source_sha256": build.source_sha256,
        "code_sha256": logged.code_sha256, "jax_version": build.jax_version,
        "jaxlib_version": build.jaxlib_version, "third_party": build.third_party,
        "model_artifact": logged.artifact_path,
        "params": {k: str(v) for k, v in tr.flat_params(build_params(build)).items()},
        "version_tags": {tags.IMPLEMENTATION: build.implementation,
                         tags.CONFIG: json.dumps(config), **tiled},
        "model_files": logged.manifest, "tags": dict(run_tags or {})},
        signing)
    return version


def recorded_kernel(source: EvidenceSource, version: str) -> dict:
    """The version's ``kernel.json`` (implementation, resolved config, code digest, JAX
    it was built with), read from its model and checked against the signed build — never
    from an editable tag.

    Raises:
        AttestationError: no signed build for the version, or the file was altered.
    """
    builds = [a for a in source.attestations()
              if a.kind == "build" and str(a.predicate.get("version")) == str(version)]
    if not builds:
        raise AttestationError(f"v{version} of {source.family} has no signed build")
    _, data = signed_artifact(source, builds[0].run_id, "build", KERNEL_JSON)
    return json.loads(data)
