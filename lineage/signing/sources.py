"""Where signed evidence is read from: the MLflow store (or, through the same protocol,
an exported audit bundle: :class:`lineage.audit.bundle.BundleSource`).

Everything that *reads* the record to decide something — the registry's checks before
an alias moves, the audit, the offline verification of a bundle — reads it through an
:class:`EvidenceSource`: the verified attestations of one family, the artifact bytes
they sign, and which build run each registered version points at. Only a verified
signature makes an attestation; a signed artifact is only returned when its bytes match
the signed digest.
"""

from __future__ import annotations

import hashlib
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

from lineage.signing.attestations import (
    ATTESTATION_DIR,
    Attestation,
    AttestationError,
    TrustPolicy,
    subject_name,
    verify_envelope,
)
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking, experiment_name


class EvidenceSource(Protocol):
    """The signed record of one family, from wherever it is kept."""

    family: str
    trust: TrustPolicy

    def attestations(self) -> list[Attestation]:
        """Every verified attestation of the family."""

    def problems(self) -> list[str]:
        """Envelopes that did not verify (tampered, unsigned, revoked or untrusted keys)."""

    def deleted(self) -> set[str]:
        """Runs that exist but were deleted (soft delete): their evidence is missing."""

    def artifact(self, run_id: str, path: str) -> bytes:
        """An artifact's bytes as stored. Raises ``FileNotFoundError`` when absent."""

    def version_run(self, version: str) -> str | None:
        """The build run a registered version points at (None: no such version)."""

    def run_created(self, run_id: str) -> datetime | None:
        """When the store created a run (its own clock; None where unknown)."""

    def children(self, parent_run_id: str) -> set[str]:
        """Runs that name ``parent_run_id`` as their parent (a hint for finding them)."""


def signed_artifact(source: EvidenceSource, run_id: str, kind: str, path: str
                    ) -> tuple[Attestation, bytes]:
    """A run's newest attestation of ``kind`` and one artifact whose bytes equal the
    signed subject digest.

    Raises:
        AttestationError: no verified attestation of that kind in the run, the artifact
            is not a subject of it, missing, or its bytes differ from the signed digest.
    """
    matches = [a for a in source.attestations() if a.run_id == run_id and a.kind == kind]
    if not matches:
        gone = " (the run was deleted)" if run_id in source.deleted() else ""
        raise AttestationError(f"run {run_id}: no verified {kind} attestation{gone}")
    attestation = max(matches, key=lambda a: a.predicate.get("attested_at", ""))
    name = subject_name(run_id, path)
    if name not in attestation.subjects:
        raise AttestationError(f"run {run_id}: {path} is not signed by its {kind} attestation")
    try:
        data = source.artifact(run_id, path)
    except (FileNotFoundError, MlflowException, OSError) as err:
        raise AttestationError(f"run {run_id}: signed artifact {path} is missing") from err
    if hashlib.sha256(data).hexdigest() != attestation.subjects[name]:
        raise AttestationError(f"run {run_id}: {path} differs from its signed digest "
                               "(altered after signing)")
    return attestation, data


def _files(repo, path: str) -> list[str]:
    """Every artifact file under ``path`` of an artifact repository (recursive), sorted."""
    found: list[str] = []
    for info in repo.list_artifacts(path):
        found.extend(_files(repo, info.path) if info.is_dir else [info.path])
    return sorted(found)


def _read(repo, path: str) -> bytes:
    """One artifact's bytes from an artifact repository (a local one: the file itself,
    not a download through a thread pool into a temporary folder)."""
    if isinstance(repo, LocalArtifactRepository):
        return (Path(repo.artifact_dir) / path).read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        return Path(repo.download_artifacts(path, dst_path=tmp)).read_bytes()


