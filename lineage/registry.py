"""Model registry: one registered model per kernel family, aliases for rollout stages.

* Registered model ``kernelgate-<family>``; a version is one build, created from the build
  run (``source = runs:/<build run id>/build``, ``run_id`` = build run id) and tagged with
  what it serves (``kernelgate.implementation``, the resolved ``kernelgate.config``).
* Aliases ``shadow``, ``canary``, ``production``. ``shadow`` needs nothing (its output is
  never served). ``canary`` and ``production`` need a complete chain of evidence for the
  version (:mod:`lineage.chain`: gate decision, shadow, approvals, and for production the
  canary steps and the confirmation decision); otherwise :class:`PromotionRefused` is
  raised and no alias moves. Whoever calls (a flow, the CLI, a Python shell) meets the
  same rules.
* Every alias move is logged as a ``promotion`` or ``rollback`` run (``lineage.records``).
  Promotion tags the version with ``kernelgate.promoted_at``; the registered model keeps
  ``kernelgate.previous_production_version`` and the JSON list
  ``kernelgate.production_history`` (oldest first, current last).
* Rollback moves ``production`` back to the previous version (its chain re-checked) or,
  with none usable, removes the alias so serving falls back to the native baseline; the
  rolled-back version is tagged ``kernelgate.rollback_reason`` / ``kernelgate.rolled_back_at``.

Aliases are read through ``get_registered_model(...).aliases`` and
``get_model_version_by_alias`` — the search APIs return empty aliases on SQLite.

Kept in one module (over 350 lines) because every alias move and its invariant check
live together: a move added elsewhere could bypass the check.
"""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime
from typing import Literal

from mlflow.exceptions import MlflowException
from pydantic import AwareDatetime, BaseModel, ConfigDict

from kernels.config import BlockSizes
from lineage import chain, tags
from lineage.records import LineageError, log_alias_change
from lineage.tracking import Tracking, experiment_name

Alias = Literal["shadow", "canary", "production"]
ALIASES: tuple[Alias, ...] = ("shadow", "canary", "production")
_HISTORY_KEEP = 50


class PromotionRefused(RuntimeError):
    """An alias move was refused: the version's chain of evidence is incomplete."""


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
            name, tags={tags.FAMILY: family},
            description=f"Attention kernel family {family!r} (kernelgate).")
    return name


def register_build(tracking: Tracking, family: str, build_run_id: str, *, implementation: str,
                   config: BlockSizes | None, artifact_path: str = "build") -> str:
    """Create a model version for a build run; returns the version number (as str).

    The version is tagged with what it serves: ``implementation`` and its resolved
    block sizes (``null`` for untiled kernels).

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
        name, source=f"runs:/{build_run_id}/{artifact_path}", run_id=build_run_id,
        tags={tags.BUILD_RUN_ID: build_run_id, tags.FAMILY: family,
              tags.IMPLEMENTATION: implementation,
              tags.CONFIG: config.model_dump_json() if config else "null"})
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


def version_tags(tracking: Tracking, family: str, version: str) -> dict[str, str]:
    """The tags of one model version of the family's registered model."""
    return dict(tracking.client().get_model_version(registered_model_name(family), version).tags)


def tag_version(tracking: Tracking, family: str, version: str, values: dict[str, str]) -> None:
    """Set tags on one model version (the links from a version to the runs that judged it)."""
    client = tracking.client()
    for key, value in values.items():
        client.set_model_version_tag(registered_model_name(family), version, key, value)


def version_kernel(tracking: Tracking, family: str, version: str
                   ) -> tuple[str, BlockSizes | None]:
    """``(implementation, block sizes)`` a model version was built with."""
    vtags = version_tags(tracking, family, version)
    raw = vtags.get(tags.CONFIG, "null")
    return vtags[tags.IMPLEMENTATION], (None if raw == "null"
                                        else BlockSizes.model_validate_json(raw))


def link_traffic_run(tracking: Tracking, family: str, version: str, stage: Literal["shadow", "canary"],
                     run_id: str) -> None:
    """Link a shadow run, or append a canary-step run, to the version it judged."""
    if stage == "shadow":
        tag_version(tracking, family, version, {tags.SHADOW_RUN_ID: run_id})
        return
    runs = json.loads(version_tags(tracking, family, version).get(tags.CANARY_RUN_IDS, "[]"))
    tag_version(tracking, family, version, {tags.CANARY_RUN_IDS: json.dumps([*runs, run_id])})


