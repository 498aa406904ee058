"""MLflow tracking helpers: store location, one experiment per kernel family, stage runs,
artifacts with recorded sha256, dataset inputs.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<project>/.kernelgate/mlflow.db``
with artifacts under ``<project>/.kernelgate/mlartifacts`` (``<project>`` = the working
directory). The registry uses the same URI.

Runs are created through :class:`mlflow.MlflowClient` (never the fluent ``mlflow.start_run``
global), so several stage runs can be open at once and nothing depends on process state.
Each run gets ``kernelgate.stage`` and ``kernelgate.family`` tags and, when given, the
parent rollout run (``mlflow.parentRunId``), so a rollout reads as one tree in the UI.
Every artifact logged here records its sha256 as the tag ``kernelgate.sha256/<path>``
(:mod:`lineage.store.tags`); :mod:`lineage.audit.audit` re-verifies them. Log artifacts only through
these helpers: an artifact without a recorded digest fails the audit.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from kernels.errors import KernelgateError
from lineage.store import tags
from lineage.store.names import experiment_name  # noqa: F401 - re-exported for callers
from lineage.store.ownership import refusing_squatted
from lineage.store.store import (  # noqa: F401 - re-exported: the store's location and client
    STORE_DIR,
    StoreUnreachable,
    Tracking,
    check_reachable,
    default_tracking,
    local_tracking,
    tracking_for,
)
from lineage.store.tags import Stage


def ensure_experiment(tracking: Tracking, family: str) -> str:
    """Return the id of the family's experiment, creating it on first use."""
    client = tracking.client()
    name = experiment_name(family)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        if tags.EXPERIMENT_KIND not in existing.tags:  # made before the tag was set
            client.set_experiment_tag(existing.experiment_id, tags.EXPERIMENT_KIND,
                                      tags.CLASSIC_EXPERIMENT)
        return existing.experiment_id
    location = f"{tracking.artifact_root.rstrip('/')}/{name}" if tracking.artifact_root else None
    return client.create_experiment(name, artifact_location=location,
                                    tags={tags.FAMILY: family,
                                          tags.EXPERIMENT_KIND: tags.CLASSIC_EXPERIMENT})


def start_run(
    tracking: Tracking,
    family: str,
    stage: Stage,
    *,
    parent_run_id: str | None = None,
    run_name: str | None = None,
    run_tags: Mapping[str, str] | None = None,
) -> str:
    """Create a run in the family's experiment and return its id (status RUNNING).

    Raises:
        lineage.store.ownership.FamilyOwnedElsewhere: another account owns the experiment.
    """
    all_tags = {tags.STAGE: stage, tags.FAMILY: family, **(run_tags or {})}
    if parent_run_id:
        all_tags[tags.PARENT] = parent_run_id
    with refusing_squatted(tracking, family, "create a run"):
        run = tracking.client().create_run(
            ensure_experiment(tracking, family), run_name=run_name or stage, tags=all_tags
        )
    return run.info.run_id


def end_run(tracking: Tracking, run_id: str, status: str = "FINISHED") -> None:
    """Terminate a run (``FINISHED``, ``FAILED`` or ``KILLED``)."""
    RunStatus.from_string(status)  # raises on an unknown status
    tracking.client().set_terminated(run_id, status=status)


