"""The one writer of a family's signed log (``lineage.family_log``).

:func:`append` is :func:`lineage.attestations.attest` with the entry's log position
signed inside the statement. The next position is learned by reading the family's
entries back from the store (every verified envelope, deleted runs included) and, where
the pipeline keeps one, its checkpoint beside its key: the log must be intact and reach
the checkpoint, otherwise :class:`~lineage.family_log.LogDamaged` is raised and nothing
is written (a writer that numbered on from a cut log would fork it). On the embedded
profile writers of a family are serialised by ``lineage.rollout.family_lock``. After the
entry is logged, the checkpoint is moved to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lineage import checkpoints, family_log
from lineage.attestations import Attestation, Signing, attest
from lineage.family_log import FamilyLog, Head, LogDamaged
from lineage.sources import EvidenceSource, StoreSource
from lineage.tracking import Tracking


def damage(log: FamilyLog, signing: Signing) -> tuple[list[str], Head | None]:
    """What is wrong with ``log`` for a writer (its own problems, and against the
    pipeline's checkpoint), and that checkpoint (None: none kept)."""
    checkpoint, why = checkpoints.pipeline_checkpoint(log, signing.key_dir, signing.trust)
    found = list(log.problems) + why
    if checkpoint is not None:
        found += checkpoints.compare(log, checkpoint, "the pipeline's checkpoint")[0]
    return found, checkpoint


def intact_log(source: EvidenceSource, signing: Signing) -> FamilyLog:
    """The family's log read from ``source``, checked for a writer.

    Raises:
        LogDamaged: a gap, broken link or fork, or shorter than (or forked from) the
            pipeline's checkpoint; the message names each and how to re-anchor.
    """
    log = family_log.read(source)
    found, _ = damage(log, signing)
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


def append(tracking: Tracking, run_id: str, kind: str, predicate: Mapping[str, Any],
           signing: Signing, *, subjects: Mapping[str, str] | None = None,
           name: str | None = None, family: str | None = None,
           force: bool = False) -> Attestation:
    """Sign ``predicate`` as the family's next log entry and log it with the run
    (``attestations/<name or kind>.dsse.json``); move the pipeline's checkpoint to it.

    Args:
        family: the log's family (default: ``predicate["family"]``).
        force: append to a damaged log (only a re-anchor does: it says what is missing).

    Raises:
        LogDamaged: the log is damaged (see :func:`intact_log`) and ``force`` is False.
    """
    family = family or predicate["family"]
    log = family_log.read(StoreSource(tracking, family, signing.trust))
    found, checkpoint = damage(log, signing)
    if found and not force:
        raise _damaged(found, family)
    seq = max(log.length, checkpoint.length if checkpoint else 0) + 1
    prev = log.digest_at(seq - 1) or (checkpoint.head if checkpoint and checkpoint.length == seq - 1
                                      else None)
    entry = attest(tracking, run_id, kind,
                   {**predicate, family_log.LOG_FIELD: {"family": family, "seq": seq, "prev": prev}},
                   signing.signer, subjects=subjects, name=name)
    genesis = log.genesis or (checkpoint.genesis if checkpoint else None) or entry.envelope_sha256
    checkpoints.write_checkpoint(Head(family=family, genesis=genesis, length=seq,
                                      head=entry.envelope_sha256), signing)
    return entry


__all__ = ["LogDamaged", "append", "damage", "intact_log", "require_intact"]