def _refuse_incomplete(tracking: Tracking, family: str, version: str, transition,
                       decision_run_id: str | None) -> chain.ChainEvidence:
    evidence = chain.collect(tracking, family, version, decision_run_id=decision_run_id)
    found = chain.problems(evidence, transition)
    if found:
        raise PromotionRefused(f"{registered_model_name(family)} v{version}: {transition} refused: "
                               + "; ".join(found))
    return evidence


def _log(tracking: Tracking, change: AliasChange, parent_run_id: str | None) -> AliasChange:
    log_alias_change(tracking, change, parent_run_id=parent_run_id)
    return change


def assign_shadow(tracking: Tracking, family: str, version: str, *,
                  owner_run_id: str | None = None) -> AliasChange:
    """Point ``shadow`` at ``version`` (mirrored traffic only; no decision needed); the
    owning rollout run is recorded on the version (its lease on the alias)."""
    name = registered_model_name(family)
    previous = alias_version(tracking, family, "shadow")
    tracking.client().get_model_version(name, version)  # raises if absent
    tracking.client().set_registered_model_alias(name, "shadow", version)
    if owner_run_id:
        tag_version(tracking, family, version, {tags.alias_owner("shadow"): owner_run_id,
                                                tags.ROLLOUT_RUN_ID: owner_run_id})
    return _log(tracking, AliasChange(family=family, alias="shadow", version=version,
                                      previous_version=previous, at=_now(), action="assign"),
                owner_run_id)


def assign_canary(tracking: Tracking, family: str, version: str, *, decision_run_id: str,
                  owner_run_id: str | None = None) -> AliasChange:
    """Point ``canary`` at ``version``; needs the chain up to ``shadow->canary``.

    Raises:
        PromotionRefused: naming every missing or wrong piece of evidence.
    """
    _refuse_incomplete(tracking, family, version, "shadow->canary", decision_run_id)
    previous = alias_version(tracking, family, "canary")
    tracking.client().set_registered_model_alias(registered_model_name(family), "canary", version)
    values = {tags.DECISION_RUN_ID: decision_run_id}
    if owner_run_id:
        values[tags.alias_owner("canary")] = owner_run_id
    tag_version(tracking, family, version, values)
    return _log(tracking, AliasChange(family=family, alias="canary", version=version,
                                      previous_version=previous, at=_now(), action="assign",
                                      decision_run_id=decision_run_id), owner_run_id)


def promote(tracking: Tracking, family: str, version: str, *, decision_run_id: str,
            parent_run_id: str | None = None) -> AliasChange:
    """Move ``production`` to ``version`` after checking its complete chain.

    Records the previous production version on the registered model and retires the
    ``canary`` and ``shadow`` aliases that pointed at ``version`` (their job is done),
    with the owner tags they carried.

    Raises:
        PromotionRefused: naming every missing or wrong piece of evidence.
    """
    evidence = _refuse_incomplete(tracking, family, version, "canary->production", decision_run_id)
    client = tracking.client()
    name = registered_model_name(family)
    current = aliases(tracking, family)
    previous = current.get("production")
    at = _now()
    client.set_registered_model_alias(name, "production", version)
    history = [v for v in production_history(tracking, family) if v != version] + [version]
    client.set_registered_model_tag(name, tags.PRODUCTION_HISTORY,
                                    json.dumps(history[-_HISTORY_KEEP:]))
    if previous and previous != version:
        client.set_registered_model_tag(name, tags.PREVIOUS_PRODUCTION, previous)
    tag_version(tracking, family, version, {
        tags.DECISION_RUN_ID: decision_run_id,
        tags.EVALUATION_RUN_ID: evidence.decision.evaluation_run_id,
        tags.REGISTRATION_ID: evidence.decision.registration_id,
        tags.PROMOTED_AT: at.isoformat()})
    for done in ("canary", "shadow"):
        if current.get(done) == version:
            client.delete_registered_model_alias(name, done)
        _drop_version_tag(tracking, family, version, tags.alias_owner(done))
    return _log(tracking, AliasChange(family=family, alias="production", version=version,
                                      previous_version=previous, at=at, action="promote",
                                      decision_run_id=decision_run_id), parent_run_id)


def _drop_version_tag(tracking: Tracking, family: str, version: str, key: str) -> None:
    with contextlib.suppress(MlflowException):  # not set
        tracking.client().delete_model_version_tag(registered_model_name(family), version, key)


