"""Audit: why is this version where it is, and can the record be believed?

The audit re-derives instead of reading verdicts. With the public keys the *auditor*
trusts (never a key found in the store) it:

1. verifies every attestation envelope of the family (deleted runs included) and names
   every one that does not verify — tampered, unsigned, or signed by a revoked or
   unknown key;
2. replays the signed alias history (numbered, hash-chained moves) and compares it with
   the aliases MLflow shows: an alias moved by hand, or a signed move deleted, is named;
3. follows the version behind the target through the chain ``lineage.chain`` defines —
   the same rules the registry enforces before a move — reading only signed records:
   build, evaluation, gate decision, registration, shadow, approvals the *signed*
   policy requires, every canary step, the confirmation decision (and a confirmation
   split used twice), whatever tags say; a deleted run is missing evidence;
4. re-derives each gate decision with ``gates.decision.decide`` from the signed report
   and the signed registration, and compares it with the signed decision;
5. cross-checks what MLflow shows — metrics, params, run tags, the version's tags —
   against the values the signatures vouch for, and re-hashes every artifact against
   its signed digest;
6. loads the version's logged model in a process of its own and checks that the code
   it runs is the code the signed build recorded.

It names every problem; ``exit_code`` is 0 only when there is none. It works on the
MLflow store or on an exported bundle (``lineage.bundle``, which also writes it; the
checks that need MLflow itself — 5 and 6 — then cover what the bundle recorded). Kept in one module
(over 350 lines) because the audit is one walk whose steps feed each other.
"""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta

from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from evaluation.report import EvaluationReport
from gates.decision import decide
from lineage import chain, registered_model, tags
from lineage import tracking as tr
from lineage.attestations import ATTESTATION_DIR, Attestation, AttestationError, subject_name
from lineage.bundle import verify_artifacts
from lineage.records import DecisionRecord
from lineage.sources import EvidenceSource, StoreSource, signed_artifact
from lineage.tracking import Tracking


class AuditLink(BaseModel):
    """One link of the chain: ``name``, the run or version it resolved to, its state."""

    name: str
    ref: str | None
    ok: bool
    detail: str


