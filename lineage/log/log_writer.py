"""The one writer of a family's signed log (``lineage.log.family_log``).

:func:`append` is :func:`lineage.signing.attestations.attest` with the entry's log position
signed inside the statement. The next position is learned by reading the family's
entries back from the store (every verified envelope, deleted runs included) and, where
the pipeline keeps one, its checkpoint beside its key: the log must be intact and reach
the checkpoint, otherwise :class:`~lineage.log.family_log.LogDamaged` is raised and nothing
is written (a writer that numbered on from a cut log would fork it). On the embedded
profile writers of a family are serialised by ``lineage.rollout.rollout.family_lock``; on a
tracking server every append is a compare-and-swap on the log's sequence: the signed entry
claims its number with the signing's sequencer (``lineage.log.log_sequence``) before it is
logged, and a writer that lost the number logs nothing and signs again from the new head.
After the entry is logged, the checkpoint (beside the key, and with the sequencer) is moved
to it.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from lineage.log import checkpoints, family_log
from lineage.log.family_log import FamilyLog, Head, LogDamaged
from lineage.log.log_sequence import SequenceTaken
from lineage.signing.attestations import Attestation, AttestationError, Signing, attest
from lineage.signing.sources import EvidenceSource, StoreSource
from lineage.store import store_identity
from lineage.store.tracking import Tracking


class Kept(NamedTuple):
    """The pipeline's checkpoints as read *before* the log (a concurrent writer logs its
    entry, then moves the checkpoints: read in this order they never run ahead of the
    log, so a writer racing another is never mistaken for a cut log)."""

    beside_key: dict[Path, bytes]
    """file -> checkpoint envelope: ``<key dir>/checkpoints/<store>/<family>.json`` of every
    store, and those of before logs carried a store identity"""
    with_sequencer: bytes | None


def kept_checkpoints(family: str, signing: Signing) -> Kept:
    """Read the pipeline's checkpoints of ``family``'s logs (call before reading the log)."""
    beside: dict[Path, bytes] = {}
    if signing.key_dir is not None:
        root = Path(signing.key_dir) / checkpoints.CHECKPOINTS
        legacy = root / family
        found = [*root.glob(f"*/{family}.json"), *(legacy.glob("*.json") if legacy.is_dir() else [])]
        for path in sorted(set(found)):
            with contextlib.suppress(OSError):
                beside[path] = path.read_bytes()
    data = signing.sequencer.checkpoint(family) if signing.sequencer is not None else None
    return Kept(beside_key=beside, with_sequencer=data)


def damage(log: FamilyLog, signing: Signing, kept: Kept | None = None,
           location: str | None = None) -> tuple[list[str], Head | None]:
    """What is wrong with ``log`` for a writer (its own problems, against the pipeline's
    checkpoints kept for its store and family, and a store found where the key folder saw
    another), and the furthest of those checkpoints (None: none kept). ``kept``: the
    checkpoints read before ``log`` was (default: read now); ``location``: where the store
    is (``lineage.store.store_identity.location``)."""
    found = list(log.problems)
    found += store_identity.check(log.store, location, signing.key_dir,
                                  "the pipeline's key folder")[0]
    checkpoint, why = checkpoints.pipeline_checkpoint(
        log, signing.key_dir, signing.trust, location,
        kept=None if kept is None else kept.beside_key)
    found += why
    if kept is None:
        data = signing.sequencer.checkpoint(log.family) if signing.sequencer is not None else None
    else:
        data = kept.with_sequencer
    if checkpoint is not None:
        found += checkpoints.compare(log, checkpoint, "the pipeline's checkpoint")[0]
    if data is not None:
        where = signing.sequencer.where(log.family)
        try:
            held = checkpoints.read_checkpoint(data, signing.trust, label=where)
        except AttestationError as err:
            found.append(f"pipeline checkpoint unusable: {err}")
        else:
            found += checkpoints.compare(log, held, f"the pipeline's checkpoint at {where}")[0]
            if checkpoint is None or held.length > checkpoint.length:
                checkpoint = held
    return found, checkpoint


def current_damage(source: EvidenceSource, signing: Signing) -> list[str]:
    """:func:`damage` of the family's log read from ``source`` now (checkpoints first)."""
    kept = kept_checkpoints(source.family, signing)
    log = family_log.read(source)
    return damage(log, signing, kept, _location(source, log, signing))[0]


