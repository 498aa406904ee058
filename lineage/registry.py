"""Model registry: one registered model per kernel family, aliases for rollout stages.

* Registered model ``kernelgate-<family>``; a version is one build, created from the build
  run (``source = runs:/<build run id>/<artifact path>``, ``run_id`` = build run id, version
  tag ``kernelgate.build_run_id``).
* Aliases ``shadow``, ``canary``, ``production``. ``shadow`` needs nothing (its output is
  never served). ``canary`` and ``production`` need a passing gate decision for *this*
  build, read back from MLflow and verified (:func:`lineage.records.load_decision`), whose
  preregistration is intact and predates the evaluation; where the decision's
  preregistered approval policy lists the transition, an approving approval run too.
  Otherwise :class:`PromotionRefused` is raised and no alias moves — ``production`` never
  points at a version without a passing decision.
* Promotion tags the version with ``kernelgate.decision_run_id``,
  ``kernelgate.evaluation_run_id``, ``kernelgate.registration_id``,
  ``kernelgate.approval_run_id`` (when any) and ``kernelgate.promoted_at``; the registered
  model keeps ``kernelgate.previous_production_version`` and the JSON list
  ``kernelgate.production_history`` (oldest first, current last).
* Rollback moves ``production`` back to the previous version (re-verifying its decision)
  or, with none, removes the alias so serving falls back to the native baseline; the
  rolled-back version is tagged ``kernelgate.rollback_reason`` / ``kernelgate.rolled_back_at``.

Aliases are read through ``get_registered_model(...).aliases`` and
``get_model_version_by_alias`` — the search APIs return empty aliases on SQLite.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Literal

from mlflow.exceptions import MlflowException
from pydantic import AwareDatetime, BaseModel, ConfigDict

from gates.preregistration import PreregistrationError, load_registration
from gates.thresholds import Transition
from lineage import tags
from lineage.records import DecisionRecord, LineageError, load_approval, load_decision
from lineage.tracking import Tracking, experiment_name

Alias = Literal["shadow", "canary", "production"]
ALIASES: tuple[Alias, ...] = ("shadow", "canary", "production")
_HISTORY_KEEP = 50
_TRANSITION: dict[Alias, Transition] = {
    "shadow": "candidate->shadow",
    "canary": "shadow->canary",
    "production": "canary->production",
}


class PromotionRefused(RuntimeError):
    """An alias move was refused: no passing, intact decision (or approval) for the version."""


class AliasChange(BaseModel):
    """A logged alias move (promotion, assignment, rollback or clearing)."""

    model_config = ConfigDict(frozen=True)

    family: str
    alias: Alias
    version: str | None  # None: alias removed
    previous_version: str | None
    at: AwareDatetime
    action: Literal["assign", "promote", "rollback", "clear"]
    reason: str = ""
    decision_run_id: str | None = None
    approval_run_id: str | None = None


def registered_model_name(family: str) -> str:
    """``kernelgate-<family>`` (same as the experiment name)."""
    return experiment_name(family)


def _now() -> datetime:
    return datetime.now(UTC)


def ensure_registered_model(tracking: Tracking, family: str) -> str:
    """Create the family's registered model if needed; returns its name."""
    client = tracking.client()
    name = registered_model_name(family)
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name,
            tags={tags.FAMILY: family},
            description=f"Attention kernel family {family!r} (kernelgate).",
        )
    return name


def register_build(
    tracking: Tracking, family: str, build_run_id: str, *, artifact_path: str = "build"
) -> str:
    """Create a model version for a build run; returns the version number (as str).

    Raises:
        LineageError: the run does not exist or is not a ``build`` run.
    """
    client = tracking.client()
    try:
        run = client.get_run(build_run_id)
    except MlflowException as exc:
        raise LineageError(f"build run {build_run_id!r} not found") from exc
    if run.data.tags.get(tags.STAGE) != "build":
        raise LineageError(f"run {build_run_id} is not a build run")
    name = ensure_registered_model(tracking, family)
    version = client.create_model_version(
        name,
        source=f"runs:/{build_run_id}/{artifact_path}",
        run_id=build_run_id,
        tags={tags.BUILD_RUN_ID: build_run_id, tags.FAMILY: family},
    )
    return str(version.version)


def aliases(tracking: Tracking, family: str) -> dict[str, str]:
    """Alias -> version of the family's registered model (empty when none exists)."""
    try:
        model = tracking.client().get_registered_model(registered_model_name(family))
    except MlflowException:
        return {}
    return {a: str(v) for a, v in model.aliases.items()}


def alias_version(tracking: Tracking, family: str, alias: Alias) -> str | None:
    """The version an alias points at, or None."""
    return aliases(tracking, family).get(alias)


def _model_tags(tracking: Tracking, family: str) -> dict[str, str]:
    return tracking.client().get_registered_model(registered_model_name(family)).tags


