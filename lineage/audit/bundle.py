"""The audit bundle: one family's signed record exported to a folder, and read back.

``kernelgate audit --export DIR`` writes it (:func:`export_bundle`); ``kernelgate audit
--bundle DIR`` reads it (:class:`BundleSource`, an :class:`~lineage.signing.sources.EvidenceSource`)
with no MLflow at all. The layout is defined here once, for both directions::

    attestations/<run id>/<kind>.dsse.json   every envelope of the family (deleted runs too)
    artifacts/<run id>/<path>                the artifacts those envelopes sign
    keys/<name>.pub.json                     the public keys trusted at export (a copy:
                                             an auditor checks their ids, not this folder)
    checkpoints/<family>.json                the pipeline's signed checkpoint of the family's
                                             log (its store, length and head) at export
                                             (<genesis>.json: a log made before logs
                                             carried a store identity)
    store_view.json                          the registry as it was: aliases, version ->
                                             build run, deleted runs (unsigned: a hint; the
                                             audit trusts the signed history and checkpoint)
    audit.txt                                the online audit at export time
    VERIFY.md                                the command that re-checks it offline
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from mlflow.exceptions import MlflowException

from lineage.aliases import registered_model
from lineage.log import checkpoints, family_log
from lineage.signing.attestations import (
    ATTESTATION_DIR,
    Attestation,
    AttestationError,
    TrustPolicy,
    verify_envelope,
)
from lineage.signing.keys import trust_from_files
from lineage.signing.sources import StoreSource
from lineage.store import store_identity
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

ATTESTATIONS = "attestations"
ARTIFACTS = "artifacts"
KEYS = "keys"
CHECKPOINTS = "checkpoints"
STORE_VIEW = "store_view.json"
AUDIT_TEXT = "audit.txt"
VERIFY_TEXT = "VERIFY.md"


def envelope_file(folder: Path, run_id: str, name: str) -> Path:
    """Where a run's envelope ``name`` (e.g. ``build.dsse.json``) lies in a bundle."""
    return Path(folder) / ATTESTATIONS / run_id / name


def artifact_file(folder: Path, run_id: str, path: str) -> Path:
    """Where a run's artifact ``path`` (as in the store) lies in a bundle."""
    return Path(folder) / ARTIFACTS / run_id / path


class BundleSource:
    """An exported audit bundle as an ``EvidenceSource`` (layout: this module's docstring).

    Raises (at construction):
        FileNotFoundError: ``folder`` has no ``store_view.json`` (not a bundle).
    """

    def __init__(self, folder: Path, trust: TrustPolicy):
        self.folder, self.trust = Path(folder), trust
        view = json.loads((self.folder / STORE_VIEW).read_text())
        self.family = view["family"]
        self.view = view
        self._found: list[Attestation] = []
        self._problems: list[str] = []
        for path in sorted((self.folder / ATTESTATIONS).rglob("*.dsse.json")):
            run_id = path.parent.name
            try:
                self._found.append(verify_envelope(path.read_bytes(), trust, run_id=run_id,
                                                   path=f"{ATTESTATION_DIR}/{path.name}"))
            except AttestationError as err:
                self._problems.append(str(err))

    def attestations(self) -> list[Attestation]:
        """Every envelope of the bundle that verifies with the trusted keys."""
        return list(self._found)

    def problems(self) -> list[str]:
        """Envelopes that did not verify."""
        return list(self._problems)

    def deleted(self) -> set[str]:
        """Runs that were deleted in the store at export."""
        return set(self.view.get("deleted_runs", []))

    def artifact(self, run_id: str, path: str) -> bytes:
        """An exported artifact's bytes. Raises ``FileNotFoundError`` when absent."""
        file = artifact_file(self.folder, run_id, path)
        if not file.is_file():
            raise FileNotFoundError(f"{run_id}/{path}")
        return file.read_bytes()

    def version_run(self, version: str) -> str | None:
        """The build run a version pointed at when exported (None: no such version)."""
        return self.view.get("versions", {}).get(str(version))

    def run_created(self, run_id: str) -> datetime | None:
        """Unknown in a bundle (the store's clock was not exported): always None."""
        return None

    def children(self, parent_run_id: str) -> set[str]:
        """Unknown in a bundle (no run tags exported): always empty."""
        return set()

    def checkpoint_files(self) -> list[Path]:
        """The signed checkpoints the bundle carries (verified by the audit, with the
        auditor's keys)."""
        return sorted((self.folder / CHECKPOINTS).glob("*.json"))