class StoreSource:
    """The family's signed record in an MLflow store (runs found by stage tag — a hint —
    deleted runs included; read once, on first use).

    Every run's envelopes are listed and read, and every one verified, on each load: a
    writer (``lineage.log.log_writer``) reads the family this way before each append, so a
    deleted or altered entry anywhere in the log stops it. The runs come from one paged
    ``search_runs``; their ``attestations/`` folders are listed and read through each run's
    own artifact repository (``run.info.artifact_uri`` from that search), not through
    MLflow's ``runs:/`` URIs, which fetch the run again (twice) for every listing and
    every download: that was most of an append's time (profiled, BENCHMARKS.md). A local
    repository's envelopes are read as files (no download into a temporary folder).

    Args:
        stages: only runs of these stages (``None``: every run of the family).
        experiment_id: read this experiment (default: the family's, by its name), e.g.
            one the family's experiment was renamed to.
    """

    def __init__(self, tracking: Tracking, family: str, trust: TrustPolicy, *,
                 stages: tuple[str, ...] | None = None, experiment_id: str | None = None):
        self.tracking, self.family, self.trust, self.stages = tracking, family, trust, stages
        self.experiment_id = experiment_id
        self._found: list[Attestation] | None = None
        self._problems: list[str] = []
        self._deleted: set[str] = set()
        self.runs: dict = {}

    def _load(self) -> None:
        if self._found is not None:
            return
        self._found = []
        client = self.tracking.client()
        experiment = (client.get_experiment(self.experiment_id) if self.experiment_id
                      else client.get_experiment_by_name(experiment_name(self.family)))
        if experiment is None:
            return
        token = None
        while True:  # MLflow's filter has no IN for tags: the stage filter is applied here
            page = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL,
                                      max_results=1000, page_token=token)
            for run in page:
                if not self.stages or run.data.tags.get(tags.STAGE) in self.stages:
                    self.runs[run.info.run_id] = run
            token = page.token
            if not token:
                break
        for run_id, run in self.runs.items():
            if run.info.lifecycle_stage == "deleted":
                self._deleted.add(run_id)
            self._read_run(run_id)

    def _read_run(self, run_id: str) -> None:
        try:
            repo = get_artifact_repository(self.runs[run_id].info.artifact_uri,
                                           tracking_uri=self.tracking.tracking_uri)
            paths = [p for p in _files(repo, ATTESTATION_DIR) if p.endswith(".dsse.json")]
        except (MlflowException, OSError) as err:
            self._problems.append(f"run {run_id}: attestations unreadable ({err})")
            return
        for path in paths:
            try:
                data = _read(repo, path)
                self._found.append(verify_envelope(data, self.trust, run_id=run_id, path=path))
            except (AttestationError, MlflowException, OSError) as err:
                self._problems.append(str(err))

    def attestations(self) -> list[Attestation]:
        self._load()
        return list(self._found)

    def problems(self) -> list[str]:
        self._load()
        return list(self._problems)

    def deleted(self) -> set[str]:
        self._load()
        return set(self._deleted)

    def artifact(self, run_id: str, path: str) -> bytes:
        try:
            return tr.read_artifact(self.tracking, run_id, path)
        except (MlflowException, OSError) as err:
            raise FileNotFoundError(f"{run_id}/{path}") from err

    def version_run(self, version: str) -> str | None:
        try:
            return self.tracking.client().get_model_version(experiment_name(self.family),
                                                            version).run_id
        except MlflowException:
            return None

    def run_created(self, run_id: str) -> datetime | None:
        self._load()
        run = self.runs.get(run_id)
        return None if run is None else datetime.fromtimestamp(run.info.start_time / 1000, UTC)

    def children(self, parent_run_id: str) -> set[str]:
        self._load()
        return {run_id for run_id, run in self.runs.items()
                if run.data.tags.get(tags.PARENT) == parent_run_id}

    def parent(self, run_id: str) -> str | None:
        """The run ``run_id`` names as its parent (a hint)."""
        self._load()
        run = self.runs.get(run_id)
        return None if run is None else run.data.tags.get(tags.PARENT)

