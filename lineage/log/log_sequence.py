"""Claiming a family log's next sequence number: the compare-and-swap of every append.

On a tracking server two writers of one family (two processes moving an alias at the same
instant, a manual rollback during a rollout) read the same head and would both sign entry
N+1 — a fork the audit then names forever. A :class:`LogSequencer` makes the append a
compare-and-swap on the log's sequence: the writer signs its entry, then *claims* number
N+1 for that entry's digest in a place with an atomic create (on the servers profile a
Prefect variable per entry, ``flows.log_sequencer``: the Prefect server refuses a second
variable of one name). Only the writer whose claim was created logs the entry; the other
is refused (:class:`SequenceTaken`), logs nothing, and signs again from the new head.

The sequencer also keeps the pipeline's checkpoint of the log where the MLflow store's
writers cannot rewrite it (the servers profile's counterpart of the checkpoint beside the
key, ``lineage.log.checkpoints``): restoring an older backup of the store is then a log shorter
than that checkpoint (a cut log) until a person re-anchors it.

:class:`FolderSequencer` is the same contract on a folder (``O_EXCL`` files), for tests and
for writers that share one filesystem. The embedded profile needs none (its writers of a
family are serialised by ``lineage.rollout.rollout.family_lock``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

from kernels.errors import KernelgateError


class SequenceTaken(KernelgateError, RuntimeError):
    """The log position a writer signed for was claimed by another writer first; nothing
    was logged. The writer reads the new head and signs again. ``seq``: that position."""

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


@runtime_checkable
class LogSequencer(Protocol):
    """Where a family log's positions are claimed and its checkpoint is kept.

    ``claim`` must be atomic: of several writers claiming one ``(family, seq)`` exactly one
    gets True, whatever their timing.
    """

    def claim(self, family: str, seq: int, envelope_sha256: str) -> bool:
        """Claim position ``seq`` of ``family``'s log for the entry with that digest.
        True: it is this writer's; False: another writer holds it."""
        ...

    def checkpoint(self, family: str) -> bytes | None:
        """The signed checkpoint envelope of ``family``'s log kept here (None: none yet)."""
        ...

    def write_checkpoint(self, family: str, data: bytes) -> None:
        """Keep ``data`` (a signed checkpoint envelope) as ``family``'s checkpoint."""
        ...

    def where(self, family: str) -> str:
        """Where ``family``'s checkpoint is kept, for messages."""
        ...


_SAFE = re.compile(r"[^a-z0-9_-]")


def safe_name(family: str) -> str:
    """``family`` as a name part of lowercase letters, digits, ``_`` and ``-`` only (each
    other character becomes ``_``; a digest suffix keeps distinct families distinct)."""
    import hashlib

    plain = _SAFE.sub("_", family.lower())
    if plain == family:
        return plain
    return f"{plain}-{hashlib.sha256(family.encode()).hexdigest()[:8]}"


class FolderSequencer:
    """:class:`LogSequencer` on a folder: a claim is a file created with ``O_EXCL``
    (``<root>/<family>/claims/<seq>``), the checkpoint ``<root>/<family>/checkpoint.json``.
    Atomic for writers on one filesystem (processes of one host, a shared local disk)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _dir(self, family: str) -> Path:
        return self.root / safe_name(family)

    def claim(self, family: str, seq: int, envelope_sha256: str) -> bool:
        """See :meth:`LogSequencer.claim`."""
        folder = self._dir(family) / "claims"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(folder / str(int(seq)), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(envelope_sha256)
        return True

    def checkpoint(self, family: str) -> bytes | None:
        """See :meth:`LogSequencer.checkpoint`."""
        path = self._dir(family) / "checkpoint.json"
        return path.read_bytes() if path.is_file() else None

    def write_checkpoint(self, family: str, data: bytes) -> None:
        """See :meth:`LogSequencer.write_checkpoint`."""
        path = self._dir(family) / "checkpoint.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)

    def where(self, family: str) -> str:
        """See :meth:`LogSequencer.where`."""
        return str(self._dir(family) / "checkpoint.json")


__all__ = ["FolderSequencer", "LogSequencer", "SequenceTaken", "safe_name"]
