"""What the approval form shows: the evidence for one transition, as markdown that fits
the Prefect UI's dialog (few columns, units in the header, ratios shown as ratios).

* ``candidate->shadow``: the held-out gate.
* ``shadow->canary``: the held-out gate and the shadow stage.
* ``canary->production``: the canary steps (requests, latency ratio, p-value, drift)
  and the confirmation split's result; under a ``decision:`` section, the adoption
  evidence too (``gates.adoption_decision.adoption_markdown``).

Pure functions over the gates' records; ``flows.promotion`` puts the text above the form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gates.canary import CanaryStepResult
from gates.decision import CriterionResult, GateDecision, short_reason
from gates.headline import verdict_line

_STATUS = {"pass": "pass", "fail": "**FAIL**", "inconclusive": "**inconclusive**",
           "not_assessed": "not assessed", "not_applicable": "n/a"}


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def criterion_cells(c: CriterionResult) -> tuple[str, str]:
    """``(observed, required)`` of one criterion, in the criterion's own unit: a change
    criterion is shown as its improvement ratio (reference ÷ candidate for lower-is-better
    metrics, so ≥ 1 means better) against the required ratio, never a raw value against
    a ratio. A tested criterion (``test``) is judged by its test, not by that ratio: it
    shows the improvement with its p-value against the test's rule."""
    if c.comparison == "value":
        return _num(c.observed), f"{c.op} {c.threshold:g}"
    observed = "—" if c.improvement is None else f"{c.improvement:.3g}×"
    if c.test is not None and c.p_value is not None:
        return (f"{observed} (p = {c.p_value:.3g})",
                f"not shown < {c.threshold:.3g}× at α {c.alpha:g} ({c.test})")
    return observed, f"≥ {c.threshold:.3g}×"


def gate_table(decision: GateDecision) -> str:
    """The gate decision as a four-column table (criterion, result, observed, required)."""
    rows = []
    for c in decision.criteria:
        observed, required = criterion_cells(c)
        rows.append(f"| {c.name} | {_STATUS.get(c.status, c.status)} | {observed} | {required} |")
    head = "| criterion | result | value or ratio × | required |\n|---|---|---|---|"
    return "\n".join([head, *rows])


def _served(r: CanaryStepResult) -> tuple[int, int]:
    """Requests each side answered; results logged before these were recorded fall back
    to the latency sample sizes."""
    if r.served_by_candidate is None or r.served_by_production is None:
        return r.n_candidate, r.n_production
    return r.served_by_candidate, r.served_by_production


def traffic_table(results: Sequence[CanaryStepResult]) -> str:
    """Shadow and canary steps, one row each: the step's traffic share, requests served by
    each side (candidate / production), the candidate's median latency as a ratio of
    production's (``latency ×``), the one-sided test's p-value with its preregistered α
    (``n/a`` where latency is not assessed, the reason above the table) and the result.

    Narrow enough for the Prefect UI's dialog at 1280 px (455 px for the table, whose
    cells never wrap: measured 2026-12-01, and asserted by ``tests/test_browser.py``):
    the step is named by its traffic share (fractions strictly increase, so it is
    unique), and whatever is long (a failed step's breaches, drift included; why latency
    was not assessed) is listed above the table, its cell saying ``FAIL`` or ``n/a``."""
    head = ("| step | served | latency × | p (α) | result |\n"
            "|---|---|---|---|---|")
    rows, notes = [], []
    untested: dict[str, list[str]] = {}  # why latency was not assessed -> steps
    for r in results:
        if not r.passed:
            notes.append(f"- **{r.step} failed:** " + "; ".join(r.breaches))
        if not r.latency_assessed:
            untested.setdefault(r.latency_not_assessed_reason or "no latency test ran",
                                []).append(r.step)
        p = _p_text(r, "{p} ({alpha:.2g})", "n/a") if r.latency_assessed else "n/a"
        cand, prod = _served(r)
        rows.append(f"| {r.traffic_fraction:.0%} | {cand} / {prod} "
                    f"| {r.median_latency_ratio:.3g} | {p} | {'pass' if r.passed else 'FAIL'} |")
    notes += [f"- latency not assessed in {', '.join(steps)}: {why}"
              for why, steps in untested.items()]
    excluded = [r for r in results if r.passed and r.production_error_count]
    if excluded:  # left out as registered: said before anyone approves on the rest
        notes.append("- production failed " + ", ".join(
            f"{r.production_error_count} in {r.step}" + _by_bucket(r) for r in excluded)
            + ": left out of the comparison as registered (exclude_production_failures)")
    legend = "Served: requests answered by the candidate / by production."
    return "\n".join([*notes, *([""] if notes else []), legend, "", head, *rows])


