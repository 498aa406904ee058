"""Checkpoints of a family's log kept where the store's writers cannot rewrite them.

A log is named by its store and family (``lineage.store.store_identity``), never by its first
entry: a log of the same family with another first entry is compared with the heads seen
before and fails as a restarted log.

* The pipeline's checkpoint: after every entry it appends (so after each rollout and
  each manual alias move), the pipeline signs ``(family, store, genesis, length, head,
  time)`` as a DSSE envelope (kind ``checkpoint``) and writes it beside its key:
  ``<key dir>/checkpoints/<store id>/<family>.json`` (one key folder may sign the logs
  of several stores). Whoever can edit the store but not the key folder cannot cut the
  log's end, or start it again, unseen. It does not stop the owner of the key.
* The auditor's remembered head: ``kernelgate audit`` remembers the last head it
  verified per log under the auditor's kernelgate home (``KERNELGATE_HOME``, default
  ``~/.kernelgate``): ``<home>/witnessed/<store id>/<family>.json``, and refuses a log
  shorter than or forked from it — trust on first use, as Certificate Transparency's
  witnesses do (RFC 9162). That one stops the key's owner too.
* A checkpoint the auditor brings (``kernelgate audit --checkpoint FILE``), or the one an
  exported bundle carries, is verified with the keys the auditor trusts.

Both folders also remember where each store was seen (``stores.json``): a log found
where another store was seen fails ("another store was put in its place").

A log made before logs carried a store identity (its first entry names no store) is
known by the store id remembered for its location, once a writer or an audit has named
one; the checkpoints of before (``<key dir>/checkpoints/<family>/<genesis>.json``, the
same under ``witnessed``) are still read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from lineage.log.family_log import FamilyLog, Head, compare
from lineage.signing.attestations import (
    AttestationError,
    Signing,
    TrustPolicy,
    make_envelope,
    verify_envelope,
)
from lineage.store import store_identity

__all__ = ["Witnessing", "checkpoint_file", "compare", "kernelgate_home", "pipeline_checkpoint",
           "read_checkpoint", "checkpoint_paths", "remember", "remembered", "store_key", "witness", "write_checkpoint"]

CHECKPOINTS = "checkpoints"
WITNESSED = "witnessed"


class Witnessing(BaseModel):
    """Which heads seen elsewhere an audit checks the log against (``witness``)."""

    key_dir: Path | None = Field(None, description="the pipeline's key folder (its checkpoints)")
    files: list[Path] = Field(default_factory=list, description="checkpoints the auditor brings")
    home: Path | None = Field(None, description="the auditor's kernelgate home (remembered heads)")
    require: bool = Field(False, description="no head at all is a problem (a bundle)")
    location: str | None = Field(None, description="where the audited store is (its tracking "
                                                   "URI; None: a bundle)")


def kernelgate_home() -> Path:
    """``KERNELGATE_HOME`` or ``~/.kernelgate`` (the auditor's own state)."""
    return Path(os.environ.get("KERNELGATE_HOME", "~/.kernelgate")).expanduser()


def checkpoint_file(key_dir: Path, family: str, store: str) -> Path:
    """Where the pipeline keeps its checkpoint of ``family``'s log in store ``store``
    (beside its key)."""
    return Path(key_dir) / CHECKPOINTS / store / f"{family}.json"


def legacy_checkpoint_file(key_dir: Path, family: str, genesis: str) -> Path:
    """Where the pipeline kept its checkpoint of a log before logs carried a store
    identity (named by its first entry)."""
    return Path(key_dir) / CHECKPOINTS / family / f"{genesis}.json"


def remembered_file(home: Path, family: str, store: str) -> Path:
    """Where an auditor remembers the last head they verified of ``family``'s log in
    store ``store``."""
    return Path(home) / WITNESSED / store / f"{family}.json"


def store_key(log: FamilyLog, location: str | None, *folders: Path | None) -> str | None:
    """The store ``log`` is known by: the one its signed first entry names, else (a log
    made before logs carried a store identity, or none yet) the one the first of
    ``folders`` that remembers ``location`` names; None: unknown."""
    if log.store is not None:
        return log.store
    if location is None:
        return None
    for folder in folders:
        found = store_identity.store_for(folder, location)
        if found is not None:
            return found
    return None


def sign_checkpoint(head: Head, signing: Signing) -> bytes:
    """A signed checkpoint envelope of ``head`` (its subject: the head entry's digest)."""
    return make_envelope("checkpoint", {f"log/{head.family}/{head.length}": head.head},
                         head.model_dump(), signing.signer)


def write_checkpoint(head: Head, signing: Signing) -> Path | None:
    """Sign ``head`` and write it beside the pipeline's key and with the signing's
    sequencer (``lineage.log.log_sequence``, e.g. a Prefect variable), where there is one.
    Returns the file beside the key (None: no key folder known)."""
    if signing.sequencer is not None:
        signing.sequencer.write_checkpoint(head.family, sign_checkpoint(head, signing))
    if signing.key_dir is None or head.store is None:
        return None
    path = checkpoint_file(signing.key_dir, head.family, head.store)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(sign_checkpoint(head, signing))
    tmp.replace(path)
    return path


def read_checkpoint(data: bytes, trust: TrustPolicy, *, label: str) -> Head:
    """A checkpoint envelope verified with ``trust``.

    Raises:
        AttestationError: not a checkpoint, or not signed by a trusted key.
    """
    attestation = verify_envelope(data, trust, path=label)
    if attestation.kind != "checkpoint":
        raise AttestationError(f"{label}: a {attestation.kind!r} envelope, not a checkpoint")
    p = attestation.predicate
    try:
        return Head(family=p["family"], store=p.get("store"), genesis=p["genesis"],
                    length=int(p["length"]), head=p["head"])
    except (KeyError, TypeError, ValueError) as err:
        raise AttestationError(f"{label}: malformed checkpoint ({err})") from err


def checkpoint_paths(log: FamilyLog, key_dir: Path, location: str | None = None) -> list[Path]:
    """Where the pipeline's checkpoints of ``log`` may be beside its key: the one of its
    store and family, and (a log made before logs carried a store identity) the one of
    its first entry."""
    paths = []
    store = store_key(log, location, key_dir)
    if store is not None:
        paths.append(checkpoint_file(key_dir, log.family, store))
    if log.store is None and log.genesis is not None:
        paths.append(legacy_checkpoint_file(key_dir, log.family, log.genesis))
    return paths


def pipeline_checkpoint(log: FamilyLog, key_dir: Path | None, trust: TrustPolicy,
                        location: str | None = None, kept: dict[Path, bytes] | None = None
                        ) -> tuple[Head | None, list[str]]:
    """The pipeline's checkpoint of ``log`` (None when there is none yet): of those at
    :func:`checkpoint_paths`, the one reaching furthest; and why one beside the key could
    not be used. ``location``: where the store is (names the store of a log whose first
    entry names none). ``kept``: the files as read before the log was (default: read now)."""
    if key_dir is None:
        return None, []
    found, why = [], []
    for path in checkpoint_paths(log, key_dir, location):
        try:
            data = kept.get(path) if kept is not None else (
                path.read_bytes() if path.is_file() else None)
            if data is not None:
                found.append(read_checkpoint(data, trust, label=str(path)))
        except (AttestationError, OSError) as err:
            why.append(f"pipeline checkpoint unusable: {err}")
    return max(found, key=lambda h: h.length, default=None), why


def _remembered_paths(log: FamilyLog, home: Path, location: str | None) -> list[Path]:
    store = store_key(log, location, home / WITNESSED)
    paths = [] if store is None else [remembered_file(home, log.family, store)]
    if log.store is None and log.genesis is not None:
        paths.append(Path(home) / WITNESSED / log.family / f"{log.genesis}.json")
    return paths


def remembered(log: FamilyLog, home: Path, location: str | None = None) -> Head | None:
    """The head this auditor last verified of ``log``'s family in its store (None: first
    audit of it here)."""
    seen = [Head.model_validate(_head_fields(json.loads(p.read_text())))
            for p in _remembered_paths(log, home, location) if p.is_file()]
    return max(seen, key=lambda h: h.length, default=None)


def _head_fields(data: dict) -> dict:
    return {k: v for k, v in data.items() if k in Head.model_fields}


def remember(log: FamilyLog, home: Path, location: str | None = None) -> Path | None:
    """Remember ``log``'s head as verified (never moving back to a shorter one), and where
    its store was seen. A log made before logs carried a store identity, whose store no
    one named yet, is remembered by its first entry, as before."""
    head = log.head()
    if head is None:
        return None
    store = store_key(log, location, home / WITNESSED)
    if location is not None and log.store is not None:
        store_identity.remember(home / WITNESSED, location, log.store)
    before = remembered(log, home, location)
    if before is not None and before.genesis == head.genesis and before.length > head.length:
        return None
    path = (remembered_file(home, head.family, store) if store is not None
            else Path(home) / WITNESSED / head.family / f"{head.genesis}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**head.model_dump(),
                                "verified_at": datetime.now(UTC).isoformat()}, indent=1))
    return path


