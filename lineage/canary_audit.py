"""The audit's re-derivation of the canary's latency judgement from the signed samples.

Each canary step's signed record (``canary/<step>.json``, a subject of its ``canary``
attestation) carries the raw ABBA timings of its compared requests. The audit
recomputes, step by step and with the earlier steps' samples as the canary did, the
per-request log ratios, the look's signed-rank p-value and whether it rejected, and
then the whole-canary verdict; any difference from what was signed is a problem.
Records of the legacy unpaired test carry no raw samples: shown, not re-derived.
"""

from __future__ import annotations

import math

import numpy as np

from gates.canary import CanaryStepResult
from gates.canary_latency import another_look, conclude_canary, step_look
from gates.canary_plan import CanaryPlan
from gates.latency_judge import abba_log_ratios
from lineage.attestations import AttestationError
from lineage.sources import EvidenceSource, signed_artifact

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
    if result.latency_look is None:
        return None if not result.latency_assessed else "assessed, but no look was signed"
    names = [s.name for s in plan.looks()]
    if result.step not in names:
        return f"step {result.step!r} is not in the registered plan"
    look = step_look(plan, names.index(result.step), result.log_ratios,
                     [e.log_ratios for e in earlier])
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


def rederive(source: EvidenceSource, plan: CanaryPlan | None,
             steps: list) -> list[Finding]:
    """Findings for the canary steps ``steps`` (``chain.StageEvidence``, in signing
    order; the newest record of a step counts, judged in the plan's step order)."""
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
    return findings
