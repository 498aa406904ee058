"""Audit: why is this version where it is? Walk the chain and re-verify every artifact.

For an alias (``production``, ``canary``, ``shadow``) or a version number, :func:`audit`
reads the version's evidence with :func:`lineage.chain.collect` and judges it with
:func:`lineage.chain.problems`, the same definition of a complete chain that
``lineage.registry`` enforces before an alias moves (gate decision, shadow, approvals,
canary steps, confirmation). It also checks what only the record can show: the version
points at its build run, each evaluation ran this build under this registration, the
registration predates the evaluation run's creation (the store's clock, not the
report's claim); and it re-hashes every artifact of every run in the chain, and of every
stage run of the rollout behind it, against the sha256 recorded when it was logged (an
artifact without a recorded digest cannot be verified and is a problem too).

The result is an :class:`AuditReport`; ``exit_code`` is 0 when nothing is wrong and 1
otherwise, and every problem names the run and artifact or link involved.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from lineage import chain, tags
from lineage import tracking as tr
from lineage.records import DecisionRecord
from lineage.registry import aliases, registered_model_name
from lineage.tracking import Tracking


class AuditLink(BaseModel):
    """One link of the chain: ``name`` (e.g. "build run"), the id it resolved to, its state."""

    name: str
    ref: str | None
    ok: bool
    detail: str


class ArtifactCheck(BaseModel):
    """The re-verification of one artifact of one run in the chain."""

    link: str
    run_id: str
    path: str
    expected_sha256: str | None
    actual_sha256: str | None
    ok: bool


class AuditReport(BaseModel):
    """The chain, the artifact checks, and every problem found (empty when the audit passes)."""

    family: str
    target: str
    model_name: str
    version: str | None
    aliases: dict[str, str]
    chain: list[AuditLink]
    artifacts: list[ArtifactCheck]
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 when the audit passes, 1 otherwise."""
        return 0 if self.ok else 1

    def render(self) -> str:
        """A plain-text report for the terminal."""
        held = [a for a, v in self.aliases.items() if v == self.version]
        lines = [
            f"audit {self.model_name} {self.target} -> version {self.version}"
            + (f" (aliases: {', '.join(held)})" if held else ""),
        ]
        lines += [
            f"  [{'ok' if link.ok else 'FAIL'}] {link.name}: {link.ref or '-'}  {link.detail}"
            for link in self.chain
        ]
        bad = [a for a in self.artifacts if not a.ok]
        lines.append(
            f"  artifacts verified: {len(self.artifacts) - len(bad)}/{len(self.artifacts)}"
        )
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append("AUDIT PASSED" if self.ok else "AUDIT FAILED")
        return "\n".join(lines)


class _Walk:
    """Accumulates links, artifact checks and problems while walking the chain."""

    def __init__(self, tracking: Tracking) -> None:
        self.tracking = tracking
        self.chain: list[AuditLink] = []
        self.problems: list[str] = []
        self.runs: list[tuple[str, str]] = []  # (link name, run id) whose artifacts to verify

    def link(self, name: str, ref: str | None, ok: bool, detail: str, *,
             problem: bool = True) -> None:
        self.chain.append(AuditLink(name=name, ref=ref, ok=ok, detail=detail))
        if not ok and problem:
            self.problems.append(f"{name} {ref or ''}: {detail}".replace("  ", " "))

    def run(self, name: str, run_id: str | None, stage: str) -> Run | None:
        if not run_id:
            return None
        try:
            run = self.tracking.client().get_run(run_id)
        except MlflowException:
            self.link(name, run_id, False, "run not found (broken link)")
            return None
        actual = run.data.tags.get(tags.STAGE)
        if actual != stage:
            self.link(name, run_id, False, f"expected stage {stage!r}, found {actual!r}")
            return None
        self.runs.append((name, run_id))
        return run

    def verify_artifacts(self) -> list[ArtifactCheck]:
        checks: list[ArtifactCheck] = []
        seen: set[str] = set()
        for name, run_id in self.runs:
            if run_id in seen:
                continue
            seen.add(run_id)
            recorded = tr.recorded_digests(self.tracking, run_id)
            stored = tr.list_artifact_files(self.tracking, run_id)
            for path in sorted(set(recorded) | set(stored)):
                expected = recorded.get(path)
                actual = None
                if path in stored:
                    actual = hashlib.sha256(tr.read_artifact(self.tracking, run_id, path)).hexdigest()
                ok = expected is not None and expected == actual
                checks.append(ArtifactCheck(link=name, run_id=run_id, path=path,
                                            expected_sha256=expected, actual_sha256=actual, ok=ok))
                if ok:
                    continue
                why = ("missing from the artifact store" if actual is None
                       else "has no recorded sha256" if expected is None
                       else "sha256 mismatch (altered after logging)")
                self.problems.append(f"artifact {path!r} of {name} {run_id}: {why}")
        return checks


def _resolve(target: str, current: dict[str, str]) -> str | None:
    if target in current:
        return current[target]
    return target if target.isdigit() else None


def _evaluation_links(walk: _Walk, name: str, record: DecisionRecord, build_run_id: str,
                      registered_at: datetime | None) -> None:
    """The evaluation run behind a decision: this build, this registration, created
    after the registration."""
    evaluation = walk.run(name, record.evaluation_run_id, "evaluation")
    if evaluation is None:
        if not record.evaluation_run_id:
            walk.link(name, None, False, "link missing")
        return
    eval_tags = evaluation.data.tags
    created = datetime.fromtimestamp(evaluation.info.start_time / 1000, UTC)
    bad = [why for cond, why in (
        (eval_tags.get(tags.BUILD_RUN_ID) != build_run_id, "evaluated another build"),
        (eval_tags.get(tags.REGISTRATION_ID) != record.registration_id,
         "its registration tag disagrees with the decision"),
        # run start times are stored in whole milliseconds
        (registered_at is not None and registered_at > created + timedelta(milliseconds=1),
         "the preregistration run was registered after the evaluation run was created"),
    ) if cond]
    walk.link(name, record.evaluation_run_id, not bad,
              "; ".join(bad) or f"split {eval_tags.get(tags.SPLIT, '?')}, this build, "
              "under this registration")


