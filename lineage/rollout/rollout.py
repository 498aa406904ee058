"""The parent run of a rollout (or re-validation) and how it ends.

A rollout is one parent run in the family's experiment (stage ``rollout``, or
``revalidation`` for the nightly job) tagged with the environment; every stage run is
its child. :func:`close_rollout` writes the :class:`RolloutOutcome` as the artifact
``rollout/outcome.json``, tags the result and ends the run (FAILED for a failure,
FINISHED otherwise).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field

from lineage.aliases import registered_model
from lineage.log.log_writer import append
from lineage.records.environment import collect_environment
from lineage.signing.attestations import Signing
from lineage.signing.keys import default_key_dir
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

PROJECT_DIR = Path(__file__).resolve().parents[2]

Result = Literal["promoted", "rejected", "timed_out", "rolled_back", "not_adopted", "errored",
                 "interrupted", "failed", "built", "evaluated"]
"""``rejected``: the gate or a person said no; ``timed_out``: nobody answered an approval
within the preregistered timeout (which rejects); ``rolled_back``: a shadow, canary or
confirmation breach (or a re-validation failure); ``not_adopted``: safe, but the
registration's adoption test found it not worth adopting (``gates.adoption_decision``:
production unchanged, no finding against the kernel); ``errored``: a stage crashed
(``flows.errored``); ``interrupted``: a person stopped the command (Ctrl-C) mid-stage;
``failed``: a crash, as records written before *Errored* existed name it."""


class RolloutRecord(BaseModel):
    """Identity of one rollout's record: store, family, kernel, parent run, work folder,
    and who signs its evidence."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    tracking: Tracking
    signing: Signing
    family: str
    implementation: str = Field(description="the registry name being rolled out")
    backend: str = Field(description="cpu / gpu / tpu: where this process runs")
    rollout_run_id: str
    work_dir: Path = Field(description="local folder for this run's files before logging")
    env_tags: dict[str, str] = Field(default_factory=dict, description=(
        "the environment tags of the parent run (signed with the outcome)"))


def open_rollout(tracking: Tracking, *, family: str, implementation: str, backend: str,
                 work_root: Path, signing: Signing, stage: tags.Stage = "rollout",
                 run_name: str | None = None) -> RolloutRecord:
    """Start the parent run (status RUNNING) tagged with the environment facts.

    Raises:
        ValueError: ``family`` is not a valid family name.
    """
    run_id = tr.start_run(tracking, family, stage, run_name=run_name or f"{stage} {implementation}")
    env_tags = collect_environment(PROJECT_DIR).as_tags()
    tr.set_tags(tracking, run_id, env_tags)
    work_dir = (Path(work_root) / run_id).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    return RolloutRecord(tracking=tracking, signing=signing, family=family,
                         implementation=implementation, backend=backend, rollout_run_id=run_id,
                         work_dir=work_dir, env_tags=env_tags)