def witness(log: FamilyLog, trust: TrustPolicy, *, key_dir: Path | None = None,
            files: Sequence[Path] = (), home: Path | None = None,
            require: bool = False, location: str | None = None) -> tuple[list[str], list[str]]:
    """Problems and warnings of ``log`` against every head seen elsewhere: the pipeline's
    checkpoint beside its key, checkpoint files the auditor brings (or a bundle carries),
    and the head the auditor remembers, each kept per store and family (so a restarted
    log is compared, and fails); and of the store the log's first entry names against the
    stores the key folder and the auditor saw at ``location``. ``require``: having no head
    at all is a problem (a bundle must carry a signed checkpoint: nothing in it is
    trusted unsigned)."""
    problems, warnings, heads = [], [], []
    for folder, whose in ((key_dir, "the pipeline's key folder"),
                          (None if home is None else Path(home) / WITNESSED, "your kernelgate home")):
        found, said = store_identity.check(log.store, location, folder, whose)
        problems += found
        warnings += said
    checkpoint, why = pipeline_checkpoint(log, key_dir, trust, location)
    problems += why
    if checkpoint is not None:
        heads.append((checkpoint, "the pipeline's checkpoint"))
    for path in files:
        try:
            heads.append((read_checkpoint(Path(path).read_bytes(), trust, label=str(path)),
                          f"checkpoint {path}"))
        except (AttestationError, OSError) as err:
            problems.append(f"checkpoint {path} unusable: {err}")
    seen = remembered(log, home, location) if home is not None else None
    if seen is not None:
        where = _remembered_paths(log, home, location)[0]
        heads.append((seen, f"the head you verified before ({where})"))
    for head, label in heads:
        found, said = compare(log, head, label)
        problems += found
        warnings += said
    if require and not heads and log.entries:
        problems.append(f"no signed checkpoint of {log.family}'s log: a cut at its end could not "
                        "be seen (pass --checkpoint FILE, one you kept)")
    return problems, warnings
