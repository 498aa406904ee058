"""Gate decision: an evaluation report judged against preregistered thresholds.

:func:`decide` never raises on bad metric values: a NaN, infinite or missing metric is a
``fail`` naming the metric (``mlflow.validate_evaluation_results`` would raise instead).
It does raise :class:`gates.preregistration.PreregistrationError` when the thresholds are
not the registered ones or the evaluation started before registration — a refusal to
judge, not a verdict.

Statuses per criterion:

* ``pass`` / ``fail`` — judged;
* ``inconclusive`` — too few cases in the metric's category (``min_cases_per_category``);
  blocks promotion;
* ``not_assessed`` — a native-only criterion (speed, device memory) for a kernel that did
  not run natively (``report.speed_assessed`` is False); blocks promotion only when the
  profile says ``not_assessed_blocks_promotion: true``, and the decision says which;
* ``not_applicable`` — a change criterion against production when there is no production
  version yet (first rollout); never blocks.

The report is read through :class:`ReportView` (duck-typed; ``evaluation.report`` is not
imported), so any object with those attributes can be judged.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gates.approval_policy import ApprovalPolicy
from gates.preregistration import Registration, check_registration
from gates.serving_contract import COVERAGE_METRIC, named_refusals
from gates.thresholds import PLATFORMS, ChangeCriterion, Thresholds, ValueCriterion, compare

DECISION_SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "inconclusive", "not_assessed", "not_applicable"]
Verdict = Literal["promote", "reject"]


class ReportView(Protocol):
    """What a gate reads from an evaluation report (see ARCHITECTURE.md, "evaluation")."""

    metrics: Mapping[str, float]
    baseline_metrics: Mapping[str, float]
    production_metrics: Mapping[str, float] | None
    speed_assessed: bool
    speed_not_assessed_reason: str | None
    target_platform: str
    device_platform: str
    started_at: datetime


class CriterionResult(BaseModel):
    """The outcome of one criterion.

    ``observed`` is the candidate's metric; for change criteria ``reference`` is the
    baseline's or production's value, ``improvement`` the factor compared with
    ``threshold`` (``improvement >= threshold``); for value criteria
    ``observed <op> threshold``.
    """

    model_config = ConfigDict(ser_json_inf_nan="strings")

    name: str
    kind: str
    metric: str
    comparison: str  # "value" or "vs baseline" / "vs production"
    status: Status
    observed: float | None = None
    reference: float | None = None
    improvement: float | None = None
    op: str
    threshold: float
    reason: str


class GateDecision(BaseModel):
    """The gate's verdict on one evaluation, with every criterion's outcome."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    schema_version: Literal[1] = DECISION_SCHEMA_VERSION
    verdict: Verdict
    summary: str
    criteria: list[CriterionResult]
    profile: str
    target_platform: str
    device_platform: str
    speed_assessed: bool
    speed_not_assessed_reason: str | None
    not_assessed_blocks_promotion: bool
    not_assessed_note: str | None = Field(
        description="Explicit statement of what was not assessed and whether it blocked."
    )
    registration_id: str
    thresholds_sha256: str
    evaluation_started_at: AwareDatetime
    decided_at: AwareDatetime
    approval_policy: ApprovalPolicy
    scope: list[str] | None = Field(
        default=None, description="Criterion kinds judged; None means every criterion."
    )

    @property
    def passed(self) -> bool:
        """True when the verdict is ``promote``."""
        return self.verdict == "promote"

    def by_status(self, status: Status) -> list[CriterionResult]:
        """The criteria with a given status."""
        return [c for c in self.criteria if c.status == status]


def _lookup(metrics: Mapping[str, object] | None, name: str, side: str) -> tuple[float | None, str]:
    """A finite float, or ``(None, reason)`` naming the metric when it is missing or invalid."""
    if metrics is None or name not in metrics or metrics[name] is None:
        return None, f"{side} metric {name!r} is missing"
    raw = metrics[name]
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None, f"{side} metric {name!r} is not a number ({raw!r})"
    if math.isnan(value):
        return None, f"{side} metric {name!r} is NaN"
    if math.isinf(value):
        return None, f"{side} metric {name!r} is infinite ({value})"
    return value, ""