def lock_folder(store_dir: Path) -> Path | None:
    """Where the family locks of this process's store live: ``<store>/locks`` on the
    embedded store; beside the database for a ``sqlite:`` tracking URI (every process
    writing that database takes the same lock, whatever its ``--store-dir``); None for a
    tracking server (the Prefect concurrency limit queues rollouts there)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return Path(store_dir) / "locks"
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).resolve().parent / "locks"
    return None


@contextlib.contextmanager
def family_lock(store_dir: Path, family: str, *, timeout_s: float = -1) -> Iterator[bool]:
    """Hold the family's lock on a store of files (the embedded store, or a ``sqlite:``
    tracking URI: :func:`lock_folder`) for a whole rollout.

    ``filelock`` takes an OS-level lock on ``<locks>/<family>.lock``, released when the
    holder exits or dies, so two rollouts of one family never overlap on one store and
    whoever holds it knows every other RUNNING run of the family is dead. A lock another
    process holds is said (a warning naming the file) before this one waits for it.
    Yields True when a lock is held (on a tracking server the Prefect concurrency limit
    queues rollouts instead, and this yields False).

    Raises:
        filelock.Timeout: the lock was not free within ``timeout_s`` (``-1``: wait).
    """
    folder = lock_folder(store_dir)
    if folder is None:
        yield False
        return
    path = folder / f"{family}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=timeout_s)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logging.getLogger(__name__).warning(
            "waiting for %s: another rollout of %s holds it (it queues here until that one "
            "ends or dies)", path, family)
        lock.acquire()
    try:
        yield True
    finally:
        lock.release()


def link(record: RolloutRecord, values: dict[str, str]) -> None:
    """Tag the parent run (links to stage runs, source-drift notes)."""
    tr.set_tags(record.tracking, record.rollout_run_id, values)


class RolloutOutcome(BaseModel):
    """How a rollout ended (also the Prefect markdown artifact and the CLI's output)."""

    family: str
    version: str | None = None
    implementation: str | None = Field(default=None, description=(
        "the registry name rolled out (a family holds versions of other kernels too)"))
    result: Result
    stage: str = Field(description="the stage that decided the result")
    reason: str
    decided_by: str | None = Field(default=None, description=(
        "who or what decided: the gate, a named approver (and how they were identified), "
        "nobody (a timeout), the shadow/canary/confirmation analysis, a crash"))
    not_assessed: str | None = Field(default=None, description=(
        "what was not assessed, short (gates.headline.caveat); None: everything was"))
    decision_summary: str | None = None
    not_assessed_note: str | None = None
    inconclusive: bool = Field(default=False, description=(
        "stopped for want of evidence (noise, no fresh calibration), not for a finding "
        "about the kernel: not a rejection under the family's loosening rule"))
    aliases: dict[str, str] = Field(default_factory=dict)
    rollout_run_id: str
    tracking_uri: str
    ui_command: str
    audit_command: str = ""
    run_link: str = Field(default="", description=(
        "the rollout run in the MLflow UI, model-training view (embedded store: the "
        "address `kernelgate ui` serves on its default port)"))

    def verdict(self) -> str:
        """The verdict line: result, stage and, in the same line, what was not assessed
        (``promoted; speed and memory not assessed at the gate``)."""
        words = self.result.replace("_", " ")
        if self.result in STOPPED:
            words += f" at {self.stage}"
        if self.inconclusive:
            words += " (inconclusive: not a verdict on the kernel)"
        return words if not self.not_assessed else f"{words}; {self.not_assessed}"

    def _says_what_was_not_assessed(self) -> bool:
        return bool(self.not_assessed) and "not assessed" in self.reason

    def summary(self) -> str:
        """One line for a flow run's state message, a notification, the version's
        description: the verdict, who decided, and the reason (what was not assessed said
        once: in the reason where it lists it, else in the verdict)."""
        who = f" (decided by {self.decided_by})" if self.decided_by else ""
        verdict = (self.verdict().removesuffix(f"; {self.not_assessed}")
                   if self._says_what_was_not_assessed() else self.verdict())
        return f"{verdict}{who}: {self.reason}"

    def title(self) -> str:
        """``family vN``, with the kernel when it is not the family's namesake
        (``cudnn v2 (pallas_mosaic_gpu)``)."""
        kernel = (f" ({self.implementation})" if self.implementation
                  and self.implementation != self.family else "")
        return f"{self.family} v{self.version or '-'}{kernel}"

    def markdown(self) -> str:
        """A short markdown summary for the Prefect UI and the CLI's last lines."""
        lines = [
            f"# kernelgate rollout: {self.title()} — **{self.verdict()}**",
            "",
            f"* decided at stage: `{self.stage}`",
        ]
        if self.decided_by:
            lines.append(f"* decided by: {self.decided_by}")
        lines.append(f"* reason: {self.reason}")
        if self.decision_summary:  # its not-assessed paragraph repeats the reason's list
            gate = (self.decision_summary.splitlines()[0] if self._says_what_was_not_assessed()
                    else self.decision_summary)
            lines.append(f"* gate: {gate}")
        if self.not_assessed_note and self.not_assessed_note not in (self.decision_summary or ""):
            lines.append(f"* not assessed: {self.not_assessed_note}")
        lines += [
            f"* aliases now: `{self.aliases}`",
            f"* MLflow rollout run: `{self.rollout_run_id}` ({self.tracking_uri})",
        ]
        if self.run_link:
            lines.append(f"* in the MLflow UI: {self.run_link}")
        if self.audit_command:
            lines.append(f"* audit it: `{self.audit_command}`")
        lines.append(f"* open the MLflow UI: `{self.ui_command}`")
        return "\n".join(lines)


STOPPED = ("rejected", "timed_out", "rolled_back", "errored", "interrupted", "failed")
"""Results that stopped the candidate (a verdict line names the stage)."""


def _commands(tracking: Tracking, family: str, version: str | None,
              key_dir: Path | None = None) -> tuple[str, str]:
    """The commands that open the MLflow UI on this store and audit ``version`` (or
    production), as a person would type them (``kernelgate ...``, with ``--store-dir``
    for an embedded store, and ``--key-dir`` for a key folder other than the default:
    audited with another folder's keys, every signature would read as untrusted)."""
    exe = Path(sys.prefix) / "bin" / "kernelgate"
    cli = str(exe) if exe.exists() else "kernelgate"
    target = version or "production"
    keys = (f" --key-dir {key_dir}" if key_dir is not None
            and Path(key_dir).resolve() != default_key_dir().resolve() else "")
    if tracking.tracking_uri.startswith("sqlite:///"):
        store = Path(tracking.tracking_uri.removeprefix("sqlite:///")).parent
        return (f"{cli} ui --store-dir {store}",
                f"{cli} audit {target} --family {family} --store-dir {store}{keys}")
    return (f"open {tracking.tracking_uri}", f"{cli} audit {target} --family {family}{keys}")


def _run_link(record: RolloutRecord) -> str:
    """The rollout run's address in the MLflow UI, in its model-training view."""
    uri = record.tracking.tracking_uri
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    experiment_id = record.tracking.client().get_run(record.rollout_run_id).info.experiment_id
    return (f"{base}/#/experiments/{experiment_id}/runs/{record.rollout_run_id}"
            f"?{tags.UI_VIEW_QUERY}")


def close_rollout(record: RolloutRecord, *, result: Result, stage: str, reason: str,
                  version: str | None, decision_summary: str | None = None,
                  not_assessed_note: str | None = None, decided_by: str | None = None,
                  not_assessed: str | None = None, inconclusive: bool = False,
                  evidence: str | None = None) -> RolloutOutcome:
    """End the parent run with the outcome and write it as a JSON artifact; the run's name
    and the version's description say the verdict line (what was not assessed in it), who
    decided and ``evidence`` (markdown, the description only). ``inconclusive``: stopped
    for want of evidence (noise the plan could not power through, no fresh calibration),
    not a finding about the kernel; signed, so the loosening rule never counts it a rejection."""
    ui_command, audit_command = _commands(record.tracking, record.family, version,
                                            record.signing.key_dir)
    outcome = RolloutOutcome(
        family=record.family, version=version, implementation=record.implementation,
        result=result, stage=stage, reason=reason,
        decided_by=decided_by, not_assessed=not_assessed, inconclusive=inconclusive,
        decision_summary=decision_summary, not_assessed_note=not_assessed_note,
        aliases=registered_model.aliases(record.tracking, record.family),
        rollout_run_id=record.rollout_run_id, tracking_uri=record.tracking.tracking_uri,
        ui_command=ui_command, audit_command=audit_command,
        run_link=_run_link(record),
    )
    tr.log_model_json(record.tracking, record.rollout_run_id, outcome, tags.OUTCOME_ARTIFACT)
    run_tags = {tags.RESULT: result, tags.DECIDED_AT_STAGE: stage, tags.NOTE: reason}
    if version is not None:
        run_tags[tags.MODEL_VERSION] = version
    if decided_by:
        run_tags[tags.DECIDED_BY] = decided_by
    link(record, run_tags)
    append(record.tracking, record.rollout_run_id, "outcome",
           {"family": record.family, "version": version, "result": result, "stage": stage,
            "reason": reason, "decided_by": decided_by, "aliases": outcome.aliases,
            "inconclusive": inconclusive, "tags": {**record.env_tags, **run_tags}},
           record.signing)
    status = {"errored": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}.get(result, "FINISHED")
    tr.end_run(record.tracking, record.rollout_run_id, status)
    record.tracking.client().update_run(record.rollout_run_id, name=run_title(
        record.implementation, version, result, stage, not_assessed))
    if version is not None and registered_model.version_exists(record.tracking, record.family, version):
        registered_model.describe_version(record.tracking, record.family, version,
                                          outcome.summary(), evidence=evidence)
    return outcome


_WHAT = {"evaluated": "evaluation", "built": "build"}


def run_title(implementation: str, version: str | None, result: str, stage: str,
              not_assessed: str | None = None) -> str:
    """The parent run's name, saying what it was and, in the same line, what was not
    assessed: ``rollout xla v3 — rejected at gate``, ``evaluation pallas_tpu v4 —
    evaluated``, ``rollout pallas_tpu v5 — promoted; speed and memory not assessed at
    the gate``."""
    what = _WHAT.get(result, "rollout")
    where = f" at {stage}" if result in STOPPED else ""
    caveat = f"; {not_assessed}" if not_assessed else ""
    return f"{what} {implementation} v{version or '-'} — {result.replace('_', ' ')}{where}{caveat}"
