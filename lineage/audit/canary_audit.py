"""The audit's re-derivation of the canary's latency judgement from the signed samples.

Each canary step's signed record (``canary/<step>.json``, a subject of its ``canary``
attestation) carries the raw ABBA timings of its compared requests. The audit
recomputes, step by step and with the earlier steps' samples as the canary did, the
per-request log ratios, the look's signed-rank p-value and whether it rejected, and
then the whole-canary verdict; any difference from what was signed is a problem.
Records of the legacy unpaired test carry no raw samples: shown, not re-derived.

Under a registration with ``decision:`` it re-derives the adoption decision too
(``gates.adoption_decision.conclude_adoption``) from the same signed samples and the
registered plan, and compares it with the signed ``adoption/decision.json`` of the
version's rollout run (a subject of its outcome attestation); a promoted version with no
signed ``adopted`` decision is a problem.
"""

from __future__ import annotations

import math

import numpy as np

from gates.adoption_decision import AdoptionVerdict, DecisionPlan, conclude_adoption
from gates.canary import PRODUCTION_FAILED, CanaryStepResult
from gates.canary_latency import another_look, conclude_canary, step_look
from gates.canary_plan import CanaryPlan
from gates.latency_judge import abba_log_ratios
from lineage.signing.attestations import AttestationError, subject_name
from lineage.signing.sources import EvidenceSource, signed_artifact
from lineage.store import tags

Finding = tuple[str, str | None, bool, str]
"""``(link name, run id, ok, detail)`` as ``audit_report.Walk.link`` takes them."""


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _step(plan: CanaryPlan, result: CanaryStepResult, earlier: list[CanaryStepResult]) -> str | None:
    """Why the signed step disagrees with its re-derivation, or None when it agrees."""
    if result.candidate_timings_s:
        r = abba_log_ratios(result.candidate_timings_s, result.production_timings_s)
        if len(r) != len(result.log_ratios) or not np.allclose(r, result.log_ratios, rtol=1e-12):
            return "the signed log ratios are not those of the signed timings"
    if result.production_error_count and not plan.exclude_production_failures and not any(
            b.startswith(PRODUCTION_FAILED) for b in result.breaches):
        return (f"production failed {result.production_error_count} request(s) and the plan "
                "does not exclude production failures, yet the step did not breach")
    if result.latency_look is None:
        return None if not result.latency_assessed else "assessed, but no look was signed"
    names = [s.name for s in plan.looks()]
    if result.step not in names:
        return f"step {result.step!r} is not in the registered plan"
    look = step_look(plan, names.index(result.step), result.log_ratios,
                     [e.log_ratios for e in earlier], result.length_buckets or None,
                     [e.length_buckets for e in earlier])
    signed = result.latency_look
    if look.n_pairs != signed.n_pairs or not _same(look.p_value, signed.p_value) \
            or look.slower != signed.slower or not _same(look.alpha, signed.alpha):
        return (f"re-derived p={look.p_value:.4g} at alpha {look.alpha:.3g} on {look.n_pairs} "
                f"pairs (slower {look.slower}); signed p={signed.p_value:.4g} at "
                f"{signed.alpha:.3g} on {signed.n_pairs} (slower {signed.slower})")
    breached = any(b.startswith("latency:") for b in result.breaches)
    if breached != look.slower:
        return f"the look says slower={look.slower} but the signed breaches say {breached}"
    return None