def _too_few_cases(metric: str, report: ReportView, min_cases: int) -> tuple[Status, str] | None:
    parts = metric.split(".")
    if min_cases <= 0 or parts[0] != "accuracy" or len(parts) < 3:
        return None
    count_name = f"accuracy.{parts[1]}.n_cases"
    n, why = _lookup(report.metrics, count_name, "candidate")
    if n is None:
        return "fail", why
    if n < min_cases:
        return "inconclusive", f"{count_name} = {n:g} < {min_cases} cases preregistered as minimum"
    return None


def _improvement(candidate: float, reference: float, c: ChangeCriterion) -> float | None:
    if candidate < 0 or reference < 0:
        return None
    cand, ref = max(candidate, c.floor), max(reference, c.floor)
    num, den = (ref, cand) if c.better == "lower" else (cand, ref)
    if den == 0:
        return 1.0 if num == 0 else math.inf
    return num / den


def _header(c: ValueCriterion | ChangeCriterion) -> dict[str, object]:
    if isinstance(c, ChangeCriterion):
        comparison, op, threshold = f"vs {c.against}", ">=", c.required_improvement
    else:
        comparison, op, threshold = "value", c.op, c.value
    return dict(
        name=c.name, kind=c.kind, metric=c.metric, comparison=comparison, op=op, threshold=threshold
    )


def _judge_value(c: ValueCriterion, report: ReportView) -> CriterionResult:
    base = _header(c)
    observed, why = _lookup(report.metrics, c.metric, "candidate")
    if observed is None:
        return CriterionResult(**base, status="fail", reason=why)
    ok = compare(observed, c.op, c.value)
    verb = "meets" if ok else "violates"
    return CriterionResult(
        **base,
        status="pass" if ok else "fail",
        observed=observed,
        reason=f"{c.metric} = {observed:.6g} {verb} {c.op} {c.value:g}",
    )


def _judge_change(c: ChangeCriterion, report: ReportView) -> CriterionResult:
    base = _header(c)
    reference_metrics = (
        report.baseline_metrics if c.against == "baseline" else report.production_metrics
    )
    if c.against == "production" and reference_metrics is None:
        return CriterionResult(
            **base, status="not_applicable", reason="no production version to compare against"
        )
    observed, why = _lookup(report.metrics, c.metric, "candidate")
    if observed is None:
        return CriterionResult(**base, status="fail", reason=why)
    reference, why = _lookup(reference_metrics, c.metric, c.against)
    if reference is None:
        return CriterionResult(**base, status="fail", observed=observed, reason=why)
    improvement = _improvement(observed, reference, c)
    if improvement is None:
        return CriterionResult(
            **base,
            status="fail",
            observed=observed,
            reference=reference,
            reason=f"{c.metric}: an improvement ratio needs non-negative values",
        )
    ok = improvement >= c.required_improvement
    ratio = "reference/candidate" if c.better == "lower" else "candidate/reference"
    return CriterionResult(
        **base,
        status="pass" if ok else "fail",
        observed=observed,
        reference=reference,
        improvement=improvement,
        reason=(
            f"{c.metric}: candidate {observed:.6g} vs {c.against} {reference:.6g}, "
            f"improvement ({ratio}) {improvement:.4g} {'>=' if ok else '<'} "
            f"required {c.required_improvement:.4g}"
        ),
    )


def _judge(
    c: ValueCriterion | ChangeCriterion, report: ReportView, min_cases: int
) -> CriterionResult:
    if c.requires_native and not report.speed_assessed:
        why = report.speed_not_assessed_reason or "the kernel did not run natively"
        why = f"not assessed: {why}; its {c.kind} is recorded for information only"
        return CriterionResult(**_header(c), status="not_assessed", reason=why)
    result = _judge_value(c, report) if isinstance(c, ValueCriterion) else _judge_change(c, report)
    if c.metric == COVERAGE_METRIC and result.status == "fail":  # name the refused cases
        result = result.model_copy(update={"reason": named_refusals(
            result.reason, getattr(report, "refused", None))})
    few = _too_few_cases(c.metric, report, min_cases)
    if few is not None and result.status != "not_applicable":
        status, why = few
        return result.model_copy(update={"status": status, "reason": why})
    return result


def _blocking(result: CriterionResult, not_assessed_blocks: bool) -> bool:
    return result.status in ("fail", "inconclusive") or (
        result.status == "not_assessed" and not_assessed_blocks
    )


