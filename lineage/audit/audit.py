"""Audit: why is this version where it is, and can the record be believed?

The audit re-derives instead of reading verdicts. With the public keys the *auditor*
trusts (never a key found in the store) it:

1. verifies every attestation envelope of the family (deleted runs included) and names
   every one that does not verify — tampered, unsigned, or signed by a revoked or unknown key;
2. replays the signed alias history (numbered, hash-chained moves) and compares it with
   the aliases MLflow shows: an alias moved by hand, or a signed move deleted, is named;
3. follows the version behind the target through the chain ``lineage.records.chain`` defines —
   the same rules the registry enforces before a move — reading only signed records:
   build, evaluation, gate decision, registration, shadow, approvals the *signed*
   policy requires, every canary step (re-derived, with any adoption decision), the
   confirmation decision (and a split used twice), whatever tags say; deleted: missing;
4. re-derives each gate decision with ``gates.decision.decide`` from the signed report
   and the signed registration, and compares it with the signed decision;
5. cross-checks what MLflow shows (metrics, params, run tags, the version's tags) against
   the signed values, and re-hashes every artifact against its signed digest;
6. hashes the files at the version's storage location (what ``models:/…`` loads)
   against the signed build's file manifest, computing the code digest itself
   (``lineage.serving.model_files``), and loads that checked copy in a process of its own.

It names every problem; ``exit_code`` is 0 only when there is none. It works on the
MLflow store or on an exported bundle (``lineage.audit.bundle``, which also writes it; the
checks that need MLflow itself — 5 and 6 — then cover what the bundle recorded). Step 5 is
``lineage.audit.store_check``; the report is ``lineage.audit.audit_report``.
"""

from __future__ import annotations

from datetime import timedelta

from evaluation.report import EvaluationReport
from gates.decision import decide
from lineage.aliases import key_changes, production_story, registered_model
from lineage.audit import canary_audit, reference_audit, store_check
from lineage.audit.audit_report import GATE_LINK, AuditReport, Walk
from lineage.audit.bundle import verify_artifacts
from lineage.log import checkpoints, family_log
from lineage.records import chain, dispatch_record, roster
from lineage.records.records import DecisionRecord
from lineage.serving import model_files
from lineage.signing.approvals import recheck_answer
from lineage.signing.attestations import Attestation, AttestationError
from lineage.signing.sources import EvidenceSource, StoreSource, signed_artifact
from lineage.store.tracking import Tracking


def _history(source: EvidenceSource, actual: dict[str, str], walk: Walk) -> dict[str, str]:
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


def _promotion_of(source: EvidenceSource, version: str, walk: Walk) -> Attestation | None:
    """The newest signed promotion of ``version``; every signed production move naming
    it is shown (its promotion, a rollback that restored it or took it out)."""
    moves, _ = registered_model.alias_history(source)
    for move in production_story.production_moves(moves):
        if production_story.role_of(move, version):
            walk.link("production move", move.run_id, True,
                      production_story.sentence(move, version), problem=False)
    promotions = [m for m in moves if m.predicate.get("action") == "promote"
                  and m.predicate.get("alias") == "production"
                  and str(m.predicate.get("version")) == version]
    return promotions[-1] if promotions else None


def _rederive(source: EvidenceSource, record: DecisionRecord, evidence: chain.ChainEvidence,
              label: str, walk: Walk) -> None:
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


def build_line(predicate: dict) -> str:
    """The audit chain's build line for a signed build attestation's ``predicate``: the
    implementation, its kernel config (``default config`` where the build passed none:
    the kernel chose its own) and the code sha256's first 12 hex digits."""
    config = predicate.get("config")
    shown = f"config {config}" if config else "default config"
    return (f"{predicate.get('implementation')} {shown}, code sha256 "
            f"{str(predicate.get('code_sha256'))[:12]}")