class AuditReport(BaseModel):
    """What was checked and every problem found (empty when the audit passes)."""

    family: str
    target: str
    model_name: str
    version: str | None
    aliases: dict[str, str]
    signed_aliases: dict[str, str]
    chain: list[AuditLink]
    registrations: list[str]
    attestations_verified: int
    artifacts_verified: int
    artifacts_checked: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 when the audit passes, 1 otherwise."""
        return 0 if self.ok else 1

    def summary(self) -> str:
        """One line: what was verified, and the verdict."""
        return (f"{'AUDIT PASSED' if self.ok else 'AUDIT FAILED'}: {self.model_name} "
                f"{self.target} -> v{self.version}; {self.attestations_verified} attestations and "
                f"{self.artifacts_verified}/{self.artifacts_checked} artifacts verified; "
                f"{len(self.problems)} problem(s)")

    def render(self) -> str:
        """A plain-text report for the terminal."""
        held = [a for a, v in self.aliases.items() if v == self.version]
        lines = [f"audit {self.model_name} {self.target} -> version {self.version}"
                 + (f" (aliases: {', '.join(held)})" if held else "")]
        lines += [f"  [{'ok' if link.ok else 'FAIL'}] {link.name}: {link.ref or '-'}  {link.detail}"
                  for link in self.chain]
        if self.registrations:
            lines.append("  registrations (oldest first):")
            lines += [f"    {r}" for r in self.registrations]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append(self.summary())
        return "\n".join(lines)


class _Walk:
    def __init__(self) -> None:
        self.links: list[AuditLink] = []
        self.problems: list[str] = []

    def link(self, name: str, ref: str | None, ok: bool, detail: str, *, problem: bool = True):
        self.links.append(AuditLink(name=name, ref=ref, ok=ok, detail=detail))
        if not ok and problem:
            self.problems.append(f"{name} {ref or ''}: {detail}".replace("  ", " "))


def _history(source: EvidenceSource, actual: dict[str, str], walk: _Walk) -> dict[str, str]:
    moves, problems = registered_model.alias_history(source)
    walk.problems += problems
    signed = registered_model.signed_aliases(moves)
    for alias in sorted(set(signed) | set(actual)):
        if signed.get(alias) != actual.get(alias):
            walk.problems.append(
                f"alias {alias} points at v{actual.get(alias)} but the signed history leaves it "
                f"at v{signed.get(alias)}: moved outside the pipeline, or a signed move was "
                "deleted")
    return signed


def _promotion_of(source: EvidenceSource, version: str) -> Attestation | None:
    moves, _ = registered_model.alias_history(source)
    promotions = [m for m in moves if m.predicate.get("action") == "promote"
                  and m.predicate.get("alias") == "production"
                  and str(m.predicate.get("version")) == version]
    return promotions[-1] if promotions else None


def _rederive(source: EvidenceSource, record: DecisionRecord, evidence: chain.ChainEvidence,
              label: str, walk: _Walk) -> None:
    """Recompute the decision from the signed report and registration."""
    evaluations = [a for a in source.attestations()
                   if a.kind == "evaluation" and a.run_id == record.evaluation_run_id]
    if not evaluations:
        gone = " (run deleted)" if record.evaluation_run_id in source.deleted() else ""
        walk.link(f"{label} evaluation", record.evaluation_run_id, False,
                  f"no signed evaluation{gone}: the decision cannot be re-derived")
        return
    evaluation = evaluations[-1]
    try:
        _, data = signed_artifact(source, evaluation.run_id, "evaluation",
                                  evaluation.predicate["report_artifact"])
    except AttestationError as exc:
        walk.link(f"{label} evaluation", evaluation.run_id, False, str(exc))
        return
    report = EvaluationReport.model_validate_json(data)
    bad = []
    if evaluation.predicate.get("build_run_id") != evidence.build_run_id:
        bad.append("it evaluated another build")
    if evaluation.predicate.get("registration_id") != record.registration_id:
        bad.append("it was under another registration")
    registration = evidence.registration
    if registration is not None and registration.registered_at > report.started_at:
        bad.append("the registration was frozen after the evaluation started")
    created = source.run_created(evaluation.run_id)
    # run start times are stored in whole milliseconds
    if registration is not None and created is not None and (
            registration.registered_at > created + timedelta(milliseconds=1)):
        bad.append("the preregistration run was registered after the evaluation run was created")
    if evidence.thresholds is not None and registration is not None and not bad:
        again = decide(report, evidence.thresholds, registration, now=record.decision.decided_at,
                       kinds=record.decision.scope)
        signed = {c.name: c.status for c in record.decision.criteria}
        rederived = {c.name: c.status for c in again.criteria}
        if again.verdict != record.decision.verdict or signed != rederived:
            differ = sorted(n for n in set(signed) | set(rederived) if signed.get(n) != rederived.get(n))
            bad.append(f"re-derived from the signed report and registration the verdict is "
                       f"{again.verdict} (criteria differing: {differ}), the signed decision "
                       f"says {record.decision.verdict}")
    walk.link(f"{label} evaluation", evaluation.run_id, not bad,
              "; ".join(bad) or f"split {report.split}, re-derived verdict "
                                 f"{record.decision.verdict}")


def _display(walk: _Walk, evidence: chain.ChainEvidence, missing: list[str],
             source: EvidenceSource) -> None:
    def named(word: str) -> bool:
        return any(word in p for p in missing)

    if evidence.build is not None:
        b = evidence.build.predicate
        walk.link("build", evidence.build_run_id, True,
                  f"{b.get('implementation')} config {b.get('config')}, code sha256 "
                  f"{str(b.get('code_sha256'))[:12]}", problem=False)
    for label, record in (("gate decision", evidence.decision),
                          ("confirmation decision", evidence.confirmation)):
        if record is None:
            walk.link(label, None, not named(f"no {label}"), "none signed", problem=False)
            continue
        d = record.decision
        walk.link(label, record.decision_run_id, not named(label),
                  f"verdict {d.verdict} ({d.profile}, scope {d.scope or 'all'})", problem=False)
        _rederive(source, record, evidence, label.split()[0], walk)
    if evidence.registration is not None:
        r = evidence.registration
        walk.link("registration", r.registration_id, True,
                  f"profile {r.profile}, thresholds sha256 {r.thresholds_sha256[:12]}, "
                  f"registered {r.registered_at:%Y-%m-%dT%H:%M:%SZ}", problem=False)
    for transition, found in evidence.approvals.items():
        a = found.record
        walk.link(f"approval {transition}", found.run_id, not named(f"approval {transition}"),
                  f"{'approved' if a.approved else 'rejected'} by {a.approver} ({a.authentication}) "
                  f"at {a.at:%Y-%m-%dT%H:%M:%SZ}: {a.comment}", problem=False)
    for stage in ([evidence.shadow] if evidence.shadow else []) + evidence.canary:
        kind = "shadow" if stage is evidence.shadow else "canary"
        walk.link(f"{kind} run", stage.run_id, stage.passed,
                  f"{stage.name}: {'passed' if stage.passed else 'did not pass'}", problem=False)


def _linked_runs(evidence: chain.ChainEvidence, promotion: Attestation | None) -> set[str]:
    runs = {evidence.build_run_id} if evidence.build_run_id else set()
    for record in (evidence.decision, evidence.confirmation):
        if record is not None:
            runs |= {record.decision_run_id, record.evaluation_run_id}
    if evidence.registration is not None:
        runs.add(evidence.registration.registration_id)
    runs |= {a.run_id for a in evidence.approvals.values()}
    runs |= {s.run_id for s in ([evidence.shadow] if evidence.shadow else []) + evidence.canary}
    if promotion is not None:
        runs.add(promotion.run_id)
        links = promotion.predicate.get("chain", {})
        for value in links.values():
            if isinstance(value, str):
                runs.add(value)
            elif isinstance(value, list):
                runs |= set(value)
            elif isinstance(value, dict):
                runs |= set(value.values())
    return runs


def _promotion_links(promotion: Attestation, evidence: chain.ChainEvidence,
                     source: EvidenceSource, walk: _Walk) -> None:
    """The links the promotion signed must be the evidence found, and must exist."""
    links = promotion.predicate.get("chain", {})
    expected = {"decision_run_id": evidence.decision.decision_run_id if evidence.decision else None,
                "confirmation_run_id": (evidence.confirmation.decision_run_id
                                        if evidence.confirmation else None),
                "shadow_run_id": evidence.shadow.run_id if evidence.shadow else None,
                "canary_run_ids": [c.run_id for c in evidence.canary]}
    differ = [k for k, v in expected.items() if links.get(k) != v]
    signed_runs = {a.run_id for a in source.attestations()}
    missing = sorted(r for r in _linked_runs(evidence, promotion) if r not in signed_runs)
    deleted = sorted(r for r in missing if r in source.deleted())
    detail = f"sequence {promotion.predicate.get('sequence')}, signed {promotion.predicate.get('attested_at')}"
    problems = []
    if differ:
        problems.append(f"the signed promotion links other evidence for {differ}")
    if missing:
        problems.append(f"linked runs without verified evidence: {missing}"
                        + (f" (deleted: {deleted})" if deleted else ""))
    walk.link("promotion", promotion.run_id, not problems, "; ".join(problems) or detail)


def _cross_check(tracking: Tracking, source: StoreSource, runs: set[str], family: str,
                 version: str, evidence: chain.ChainEvidence, walk: _Walk) -> tuple[int, int]:
    """MLflow's metrics, params and tags against the signed values, and every artifact
    against its signed digest. Returns ``(artifacts verified, artifacts checked)``."""
    verified = checked = 0
    by_run: dict[str, list[Attestation]] = {}
    for a in source.attestations():
        by_run.setdefault(a.run_id, []).append(a)
    for run_id in sorted(r for r in runs if r):
        try:
            run = tracking.client().get_run(run_id)
        except MlflowException:
            continue  # named as missing evidence already
        signed_subjects: dict[str, str] = {}
        for attestation in by_run.get(run_id, []):
            signed_subjects.update(attestation.subjects)
            p = attestation.predicate
            for key, value in (p.get("tags") or {}).items():
                if run.data.tags.get(key) != str(value):
                    walk.problems.append(f"run {run_id}: tag {key} is {run.data.tags.get(key)!r}, "
                                         f"signed {value!r}")
            for key, value in (p.get("metrics") or {}).items():
                shown = run.data.metrics.get(key)
                if shown is None or not _same(shown, value):
                    walk.problems.append(f"run {run_id}: metric {key} is {shown}, signed {value}")
            for key, value in (p.get("params") or {}).items():
                if run.data.params.get(key) != str(value):
                    walk.problems.append(f"run {run_id}: param {key} is "
                                         f"{run.data.params.get(key)!r}, signed {value!r}")
        stored = tr.list_artifact_files(tracking, run_id)
        for path in stored:
            if path.startswith(f"{ATTESTATION_DIR}/"):
                continue
            checked += 1
            name = subject_name(run_id, path)
            if name not in signed_subjects:
                walk.problems.append(f"artifact {path!r} of run {run_id}: not covered by any "
                                     "signature (added after signing)")
                continue
            digest = hashlib.sha256(tr.read_artifact(tracking, run_id, path)).hexdigest()
            if digest != signed_subjects[name]:
                walk.problems.append(f"artifact {path!r} of run {run_id}: sha256 mismatch with "
                                     "its signed digest (altered after signing)")
            else:
                verified += 1
        for name in signed_subjects:
            run_part, _, path = name.partition("/")
            if run_part == run_id and path not in stored:
                checked += 1
                walk.problems.append(f"artifact {path!r} of run {run_id}: signed but missing "
                                     "from the artifact store")
    if evidence.build is not None:
        shown = registered_model.version_tags(tracking, family, version)
        for key, value in (evidence.build.predicate.get("version_tags") or {}).items():
            if shown.get(key) != value:
                walk.problems.append(f"v{version}: tag {key} is {shown.get(key)!r}, the signed "
                                     f"build says {value!r} (what serves is read from the "
                                     "signed build, not the tag)")
    return verified, checked


LINK_TAGS = {tags.DECISION_RUN_ID: "decision_run_id", tags.EVALUATION_RUN_ID: "evaluation_run_id",
             tags.REGISTRATION_ID: "registration_id",
             tags.CONFIRMATION_RUN_ID: "confirmation_run_id", tags.SHADOW_RUN_ID: "shadow_run_id"}
"""Version tags an auditor follows in the MLflow UI -> the promotion's signed link."""


