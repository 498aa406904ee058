"""Which changes between two registrations make the thresholds looser (pure logic).

Registrations of a family form an append-only chain; a new registration that loosens
any criterion after a candidate was rejected needs a named approval (threshold
shopping: re-running a rejected candidate under a copy of the file with one bound
relaxed). "Looser" means: a candidate that failed before could pass now, or a check that
could stop a rollout no longer can. Any change that is not clearly a tightening is
reported, so the approval has to say why.
"""

from __future__ import annotations

from gates.thresholds import ChangeCriterion, Thresholds, ValueCriterion

_UPPER_BOUNDS = ("<=", "<")
_LOWER_BOUNDS = (">=", ">")


def _value(platform: str, old: ValueCriterion, new: ValueCriterion) -> list[str]:
    where = f"{platform}/{old.name}"
    if (old.metric, old.op, old.kind, old.requires_native) != (
            new.metric, new.op, new.kind, new.requires_native):
        return [f"{where}: changed from {old.metric} {old.op} {old.value:g} to "
                f"{new.metric} {new.op} {new.value:g}"]
    looser = ((old.op in _UPPER_BOUNDS and new.value > old.value)
              or (old.op in _LOWER_BOUNDS and new.value < old.value)
              or (old.op == "==" and new.value != old.value))
    return [f"{where}: {old.metric} {old.op} {old.value:g} -> {new.value:g}"] if looser else []


def _change(platform: str, old: ChangeCriterion, new: ChangeCriterion) -> list[str]:
    where = f"{platform}/{old.name}"
    if (old.metric, old.against, old.better, old.kind, old.requires_native) != (
            new.metric, new.against, new.better, new.kind, new.requires_native):
        return [f"{where}: changed what it compares"]
    out = []
    if new.required_improvement < old.required_improvement:
        out.append(f"{where}: required improvement {old.required_improvement:.4g} -> "
                   f"{new.required_improvement:.4g}")
    if new.floor > old.floor:
        out.append(f"{where}: floor {old.floor:g} -> {new.floor:g}")
    return out


def loosenings(old: Thresholds, new: Thresholds) -> list[str]:
    """Every way ``new`` is looser than ``old``, in words (empty: not looser)."""
    out: list[str] = []
    if old.not_assessed_blocks_promotion and not new.not_assessed_blocks_promotion:
        out.append("not_assessed_blocks_promotion: true -> false")
    if new.min_cases_per_category < old.min_cases_per_category:
        out.append(f"min_cases_per_category {old.min_cases_per_category} -> "
                   f"{new.min_cases_per_category}")
    for platform, old_criteria in old.platforms.items():
        new_criteria = new.platforms[platform]
        new_by_name = {c.name: c for c in (*new_criteria.value, *new_criteria.change)}
        for criterion in (*old_criteria.value, *old_criteria.change):
            replacement = new_by_name.get(criterion.name)
            if replacement is None:
                out.append(f"{platform}/{criterion.name}: removed")
            elif type(replacement) is not type(criterion):
                out.append(f"{platform}/{criterion.name}: changed kind of criterion")
            elif isinstance(criterion, ValueCriterion):
                out += _value(platform, criterion, replacement)
            else:
                out += _change(platform, criterion, replacement)
    out += _canary(old, new) + _approval(old, new)
    return out


def _canary(old: Thresholds, new: Thresholds) -> list[str]:
    a, b = old.canary, new.canary
    out = []
    if [(s.traffic_fraction, s.requests) for s in b.steps] != [
            (s.traffic_fraction, s.requests) for s in a.steps]:
        fewer = (len(b.steps) < len(a.steps)
                 or sum(s.requests for s in b.steps) < sum(s.requests for s in a.steps))
        if fewer:
            out.append("canary: fewer steps or requests")
    for name in ("max_error_count", "max_nan_count", "max_output_drift", "max_memory_growth_bytes"):
        if getattr(b, name) > getattr(a, name):
            out.append(f"canary.{name} {getattr(a, name):g} -> {getattr(b, name):g}")
    if b.latency.alpha < a.latency.alpha:
        out.append(f"canary.latency.alpha {a.latency.alpha:g} -> {b.latency.alpha:g}")
    if b.latency.min_slowdown_ratio > a.latency.min_slowdown_ratio:
        out.append(f"canary.latency.min_slowdown_ratio {a.latency.min_slowdown_ratio:g} -> "
                   f"{b.latency.min_slowdown_ratio:g}")
    return out


def _approval(old: Thresholds, new: Thresholds) -> list[str]:
    a, b = old.approval, new.approval
    out = [f"approval no longer required for {t}" for t in a.required_for if t not in b.required_for]
    if b.auto_approve and not a.auto_approve:
        out.append("approval.auto_approve: false -> true")
    if a.require_signed and not b.require_signed:
        out.append("approval.require_signed: true -> false")
    added = {p.keyid for p in b.approvers} - {p.keyid for p in a.approvers}
    if added:
        out.append(f"approval: new approver keys {sorted(added)}")
    return out