@contextlib.contextmanager
def stage_run(
    tracking: Tracking,
    family: str,
    stage: Stage,
    *,
    parent_run_id: str | None = None,
    run_name: str | None = None,
    run_tags: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Context manager around :func:`start_run`: yields the run id, ends FINISHED or FAILED."""
    run_id = start_run(
        tracking, family, stage, parent_run_id=parent_run_id, run_name=run_name, run_tags=run_tags
    )
    try:
        yield run_id
    except BaseException:
        end_run(tracking, run_id, "FAILED")
        raise
    end_run(tracking, run_id, "FINISHED")


BATCH_SIZE = 100
"""Entries per ``MlflowClient.log_batch`` call: MLflow takes at most 100 params and 100 tags
(1000 entities) in one batch (``mlflow.utils.validation``)."""


def _log_batched(tracking: Tracking, run_id: str, field: str, items: list) -> None:
    client = tracking.client()
    for start in range(0, len(items), BATCH_SIZE):
        client.log_batch(run_id, **{field: items[start:start + BATCH_SIZE]})


def set_tags(tracking: Tracking, run_id: str, values: Mapping[str, Any]) -> None:
    """Set run tags (values stringified), in batches of :data:`BATCH_SIZE`: one store
    transaction (or one request to a tracking server) per batch rather than per tag."""
    _log_batched(tracking, run_id, "tags", [RunTag(k, str(v)) for k, v in values.items()])


def log_metrics(tracking: Tracking, run_id: str, values: Mapping[str, float]) -> None:
    """Log metrics (step 0, one timestamp) in batches of :data:`BATCH_SIZE`.

    Raises:
        mlflow.exceptions.MlflowException: a value is not a number (MLflow's check).
    """
    now = int(time.time() * 1000)
    _log_batched(tracking, run_id, "metrics",
                 [Metric(k, float(v), now, 0) for k, v in values.items()])


def log_params(tracking: Tracking, run_id: str, params: BaseModel | Mapping[str, Any]) -> None:
    """Log a flat view of a config (pydantic model or mapping) as run params, in batches
    of :data:`BATCH_SIZE`. Nested fields become dotted names (``block_sizes.block_q``)."""
    _log_batched(tracking, run_id, "params",
                 [Param(k, str(v)) for k, v in flat_params(params).items()])


def flat_params(params: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """The names and values :func:`log_params` logs for ``params``."""
    data = params.model_dump(mode="json") if isinstance(params, BaseModel) else dict(params)
    return _flatten(data)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _check_artifact_path(artifact_path: str) -> str:
    path = PurePosixPath(artifact_path)
    if path.is_absolute() or ".." in path.parts or not path.name or str(path) != artifact_path:
        raise ValueError(f"artifact path must be a normalised relative path, got {artifact_path!r}")
    return artifact_path


def log_bytes(tracking: Tracking, run_id: str, data: bytes, artifact_path: str) -> str:
    """Log ``data`` as the artifact ``artifact_path`` and record its sha256; returns the digest."""
    path = PurePosixPath(_check_artifact_path(artifact_path))
    digest = hashlib.sha256(data).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / path.name
        local.write_bytes(data)
        parent = str(path.parent) if str(path.parent) != "." else None
        tracking.client().log_artifact(run_id, str(local), artifact_path=parent)
    tracking.client().set_tag(run_id, tags.DIGEST_PREFIX + artifact_path, digest)
    return digest


def log_text(tracking: Tracking, run_id: str, text: str, artifact_path: str) -> str:
    """Log UTF-8 text as an artifact (see :func:`log_bytes`); returns the sha256."""
    return log_bytes(tracking, run_id, text.encode("utf-8"), artifact_path)


def log_model_json(tracking: Tracking, run_id: str, model: BaseModel, artifact_path: str) -> str:
    """Log a pydantic model as indented JSON (see :func:`log_bytes`); returns the sha256."""
    return log_text(tracking, run_id, model.model_dump_json(indent=2), artifact_path)


def log_file(
    tracking: Tracking, run_id: str, local_path: str | Path, artifact_dir: str | None = None
) -> str:
    """Log a local file under ``artifact_dir`` (keeping its name); returns the artifact path.

    Raises:
        FileNotFoundError: ``local_path`` is not a file.
    """
    local = Path(local_path)
    if not local.is_file():
        raise FileNotFoundError(f"not a file: {local}")
    artifact_path = f"{artifact_dir.strip('/')}/{local.name}" if artifact_dir else local.name
    log_bytes(tracking, run_id, local.read_bytes(), artifact_path)
    return artifact_path


def log_directory(
    tracking: Tracking, run_id: str, local_dir: str | Path, artifact_dir: str
) -> list[str]:
    """Log every file below ``local_dir`` under ``artifact_dir``; returns the artifact paths."""
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    prefix = _check_artifact_path(artifact_dir.strip("/"))
    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # The bytes hashed are the bytes logged: each file is read once, hashed, and
        # written to a private copy, which goes to the store in one log_artifacts call;
        # the digests follow in tag batches (:func:`set_tags`).
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = file.relative_to(root).as_posix()
            data = file.read_bytes()
            digests[_check_artifact_path(f"{prefix}/{rel}")] = hashlib.sha256(data).hexdigest()
            copy = Path(tmp) / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(data)
        if digests:
            tracking.client().log_artifacts(run_id, tmp, artifact_path=prefix)
    set_tags(tracking, run_id, {tags.DIGEST_PREFIX + path: d for path, d in digests.items()})
    return list(digests)


def recorded_digests(tracking: Tracking, run_id: str) -> dict[str, str]:
    """Artifact path -> sha256 recorded when each artifact was logged."""
    run_tags = tracking.client().get_run(run_id).data.tags
    n = len(tags.DIGEST_PREFIX)
    return {k[n:]: v for k, v in run_tags.items() if k.startswith(tags.DIGEST_PREFIX)}


def list_artifact_files(tracking: Tracking, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of a run (recursive), as artifact paths."""
    files: list[str] = []
    for info in tracking.client().list_artifacts(run_id, path):
        if info.is_dir:
            files.extend(list_artifact_files(tracking, run_id, info.path))
        else:
            files.append(info.path)
    return sorted(files)


def read_artifact(tracking: Tracking, run_id: str, artifact_path: str) -> bytes:
    """The bytes of one artifact as stored now.

    Raises:
        mlflow.exceptions.MlflowException / OSError: no such artifact.
    """
    with tempfile.TemporaryDirectory() as tmp:
        local = tracking.client().download_artifacts(run_id, artifact_path, dst_path=tmp)
        return Path(local).read_bytes()


def log_dataset(
    tracking: Tracking,
    run_id: str,
    *,
    name: str,
    digest: str,
    source_uri: str,
    context: str,
) -> None:
    """Record a dataset input (``mlflow.log_input`` semantics) by name, digest and source.

    ``context`` is the split or role (``heldout``, ``confirmation``, ``weights``); it is
    stored as the standard ``mlflow.data.context`` input tag. The dataset itself is not
    copied: content addressing makes the digest the identity. MLflow caps a dataset
    digest at 36 characters, so the dataset carries the sha256's first 32 hex digits
    and the full digest goes to the input tag ``kernelgate.sha256``.
    """
    with warnings.catch_warnings():
        # several artifact-repository sources claim file:// URIs; any of them serialises the same
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(source_uri)
    dataset = MetaDataset(source=source, name=name, digest=digest[:MLFLOW_DIGEST_CHARS])
    tracking.client().log_inputs(
        run_id,
        datasets=[
            DatasetInput(
                dataset._to_mlflow_entity(),
                tags=[InputTag(tags.DATASET_CONTEXT, context), InputTag(tags.DATASET_SHA256, digest)],
            )
        ],
    )


MLFLOW_DIGEST_CHARS = 32


def dataset_facts(run) -> list[dict[str, str]]:
    """The dataset inputs an MLflow run shows (``run.inputs``), as a signed predicate
    lists them: name, digest, source, context and full sha256, sorted."""
    out = []
    for item in (run.inputs.dataset_inputs if run.inputs else []):
        input_tags = {t.key: t.value for t in item.tags}
        out.append({"name": item.dataset.name, "digest": item.dataset.digest,
                    "source": item.dataset.source,
                    "context": input_tags.get(tags.DATASET_CONTEXT, ""),
                    "sha256": input_tags.get(tags.DATASET_SHA256, "")})
    return sorted(out, key=lambda d: (d["context"], d["name"], d["digest"]))


class ArtifactIntegrityError(KernelgateError, RuntimeError):
    """An artifact is missing, has no recorded sha256, or no longer matches it."""


def read_verified_artifact(tracking: Tracking, run_id: str, artifact_path: str) -> bytes:
    """The artifact's bytes, after checking them against the sha256 recorded at logging.

    Raises:
        ArtifactIntegrityError: no recorded digest, unreadable artifact, or a mismatch.
    """
    expected = recorded_digests(tracking, run_id).get(artifact_path)
    if expected is None:
        raise ArtifactIntegrityError(f"run {run_id}: no sha256 recorded for {artifact_path!r}")
    try:
        data = read_artifact(tracking, run_id, artifact_path)
    except (MlflowException, OSError) as exc:
        raise ArtifactIntegrityError(
            f"run {run_id}: artifact {artifact_path!r} unreadable"
        ) from exc
    if hashlib.sha256(data).hexdigest() != expected:
        raise ArtifactIntegrityError(
            f"run {run_id}: artifact {artifact_path!r} does not match its recorded sha256"
        )
    return data