def rederive(source: EvidenceSource, plan: CanaryPlan | None, steps: list, *,
             decision: DecisionPlan | None = None, version: str | None = None,
             promoted: bool = False) -> list[Finding]:
    """Findings for the canary steps ``steps`` (``chain.StageEvidence``, in signing
    order; the newest record of a step counts, judged in the plan's step order) and,
    with a registered ``decision`` and the ``version`` audited, its adoption decision
    (``promoted``: the version holds production, so it must have been adopted)."""
    if plan is None or not plan.paired or not steps:
        return []
    findings: list[Finding] = []
    earlier: list[CanaryStepResult] = []
    latest = {s.name: s for s in steps}  # in signing order: a step signed again counts last
    order = [s.name for s in plan.looks()]
    for stage in sorted(latest.values(), key=lambda s: order.index(s.name)
                        if s.name in order else len(order)):
        try:
            _, data = signed_artifact(source, stage.run_id, "canary", f"canary/{stage.name}.json")
        except AttestationError as err:
            findings.append(("canary samples", stage.run_id, False, str(err)))
            return findings
        result = CanaryStepResult.model_validate_json(data)
        why = _step(plan, result, earlier)
        if why is None and len(earlier) >= len(plan.steps) and not another_look(plan, earlier):
            why = (f"{stage.name} is an extra look the plan did not call for: the verdict "
                   "before it was not inconclusive")
        look = result.latency_look
        detail = why or (f"{stage.name}: re-derived from {len(result.log_ratios)} signed samples"
                         + (f": p={look.p_value:.3g} at alpha_k={look.alpha:.3g}" if look
                            else f" (latency not assessed: {result.latency_not_assessed_reason})"))
        findings.append(("canary re-derived", stage.run_id, why is None, detail))
        earlier.append(result)
    if len(earlier) >= len(plan.steps) and not another_look(plan, earlier):
        verdict = conclude_canary(plan, earlier)
        findings.append(("canary verdict", None, True,
                         f"re-derived: {verdict.verdict} ({verdict.reason})"))
        if decision is not None and version is not None:
            findings += adoption(source, decision, verdict.verdict, earlier, version,
                                 promoted=promoted)
    return findings


def signed_adoption(source: EvidenceSource, version: str) -> tuple[str, AdoptionVerdict] | None:
    """The newest signed adoption decision of ``version``: ``(rollout run id, verdict)``
    from an outcome attestation naming the version whose subjects hold
    ``adoption/decision.json``, or None when no rollout of it signed one.

    Raises:
        AttestationError: the signed file is missing or was altered after signing.
    """
    outcomes = sorted((a for a in source.attestations() if a.kind == "outcome"
                       and str(a.predicate.get("version")) == version
                       and subject_name(a.run_id, tags.ADOPTION_ARTIFACT) in a.subjects),
                      key=lambda a: a.predicate.get("attested_at", ""))
    if not outcomes:
        return None
    run_id = outcomes[-1].run_id
    _, data = signed_artifact(source, run_id, "outcome", tags.ADOPTION_ARTIFACT)
    return run_id, AdoptionVerdict.model_validate_json(data)


def _said(verdict: AdoptionVerdict) -> str:
    """An adoption verdict's decision in words, per bucket where it has buckets."""
    per = "".join(f"; bucket {b.bucket}: {b.status} at {b.decided_at} of {b.n_pairs}"
                  for b in verdict.buckets)
    return (f"{verdict.outcome} at {verdict.decided_at} of {verdict.n_pairs} pairs, looks "
            f"{verdict.looks}{per}")


def adoption(source: EvidenceSource, decision: DecisionPlan, safety: str,
             results: list[CanaryStepResult], version: str, *,
             promoted: bool) -> list[Finding]:
    """The adoption decision re-derived from the signed canary ``results`` (in step
    order) and the registered ``decision``, against the signed one; ``safety``: the
    re-derived whole-canary verdict."""
    try:
        found = signed_adoption(source, version)
    except AttestationError as err:
        return [("adoption decision", None, False, str(err))]
    if found is None:
        if promoted:
            return [("adoption decision", None, False, f"v{version} holds production under a "
                     "registration with decision:, but no rollout signed an adoption decision")]
        return []
    run_id, signed = found
    reason = next((r.latency_not_assessed_reason for r in results if not r.log_ratios), None)
    again = conclude_adoption(decision, safety, [r.log_ratios for r in results],
                              buckets=[r.length_buckets for r in results],
                              not_assessed_reason=reason)
    said, derived = _said(signed), _said(again)
    if said != derived:
        return [("adoption decision", run_id, False, f"re-derived from the signed canary samples "
                 f"and the registered plan: {derived}; signed: {said}")]
    if promoted and signed.outcome != "adopted":
        return [("adoption decision", run_id, False,
                 f"v{version} holds production, but its signed adoption decision is "
                 f"{signed.outcome}: {signed.reason}")]
    return [("adoption decision", run_id, True, f"re-derived: {again.reason}")]