def _link_tags(tracking: Tracking, family: str, version: str, promotion: Attestation,
               walk: _Walk) -> None:
    """The version's link tags must lead where the signed promotion does."""
    shown = registered_model.version_tags(tracking, family, version)
    links = promotion.predicate.get("chain", {})
    for key, field in LINK_TAGS.items():
        if links.get(field) and shown.get(key) != links[field]:
            walk.problems.append(f"v{version}: tag {key} is {shown.get(key)!r}, the signed "
                                 f"promotion links {links[field]!r} (the UI's link is wrong; "
                                 "the audit follows the signed one)")


def _deleted(source: StoreSource, runs: set[str], walk: _Walk) -> None:
    for run_id in sorted(runs & source.deleted()):
        walk.problems.append(f"run {run_id} was deleted: evidence an auditor follows in the "
                             "MLflow UI is gone (restore it from the trash)")


def _same(a: float, b) -> bool:
    """Equal up to float formatting; NaN equals NaN and an infinity itself (a metric
    that was NaN when signed and is NaN now is unchanged)."""
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        return (math.isnan(x) and math.isnan(y)) or x == y
    return abs(x - y) <= 1e-12 * max(1.0, abs(y))


def _loaded_model(tracking: Tracking, source: StoreSource, version: str, walk: _Walk) -> None:
    from lineage.version_runners import VersionWorker
    from lineage.versions import recorded_kernel

    try:
        kernel = recorded_kernel(source, version)
        worker = VersionWorker(tracking, source.family, version, expected_code=kernel["code_sha256"])
    except (AttestationError, RuntimeError) as exc:
        walk.link("loaded model", version, False, str(exc))
        return
    try:
        drift = worker.info.get("jax_drift")
        walk.link("loaded model", version, True,
                  f"loaded in its own process; its code sha256 {worker.info['code_sha256'][:12]} "
                  "is the signed build's" + (f"; {drift}" if drift else ""))
    finally:
        worker.close()