def _location(source: EvidenceSource, log: FamilyLog, signing: Signing) -> str | None:
    """Where the store a writer reads is; a store made afresh where the key folder saw
    another (nothing of any family in it) makes the key folder forget the old one there,
    so its first entry names a new store id (``lineage.store.store_identity``)."""
    tracking = getattr(source, "tracking", None)
    if tracking is None:
        return None
    where = store_identity.location(tracking)
    if (not log.entries and not log.legacy and signing.key_dir is not None
            and store_identity.store_for(signing.key_dir, where) is not None
            and store_identity.is_fresh(tracking, source.family)):
        store_identity.forget(signing.key_dir, where)
    return where


def intact_log(source: EvidenceSource, signing: Signing) -> FamilyLog:
    """The family's log read from ``source``, checked for a writer.

    Raises:
        LogDamaged: a gap, broken link or fork, or shorter than (or forked from) the
            pipeline's checkpoint; the message names each and how to re-anchor.
    """
    kept = kept_checkpoints(source.family, signing)
    log = family_log.read(source)
    found, _ = damage(log, signing, kept, _location(source, log, signing))
    if found:
        raise _damaged(found, source.family)
    return log


def _damaged(found: list[str], family: str) -> LogDamaged:
    return LogDamaged("; ".join(found) + f". Nothing more is signed for {family} until a person "
                      "named in its registration's approval policy re-anchors the log "
                      f"(kernelgate reanchor --family {family} --key ... --reason ...)")


def require_intact(tracking: Tracking, family: str, signing: Signing) -> FamilyLog:
    """:func:`intact_log` of the family's store."""
    return intact_log(StoreSource(tracking, family, signing.trust), signing)


def earlier_log(tracking: Tracking, family: str, key_dir: Path | None) -> str | None:
    """Why ``family`` cannot be started as a new family in this store, or None: a name
    that has or had a log there (the pipeline's checkpoint of the family in this store,
    beside its key; an experiment of the family under another name, e.g. renamed, or
    deleted) names that log. A new log of a known family would be a restarted log."""
    where = store_identity.location(tracking)
    store = store_identity.store_for(key_dir, where)
    if store is not None and store_identity.is_fresh(tracking, family):
        return None  # a new store made where another was: a new store id, nothing to restart
    if key_dir is not None and store is not None:
        path = checkpoints.checkpoint_file(key_dir, family, store)
        if path.is_file():
            return (f"{family} has a signed log in this store (the pipeline's checkpoint "
                    f"{path}): a name that has or had a log cannot start a new one")
    from mlflow.entities import ViewType

    from lineage.store import tags
    from lineage.store.tracking import experiment_name

    found = tracking.client().search_experiments(
        view_type=ViewType.ALL, filter_string=f"tags.`{tags.FAMILY}` = '{family}'")
    others = sorted(e.name for e in found if e.name != experiment_name(family)
                    or e.lifecycle_stage != "active")
    if others:
        return (f"{family} had a log in this store (experiment {', '.join(others)}, renamed or "
                "deleted): a name that has or had a log cannot start a new one")
    return None


CLAIM_WAIT_S = 120.0
"""How long a writer that keeps losing *one* log position waits for the winner's entry to
appear before giving up (a winner that died between its claim and its entry leaves the
position taken and empty: the log needs a person then). While the log moves on — other
writers winning one position after another — the writer keeps trying."""


class Stalled:
    """Whether lost claims show a log that stopped moving: the same position lost for
    ``CLAIM_WAIT_S`` seconds (the clock restarts whenever the lost position changes)."""

    def __init__(self) -> None:
        self.seq: int | None = None
        self.since = time.monotonic()

    def __call__(self, err: SequenceTaken) -> bool:
        if err.seq != self.seq:
            self.seq, self.since = err.seq, time.monotonic()
        return time.monotonic() - self.since > CLAIM_WAIT_S