def production_history(tracking: Tracking, family: str) -> list[str]:
    """Versions promoted to production, oldest first (the current one last)."""
    raw = _model_tags(tracking, family).get(tags.PRODUCTION_HISTORY, "[]")
    return [str(v) for v in json.loads(raw)]


def _passing_decision(
    tracking: Tracking, family: str, version: str, decision_run_id: str
) -> DecisionRecord:
    """Load and check a decision for ``version``; raise PromotionRefused if it does not hold."""
    client = tracking.client()
    name = registered_model_name(family)
    try:
        mv = client.get_model_version(name, version)
    except MlflowException as exc:
        raise PromotionRefused(f"{name} has no version {version}") from exc
    try:
        record = load_decision(tracking, decision_run_id)
        registration = load_registration(record.registration_id, tracking=tracking)
    except (LineageError, PreregistrationError) as exc:
        raise PromotionRefused(f"{name} v{version}: decision not usable: {exc}") from exc
    if record.decision.verdict != "promote":
        raise PromotionRefused(
            f"{name} v{version}: decision {decision_run_id} rejects the candidate:\n"
            f"{record.decision.summary}"
        )
    if record.build_run_id != mv.run_id:
        raise PromotionRefused(
            f"{name} v{version}: decision {decision_run_id} judged build {record.build_run_id}, "
            f"but the version is build {mv.run_id}"
        )
    if record.decision.thresholds_sha256 != registration.thresholds_sha256:
        raise PromotionRefused(f"decision {decision_run_id}: thresholds hash != registration's")
    if record.decision.evaluation_started_at < registration.registered_at:
        raise PromotionRefused(f"decision {decision_run_id}: evaluation predates registration")
    return record


def _check_approval(
    tracking: Tracking,
    record: DecisionRecord,
    version: str,
    transition: Transition,
    approval_run_id: str | None,
) -> None:
    policy = record.decision.approval_policy
    if transition not in policy.required_for:
        return
    if approval_run_id is None:
        raise PromotionRefused(f"{transition} needs an approval run (preregistered policy)")
    try:
        approval, approved_decision = load_approval(tracking, approval_run_id)
    except LineageError as exc:
        raise PromotionRefused(f"approval not usable: {exc}") from exc
    problems = [
        (not approval.approved, "it does not approve"),
        (approval.timed_out, "it timed out"),
        (approval.transition != transition, f"it is for {approval.transition}"),
        (approval.version != version, f"it is for version {approval.version}"),
        (approved_decision != record.decision_run_id, "it approves another decision"),
        (
            approval.auto_approved and not policy.auto_approve,
            "it was auto-approved but the policy requires a person",
        ),
    ]
    reasons = [why for bad, why in problems if bad]
    if reasons:
        raise PromotionRefused(f"approval run {approval_run_id} refused: {'; '.join(reasons)}")


def version_tags(tracking: Tracking, family: str, version: str) -> dict[str, str]:
    """The tags of one model version of the family's registered model."""
    return dict(tracking.client().get_model_version(registered_model_name(family), version).tags)


def tag_version(tracking: Tracking, family: str, version: str, values: dict[str, str]) -> None:
    """Set tags on one model version (the links from a version to the runs that judged it)."""
    client = tracking.client()
    for key, value in values.items():
        client.set_model_version_tag(registered_model_name(family), version, key, value)


def assign_shadow(tracking: Tracking, family: str, version: str) -> AliasChange:
    """Point ``shadow`` at ``version`` (mirrored traffic only; no decision needed)."""
    name = registered_model_name(family)
    previous = alias_version(tracking, family, "shadow")
    tracking.client().get_model_version(name, version)  # raises if absent
    tracking.client().set_registered_model_alias(name, "shadow", version)
    return AliasChange(
        family=family,
        alias="shadow",
        version=version,
        previous_version=previous,
        at=_now(),
        action="assign",
    )


def assign_canary(
    tracking: Tracking,
    family: str,
    version: str,
    *,
    decision_run_id: str,
    approval_run_id: str | None = None,
) -> AliasChange:
    """Point ``canary`` at ``version``; needs a passing decision (and approval if listed).

    Raises:
        PromotionRefused: see the module docstring.
    """
    record = _passing_decision(tracking, family, version, decision_run_id)
    _check_approval(tracking, record, version, _TRANSITION["canary"], approval_run_id)
    previous = alias_version(tracking, family, "canary")
    tracking.client().set_registered_model_alias(registered_model_name(family), "canary", version)
    tag_version(tracking, family, version, {tags.DECISION_RUN_ID: decision_run_id})
    return AliasChange(
        family=family,
        alias="canary",
        version=version,
        previous_version=previous,
        at=_now(),
        action="assign",
        decision_run_id=decision_run_id,
        approval_run_id=approval_run_id,
    )