def _display(walk: Walk, evidence: chain.ChainEvidence, missing: list[str],
             source: EvidenceSource, version: str, promoted: bool) -> None:
    def named(word: str) -> bool:
        return any(word in p for p in missing)

    if evidence.build is not None:
        b = evidence.build.predicate
        walk.link("build", evidence.build_run_id, True, build_line(b), problem=False)
    for label, record in ((GATE_LINK, evidence.decision),
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
        if evidence.thresholds is not None and (
                wrong := recheck_answer(a, evidence.thresholds.approval)):
            walk.link(f"signed answer {transition}", found.run_id, False, wrong)
    for stage in ([evidence.shadow] if evidence.shadow else []) + evidence.canary:
        kind = "shadow" if stage is evidence.shadow else "canary"
        walk.link(f"{kind} run", stage.run_id, stage.passed,
                  f"{stage.name}: {'passed' if stage.passed else 'did not pass'}", problem=False)
    t = evidence.thresholds
    for found in canary_audit.rederive(source, t and t.canary, evidence.canary,
                                       decision=t and t.decision, version=version, promoted=promoted):
        walk.link(*found)


def _rollout_of(promotion: Attestation, source: EvidenceSource, walk: Walk) -> str | None:
    """The rollout run the promotion was signed under (its signed ``parent_run_id``; a
    promotion signed before that field: MLflow's parent tag, a hint). A parent tag that
    differs from the signed one is a problem: it would take the rollout's own files out
    of the cross-check."""
    shown = source.parent(promotion.run_id)
    if "parent_run_id" not in promotion.predicate:
        return shown
    signed = promotion.predicate["parent_run_id"]
    if shown != signed:
        walk.problems.append(f"run {promotion.run_id}: its parent run is {shown} in MLflow, "
                             f"signed {signed} (re-pointed outside the pipeline)")
    return signed


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
                     source: EvidenceSource, walk: Walk) -> None:
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


def _loaded_model(tracking: Tracking, source: StoreSource, version: str, walk: Walk) -> None:
    from lineage.serving.version_runners import VersionWorker

    try:
        worker = VersionWorker(tracking, source.family, version, trust=source.trust)
    except (AttestationError, RuntimeError) as exc:
        walk.link("loaded model", version, False, str(exc))
        return
    try:
        drift = worker.info.get("jax_drift")
        walk.link("loaded model", version, True, "loaded in its own process from the checked "
                  f"files; code sha256 {worker.info['code_sha256'][:12]} computed from them"
                  + (f"; {drift}" if drift else ""))
    finally:
        worker.close()