def rollback(tracking: Tracking, family: str, *, reason: str, alias: Alias = "production",
             retire_if_unusable: bool = False, parent_run_id: str | None = None) -> AliasChange:
    """Undo the version behind ``alias`` and tag it with ``reason``.

    For ``production``: restore the previously promoted version (its chain re-checked)
    or remove the alias when there is none. For ``canary``/``shadow``: remove the alias.

    Args:
        retire_if_unusable: when the previous production version no longer has a
            complete chain, remove ``production`` (the native baseline serves) instead of
            raising; the reason records why. For recovery paths that must not leave a
            failing version in production.

    Raises:
        ValueError: empty reason, or ``alias`` points at nothing.
        PromotionRefused: the previous production version's chain is incomplete (and
            ``retire_if_unusable`` is False).
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
                _refuse_incomplete(tracking, family, restored, "canary->production", None)
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
        client.set_registered_model_tag(name, tags.PREVIOUS_PRODUCTION,
                                        history[-2] if len(history) > 1 else "")
    else:
        client.delete_registered_model_alias(name, alias)
    at = _now()
    tag_version(tracking, family, current,
                {tags.ROLLBACK_REASON: reason, tags.ROLLED_BACK_AT: at.isoformat()})
    return _log(tracking, AliasChange(family=family, alias=alias, version=restored,
                                      previous_version=current, at=at, action="rollback",
                                      reason=reason), parent_run_id)


def reject(tracking: Tracking, family: str, version: str, reason: str, *,
           parent_run_id: str | None = None) -> list[AliasChange]:
    """Record why a version stops here (``kernelgate.rejection_reason``); a ``shadow`` or
    ``canary`` alias pointing at it is rolled back. ``production`` is never touched."""
    tag_version(tracking, family, version, {tags.REJECTION_REASON: reason})
    return [rollback(tracking, family, reason=reason, alias=alias, parent_run_id=parent_run_id)
            for alias in ("shadow", "canary") if alias_version(tracking, family, alias) == version]


def clear_stale(tracking: Tracking, family: str, alias: Alias, *, reason: str,
                parent_run_id: str | None = None) -> str | None:
    """Remove an alias that no longer means anything (left by a rollout that died).

    Returns the version it pointed at (tagged ``kernelgate.stale_reason``), or None.
    ``production`` is never cleared here: use :func:`rollback`.
    """
    if alias == "production":
        raise ValueError("production is only moved by promote/rollback")
    version = alias_version(tracking, family, alias)
    if version is not None:
        tracking.client().delete_registered_model_alias(registered_model_name(family), alias)
        tag_version(tracking, family, version, {tags.STALE_REASON: f"{alias}: {reason}"})
        _log(tracking, AliasChange(family=family, alias=alias, version=None,
                                   previous_version=version, at=_now(), action="clear",
                                   reason=reason), parent_run_id)
    return version


def clear_stale_aliases(tracking: Tracking, family: str, *, lease_s: float,
                        cleared_by_run_id: str) -> list[str]:
    """Clear ``canary``/``shadow`` aliases left by rollouts that did not finish.

    An alias whose owning rollout run is still RUNNING and younger than ``lease_s``
    seconds is left alone (that rollout is live). Returns the aliases cleared.
    """
    cleared = []
    for alias in ("canary", "shadow"):
        version = alias_version(tracking, family, alias)
        if version is None:
            continue
        owner = version_tags(tracking, family, version).get(tags.alias_owner(alias))
        if owner:
            try:
                run = tracking.client().get_run(owner)
            except MlflowException:
                run = None
            if (run is not None and run.info.status == "RUNNING"
                    and time.time() - run.info.start_time / 1000 < lease_s):
                continue
        clear_stale(tracking, family, alias, parent_run_id=cleared_by_run_id,
                    reason=(f"left by rollout run {owner or '(unknown)'}, which did not finish; "
                            f"cleared by {cleared_by_run_id}"))
        cleared.append(alias)
    return cleared


def link_confirmation(tracking: Tracking, family: str, version: str, decision_run_id: str) -> None:
    """Link the confirmation-split decision to the version it judged."""
    tag_version(tracking, family, version, {tags.CONFIRMATION_RUN_ID: decision_run_id})


def link_approval(tracking: Tracking, family: str, version: str, transition: str,
                  approval_run_id: str) -> None:
    """Link an approval run (approval, rejection or timeout) to the version it is about."""
    tag_version(tracking, family, version, {tags.approval_run_id(transition): approval_run_id})
