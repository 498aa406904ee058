"""Gate decision: an evaluation report judged against preregistered thresholds.

:func:`decide` never raises on bad metric values: a NaN, infinite or missing metric is a
``fail`` naming the metric (``mlflow.validate_evaluation_results`` would raise instead).
It does raise :class:`gates.preregistration.PreregistrationError` when the thresholds are
not the registered ones or the evaluation started before registration — a refusal to
judge, not a verdict.

Statuses per criterion:

* ``pass`` / ``fail`` — judged (a change criterion with ``test: paired_permutation``
  fails only when its paired test shows the regression at its ``alpha``: ``gates.speed_test``);
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

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gates.approval_policy import ApprovalPolicy
from gates.criteria_judge import CriterionResult as CriterionResult  # re-exported
from gates.criteria_judge import ReportView as ReportView  # re-exported
from gates.criteria_judge import Status as Status  # re-exported
from gates.criteria_judge import judge
from gates.preregistration import Registration, check_registration
from gates.thresholds import PLATFORMS, Thresholds

DECISION_SCHEMA_VERSION = 1

Verdict = Literal["promote", "reject"]


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
    # named, so a count that differs from one rollout to the next says why (the first has
    # no production to compare against)
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.status == "not_applicable":
            by_reason.setdefault(r.reason, []).append(r.name)
    lines += [f"- not applicable ({reason}): {', '.join(names)}"
              for reason, names in by_reason.items()]
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
        judge(c, report, thresholds.min_cases_per_category)
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
