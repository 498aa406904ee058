"""The files that serve are the files signed: a version's model folder, by sha256.

At build :func:`folder_manifest` lists every file of the logged MLflow model (``MLmodel``,
``code/…``, ``artifacts/…``, the pickled wrapper, the requirements) with its sha256; the
signed ``build`` attestation carries it as ``model_files``. Whatever loads a version —
the audit, :class:`lineage.serving.version_runners.VersionPool` and the worker process it
starts — copies the files from the version's *storage location* (what ``models:/…``
loads, which the registry's row names and anyone who can write the store can repoint),
hashes them, compares them with the signed manifest, and computes the code digest of the
``code/`` folder itself. It never asks the loaded model (``describe()``) what it is: a
doctored model can say anything.

A version built before file manifests existed has no ``model_files`` in its signed
build: :func:`check` says so (a warning, not a failure); its artifacts are still
re-hashed against the build's signed subjects by the audit.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import mlflow.artifacts
from mlflow.exceptions import MlflowException
from pydantic import BaseModel, Field

from lineage import model as version_model
from lineage.aliases import registered_model
from lineage.signing.attestations import Attestation, AttestationError
from lineage.signing.sources import EvidenceSource
from lineage.store.tracking import Tracking

CODE_DIR = "code"
NO_MANIFEST = "built before file manifests: its signed build lists no model files"


def folder_manifest(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (relative POSIX path -> sha256), sorted."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def code_digest_of(manifest: dict[str, str]) -> str:
    """The code digest (``lineage.model.code_digest``) of the ``code/`` files of a
    model folder's manifest: computed from the files, never reported by the model."""
    prefix = f"{CODE_DIR}/"
    return version_model.code_digest({k.removeprefix(prefix): v for k, v in manifest.items()
                                      if k.startswith(prefix)})


def compare(found: dict[str, str], signed: dict[str, str]) -> list[str]:
    """One problem per file that differs from the signed manifest, is missing, or is
    not in it (each names the file)."""
    problems = []
    for name in sorted(set(found) | set(signed)):
        if name not in signed:
            problems.append(f"{name}: not in the signed file manifest (added after signing)")
        elif name not in found:
            problems.append(f"{name}: signed but missing")
        elif found[name] != signed[name]:
            problems.append(f"{name}: sha256 differs from the signed file manifest")
    return problems


class ModelFiles(BaseModel):
    """What was found at a version's storage location, against its signed build."""

    version: str
    storage_location: str
    path: Path | None = Field(None, description="the local copy that was hashed")
    code_sha256: str | None = Field(None, description="computed from the copied code/ files")
    signed_code_sha256: str | None = None
    manifest_signed: bool = False
    problems: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        if self.problems:
            return (f"the files at v{self.version}'s storage location {self.storage_location} "
                    "are not the signed ones: " + "; ".join(self.problems))
        if not self.manifest_signed:
            return f"v{self.version} {NO_MANIFEST}"
        return (f"every file at {self.storage_location} matches the signed manifest; code "
                f"sha256 {str(self.code_sha256)[:12]} computed from them")


def find_build(source: EvidenceSource, version: str) -> Attestation | None:
    """The version's verified ``build`` attestation in ``source`` (``None``: none)."""
    return next((a for a in source.attestations()
                 if a.kind == "build" and str(a.predicate.get("version")) == str(version)), None)


def signed_build(source: EvidenceSource, version: str) -> Attestation:
    """The version's signed build attestation.

    Raises:
        AttestationError: none verifies.
    """
    build = find_build(source, version)
    if build is None:
        raise AttestationError(f"v{version} of {source.family} has no signed build")
    return build


def fetch(tracking: Tracking, source: EvidenceSource, version: str, dst: Path) -> ModelFiles:
    """Copy v``version``'s files from its storage location to ``dst`` and check them
    against its signed build (``problems`` empty: they are the signed files; load them
    from ``path``, nothing else). Never raises on a mismatch; raises
    ``AttestationError`` when the version has no signed build."""
    build = signed_build(source, version)
    name = registered_model.registered_model_name(source.family)
    location = ""
    try:
        location = tracking.client().get_model_version_download_uri(name, version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=location,
                                                         dst_path=str(dst),
                                                         tracking_uri=tracking.tracking_uri))
    except (MlflowException, OSError) as err:
        return ModelFiles(version=version, storage_location=location,
                          problems=[f"the storage location could not be read: {err}"])
    found = folder_manifest(local)
    signed = build.predicate.get("model_files")
    out = ModelFiles(version=version, storage_location=location, path=local,
                     code_sha256=code_digest_of(found),
                     signed_code_sha256=build.predicate.get("code_sha256"),
                     manifest_signed=isinstance(signed, dict))
    if out.manifest_signed:
        out.problems = compare(found, signed)
        if not out.problems and out.code_sha256 != out.signed_code_sha256:
            out.problems.append(f"code/: its code sha256 {out.code_sha256} is not the signed "
                                f"build's {out.signed_code_sha256}")
    return out


def check(tracking: Tracking, source: EvidenceSource, version: str) -> ModelFiles:
    """:func:`fetch` into a temporary folder (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="kernelgate-model-") as tmp:
        found = fetch(tracking, source, version, Path(tmp))
        found.path = None
        return found


def check_link(tracking: Tracking, source: EvidenceSource, version: str) -> tuple[bool, str]:
    """The audit's ``model files`` link: ``(ok, detail)`` of :func:`check` (no signed
    build is a failed link too)."""
    try:
        found = check(tracking, source, version)
    except AttestationError as exc:
        return False, str(exc)
    return not found.problems, found.summary()