def promote(
    tracking: Tracking,
    family: str,
    version: str,
    *,
    decision_run_id: str,
    approval_run_id: str | None = None,
) -> AliasChange:
    """Move ``production`` to ``version`` after verifying its passing decision and approval.

    Records the previous production version on the registered model and clears the
    ``canary`` and ``shadow`` aliases that pointed at ``version`` (their job is done).

    Raises:
        PromotionRefused: no passing, intact decision for this build; approval missing or
            not approving where the preregistered policy requires it.
    """
    record = _passing_decision(tracking, family, version, decision_run_id)
    _check_approval(tracking, record, version, _TRANSITION["production"], approval_run_id)
    client = tracking.client()
    name = registered_model_name(family)
    current = aliases(tracking, family)
    previous = current.get("production")
    at = _now()
    client.set_registered_model_alias(name, "production", version)
    history = [v for v in production_history(tracking, family) if v != version] + [version]
    client.set_registered_model_tag(
        name, tags.PRODUCTION_HISTORY, json.dumps(history[-_HISTORY_KEEP:])
    )
    if previous and previous != version:
        client.set_registered_model_tag(name, tags.PREVIOUS_PRODUCTION, previous)
    version_tags = {
        tags.DECISION_RUN_ID: decision_run_id,
        tags.EVALUATION_RUN_ID: record.evaluation_run_id,
        tags.REGISTRATION_ID: record.registration_id,
        tags.PROMOTED_AT: at.isoformat(),
    }
    if approval_run_id:
        version_tags[tags.APPROVAL_RUN_ID] = approval_run_id
    tag_version(tracking, family, version, version_tags)
    for done in ("canary", "shadow"):
        if current.get(done) == version:
            client.delete_registered_model_alias(name, done)
    return AliasChange(
        family=family,
        alias="production",
        version=version,
        previous_version=previous,
        at=at,
        action="promote",
        decision_run_id=decision_run_id,
        approval_run_id=approval_run_id,
    )


def rollback(
    tracking: Tracking,
    family: str,
    *,
    reason: str,
    alias: Alias = "production",
    retire_if_unusable: bool = False,
) -> AliasChange:
    """Undo the version behind ``alias`` and tag it with ``reason``.

    For ``production``: restore the previously promoted version (its decision re-verified)
    or remove the alias when there is none. For ``canary``/``shadow``: remove the alias.

    Args:
        retire_if_unusable: when the previous production version no longer has a usable
            decision, remove ``production`` (the native baseline serves) instead of
            raising; the reason records why. For recovery paths that must not leave a
            failing version in production.

    Raises:
        ValueError: empty reason, or ``alias`` points at nothing.
        PromotionRefused: the previous production version no longer has a usable decision
            (and ``retire_if_unusable`` is False).
    """
    if not reason.strip():
        raise ValueError("rollback needs a reason")
    client = tracking.client()
    name = registered_model_name(family)
    current = alias_version(tracking, family, alias)
    if current is None:
        raise ValueError(f"{name}: alias {alias!r} points at nothing; nothing to roll back")
    restored: str | None = None
    if alias == "production":
        history = [v for v in production_history(tracking, family) if v != current]
        if history:
            restored = history[-1]
            try:
                decision_run_id = version_tags(tracking, family, restored).get(tags.DECISION_RUN_ID)
                if decision_run_id is None:
                    raise PromotionRefused(f"{name} v{restored} has no decision; not restored")
                _passing_decision(tracking, family, restored, decision_run_id)
            except PromotionRefused as exc:
                if not retire_if_unusable:
                    raise
                reason = f"{reason}; previous production not restored ({exc})"
                restored = None
        if restored:
            client.set_registered_model_alias(name, "production", restored)
        else:
            client.delete_registered_model_alias(name, "production")
        client.set_registered_model_tag(name, tags.PRODUCTION_HISTORY, json.dumps(history))
        client.set_registered_model_tag(
            name, tags.PREVIOUS_PRODUCTION, history[-2] if len(history) > 1 else ""
        )
    else:
        client.delete_registered_model_alias(name, alias)
    at = _now()
    tag_version(
        tracking,
        family,
        current,
        {tags.ROLLBACK_REASON: reason, tags.ROLLED_BACK_AT: at.isoformat()},
    )
    return AliasChange(
        family=family,
        alias=alias,
        version=restored,
        previous_version=current,
        at=at,
        action="rollback",
        reason=reason,
    )


def clear_stale(tracking: Tracking, family: str, alias: Alias, *, reason: str) -> str | None:
    """Remove an alias that no longer means anything (e.g. ``shadow`` after a promotion).

    Returns the version it pointed at (tagged ``kernelgate.stale_reason``), or None.
    ``production`` is never cleared here: use :func:`rollback`.
    """
    if alias == "production":
        raise ValueError("production is only moved by promote/rollback")
    version = alias_version(tracking, family, alias)
    if version is not None:
        tracking.client().delete_registered_model_alias(registered_model_name(family), alias)
        tag_version(tracking, family, version, {tags.STALE_REASON: f"{alias}: {reason}"})
    return version
