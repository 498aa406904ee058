"""Audit: why is this version where it is? Walk the chain and re-verify every artifact.

For an alias (``production``, ``canary``, ``shadow``) or a version number, :func:`audit`
follows the links of :mod:`lineage.tags`::

    version -> build run -> gate (decision) run -> evaluation run -> preregistration run
            -> approval run

checking that each run exists and has the expected stage, that the links agree (the
decision judged this build, the evaluation ran this build, the registration predates the
evaluation run and the evaluation start, the thresholds hash matches, the approval
approves this decision and version), and re-hashing every artifact of every run in the
chain against the sha256 recorded when it was logged (an artifact without a recorded
digest cannot be verified and is a problem too). A version that holds ``production`` or
``canary`` or was ever promoted must have a passing decision.

The result is an :class:`AuditReport`; ``exit_code`` is 0 when nothing is wrong and 1
otherwise, and every problem names the run and artifact or link involved. The CLI
(``flows/cli.py``) prints :meth:`AuditReport.render` and exits with ``exit_code``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from gates.preregistration import PreregistrationError, load_registration
from lineage import tags
from lineage import tracking as tr
from lineage.records import LineageError, load_approval, load_decision
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

    def link(self, name: str, ref: str | None, ok: bool, detail: str) -> None:
        self.chain.append(AuditLink(name=name, ref=ref, ok=ok, detail=detail))
        if not ok:
            self.problems.append(f"{name} {ref or ''}: {detail}".replace("  ", " "))

    def run(self, name: str, run_id: str | None, stage: str) -> Run | None:
        if not run_id:
            self.link(name, None, False, "link missing")
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
                    actual = hashlib.sha256(
                        tr.read_artifact(self.tracking, run_id, path)
                    ).hexdigest()
                ok = expected is not None and expected == actual
                checks.append(
                    ArtifactCheck(
                        link=name,
                        run_id=run_id,
                        path=path,
                        expected_sha256=expected,
                        actual_sha256=actual,
                        ok=ok,
                    )
                )
                if ok:
                    continue
                why = (
                    "missing from the artifact store"
                    if actual is None
                    else "has no recorded sha256"
                    if expected is None
                    else "sha256 mismatch (altered after logging)"
                )
                self.problems.append(f"artifact {path!r} of {name} {run_id}: {why}")
        return checks


def _resolve(tracking: Tracking, family: str, target: str, current: dict[str, str]) -> str | None:
    if target in current:
        return current[target]
    return target if target.isdigit() else None


def audit(tracking: Tracking, family: str, alias_or_version: str) -> AuditReport:
    """Audit the version behind ``alias_or_version`` of ``family`` (never raises on bad lineage).

    Returns:
        :class:`AuditReport`; ``exit_code`` 1 when any link is broken or artifact altered.
    """
    name = registered_model_name(family)
    current = aliases(tracking, family)
    walk = _Walk(tracking)
    version = _resolve(tracking, family, alias_or_version, current)

    def report() -> AuditReport:
        return AuditReport(
            family=family,
            target=alias_or_version,
            model_name=name,
            version=version,
            aliases=current,
            chain=walk.chain,
            artifacts=walk.verify_artifacts(),
            problems=walk.problems,
        )

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

    build = walk.run("build run", mv.run_id, "build")
    if build is not None:
        consistent = mv.tags.get(tags.BUILD_RUN_ID) == mv.run_id and mv.source.startswith(
            f"runs:/{mv.run_id}/"
        )
        walk.link(
            "build run",
            mv.run_id,
            consistent,
            "version source and tag point at this run"
            if consistent
            else "version source/tag do not point at the build run",
        )

    held = [a for a, v in current.items() if v == version and a in ("production", "canary")]
    decision_run_id = mv.tags.get(tags.DECISION_RUN_ID)
    needs_decision = bool(held) or tags.PROMOTED_AT in mv.tags
    if decision_run_id is None:
        walk.link(
            "gate decision",
            None,
            not needs_decision,
            f"none, but the version holds {held or 'a past promotion'}"
            if needs_decision
            else "none (never promoted)",
        )
        return report()
    if walk.run("gate decision", decision_run_id, "gate") is None:
        return report()
    try:
        record = load_decision(tracking, decision_run_id)
    except LineageError as exc:
        walk.link("gate decision", decision_run_id, False, str(exc))
        return report()
    decision = record.decision
    verdict_ok = decision.verdict == "promote" or not needs_decision
    walk.link(
        "gate decision",
        decision_run_id,
        verdict_ok and record.build_run_id == mv.run_id,
        f"verdict {decision.verdict} ({decision.profile}); judged build {record.build_run_id}",
    )

    evaluation = walk.run("evaluation run", record.evaluation_run_id, "evaluation")
    if evaluation is not None:
        eval_tags = evaluation.data.tags
        ok = (
            eval_tags.get(tags.BUILD_RUN_ID) == mv.run_id
            and eval_tags.get(tags.REGISTRATION_ID) == record.registration_id
        )
        walk.link(
            "evaluation run",
            record.evaluation_run_id,
            ok,
            "evaluated this build under this registration"
            if ok
            else "its build/registration tags disagree with the decision",
        )

    if walk.run("preregistration run", record.registration_id, "preregistration") is not None:
        try:
            registration = load_registration(record.registration_id, tracking=tracking)
        except PreregistrationError as exc:
            walk.link("preregistration run", record.registration_id, False, str(exc))
        else:
            eval_start = (
                datetime.fromtimestamp(evaluation.info.start_time / 1000, UTC)
                if evaluation is not None
                else decision.evaluation_started_at
            )
            problems = [
                (
                    registration.thresholds_sha256 != decision.thresholds_sha256,
                    "thresholds hash differs from the decision's",
                ),
                (
                    registration.registered_at > decision.evaluation_started_at,
                    "registered after the evaluation started",
                ),
                (
                    # run start times are stored in whole milliseconds
                    registration.registered_at > eval_start + timedelta(milliseconds=1),
                    "registered after the evaluation run was created",
                ),
            ]
            bad = [why for cond, why in problems if cond]
            walk.link(
                "preregistration run",
                record.registration_id,
                not bad,
                "; ".join(bad)
                or f"profile {registration.profile}, thresholds sha256 "
                f"{registration.thresholds_sha256[:12]}, registered {registration.registered_at:%Y-%m-%dT%H:%M:%SZ}",
            )

    approval_run_id = mv.tags.get(tags.APPROVAL_RUN_ID)
    approval_needed = (
        tags.PROMOTED_AT in mv.tags
        and "canary->production" in decision.approval_policy.required_for
    )
    if approval_run_id is None:
        walk.link(
            "approval",
            None,
            not approval_needed,
            "missing, but the preregistered policy requires one"
            if approval_needed
            else "none required",
        )
    elif walk.run("approval", approval_run_id, "approval") is not None:
        try:
            approval, approved_decision = load_approval(tracking, approval_run_id)
        except LineageError as exc:
            walk.link("approval", approval_run_id, False, str(exc))
        else:
            ok = approval.approved and approved_decision == decision_run_id
            walk.link(
                "approval",
                approval_run_id,
                ok,
                f"{'approved' if approval.approved else 'rejected'} by {approval.approver} "
                f"at {approval.at:%Y-%m-%dT%H:%M:%SZ}: {approval.comment}",
            )
    _traffic_stages(walk, mv.tags)
    return report()


def _traffic_stages(walk: _Walk, version_tags: dict[str, str]) -> None:
    """Shadow and canary runs of the rollout that judged the version, each passed.

    Required once the version records a rollout run (the flows always run shadow and
    canary before promoting); versions promoted by other means show "none recorded".
    """
    if tags.ROLLOUT_RUN_ID not in version_tags:
        walk.link("traffic stages", None, True, "none recorded (not promoted by a rollout flow)")
        return
    rollout = walk.run("rollout run", version_tags[tags.ROLLOUT_RUN_ID], "rollout")
    if rollout is not None:
        # Every stage run of that rollout (alias moves, outcome, traffic records) has its
        # artifacts re-verified too, not only the runs the chain links to.
        children = walk.tracking.client().search_runs(
            [rollout.info.experiment_id],
            filter_string=f"tags.`{tags.PARENT}` = '{rollout.info.run_id}'")
        for child in children:
            walk.runs.append((f"{child.data.tags.get(tags.STAGE, 'stage')} run", child.info.run_id))
        walk.link("rollout run", rollout.info.run_id, True,
                  f"{rollout.data.tags.get('kernelgate.result', 'unfinished')}; "
                  f"{len(children)} stage runs")
    promoted = tags.PROMOTED_AT in version_tags
    shadow = walk.run("shadow run", version_tags.get(tags.SHADOW_RUN_ID), "shadow")
    if shadow is not None:
        passed = shadow.data.tags.get(tags.SHADOW_PASSED) == "true"
        walk.link("shadow run", shadow.info.run_id, passed or not promoted,
                  "passed" if passed else "did not pass")
    canary_ids = json.loads(version_tags.get(tags.CANARY_RUN_IDS, "[]"))
    if promoted and not canary_ids:
        walk.link("canary runs", None, False, "promoted without a recorded canary step")
    for run_id in canary_ids:
        run = walk.run("canary run", run_id, "canary")
        if run is not None:
            passed = run.data.tags.get(tags.CANARY_PASSED) == "true"
            walk.link("canary run", run_id, passed or not promoted,
                      f"{run.info.run_name}: {'passed' if passed else 'did not pass'}")
