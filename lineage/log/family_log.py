"""One append-only signed log per family, read back and checked.

Every attestation the pipeline signs for a family (registration, build, evaluation,
decision, approval, shadow, canary step, alias move, outcome, re-anchor) carries, inside
the signed statement, its position in the family's log: ``predicate["log"] = {"family",
"seq", "prev"}`` — its sequence number (1, 2, ...) and the sha256 of the previous entry's
envelope as stored (``None`` for entry 1). Each envelope stays an artifact of its run
(where people look); the order is the signed ``(seq, prev)`` chain, so deleting any
envelope leaves a gap or a broken link that :func:`read` names. Deleting the *last*
entries leaves no gap: that is what a checkpoint held elsewhere sees
(:mod:`lineage.log.checkpoints`; :func:`compare` checks a log against one).

Entry 1 also names the store the log belongs to (``"store"``: its id,
``lineage.store.store_identity``): a log is known by its store and family, so a log of the same
family with another first entry is a restarted log, compared with (and failed against)
the heads seen before. A log whose first entry names no store was made before logs carried
a store identity: verified as before, and said. Entries signed before the log existed (no
``log`` field) are a legacy prefix: counted and said, never a failure. A gap re-anchored by a person's signed approval
(``lineage.aliases.reanchor``) is a warning forever after, not a problem. The writer is
``lineage.log.log_writer``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kernels.errors import KernelgateError
from lineage.signing.attestations import Attestation
from lineage.signing.sources import EvidenceSource

LOG_FIELD = "log"


class LogDamaged(KernelgateError, RuntimeError):
    """The family's signed log has a gap, a broken link or a fork, or is shorter than (or
    forked from) a checkpoint: nothing more is written until a person re-anchors it
    (``kernelgate reanchor``)."""


class Head(BaseModel):
    """A log's identity (store, family, first entry) and how far it reached (length, head)."""

    model_config = ConfigDict(frozen=True)

    family: str
    store: str | None = Field(None, description="the store id entry 1 names (None: a log "
                                                "made before logs carried a store identity)")
    genesis: str = Field(description="sha256 of entry 1's envelope")
    length: int = Field(ge=1)
    head: str = Field(description="sha256 of entry `length`'s envelope")


class FamilyLog(BaseModel):
    """The family's log as read from a source: entries in order, and what is wrong."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    family: str
    entries: dict[int, Attestation] = Field(default_factory=dict)
    legacy: int = 0
    problems: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    acknowledged: dict[int, str] = Field(default_factory=dict, description="seq -> re-anchor")
    damaged: list[int] = Field(default_factory=list, description="seqs missing, forked or unchained")

    @property
    def length(self) -> int:
        """The highest sequence number present (0: no log entry yet)."""
        return max(self.entries, default=0)

    def digest_at(self, seq: int) -> str | None:
        """sha256 of entry ``seq``'s envelope, or None when it is not present."""
        entry = self.entries.get(seq)
        return None if entry is None else entry.envelope_sha256

    @property
    def genesis(self) -> str | None:
        """sha256 of entry 1 (the log's identity), or the genesis a re-anchor recorded."""
        if 1 in self.entries:
            return self.entries[1].envelope_sha256
        for seq in sorted(self.entries):
            if self.entries[seq].kind == "reanchor":
                return self.entries[seq].predicate.get("genesis")
        return None

    @property
    def store(self) -> str | None:
        """The store id entry 1 signs (or a re-anchor recorded); None: unknown, or a log
        made before logs carried a store identity."""
        if 1 in self.entries:
            return position(self.entries[1]).get("store")
        for seq in sorted(self.entries):
            if self.entries[seq].kind == "reanchor":
                return self.entries[seq].predicate.get("store")
        return None

    def head(self) -> Head | None:
        """This log's head (None: empty, or its identity is unknown)."""
        genesis = self.genesis
        if not self.entries or genesis is None:
            return None
        return Head(family=self.family, store=self.store, genesis=genesis, length=self.length,
                    head=self.entries[self.length].envelope_sha256)

    def gaps(self) -> list[int]:
        """Damaged sequence numbers (missing, forked, unchained) no re-anchor acknowledged."""
        return [s for s in self.damaged if s not in self.acknowledged]

    def between(self, first: int, last: int) -> list[Attestation]:
        """Entries ``first..last`` that are present, in order."""
        return [self.entries[s] for s in range(first, last + 1) if s in self.entries]


def position(attestation: Attestation) -> dict | None:
    """An attestation's signed log position, or None (signed before the log existed)."""
    pos = attestation.predicate.get(LOG_FIELD)
    return pos if isinstance(pos, dict) else None