def audit(tracking: Tracking | None, family: str, target: str, *, trust=None,
          source: EvidenceSource | None = None, load_model: bool = True,
          recheck_reference: int = 0,
          witnessing: checkpoints.Witnessing | None = None) -> AuditReport:
    """Audit the version behind ``target`` (an alias or a version number) of ``family``.

    Args:
        tracking: the MLflow store (``None`` with a bundle ``source``).
        trust: the ``TrustPolicy`` of keys the auditor accepts (with a store).
        source: where the signed evidence is read (default: the store).
        load_model: load the version's model in its own process and check its code.
        recheck_reference: recompute this many of the held-out evaluation's cached
            float64 references with NumPy on this host (``evaluation.reference_cache``;
            needs the test set where the evaluation read it); 0: do not.
        witnessing: check the family's signed log against checkpoints and the head the
            auditor remembers (``lineage.log.checkpoints``), and remember it when intact.

    Returns:
        :class:`AuditReport`; never raises on bad lineage (every problem is named).
    """
    source = source or StoreSource(tracking, family, trust)
    walk = Walk()
    walk.problems += [f"attestation does not verify: {p}" for p in source.problems()]
    log = family_log.read(source)
    seen = witnessing or checkpoints.Witnessing()
    where = seen.location or (tracking.tracking_uri if tracking is not None else None)
    found, warnings = checkpoints.witness(log, source.trust, **seen.model_dump() | {"location": where})
    notices, wrong = roster.audit_roster(source)
    walk.problems += log.problems + found + wrong
    if seen.home is not None and not log.problems and not found:
        checkpoints.remember(log, seen.home, where)
    online = isinstance(source, StoreSource)
    actual = registered_model.aliases(tracking, family) if online else source.view.get("aliases", {})
    signed = _history(source, actual, walk)
    version = actual.get(target) or (target if target.isdigit() else None)
    name = registered_model.registered_model_name(family)

    def report(verified: int = 0, checked: int = 0) -> AuditReport:
        return AuditReport(family=family, target=target, model_name=name, version=version,
                           aliases=actual, signed_aliases=signed, chain=walk.links,
                           registrations=roster.registration_lines(source), notices=notices,
                           attestations_verified=len(source.attestations()),
                           artifacts_verified=verified, artifacts_checked=checked,
                           problems=walk.problems, warnings=log.warnings + warnings,
                           key_changes=key_changes.key_changes(log))

    # nothing to follow: no such alias, or a number the log signs no build of (one it signs
    # but the registry lacks was deleted: a finding below)
    if version is None or (source.version_run(version) is None
                           and model_files.find_build(source, version) is None):
        built = sorted({str(a.predicate.get("version")) for a in source.attestations()
                        if a.kind == "build"}, key=lambda v: (len(v), v))
        built_line = f"signed builds: {', '.join('v' + v for v in built) or 'none'}"
        history = (f"the signed alias history leaves it at v{signed[target]}"
                   if signed.get(target) else "the signed alias history sets none either")
        return report().model_copy(update={"absent": (
            f"MLflow shows no alias {target!r} and {history} (aliases now: "
            f"{actual or 'none'}; {built_line})" if version is None else
            f"{name} has no version {version}: its log signs no build of it ({built_line})")})
    promotion = _promotion_of(source, version, walk)
    held = [a for a, v in actual.items() if v == version]
    transition = ("canary->production" if "production" in held or promotion is not None
                  else "shadow->canary" if "canary" in held else None)
    decision_run_id = (promotion.predicate.get("chain", {}).get("decision_run_id")
                       if promotion else None)
    evidence = chain.collect(source, version, decision_run_id=decision_run_id)
    walk.link("version", version, source.version_run(version) is not None,
              f"build run {source.version_run(version)}")
    missing = chain.problems(evidence, transition) if transition else evidence.read_problems
    _display(walk, evidence, missing, source, version, transition == "canary->production")
    walk.problems += missing + dispatch_record.version_problems(
        source, evidence.build_run_id, evidence.build.predicate if evidence.build else None)
    if transition == "canary->production":
        if promotion is None:
            walk.link("promotion", None, False,
                      f"v{version} holds production but no signed promotion of it exists")
        else:
            _promotion_links(promotion, evidence, source, walk)
    verified = checked = 0
    if online:
        runs = _linked_runs(evidence, promotion)
        rollout_run = _rollout_of(promotion, source, walk) if promotion is not None else None
        if rollout_run:  # every stage run of that rollout, not only the ones linked
            runs |= {rollout_run} | source.children(rollout_run)
        verified, checked, found = store_check.cross_check(
            tracking, source, runs, family, version, evidence.build, warnings=warnings)
        walk.problems += found + store_check.deleted_problems(source, runs)
        if promotion is not None:
            walk.problems += store_check.link_tag_problems(tracking, family, version, promotion)
        if evidence.build is not None:
            walk.link("model files", version, *model_files.check_link(tracking, source, version))
        if load_model and evidence.build is not None:
            _loaded_model(tracking, source, version, walk)
        for record in (evidence.decision, evidence.confirmation) if recheck_reference else ():
            if record is not None:  # the confirmation's references too
                reference_audit.recheck_reference(source, record.evaluation_run_id,
                                                  recheck_reference, walk)
    else:
        verified, checked, found = verify_artifacts(source, _linked_runs(evidence, promotion))
        walk.problems += found
    return report(verified, checked)