def audit(tracking: Tracking, family: str, alias_or_version: str) -> AuditReport:
    """Audit the version behind ``alias_or_version`` of ``family`` (never raises on bad lineage).

    Returns:
        :class:`AuditReport`; ``exit_code`` 1 when any link is broken, evidence is
        missing, or an artifact was altered.
    """
    name = registered_model_name(family)
    current = aliases(tracking, family)
    walk = _Walk(tracking)
    version = _resolve(alias_or_version, current)

    def report() -> AuditReport:
        return AuditReport(family=family, target=alias_or_version, model_name=name,
                           version=version, aliases=current, chain=walk.chain,
                           artifacts=walk.verify_artifacts(), problems=walk.problems)

    if version is None:
        try:
            tracking.client().get_registered_model(name)
            why = (f"{alias_or_version!r} is not a version number and no such alias is set; "
                   f"aliases now: {current or 'none'}")
        except MlflowException:
            why = f"registered model {name!r} does not exist in this store (family {family!r})"
        walk.link("version", None, False, why)
        return report()
    try:
        mv = tracking.client().get_model_version(name, version)
    except MlflowException:
        walk.link("version", version, False, f"{name} has no version {version}")
        return report()
    walk.link("version", version, True, f"source {mv.source}")
    if walk.run("build run", mv.run_id, "build") is not None:
        consistent = (mv.tags.get(tags.BUILD_RUN_ID) == mv.run_id
                      and mv.source.startswith(f"runs:/{mv.run_id}/"))
        walk.link("build run", mv.run_id, consistent,
                  "version source and tag point at this run" if consistent
                  else "version source/tag do not point at the build run")

    held = [a for a, v in current.items() if v == version]
    transition = ("canary->production" if "production" in held or tags.PROMOTED_AT in mv.tags
                  else "shadow->canary" if "canary" in held else None)
    evidence = chain.collect(tracking, family, version)
    if transition is None and evidence.decision is None:
        walk.link("gate decision", None, True, "none (never promoted)")
        return report()
    missing = chain.problems(evidence, transition) if transition else []
    _display(walk, evidence, missing)
    walk.problems += missing
    _rollout_runs(walk, mv.tags.get(tags.ROLLOUT_RUN_ID))
    return report()


def _display(walk: _Walk, evidence: chain.ChainEvidence, missing: list[str]) -> None:
    """The chain's links for the reader (their problems come from ``chain.problems``),
    plus the record-only checks of the evaluations behind each decision."""
    def named(word: str) -> list[str]:
        return [p for p in missing if word in p]

    registered_at = evidence.registration.registered_at if evidence.registration else None
    for label, record in (("gate decision", evidence.decision),
                          ("confirmation decision", evidence.confirmation)):
        if record is None:
            walk.link(label, None, not named(f"no {label}"), "none recorded", problem=False)
            continue
        walk.run(label, record.decision_run_id, "gate")
        decision = record.decision
        walk.link(label, record.decision_run_id, not named(label),
                  f"verdict {decision.verdict} ({decision.profile}, scope "
                  f"{decision.scope or 'all'}); judged build {record.build_run_id}", problem=False)
        _evaluation_links(walk, f"{label.split()[0]} evaluation run", record,
                          evidence.build_run_id, registered_at)
    if evidence.decision is not None:  # its artifacts are verified even when unusable
        walk.run("preregistration run", evidence.decision.registration_id, "preregistration")
    if evidence.registration is not None:
        reg = evidence.registration
        walk.link("preregistration run", reg.registration_id, True,
                  f"profile {reg.profile}, thresholds sha256 {reg.thresholds_sha256[:12]}, "
                  f"registered {reg.registered_at:%Y-%m-%dT%H:%M:%SZ}", problem=False)
    for transition, found in evidence.approvals.items():
        walk.run("approval", found.run_id, "approval")
        a = found.record
        walk.link(f"approval {transition}", found.run_id, not named(f"approval {transition}"),
                  f"{'approved' if a.approved else 'rejected'} by {a.approver} at "
                  f"{a.at:%Y-%m-%dT%H:%M:%SZ}: {a.comment}", problem=False)
    for stage in ([evidence.shadow] if evidence.shadow else []) + evidence.canary:
        kind = "shadow" if stage is evidence.shadow else "canary"
        walk.run(f"{kind} run", stage.run_id, kind)
        walk.link(f"{kind} run", stage.run_id, stage.passed,
                  f"{stage.name}: {'passed' if stage.passed else 'did not pass'}", problem=False)


def _rollout_runs(walk: _Walk, rollout_run_id: str | None) -> None:
    """Every stage run of the rollout behind the version has its artifacts re-verified
    too (alias moves, outcome, traffic records), not only the runs the chain links to."""
    rollout = walk.run("rollout run", rollout_run_id, "rollout")
    if rollout is None:
        return
    children = walk.tracking.client().search_runs(
        [rollout.info.experiment_id],
        filter_string=f"tags.`{tags.PARENT}` = '{rollout.info.run_id}'")
    for child in children:
        walk.runs.append((f"{child.data.tags.get(tags.STAGE, 'stage')} run", child.info.run_id))
    walk.link("rollout run", rollout.info.run_id, True,
              f"{rollout.data.tags.get(tags.RESULT, 'unfinished')}; {len(children)} stage runs",
              problem=False)