def _by_bucket(r: CanaryStepResult) -> str:
    if not r.production_failed_buckets:
        return ""
    return " (" + ", ".join(f"{b} tokens: {n}" for b, n in
                            sorted(r.production_failed_buckets.items())) + ")"


def traffic_line(r: CanaryStepResult) -> str:
    """One step as a sentence (for a stage shown beside another table)."""
    latency = f"{r.median_latency_ratio:.3g}× production's" + (
        "" if r.latency_assessed else " (not assessed)")
    verdict = "pass" if r.passed else "**FAIL**: " + "; ".join(r.breaches)
    cand, prod = _served(r)
    return (f"{cand} served by the candidate / {prod} by production, median "
            f"latency {latency}, {_p_text(r, 'p = {p:.3g} (α {alpha:g})', 'no latency test')}: "
            f"{verdict}")


def _p_text(r: CanaryStepResult, form: str, missing: str) -> str:
    """``form`` filled with the step's p-value and alpha; ``missing`` where no test ran
    (a shadow or a step whose latency is not assessed records NaN for both)."""
    if not (math.isfinite(r.p_value) and math.isfinite(r.alpha)):
        return missing
    if "{p}" in form:  # the table's narrow cell: two digits, a floor for tiny values
        return form.format(p="<0.001" if r.p_value < 1e-3 else f"{r.p_value:.2g}", alpha=r.alpha)
    return form.format(p=r.p_value, alpha=r.alpha)


def _decision_block(title: str, decision: GateDecision, *, table: bool = True) -> str:
    """A decision's heading (the verdict and, in the same line, what was not assessed),
    its tally and reasons, then its criteria: the table, or (where another table must
    come last) one line per criterion."""
    tally = decision.summary.splitlines()[0] if decision.summary else decision.verdict
    lines = [f"### {title}: **{verdict_line(decision.verdict, decision)}**", "", tally]
    if not decision.passed:
        lines += ["", short_reason(decision)]
    if decision.not_assessed_note:
        lines += ["", f"*{decision.not_assessed_note}*"]
    return "\n".join([*lines, "", gate_table(decision) if table else criteria_rows(decision)])


def criteria_rows(decision: GateDecision) -> str:
    """One markdown list row per criterion: name, result, observed against required."""
    rows = []
    for c in decision.criteria:
        observed, required = criterion_cells(c)
        rows.append(f"- {c.name}: {_STATUS.get(c.status, c.status)} ({observed}, "
                    f"required {required})")
    return "\n".join(rows)


def signed_only_note(flow_run_id: str, approvers: Sequence[str]) -> str:
    """What a policy with ``require_signed`` tells the release manager above the form:
    the command that signs an answer, that a typed answer is refused, and who may sign
    (``approvers``: the registered policy's names)."""
    who = (f"Approvers named in the registered policy: {', '.join(approvers)}." if approvers
           else "**No approver is named in the registered policy: nobody can approve** (add "
                "the entry `kernelgate keys create --name NAME` prints to the thresholds "
                "file's `approval.approvers` and roll out again).")
    return ("**This policy takes only signed approvals.** Run `kernelgate approve "
            f"{flow_run_id} --key <your key>` and paste its output into *Signed approval*; "
            f"an answer typed here is refused. {who}")


def approval_markdown(transition: str, version: str, decision: GateDecision, *,
                      traffic: Sequence[CanaryStepResult] = (),
                      confirmation: GateDecision | None = None,
                      signed_only: str | None = None, adoption: str | None = None) -> str:
    """The evidence the release manager is asked to approve for ``transition``. One
    table, last: the Prefect UI's markdown renders nothing after a table.
    ``signed_only``: :func:`signed_only_note`, shown first (a policy with
    ``require_signed``). ``adoption``: the adoption test's evidence
    (``gates.adoption_decision.adoption_markdown``; a registration with ``decision:``),
    shown at ``canary->production`` after the confirmation, before the canary steps."""
    parts = [f"## Approve `{transition}` for v{version}?"]
    if signed_only:
        parts.append(signed_only)
    shadow = [r for r in traffic if r.step == "shadow"]
    if transition == "canary->production":
        parts.append(_decision_block("Confirmation split (accuracy only)", confirmation,
                                     table=False)
                     if confirmation is not None else "### Confirmation split: not run")
        if adoption:
            parts.append(adoption)
        canary = [r for r in traffic if r.step != "shadow"]
        parts.append("### Canary steps\n\n" + (traffic_table(canary) if canary
                                               else "No canary step ran."))
    else:
        if transition == "shadow->canary":
            parts.append("### Shadow (mirrored; the candidate served nothing)\n\n"
                         + (traffic_line(shadow[-1]) if shadow else "No shadow result."))
        parts.append(_decision_block("Held-out gate", decision))
    return "\n\n".join(parts) + "\n"
