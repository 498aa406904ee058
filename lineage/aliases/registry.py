"""The alias-moving wall: every move of ``shadow``, ``canary`` and ``production``.

* One registered model per kernel family (:mod:`lineage.aliases.registered_model` creates, reads
  and tags it and reads the signed alias history back; it never moves an alias).
* Aliases ``shadow``, ``canary``, ``production``. ``shadow`` needs nothing (its output is
  never served). ``canary`` and ``production`` need a complete, signed chain of evidence
  for the version (:mod:`lineage.records.chain`); otherwise :class:`PromotionRefused` is raised
  and no alias moves. Whoever calls (a flow, the CLI, a Python shell) meets the same rules.
* Promotion is a compare-and-swap: it is refused when ``production`` is no longer the
  version the candidate was judged against.
* MLflow has no transactions across calls, so every alias move is first a signed intent
  (an ``alias`` attestation, numbered per family and hash-chained to the previous one,
  logged as a ``promotion``/``rollback`` run), then the move itself. :func:`reconcile`
  replays the signed history and makes the aliases say what it says (finishing a move a
  crash interrupted, undoing one made by hand); the audit reads the history from the
  attestations, never from a tag.
* Rollback restores the newest earlier production version whose chain is still complete
  and that still exists, or takes ``production`` down (the native baseline serves), and
  says why either way.

Every alias move and its invariant check live here together (a move added elsewhere
could bypass it); each is an entry of the family's signed log (``lineage.log.log_writer``),
a compare-and-swap on its sequence where writers race (``_move``). Kept over 350 lines
for that reason: splitting the moves from their checks would open a path around them.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime
from typing import Literal

from mlflow.exceptions import MlflowException
from pydantic import AwareDatetime, BaseModel, ConfigDict

from kernels.errors import KernelgateError
from lineage.aliases import production_story
from lineage.aliases.registered_model import (
    Alias,
    alias_version,
    aliases,
    drop_version_tag,
    ensure_registered_model,
    production_history,
    registered_model_name,
    signed_aliases,
    store_alias_history,
    tag_version,
    version_exists,
    version_tags,
)
from lineage.log import family_log, log_writer
from lineage.log.log_sequence import SequenceTaken
from lineage.records import chain
from lineage.records.records import log_alias_change
from lineage.signing.attestations import Signing, TrustPolicy
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store.tracking import Tracking


class PromotionRefused(KernelgateError, RuntimeError):
    """An alias move was refused: incomplete evidence, or production moved meanwhile."""


class AliasChange(BaseModel):
    """A logged alias move (promotion, assignment, rollback or clearing)."""

    model_config = ConfigDict(frozen=True)

    family: str
    alias: Alias
    version: str | None  # None: alias removed
    previous_version: str | None
    at: AwareDatetime
    action: Literal["assign", "promote", "rollback", "clear", "reconcile", "reattest"]
    reason: str = ""
    decision_run_id: str | None = None


def _now() -> datetime:
    return datetime.now(UTC)


def _move(tracking: Tracking, family: str, change: AliasChange, signing: Signing, *,
          parent_run_id: str | None, chain_links: dict | None = None) -> AliasChange:
    """Sign the intent, then move the alias (the order that lets reconcile finish it).

    The signed move is a compare-and-swap on the family's log (``lineage.log.log_writer``):
    when another writer took the log position first, nothing of this attempt is signed
    and the move is signed again from the new head — numbered after the other move, its
    ``previous_version`` what the signed history now says. A promotion, rollback or
    clearing whose alias the other writer moved away from ``previous_version`` is refused
    instead (it was decided about a state that no longer holds). With concurrent writers
    (``signing.sequencer``) the first attempt compares too: the caller's read of the alias
    may already be stale (another writer signed its move and has not set the alias yet).

    Raises:
        PromotionRefused: the alias moved meanwhile (promotion, rollback, clearing).
        SequenceTaken: one log position stayed lost for ``CLAIM_WAIT_S`` seconds.
    """
    stalled = log_writer.Stalled()
    for attempt in range(1, 10_000):
        # the log's length first, then the history the move is numbered from: a move
        # signed by another writer in between makes the append refuse (expect_seq)
        head = (family_log.read(StoreSource(tracking, family, signing.trust)).length
                if signing.sequencer is not None else None)
        moves, _ = store_alias_history(tracking, family, signing.trust)
        # with concurrent writers (a sequencer), from the first attempt on: the caller read
        # the MLflow alias, which another writer sets only after signing its move (services,
        # 2026-12-01: an assignment signed with previous None after v1's), or read the signed
        # history before checking the evidence (promote); without one, the family lock
        # serialises the writers and a lost position never happens
        if attempt > 1 or signing.sequencer is not None:
            now = signed_aliases(moves).get(change.alias)
            if now != change.previous_version:
                if change.action != "assign":
                    raise PromotionRefused(
                        f"{registered_model_name(family)}: {change.action} of {change.alias} "
                        f"refused: another writer moved it to v{now} meanwhile (this move "
                        f"expected v{change.previous_version}); look again")
                change = change.model_copy(update={"previous_version": now})
        try:
            log_alias_change(tracking, change, signing=signing, sequence=len(moves) + 1,
                             previous_envelope=moves[-1].envelope_sha256 if moves else None,
                             chain=chain_links, parent_run_id=parent_run_id,
                             log_seq=None if head is None else head + 1)
            break
        except SequenceTaken as err:
            if stalled(err):
                raise log_writer.gave_up(err) from err
            log_writer.backoff(attempt)
    version = change.version
    if signing.sequencer is not None:  # concurrent writers: the alias as the signed history
        # now leaves it (a move signed after this one wins even if its alias was set first)
        moves, _ = store_alias_history(tracking, family, signing.trust)
        version = signed_aliases(moves).get(change.alias)
    _apply(tracking, family, change.alias, version)
    return change


def _apply(tracking: Tracking, family: str, alias: str, version: str | None) -> None:
    client = tracking.client()
    name = ensure_registered_model(tracking, family)
    if version is None:
        with contextlib.suppress(MlflowException):  # already gone
            client.delete_registered_model_alias(name, alias)
    else:
        client.set_registered_model_alias(name, alias, version)


def reconcile(tracking: Tracking, family: str, signing: Signing) -> list[str]:
    """Make the aliases say what the signed history says; returns what was changed.

    Finishes a move whose intent was signed but whose alias move a crash interrupted,
    and undoes an alias moved outside the pipeline; the caller logs what changed.
    """
    log_writer.require_intact(tracking, family, signing)  # a cut history is no guide
    moves, _ = store_alias_history(tracking, family, signing.trust)
    wanted, actual = signed_aliases(moves), aliases(tracking, family)
    changed = []
    for alias in sorted(set(wanted) | set(actual)):
        if wanted.get(alias) != actual.get(alias):
            _apply(tracking, family, alias, wanted.get(alias))
            changed.append(f"{alias}: {actual.get(alias)} -> {wanted.get(alias)} (as signed)")
    return changed


def _refuse_incomplete(tracking: Tracking, family: str, version: str, transition,
                       decision_run_id: str | None, signing: Signing) -> chain.ChainEvidence:
    source = StoreSource(tracking, family, signing.trust)
    evidence = chain.collect(source, version, decision_run_id=decision_run_id)
    found = chain.problems(evidence, transition) + log_writer.current_damage(source, signing)
    if found:
        raise PromotionRefused(f"{registered_model_name(family)} v{version}: {transition} refused: "
                               + "; ".join(found))
    return evidence


def assign_shadow(tracking: Tracking, family: str, version: str, *, signing: Signing,
                  owner_run_id: str | None = None) -> AliasChange:
    """Point ``shadow`` at ``version`` (mirrored traffic only; no decision needed); the
    owning rollout run is recorded on the version (its lease on the alias).

    Raises:
        PromotionRefused: no such version.
    """
    if not version_exists(tracking, family, version):
        raise PromotionRefused(f"{registered_model_name(family)} has no version {version}")
    change = AliasChange(family=family, alias="shadow", version=version,
                         previous_version=alias_version(tracking, family, "shadow"), at=_now(),
                         action="assign")
    _move(tracking, family, change, signing, parent_run_id=owner_run_id)
    if owner_run_id:
        tag_version(tracking, family, version, {tags.alias_owner("shadow"): owner_run_id,
                                                tags.ROLLOUT_RUN_ID: owner_run_id})
    return change


def assign_canary(tracking: Tracking, family: str, version: str, *, decision_run_id: str,
                  signing: Signing, owner_run_id: str | None = None) -> AliasChange:
    """Point ``canary`` at ``version``; needs the signed chain up to ``shadow->canary``.

    Raises:
        PromotionRefused: naming every missing or wrong piece of evidence.
    """
    _refuse_incomplete(tracking, family, version, "shadow->canary", decision_run_id, signing)
    change = AliasChange(family=family, alias="canary", version=version,
                         previous_version=alias_version(tracking, family, "canary"), at=_now(),
                         action="assign", decision_run_id=decision_run_id)
    _move(tracking, family, change, signing, parent_run_id=owner_run_id)
    values = {tags.DECISION_RUN_ID: decision_run_id}
    if owner_run_id:
        values[tags.alias_owner("canary")] = owner_run_id
    tag_version(tracking, family, version, values)
    return change


def promote(tracking: Tracking, family: str, version: str, *, decision_run_id: str,
            expected_previous: str | None, signing: Signing,
            parent_run_id: str | None = None) -> AliasChange:
    """Move ``production`` to ``version`` after checking its complete signed chain — a
    compare-and-swap against ``expected_previous``, the production the candidate was
    judged against.

    Retires the ``canary`` and ``shadow`` aliases that pointed at ``version`` (their job
    is done) and their owner tags.

    Raises:
        PromotionRefused: naming every missing or wrong piece of evidence, or production
            is no longer ``expected_previous`` (in the registry or in the signed history).
    """
    moves, _ = store_alias_history(tracking, family, signing.trust)
    current = aliases(tracking, family)
    signed_production = signed_aliases(moves).get("production")
    if current.get("production") != expected_previous or signed_production != expected_previous:
        raise PromotionRefused(
            f"{registered_model_name(family)} v{version}: production is v{current.get('production')} "
            f"(signed history: v{signed_production}), not the v{expected_previous} this candidate "
            "was judged against; evaluate it again against the current production")
    evidence = _refuse_incomplete(tracking, family, version, "canary->production",
                                  decision_run_id, signing)
    change = AliasChange(family=family, alias="production", version=version,
                         previous_version=expected_previous, at=_now(), action="promote",
                         decision_run_id=decision_run_id)
    links = {"build_run_id": evidence.build_run_id, "decision_run_id": decision_run_id,
             "evaluation_run_id": evidence.decision.evaluation_run_id,
             "registration_id": evidence.decision.registration_id,
             "confirmation_run_id": evidence.confirmation.decision_run_id,
             "shadow_run_id": evidence.shadow.run_id,
             "canary_run_ids": [c.run_id for c in evidence.canary],
             "approval_run_ids": {t: a.run_id for t, a in evidence.approvals.items()}}
    _move(tracking, family, change, signing, parent_run_id=parent_run_id, chain_links=links)
    for done in ("canary", "shadow"):
        # refused: another writer moved the alias away from this version meanwhile (signed
        # history), so it is no longer this version's to retire; production has moved
        if current.get(done) == version:
            with contextlib.suppress(PromotionRefused):
                _move(tracking, family, AliasChange(
                    family=family, alias=done, version=None, previous_version=version,
                    at=_now(), action="clear", reason=f"{done} retired: v{version} was promoted"),
                    signing, parent_run_id=parent_run_id)
        drop_version_tag(tracking, family, version, tags.alias_owner(done))
    tell_production_story(tracking, family, signing.trust,
                          [version] + ([expected_previous] if expected_previous else []))
    tag_version(tracking, family, version, {
        tags.DECISION_RUN_ID: decision_run_id,
        tags.EVALUATION_RUN_ID: evidence.decision.evaluation_run_id,
        tags.REGISTRATION_ID: evidence.decision.registration_id,
        tags.PROMOTED_AT: change.at.isoformat()})
    return change


def check_rollback(tracking: Tracking, family: str, *, signing: Signing,
                   alias: Alias = "production", to: str | int | None = None) -> str:
    """What :func:`rollback` checks before it moves anything, with nothing written: the
    signed log is intact, ``alias`` points at a version (returned), and ``to``, where
    given, is an earlier production version (signed history) that still exists with a
    complete chain. A command asks this first to refuse in a line, before any flow runs.

    Raises:
        ValueError, PromotionRefused, LogDamaged: as :func:`rollback`.
    """
    log_writer.require_intact(tracking, family, signing)  # LogDamaged: nothing moves
    current = alias_version(tracking, family, alias)
    if current is None:
        raise ValueError(f"{registered_model_name(family)}: alias {alias!r} points at nothing; "
                         "nothing to roll back")
    if to is not None:
        to = str(to)
        if alias != "production" or to == current:
            raise ValueError(f"rollback --to v{to}: only production rolls back to a version, "
                             f"and v{current} is what it serves now")
        history = production_history(tracking, family, signing.trust)
        if to not in history:
            raise PromotionRefused(f"{registered_model_name(family)} v{to} is not an earlier "
                                   f"production version (signed history: {history})")
        if not version_exists(tracking, family, to):
            raise PromotionRefused(f"{registered_model_name(family)} v{to} no longer exists")
        _refuse_incomplete(tracking, family, to, "canary->production", None, signing)
    return current


def rollback(tracking: Tracking, family: str, *, reason: str, signing: Signing,
             alias: Alias = "production", parent_run_id: str | None = None,
             to: str | None = None) -> AliasChange:
    """Undo the version behind ``alias`` and tag it with ``reason``.

    For ``production``: restore the newest earlier production version that still exists
    and whose chain is still complete (the signed history says which were promoted), or
    remove the alias when none is usable; the reason records which versions were passed
    over and why. ``to`` (a person's choice: ``kernelgate rollback --to N``) restores
    that version instead, if promoted and not rolled back since (signed history), still
    there, its chain complete. For ``canary``/``shadow``: remove the alias.

    Raises:
        ValueError: empty reason, ``alias`` points at nothing, or ``to`` is given for an
            alias other than production or is the current version.
        PromotionRefused, LogDamaged: ``to`` is not usable; the signed log is damaged.
    """
    if not reason.strip():
        raise ValueError("rollback needs a reason")
    current = check_rollback(tracking, family, signing=signing, alias=alias, to=to)
    restored: str | None = None
    if to is not None:
        restored = str(to)
    elif alias == "production":
        passed_over = []
        for candidate in reversed([v for v in production_history(tracking, family, signing.trust)
                                   if v != current]):
            if not version_exists(tracking, family, candidate):
                passed_over.append(f"v{candidate} no longer exists")
                continue
            try:
                _refuse_incomplete(tracking, family, candidate, "canary->production", None,
                                   signing)
            except PromotionRefused as exc:
                passed_over.append(f"v{candidate} unusable ({exc})")
                continue
            restored = candidate
            break
        if passed_over:
            reason = f"{reason}; passed over: {'; '.join(passed_over)}"
        if restored is None:
            reason = f"{reason}; no earlier usable production: production taken down"
    change = AliasChange(family=family, alias=alias, version=restored, previous_version=current,
                         at=_now(), action="rollback", reason=reason)
    _move(tracking, family, change, signing, parent_run_id=parent_run_id)
    tag_version(tracking, family, current,
                {tags.ROLLBACK_REASON: reason, tags.ROLLED_BACK_AT: change.at.isoformat()})
    if alias == "production":
        tell_production_story(tracking, family, signing.trust,
                              [current] + ([restored] if restored else []))
    return change


def tell_production_story(tracking: Tracking, family: str, trust: TrustPolicy,
                          versions: list[str]) -> None:
    """After a production move: the registered model's history tags (every production
    move with its time and reason; the version production last pointed at before now)
    and the version pages of ``versions`` (a production-story block at the top), all
    from the signed alias history (``lineage.aliases.production_story``). For people; nothing
    reads them back. A version deleted since is skipped."""
    moves = production_story.production_moves(store_alias_history(tracking, family, trust)[0])
    client = tracking.client()
    name = registered_model_name(family)
    client.set_registered_model_tag(name, tags.PRODUCTION_HISTORY,
                                    production_story.history_tag(moves))
    if moves and moves[-1].previous_version:
        client.set_registered_model_tag(name, tags.PREVIOUS_PRODUCTION,
                                        moves[-1].previous_version)
    for version in versions:
        if not version_exists(tracking, family, version):
            continue
        page = client.get_model_version(name, version).description
        client.update_model_version(name, version,
                                    description=production_story.with_story(page, moves, version))


def reject(tracking: Tracking, family: str, version: str, reason: str, *, signing: Signing,
           parent_run_id: str | None = None) -> list[AliasChange]:
    """Record why a version stops here (``kernelgate.rejection_reason``); a ``shadow`` or
    ``canary`` alias pointing at it is rolled back. ``production`` is never touched."""
    tag_version(tracking, family, version, {tags.REJECTION_REASON: reason})
    return [rollback(tracking, family, reason=reason, alias=alias, signing=signing,
                     parent_run_id=parent_run_id)
            for alias in ("shadow", "canary") if alias_version(tracking, family, alias) == version]


def decline(tracking: Tracking, family: str, version: str, reason: str, *, signing: Signing,
            parent_run_id: str | None = None) -> list[AliasChange]:
    """Record that a safe version is not adopted (``kernelgate.not_adopted_reason``: the
    adoption test found it not worth it); a ``shadow`` or ``canary`` alias pointing at it
    is taken back. ``production`` is never touched, and nothing here is a rejection."""
    tag_version(tracking, family, version, {tags.NOT_ADOPTED_REASON: reason})
    return [rollback(tracking, family, reason=reason, alias=alias, signing=signing,
                     parent_run_id=parent_run_id)
            for alias in ("shadow", "canary") if alias_version(tracking, family, alias) == version]


def clear_stale(tracking: Tracking, family: str, alias: Alias, *, reason: str, signing: Signing,
                parent_run_id: str | None = None) -> str | None:
    """Remove an alias that no longer means anything (left by a rollout that died).

    Returns the version it pointed at (tagged ``kernelgate.stale_reason``), or None.
    ``production`` is never cleared here: use :func:`rollback`.
    """
    if alias == "production":
        raise ValueError("production is only moved by promote/rollback")
    version = alias_version(tracking, family, alias)
    if version is not None:
        _move(tracking, family, AliasChange(family=family, alias=alias, version=None,
                                            previous_version=version, at=_now(), action="clear",
                                            reason=reason), signing, parent_run_id=parent_run_id)
        tag_version(tracking, family, version, {tags.STALE_REASON: f"{alias}: {reason}"})
    return version


def clear_stale_aliases(tracking: Tracking, family: str, *, lease_s: float,
                        cleared_by_run_id: str, signing: Signing,
                        owner_is_dead: bool = False) -> list[str]:
    """Clear ``canary``/``shadow`` aliases left by rollouts that did not finish.

    An alias whose owning rollout run is still RUNNING and younger than ``lease_s``
    seconds is left alone (that rollout is live) — unless ``owner_is_dead`` (the caller
    holds the family's lock, so no other rollout of it can be running). Returns the
    aliases cleared.
    """
    cleared = []
    for alias in ("canary", "shadow"):
        version = alias_version(tracking, family, alias)
        if version is None:
            continue
        owner = version_tags(tracking, family, version).get(tags.alias_owner(alias))
        if owner and not owner_is_dead:
            try:
                run = tracking.client().get_run(owner)
            except MlflowException:
                run = None
            if (run is not None and run.info.status == "RUNNING"
                    and time.time() - run.info.start_time / 1000 < lease_s):
                continue
        clear_stale(tracking, family, alias, signing=signing, parent_run_id=cleared_by_run_id,
                    reason=(f"left by rollout run {owner or '(unknown)'}, which did not finish; "
                            f"cleared by {cleared_by_run_id}"))
        cleared.append(alias)
    return cleared