def _summary(
    verdict: Verdict, results: list[CriterionResult], blocks: bool, note: str | None
) -> str:
    counts = {
        s: sum(r.status == s for r in results)
        for s in ("pass", "fail", "inconclusive", "not_assessed", "not_applicable")
    }
    tally = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    lines = [f"{verdict.upper()}: {tally}."]
    lines += [f"- {r.status}: {r.name}: {r.reason}" for r in results if _blocking(r, blocks)]
    if note:
        lines.append(note)
    return "\n".join(lines)


def short_reason(decision: GateDecision) -> str:
    """One line naming the criteria that stopped a candidate (their reasons are in the
    decision's summary and table, printed once): ``gate rejected: fail: a, b; ...``."""
    by_status: dict[str, list[str]] = {}
    for r in decision.criteria:
        if _blocking(r, decision.not_assessed_blocks_promotion):
            by_status.setdefault(r.status.replace("_", " "), []).append(r.name)
    return f"gate {decision.verdict}: " + "; ".join(
        f"{status}: {', '.join(names)}" for status, names in by_status.items())


def decide(
    report: ReportView,
    thresholds: Thresholds,
    registration: Registration,
    *,
    now: datetime | None = None,
    kinds: Collection[str] | None = None,
) -> GateDecision:
    """Judge ``report`` against the criteria for ``report.target_platform``.

    Args:
        report: evaluation report (see :class:`ReportView`); ``started_at`` tz-aware.
        thresholds: loaded with :func:`gates.thresholds.load_thresholds` from the file that
            ``registration`` froze (its ``source_sha256`` is compared).
        registration: from :func:`gates.preregistration.verify_registration` or
            :func:`gates.preregistration.preregister`.
        now: decision time (UTC), for tests; defaults to the current time.
        kinds: judge only criteria of these kinds (e.g. ``{"accuracy"}`` on the
            confirmation split, whose speed was judged on the held-out split); ``None``
            judges every criterion. The decision records the scope.

    Returns:
        A :class:`GateDecision`; verdict ``promote`` only when no criterion failed or was
        inconclusive and, where the profile says so, none was ``not_assessed``.

    Raises:
        PreregistrationError: thresholds differ from the registered file, or the evaluation
            started before the registration.
        ValueError: ``report.target_platform`` is not one of tpu/gpu/cpu, or naive
            ``report.started_at``.
    """
    check_registration(registration, thresholds.source_sha256, report.started_at)
    if report.target_platform not in PLATFORMS:
        raise ValueError(
            f"report.target_platform must be one of {PLATFORMS}, got {report.target_platform!r}"
        )
    criteria = thresholds.platforms[report.target_platform]  # type: ignore[index]
    results = [
        _judge(c, report, thresholds.min_cases_per_category)
        for c in (*criteria.value, *criteria.change)
        if kinds is None or c.kind in kinds
    ]
    if not results:
        raise ValueError(f"no criterion of kinds {sorted(kinds or [])} for {report.target_platform}")
    blocks = thresholds.not_assessed_blocks_promotion
    verdict: Verdict = "reject" if any(_blocking(r, blocks) for r in results) else "promote"
    not_assessed = [r.name for r in results if r.status == "not_assessed"]
    note = None
    if not_assessed:
        why = report.speed_not_assessed_reason or "the kernel did not run natively"
        effect = (
            "this BLOCKS promotion"
            if blocks
            else "this does NOT block promotion, so the promotion says nothing about speed or device memory"
        )
        note = (
            f"Not assessed ({why}): {', '.join(not_assessed)}. Profile {thresholds.profile!r} "
            f"sets not_assessed_blocks_promotion={str(blocks).lower()}: {effect}."
        )
    return GateDecision(
        verdict=verdict,
        summary=_summary(verdict, results, blocks, note),
        criteria=results,
        profile=thresholds.profile,
        target_platform=report.target_platform,
        device_platform=report.device_platform,
        speed_assessed=report.speed_assessed,
        speed_not_assessed_reason=report.speed_not_assessed_reason,
        not_assessed_blocks_promotion=blocks,
        not_assessed_note=note,
        registration_id=registration.registration_id,
        thresholds_sha256=registration.thresholds_sha256,
        evaluation_started_at=report.started_at,
        decided_at=now or datetime.now(UTC),
        approval_policy=thresholds.approval,
        scope=sorted(kinds) if kinds is not None else None,
    )