def append(tracking: Tracking, run_id: str, kind: str, predicate: Mapping[str, Any],
           signing: Signing, *, subjects: Mapping[str, str] | None = None,
           name: str | None = None, family: str | None = None,
           force: bool = False, retry: bool = True,
           expect_seq: int | None = None) -> Attestation:
    """Sign ``predicate`` as the family's next log entry and log it with the run
    (``attestations/<name or kind>.dsse.json``); move the pipeline's checkpoint to it.

    With a sequencer (``signing.sequencer``) the entry first claims its position; when
    another writer holds it, nothing is logged and (``retry``) the entry is signed again
    from the new head, with growing randomised pauses, until one position has been lost
    for ``CLAIM_WAIT_S`` seconds (its claimant died: see ``Stalled``).

    Args:
        family: the log's family (default: ``predicate["family"]``).
        force: append to a damaged log (only a re-anchor does: it says what is missing).
        retry: False: raise :class:`SequenceTaken` at the first lost claim (a caller whose
            predicate depends on the head, such as an alias move, re-derives it).
        expect_seq: the position the caller prepared ``predicate`` for (read the log's
            length *before* reading what the predicate depends on); another position is
            refused as :class:`SequenceTaken` (the log moved on meanwhile).

    Raises:
        LogDamaged: the log is damaged (see :func:`intact_log`) and ``force`` is False.
        SequenceTaken: the position was lost (``retry`` False), or one position stayed
            lost for ``CLAIM_WAIT_S`` seconds.
    """
    family = family or predicate["family"]
    stalled = Stalled()
    for attempt in range(1, 10_000):
        try:
            return _append_once(tracking, run_id, kind, predicate, signing, subjects=subjects,
                                name=name, family=family, force=force, expect_seq=expect_seq)
        except SequenceTaken as err:
            if not retry:
                raise
            if stalled(err):
                raise gave_up(err) from err
            backoff(attempt)
    raise AssertionError("unreachable")


def gave_up(err: SequenceTaken) -> SequenceTaken:
    """The error of a writer that kept losing its log position for ``CLAIM_WAIT_S``."""
    return SequenceTaken(f"{err} — for {CLAIM_WAIT_S:g} s: if the writer holding that position "
                         "died between its claim and its entry, the position stays empty and "
                         "the log needs a person (kernelgate reanchor)", seq=err.seq)


def backoff(attempt: int) -> None:
    """Pause before signing again after a lost claim (randomised, growing to 2 s)."""
    time.sleep(random.uniform(0.05, min(2.0, 0.1 * 2 ** min(attempt, 5))))


def _append_once(tracking: Tracking, run_id: str, kind: str, predicate: Mapping[str, Any],
                 signing: Signing, *, subjects: Mapping[str, str] | None, name: str | None,
                 family: str, force: bool, expect_seq: int | None = None) -> Attestation:
    kept = kept_checkpoints(family, signing)  # before the log: see Kept
    source = StoreSource(tracking, family, signing.trust)
    log = family_log.read(source)
    where = _location(source, log, signing)
    found, checkpoint = damage(log, signing, kept, where)
    if found and not force:
        raise _damaged(found, family)
    seq = max(log.length, checkpoint.length if checkpoint else 0) + 1
    prev = log.digest_at(seq - 1) or (checkpoint.head if checkpoint and checkpoint.length == seq - 1
                                      else None)
    if expect_seq is not None and seq != expect_seq:
        raise SequenceTaken(f"entry {expect_seq} of {family}'s signed log was taken by another "
                            f"writer (the log is at entry {seq - 1}); nothing was logged",
                            seq=expect_seq)

    def claim(digest: str) -> None:
        if signing.sequencer is not None and not signing.sequencer.claim(family, seq, digest):
            raise SequenceTaken(f"entry {seq} of {family}'s signed log was claimed by another "
                                "writer first; nothing was logged", seq=seq)

    store = (log.store or (checkpoint.store if checkpoint else None)
             or store_identity.store_for(signing.key_dir, where) or store_identity.new_store_id())
    position = {"family": family, "seq": seq, "prev": prev}
    if seq == 1:  # the log's identity: its store and family, signed
        position["store"] = store
    entry = attest(tracking, run_id, kind, {**predicate, family_log.LOG_FIELD: position},
                   signing.signer, subjects=subjects, name=name, before_logging=claim)
    genesis = log.genesis or (checkpoint.genesis if checkpoint else None) or entry.envelope_sha256
    if signing.key_dir is not None:
        store_identity.remember(signing.key_dir, where, store)
    checkpoints.write_checkpoint(Head(family=family, store=store, genesis=genesis, length=seq,
                                      head=entry.envelope_sha256), signing)
    return entry


__all__ = ["LogDamaged", "SequenceTaken", "append", "current_damage", "damage", "earlier_log", "intact_log",
           "require_intact"]
