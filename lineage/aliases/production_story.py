"""How each version got into production and out of it, told from the signed alias history.

The registry's aliases say where production points now; the signed, hash-chained alias
moves (``lineage.aliases.registered_model.alias_history``) say how it got there. This module
turns the production moves into sentences for people: the audit of a version lists
every move that names it (its promotion, a rollback that restored it, the rollback that
took it out), its MLflow version page carries the same lines at the top of its
description, and the registered model's ``kernelgate.production_history`` tag lists the
moves with their times and reasons. All three are written or read from the same signed
moves, so after ``kernelgate rollback --to 3`` none of them still tells v3's story as it
stood at its promotion.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from lineage.signing.attestations import Attestation

STORY_START = "<!-- kernelgate:production-story -->"
STORY_END = "<!-- /kernelgate:production-story -->"
HISTORY_KEEP = 50
"""Moves kept in the registered model's ``kernelgate.production_history`` tag (newest)."""


class ProductionMove(BaseModel):
    """One signed move of the ``production`` alias.

    Attributes:
        sequence: the move's number in the family's signed alias history (1, 2, ...).
        action: ``promote``, ``rollback``, ``reconcile``, ``reattest`` or ``clear``.
        version: what production points at after the move (None: nothing serves).
        previous_version: what it pointed at before.
        at: when the move was signed (UTC, as signed).
        reason: the signed reason (a rollback's names who asked, e.g. "manual rollback
            requested by rm@example.com: ...").
        run_id: the MLflow run that holds the signed move.
        keyid: the key that signed it.
    """

    sequence: int
    action: str
    version: str | None
    previous_version: str | None
    at: datetime
    reason: str = ""
    run_id: str
    keyid: str


def production_moves(moves: list[Attestation]) -> list[ProductionMove]:
    """The moves of ``production`` among verified alias ``moves`` (any order), in
    sequence order."""
    out = []
    for move in moves:
        p = move.predicate
        if p.get("alias") != "production":
            continue
        out.append(ProductionMove(
            sequence=int(p.get("sequence", 0)), action=str(p.get("action")),
            version=None if p.get("version") is None else str(p["version"]),
            previous_version=None if p.get("previous_version") is None
            else str(p["previous_version"]),
            at=p["at"], reason=str(p.get("reason") or ""), run_id=move.run_id,
            keyid=move.keyid))
    return sorted(out, key=lambda m: m.sequence)


Role = Literal["in", "out"]


def role_of(move: ProductionMove, version: str) -> Role | None:
    """``in`` when ``move`` put ``version`` into production, ``out`` when it took it out,
    None when it does not name it."""
    if move.version == version:
        return "in"
    if move.previous_version == version:
        return "out"
    return None


def sentence(move: ProductionMove, version: str) -> str:
    """One line about ``move`` as it concerns ``version`` (for the audit, the version
    page and the CLI).

    Raises:
        ValueError: ``move`` does not name ``version``.
    """
    role = role_of(move, version)
    when = f"{move.at:%Y-%m-%d %H:%M:%S} UTC"
    why = f": {move.reason}" if move.reason else ""
    if role == "in":
        came = (f"from v{move.previous_version}" if move.previous_version
                else "where nothing served")
        verb = {"promote": "promoted to production", "rollback": "restored to production by a "
                "rollback"}.get(move.action, f"put into production ({move.action})")
        return f"{when}: {verb} {came} (move {move.sequence}, run {move.run_id[:8]}){why}"
    if role == "out":
        went = f"to v{move.version}" if move.version else "(production taken down)"
        verb = {"rollback": "rolled back from production", "promote": "replaced in production "
                "by a promotion"}.get(move.action, f"taken out of production ({move.action})")
        return f"{when}: {verb} {went} (move {move.sequence}, run {move.run_id[:8]}){why}"
    raise ValueError(f"move {move.sequence} does not name v{version}")


def story_of(moves: list[ProductionMove], version: str) -> list[str]:
    """Every production move naming ``version``, oldest first, as sentences."""
    return [sentence(m, version) for m in moves if role_of(m, version)]


def status_line(moves: list[ProductionMove], version: str) -> str | None:
    """Where ``version`` stands now, from its newest production move (None: never in
    production)."""
    named = [m for m in moves if role_of(m, version)]
    if not named:
        return None
    last = named[-1]
    if role_of(last, version) == "in":
        how = "promoted" if last.action == "promote" else f"restored by a {last.action}"
        return f"In production since {last.at:%Y-%m-%d %H:%M:%S} UTC ({how})."
    return (f"Not in production: {last.action} at {last.at:%Y-%m-%d %H:%M:%S} UTC"
            f"{f' ({last.reason})' if last.reason else ''}.")


def history_tag(moves: list[ProductionMove]) -> str:
    """The registered model's ``kernelgate.production_history`` tag: the newest
    :data:`HISTORY_KEEP` production moves as JSON (version, previous version, action,
    time, reason, run). For people in the MLflow UI; nothing reads it back."""
    return json.dumps([{"version": m.version, "from": m.previous_version, "action": m.action,
                        "at": m.at.isoformat(), "reason": m.reason, "run_id": m.run_id}
                       for m in moves[-HISTORY_KEEP:]])


def story_block(description: str | None) -> str:
    """The production-story block at the top of ``description`` (with its trailing
    newline), or "" when it has none: what a rewrite of the rest of the page keeps."""
    text = description or ""
    if STORY_START not in text or STORY_END not in text:
        return ""
    return STORY_START + text.split(STORY_START, 1)[1].split(STORY_END, 1)[0] + STORY_END + "\n\n"


def with_story(description: str | None, moves: list[ProductionMove], version: str) -> str:
    """``description`` (a version page's markdown) with its production-story block
    replaced by the current one at the top: the status line and every move naming
    ``version``. A description without moves naming the version is returned unchanged."""
    text = description or ""
    if STORY_START in text and STORY_END in text:
        head, rest = text.split(STORY_START, 1)
        text = head + rest.split(STORY_END, 1)[1].lstrip("\n")
    lines = story_of(moves, version)
    if not lines:
        return text
    block = [STORY_START, f"**{status_line(moves, version)}**", "", "Production history "
             "(signed alias moves):", "", *[f"- {line}" for line in lines], STORY_END, ""]
    return "\n".join(block) + "\n" + text