def read(source: EvidenceSource) -> FamilyLog:
    """The family's log from every verified attestation ``source`` holds."""
    log = FamilyLog(family=source.family)
    by_seq: dict[int, dict[str, Attestation]] = {}
    for a in source.attestations():
        pos = position(a)
        if pos is None:
            log.legacy += 1
            continue
        seq = pos.get("seq")  # a protobuf Struct reads every number back as a float
        seq = int(seq) if isinstance(seq, float) and seq.is_integer() else seq
        if pos.get("family") != source.family or not isinstance(seq, int) or seq < 1:
            log.problems.append(f"signed log: {a.run_id}/{a.path} is entry {seq!r} of family "
                                f"{pos.get('family')!r}'s log, not of {source.family!r}'s")
            continue
        by_seq.setdefault(seq, {})[a.envelope_sha256] = a
    issues: dict[int, str] = {}  # seq -> what is wrong there
    for seq, versions in sorted(by_seq.items()):
        chosen = sorted(versions.values(), key=lambda a: a.envelope_sha256)
        log.entries[seq] = chosen[0]
        if len(chosen) > 1:
            issues[seq] = (f"entry {seq} exists in {len(chosen)} different signed versions (a "
                           f"fork: runs {sorted(a.run_id for a in chosen)})")
    for entry in log.entries.values():
        if entry.kind == "reanchor":
            p = entry.predicate
            for missing in p.get("missing", []):
                log.acknowledged[int(missing)] = (
                    f"re-anchored at entry {int(position(entry)['seq'])} by {p.get('approver')} "
                    f"({p.get('attested_at', '')[:19]}): {p.get('reason')}")
            log.warnings.append(f"signed log of {source.family}: entry {int(position(entry)['seq'])} "
                                f"re-anchors it: entries {p.get('missing')} missing or damaged, "
                                f"approved by {p.get('approver')}: {p.get('reason')}")
    for seq in range(1, log.length):
        if seq not in log.entries:
            issues[seq] = (f"entry {seq} of {log.length} is missing (its envelope, or its run, "
                           "was deleted): a record the rules read may be gone")
    for seq, entry in sorted(log.entries.items()):
        prev = position(entry).get("prev")
        if seq == 1 and prev is not None:
            issues.setdefault(seq, "entry 1 names a previous entry")
        elif seq > 1 and seq - 1 in log.entries and prev != log.entries[seq - 1].envelope_sha256:
            issues.setdefault(seq, f"entry {seq} does not chain to entry {seq - 1} (reordered, "
                                   "replaced or forked)")
    for seq, issue in sorted(issues.items()):
        if seq in log.acknowledged:
            log.warnings.append(f"signed log of {source.family}: {issue}; {log.acknowledged[seq]}")
        else:
            log.problems.append(f"signed log of {source.family}: {issue}")
        log.damaged.append(seq)
    if 1 in log.entries and log.store is None:
        log.warnings.append(f"signed log of {source.family}: made before logs carried a store "
                            "identity (entry 1 names no store): a restarted log is seen only "
                            "against a checkpoint or remembered head written since")
    if log.legacy:
        log.warnings.append(f"signed log of {source.family}: {log.legacy} signed record(s) from "
                            "before the log existed (no log position; not ordered)")
    return log


def compare(log: FamilyLog, head: Head, label: str) -> tuple[list[str], list[str]]:
    """Problems and warnings of ``log`` against a head seen before (a checkpoint, or the
    one an auditor remembers): the log must reach it and hold its head at its length."""
    if head.family != log.family:
        return [f"{label}: it is for family {head.family!r}, not {log.family!r}"], []
    if log.genesis is not None and head.genesis != log.genesis:
        return [f"{label}: it is for another log of {log.family} (first entry "
                f"{head.genesis[:12]}, this log's {log.genesis[:12]}): a restarted log (the "
                "family's log was replaced or started again)"], []
    if not log.entries:
        return [f"{label}: {log.family} had a signed log of {head.length} entries (first entry "
                f"{head.genesis[:12]}) and none of it is here: a restarted or removed log (its "
                "experiment renamed or deleted?); its last entries were cut"], []
    if log.length < head.length:
        return [f"{label}: the signed log of {log.family} has {log.length} entries, but "
                f"{head.length} were seen (head {head.head[:12]}): its last entries were cut"], []
    found = log.digest_at(head.length)
    if found is None:
        if head.length in log.acknowledged:
            return [], [f"{label}: its head (entry {head.length}) is missing, "
                        f"{log.acknowledged[head.length]}"]
        return [f"{label}: entry {head.length} (its head) is missing from the log"], []
    if found != head.head:
        said = (f"{label}: entry {head.length} is {found[:12]}, not the {head.head[:12]} seen: "
                "the log was forked or rewritten")
        if head.length in log.acknowledged:
            return [], [f"{said}; {log.acknowledged[head.length]}"]
        return [said], []
    return [], []
