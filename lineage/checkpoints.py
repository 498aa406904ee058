"""Checkpoints of a family's log kept where the store's writers cannot rewrite them.

* The pipeline's checkpoint: after every entry it appends (so after each rollout and
  each manual alias move), the pipeline signs ``(family, genesis, length, head, time)``
  as a DSSE envelope (kind ``checkpoint``) and writes it beside its key:
  ``<key dir>/checkpoints/<family>/<genesis>.json`` (one key folder may sign the logs
  of several stores; a log is named by its family and its first entry). Whoever can
  edit the store but not the key folder cannot cut the log's end unseen. It does not
  stop the owner of the key.
* The auditor's remembered head: ``kernelgate audit`` remembers the last head it
  verified per log under the auditor's kernelgate home (``KERNELGATE_HOME``, default
  ``~/.kernelgate``): ``<home>/witnessed/<family>/<genesis>.json``, and refuses a log
  shorter than or forked from it — trust on first use, as Certificate Transparency's
  witnesses do (RFC 9162). That one stops the key's owner too.
* A checkpoint the auditor brings (``kernelgate audit --checkpoint FILE``), or the one an
  exported bundle carries, is verified with the keys the auditor trusts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from lineage.attestations import (
    AttestationError,
    Signing,
    TrustPolicy,
    make_envelope,
    verify_envelope,
)
from lineage.family_log import FamilyLog, Head, compare

__all__ = ["Witnessing", "compare", "kernelgate_home", "pipeline_checkpoint", "read_checkpoint", "remember",
           "remembered", "witness", "write_checkpoint"]

CHECKPOINTS = "checkpoints"
WITNESSED = "witnessed"


class Witnessing(BaseModel):
    """Which heads seen elsewhere an audit checks the log against (``witness``)."""

    key_dir: Path | None = Field(None, description="the pipeline's key folder (its checkpoints)")
    files: list[Path] = Field(default_factory=list, description="checkpoints the auditor brings")
    home: Path | None = Field(None, description="the auditor's kernelgate home (remembered heads)")
    require: bool = Field(False, description="no head at all is a problem (a bundle)")


def kernelgate_home() -> Path:
    """``KERNELGATE_HOME`` or ``~/.kernelgate`` (the auditor's own state)."""
    return Path(os.environ.get("KERNELGATE_HOME", "~/.kernelgate")).expanduser()


def checkpoint_file(key_dir: Path, family: str, genesis: str) -> Path:
    """Where the pipeline keeps its checkpoint of one log (beside its key)."""
    return Path(key_dir) / CHECKPOINTS / family / f"{genesis}.json"


def remembered_file(home: Path, family: str, genesis: str) -> Path:
    """Where an auditor remembers the last head they verified of one log."""
    return Path(home) / WITNESSED / family / f"{genesis}.json"


def sign_checkpoint(head: Head, signing: Signing) -> bytes:
    """A signed checkpoint envelope of ``head`` (its subject: the head entry's digest)."""
    return make_envelope("checkpoint", {f"log/{head.family}/{head.length}": head.head},
                         head.model_dump(), signing.signer)


def write_checkpoint(head: Head, signing: Signing) -> Path | None:
    """Sign ``head`` and write it beside the pipeline's key and with the signing's
    sequencer (``lineage.log_sequence``, e.g. a Prefect variable), where there is one.
    Returns the file beside the key (None: no key folder known)."""
    if signing.sequencer is not None:
        signing.sequencer.write_checkpoint(head.family, sign_checkpoint(head, signing))
    if signing.key_dir is None:
        return None
    path = checkpoint_file(signing.key_dir, head.family, head.genesis)
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
        return Head(family=p["family"], genesis=p["genesis"], length=int(p["length"]),
                    head=p["head"])
    except (KeyError, TypeError, ValueError) as err:
        raise AttestationError(f"{label}: malformed checkpoint ({err})") from err


def pipeline_checkpoint(log: FamilyLog, key_dir: Path | None, trust: TrustPolicy
                        ) -> tuple[Head | None, list[str]]:
    """The pipeline's checkpoint of ``log`` (None when there is none yet), and why one
    beside the key could not be used."""
    if key_dir is None or log.genesis is None:
        return None, []
    path = checkpoint_file(key_dir, log.family, log.genesis)
    if not path.is_file():
        return None, []
    try:
        return read_checkpoint(path.read_bytes(), trust, label=str(path)), []
    except (AttestationError, OSError) as err:
        return None, [f"pipeline checkpoint unusable: {err}"]


def remembered(log: FamilyLog, home: Path) -> Head | None:
    """The head this auditor last verified of ``log`` (None: first audit of it here)."""
    if log.genesis is None:
        return None
    path = remembered_file(home, log.family, log.genesis)
    if not path.is_file():
        return None
    return Head.model_validate_json(path.read_text())


def remember(log: FamilyLog, home: Path) -> Path | None:
    """Remember ``log``'s head as verified (never moving back to a shorter one)."""
    head = log.head()
    if head is None:
        return None
    before = remembered(log, home)
    if before is not None and before.length > head.length:
        return None
    path = remembered_file(home, head.family, head.genesis)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**head.model_dump(),
                                "verified_at": datetime.now(UTC).isoformat()}, indent=1))
    return path


def witness(log: FamilyLog, trust: TrustPolicy, *, key_dir: Path | None = None,
            files: Sequence[Path] = (), home: Path | None = None,
            require: bool = False) -> tuple[list[str], list[str]]:
    """Problems and warnings of ``log`` against every head seen elsewhere: the pipeline's
    checkpoint beside its key, checkpoint files the auditor brings (or a bundle carries),
    and the head the auditor remembers. ``require``: having none at all is a problem (a
    bundle must carry a signed checkpoint: nothing in it is trusted unsigned)."""
    problems, warnings, heads = [], [], []
    checkpoint, why = pipeline_checkpoint(log, key_dir, trust)
    problems += why
    if checkpoint is not None:
        heads.append((checkpoint, "the pipeline's checkpoint"))
    for path in files:
        try:
            heads.append((read_checkpoint(Path(path).read_bytes(), trust, label=str(path)),
                          f"checkpoint {path}"))
        except (AttestationError, OSError) as err:
            problems.append(f"checkpoint {path} unusable: {err}")
    seen = remembered(log, home) if home is not None else None
    if seen is not None:
        heads.append((seen, f"the head you verified before ({remembered_file(home, seen.family, seen.genesis)})"))
    for head, label in heads:
        found, said = compare(log, head, label)
        problems += found
        warnings += said
    if require and not heads and log.entries:
        problems.append(f"no signed checkpoint of {log.family}'s log: a cut at its end could not "
                        "be seen (pass --checkpoint FILE, one you kept)")
    return problems, warnings