def _registrations(source: EvidenceSource) -> list[str]:
    out = []
    for a in sorted((a for a in source.attestations() if a.kind == "registration"),
                    key=lambda a: a.predicate.get("registered_at", "")):
        p = a.predicate
        line = f"{p.get('registered_at')} {a.run_id} profile {p.get('profile')} sha256 {str(p.get('thresholds_sha256'))[:12]}"
        if p.get("loosened"):
            approval = p.get("loosening_approval") or {}
            line += (f"; LOOSENED {p['loosened']} approved by {approval.get('approver')}: "
                     f"{approval.get('reason')}" if approval else f"; loosened {p['loosened']}")
        out.append(line)
    return out


def audit(tracking: Tracking | None, family: str, target: str, *, trust=None,
          source: EvidenceSource | None = None, load_model: bool = True,
          recheck_reference: int = 0) -> AuditReport:
    """Audit the version behind ``target`` (an alias or a version number) of ``family``.

    Args:
        tracking: the MLflow store (``None`` with a bundle ``source``).
        trust: the ``TrustPolicy`` of keys the auditor accepts (with a store).
        source: where the signed evidence is read (default: the store).
        load_model: load the version's model in its own process and check its code.
        recheck_reference: recompute this many of the held-out evaluation's cached
            float64 references with NumPy on this host (``evaluation.reference_cache``;
            needs the test set where the evaluation read it); 0: do not.

    Returns:
        :class:`AuditReport`; never raises on bad lineage (every problem is named).
    """
    source = source or StoreSource(tracking, family, trust)
    walk = _Walk()
    walk.problems += [f"attestation does not verify: {p}" for p in source.problems()]
    online = isinstance(source, StoreSource)
    actual = registered_model.aliases(tracking, family) if online else source.view.get("aliases", {})
    signed = _history(source, actual, walk)
    version = actual.get(target) or (target if target.isdigit() else None)
    name = registered_model.registered_model_name(family)

    def report(verified: int = 0, checked: int = 0) -> AuditReport:
        return AuditReport(family=family, target=target, model_name=name, version=version,
                           aliases=actual, signed_aliases=signed, chain=walk.links,
                           registrations=_registrations(source),
                           attestations_verified=len(source.attestations()),
                           artifacts_verified=verified, artifacts_checked=checked,
                           problems=walk.problems)

    if version is None:
        walk.link("version", None, False, f"{target!r} is not a version number and no such alias "
                  f"is set; aliases now: {actual or 'none'}")
        return report()
    promotion = _promotion_of(source, version)
    held = [a for a, v in actual.items() if v == version]
    transition = ("canary->production" if "production" in held or promotion is not None
                  else "shadow->canary" if "canary" in held else None)
    decision_run_id = (promotion.predicate.get("chain", {}).get("decision_run_id")
                       if promotion else None)
    evidence = chain.collect(source, version, decision_run_id=decision_run_id)
    walk.link("version", version, source.version_run(version) is not None,
              f"build run {source.version_run(version)}")
    missing = chain.problems(evidence, transition) if transition else evidence.read_problems
    _display(walk, evidence, missing, source)
    walk.problems += missing
    if transition == "canary->production":
        if promotion is None:
            walk.link("promotion", None, False,
                      f"v{version} holds production but no signed promotion of it exists")
        else:
            _promotion_links(promotion, evidence, source, walk)
    verified = checked = 0
    if online:
        runs = _linked_runs(evidence, promotion)
        rollout_run = source.parent(promotion.run_id) if promotion is not None else None
        if rollout_run:  # every stage run of that rollout, not only the ones linked
            runs |= {rollout_run} | source.children(rollout_run)
        verified, checked = _cross_check(tracking, source, runs, family, version, evidence, walk)
        _deleted(source, runs, walk)
        if promotion is not None:
            _link_tags(tracking, family, version, promotion, walk)
        if load_model and evidence.build is not None:
            _loaded_model(tracking, source, version, walk)
        if recheck_reference and evidence.decision is not None:
            _recheck_reference(source, evidence.decision.evaluation_run_id, recheck_reference, walk)
    else:
        verified, checked, found = verify_artifacts(source, _linked_runs(evidence, promotion))
        walk.problems += found
    return report(verified, checked)