def verify_artifacts(source: BundleSource, runs: set[str]) -> tuple[int, int, list[str]]:
    """Re-hash every artifact the attestations of ``runs`` sign against its signed digest.

    Returns ``(verified, checked, problems)``; a missing or altered artifact is a problem
    named, never an exception.
    """
    verified = checked = 0
    problems: list[str] = []
    for attestation in source.attestations():
        if attestation.run_id not in runs:
            continue
        for name, digest in attestation.subjects.items():
            run_id, _, path = name.partition("/")
            checked += 1
            try:
                ok = hashlib.sha256(source.artifact(run_id, path)).hexdigest() == digest
            except FileNotFoundError:
                problems.append(f"artifact {path!r} of run {run_id}: missing from the bundle")
                continue
            if ok:
                verified += 1
            else:
                problems.append(f"artifact {path!r} of run {run_id}: differs from its signed digest")
    return verified, checked, problems


class AuditText(Protocol):
    """What the export needs of an audit report (``lineage.audit.audit_report.AuditReport``)."""

    target: str

    def render(self) -> str:
        """The report as terminal text."""


def export_bundle(tracking: Tracking, family: str, report: AuditText, trust_files: list[Path],
                  out: Path, key_dir: Path | None = None) -> Path:
    """Write a self-contained audit bundle: every envelope of the family, the artifacts
    they sign, the trusted public keys, the registry as it is now, the audit text and
    the command that re-checks it offline, and the pipeline's signed checkpoint of the
    family's log from ``key_dir`` (where there is one). Returns ``out``.

    Raises:
        FileExistsError: ``out`` exists and is not empty.
        KeyFileError: a trusted key file cannot be read.
    """
    source = StoreSource(tracking, family, trust_from_files(trust_files))
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose a new folder for the bundle")
    for attestation in source.attestations():
        envelope = envelope_file(out, attestation.run_id, Path(attestation.path).name)
        envelope.parent.mkdir(parents=True, exist_ok=True)
        envelope.write_bytes(tr.read_artifact(tracking, attestation.run_id, attestation.path))
        for name in attestation.subjects:
            run_id, _, path = name.partition("/")
            target = artifact_file(out, run_id, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(MlflowException, OSError):  # missing: offline check names it
                target.write_bytes(tr.read_artifact(tracking, run_id, path))
    log = family_log.read(source)
    if key_dir is not None:
        for checkpoint in checkpoints.checkpoint_paths(log, key_dir,
                                                       store_identity.location(tracking)):
            if checkpoint.is_file():
                (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
                shutil.copy(checkpoint, out / CHECKPOINTS / checkpoint.name)
    keys = out / KEYS
    keys.mkdir(parents=True, exist_ok=True)
    for path in trust_files:
        shutil.copy(path, keys / Path(path).name)
    name = registered_model.registered_model_name(family)
    versions = {str(mv.version): mv.run_id
                for mv in tracking.client().search_model_versions(f"name='{name}'")}
    (out / STORE_VIEW).write_text(json.dumps(
        {"family": family, "aliases": registered_model.aliases(tracking, family),
         "versions": versions, "deleted_runs": sorted(source.deleted()),
         "exported_at": datetime.now(UTC).isoformat()}, indent=2))
    (out / AUDIT_TEXT).write_text(report.render() + "\n")
    key_args = " ".join(f"--trusted-key {KEYS}/{Path(p).name}" for p in trust_files)
    (out / VERIFY_TEXT).write_text(
        f"# Audit bundle: kernelgate-{family} {report.target}\n\n"
        "Re-check offline (no MLflow needed), from this folder:\n\n"
        f"    kernelgate audit {report.target} --family {family} --bundle . {key_args}\n\n"
        "It verifies every envelope with the keys you pass (check their ids against the ones "
        "you trust, not against this folder), every artifact against its signed digest, "
        "re-derives each gate decision from the signed report and registration, and replays "
        "the family's signed log and its alias history. audit.txt is the online audit at "
        "export time.\n\n"
        "Nothing in this folder is trusted unsigned. Pass your own keys: `--trusted-key` "
        "with public keys you hold yourself (the copies in keys/ came with the bundle). "
        "Deleting the last entries of the log leaves no gap; a signed checkpoint of its "
        "length and head does: the bundle carries the pipeline's (checkpoints/), and "
        "`--checkpoint FILE` checks against one you kept (from the pipeline's key folder, "
        "`<key dir>/checkpoints/<family>/`, or an earlier bundle). `kernelgate audit` also "
        "remembers the last head it verified under your kernelgate home (KERNELGATE_HOME) "
        "and refuses a shorter or forked log. store_view.json is unsigned: aliases in it "
        "that the signed history does not leave are named.\n")
    return out
