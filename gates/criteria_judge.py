"""Judging one criterion of a gate: a value criterion, or a change criterion against the
baseline or production (a point estimate, or a paired test: ``gates.speed_test``).

``gates.decision`` judges every criterion with :func:`judge` and turns the results into a
verdict; the statuses are described there. The report is read through
:class:`ReportView` (duck-typed; ``evaluation.report`` is not imported).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from gates.serving_contract import COVERAGE_METRIC, named_refusals
from gates.speed_test import PAIRED_PERMUTATION, QUANTILE_OF, paired_latencies, paired_quantile_test
from gates.thresholds import ChangeCriterion, ValueCriterion, compare

Status = Literal["pass", "fail", "inconclusive", "not_assessed", "not_applicable"]

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
    ``observed <op> threshold``. A change criterion judged by a test
    (``gates.speed_test``) also records it: ``test``, ``alpha``, ``p_value`` and the
    one-sided lower ``confidence_bound`` of the candidate/reference ratio; its status is
    the test's, not ``improvement >= threshold``.
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
    test: str | None = None
    alpha: float | None = None
    p_value: float | None = None
    confidence_bound: float | None = None


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
    if c.test == PAIRED_PERMUTATION:
        return _judge_tested(c, report, dict(**base, observed=observed, reference=reference,
                                             improvement=improvement))
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


def _judge_tested(c: ChangeCriterion, report: ReportView, known: dict) -> CriterionResult:
    """The paired test on the per-repeat latencies (``gates.speed_test``)."""
    known |= dict(test=c.test, alpha=c.alpha)
    pairs = paired_latencies(getattr(report, "performance", None), c.against)
    if isinstance(pairs, str):
        return CriterionResult(**known, status="fail", reason=f"{c.metric}: {pairs}")
    assert c.alpha is not None and c.max_regression is not None  # the schema's rule
    try:
        t = paired_quantile_test(*pairs, quantile=QUANTILE_OF[c.metric],
                                 max_ratio=c.max_regression, alpha=c.alpha)
    except ValueError as err:  # latencies that cannot be tested: a failure, said why
        return CriterionResult(**known, status="fail", reason=f"{c.metric}: {err}")
    if not t.can_reject:  # a test that cannot fail must not pass: it blocks, said why
        return CriterionResult(**known, status="inconclusive", reason=t.words(c.metric,
                                                                            c.against))
    return CriterionResult(**known, status="fail" if t.rejected else "pass",
                           p_value=t.p_value, confidence_bound=t.lower_bound,
                           reason=t.words(c.metric, c.against))


def judge(
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