def _recheck_reference(source: EvidenceSource, evaluation_run_id: str, sample: int,
                       walk: _Walk) -> None:
    """Recompute ``sample`` cached references of an evaluation (its signed index says
    which arrays it used) and compare; a test set that is not on this host is said,
    not counted as a problem."""
    from evaluation.reference_cache import INDEX_FILE, ReferenceIndex, recheck
    from evaluation.report import REPORT_FILENAME, EvaluationReport
    from evaluation.testset import load_split

    try:
        index = ReferenceIndex.model_validate_json(
            source.artifact(evaluation_run_id, f"evaluation/{INDEX_FILE}"))
        report = EvaluationReport.model_validate_json(
            source.artifact(evaluation_run_id, f"evaluation/{REPORT_FILENAME}"))
    except Exception as err:  # noqa: BLE001 - a missing index is a finding, not a crash
        walk.link("reference", evaluation_run_id, False, f"no readable reference index: {err}")
        return
    try:
        cases = {c.spec.case_id: c for c in load_split(report.testset_dir, report.split)}
    except FileNotFoundError:
        walk.link("reference", evaluation_run_id, False, f"test set {report.testset_dir} is not "
                  "on this host; the cached reference was not rechecked", problem=False)
        return
    result = recheck(index, cases, sample=sample)
    walk.link("reference", evaluation_run_id, not result.problems,
              f"{result.checked} cached references ({', '.join(result.methods) or 'none'}) "
              "recomputed with NumPy: max "
              f"relative difference {result.max_rel_diff:.2g}" + "".join(f"; {p}" for p in result.problems))
