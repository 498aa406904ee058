"""Key changes as entries of every family's signed log.

A rotation of the pipeline key, a revocation (with its position) and a new approver key
change what the audit trusts; each is signed by the pipeline's current key as one
``key_change`` entry of each family's append-only log (``lineage.log.log_writer.append``),
in a ``key_change`` run of the family's experiment. So the audit sees the key changes in
order among the family's other records (:func:`key_changes`), and deleting one leaves a
gap in the log like any other deleted record. The key folder stays the source of what
is trusted (``lineage.signing.keys``); the entries are the history an auditor can check it
against. ``kernelgate keys rotate|revoke|create --name`` write them
(``flows.cli_keys``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from lineage.aliases.key_rotation import families
from lineage.log.family_log import FamilyLog, position
from lineage.log.log_writer import append
from lineage.signing.attestations import Signing
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

KIND = "key_change"
ARTIFACT = "keys/key_change.json"


class KeyChange(BaseModel):
    """One change of the keys the pipeline's records are verified with.

    Attributes:
        action: ``rotate`` (the pipeline key retired, ``new_keyid`` created), ``revoke``
            (``keyid``'s signatures void from ``revoked_from``; ``None``: from the start)
            or ``approver_key`` (a person's key ``keyid`` created under ``name``).
        keyid: the key the change is about (the retired, revoked or new approver key).
        new_keyid: the new pipeline key (``rotate`` only).
        name: the approver's name (``approver_key`` only).
        revoked_from: ISO time (``revoke`` only; ``None``: from the start).
        at: when the change was made (UTC).
    """

    action: Literal["rotate", "revoke", "approver_key"]
    keyid: str = Field(min_length=8)
    new_keyid: str | None = None
    name: str | None = None
    revoked_from: str | None = None
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def describe(self) -> str:
        """One line for people."""
        if self.action == "rotate":
            return f"pipeline key {self.keyid[:12]} retired, {(self.new_keyid or '?')[:12]} new"
        if self.action == "revoke":
            return (f"key {self.keyid[:12]} revoked "
                    + (f"from {self.revoked_from}" if self.revoked_from else "from the start"))
        return f"approver key {self.keyid[:12]} created for {self.name}"


def log_key_change(tracking: Tracking, family: str, change: KeyChange,
                   signing: Signing) -> str:
    """Sign ``change`` as the next entry of ``family``'s log; returns the run id.

    Raises:
        lineage.log.family_log.LogDamaged: the family's log is damaged (nothing is written).
    """
    data = change.model_dump(mode="json")
    run_tags = {tags.NOTE: change.describe()}
    with tr.stage_run(tracking, family, "key_change", run_name=f"key-{change.action}",
                      run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, change, ARTIFACT)
        append(tracking, run_id, KIND, {**data, "family": family, "tags": run_tags}, signing)
    return run_id


def log_everywhere(tracking: Tracking, change: KeyChange, signing: Signing) -> list[str]:
    """:func:`log_key_change` for every family of the store; returns the families."""
    done = []
    for family in families(tracking):
        log_key_change(tracking, family, change, signing)
        done.append(family)
    return done


def key_changes(log: FamilyLog) -> list[str]:
    """The key changes of ``log``, in log order: ``entry <seq>: <what>`` lines."""
    out = []
    for seq in sorted(log.entries):
        entry = log.entries[seq]
        if entry.kind == KIND:
            fields = {k: entry.predicate.get(k) for k in KeyChange.model_fields}
            try:
                text = KeyChange.model_validate(fields).describe()
            except ValueError as err:
                text = f"unreadable key change ({err})"
            out.append(f"entry {int(position(entry)['seq'])}: {text} "
                       f"({str(fields.get('at') or '')[:19]})")
    return out
