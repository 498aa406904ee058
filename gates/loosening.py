"""Which changes between two registrations make the thresholds looser (pure logic).

Registrations of a family form an append-only chain; a new registration that loosens
any criterion after a candidate was rejected needs a named approval (threshold
shopping: re-running a rejected candidate under a copy of the file with one bound
relaxed). "Looser" means: a candidate that failed before could pass now, or a check that
could stop a rollout no longer can. Any change that is not clearly a tightening is
reported, so the approval has to say why.

Nothing here names a field: :func:`loosenings` walks the schema's models and compares each
field by the direction it declares (``gates.directions``, declared in
``gates.thresholds``). A field that declares none is compared as ``any_change`` (and
``tests/test_gates_loosening.py`` fails). A bound that goes from set to unset or back
(``min_improvement`` exchanged for ``max_regression``) is reported as a change.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gates.directions import Direction, Looser, direction_of
from gates.thresholds import Thresholds

_UPPER_BOUNDS = ("<=", "<")
_LOWER_BOUNDS = (">=", ">")
_UNDECLARED = Direction(Looser.ANY_CHANGE)


def loosenings(old: Thresholds, new: Thresholds) -> list[str]:
    """Every way ``new`` is looser than ``old``, in words (empty: not looser), e.g.
    ``cpu/hard-error-ratio: accuracy.hard.max_error_ratio_to_baseline <= 2 -> 3`` or
    ``canary.max_nan_count 0 -> 2``. Criteria are matched by name per platform, canary
    steps by name, approvers by key id."""
    return _model(old, new, "")


def _model(old: BaseModel, new: BaseModel, where: str) -> list[str]:
    out: list[str] = []
    for name, field in type(old).model_fields.items():
        direction = direction_of(field) or _UNDECLARED
        attribute = direction.compare or name
        out += _field(direction, name, getattr(old, attribute), getattr(new, attribute),
                      where, old)
    return out


def _field(d: Direction, name: str, a: Any, b: Any, where: str, owner: BaseModel) -> list[str]:
    looser = d.looser
    if looser is Looser.NOT_A_LIMIT:
        return []
    if looser is Looser.NESTED:
        if a is None or b is None:  # an optional sub-model set or unset: another test
            return [] if a == b else [f"{where}{name} {_words(a)} -> {_words(b)}"]
        return _model(a, b, f"{where}{name}.")
    if looser in (Looser.FEWER, Looser.MORE):
        return _members(d, name, a, b, where)
    shown = name
    if looser is Looser.BY_OP:
        op = owner.op  # type: ignore[attr-defined]
        looser = (Looser.HIGHER if op in _UPPER_BOUNDS else
                  Looser.LOWER if op in _LOWER_BOUNDS else Looser.ANY_CHANGE)
        shown = f"{getattr(owner, 'metric', name)} {op}"
    if _is_looser(looser, a, b):
        if isinstance(a, dict | list):
            return [f"{where}{shown} changed"]
        return [f"{where}{shown} {_words(a)} -> {_words(b)}"]
    return []


def _is_looser(looser: Looser, a: Any, b: Any) -> bool:
    if looser is Looser.ANY_CHANGE or (looser in (Looser.HIGHER, Looser.LOWER)
                                       and (a is None or b is None)):
        return a != b
    return {Looser.HIGHER: lambda: b > a, Looser.LOWER: lambda: b < a,
            Looser.TRUE_TO_FALSE: lambda: bool(a) and not b,
            Looser.FALSE_TO_TRUE: lambda: not a and bool(b)}[looser]()


def _members(d: Direction, name: str, a: Any, b: Any, where: str) -> list[str]:
    old, new = _keyed(a, d.key), _keyed(b, d.key)
    if d.key and len(new) != len(b) and list(b) != list(a):
        return [f"{where}{name}: a {d.key} repeated"]  # which one counts is anyone's guess
    out: list[str] = []
    for key in [*old, *(k for k in new if k not in old)]:
        member = old.get(key, new.get(key))
        prefix = f"{where}{(d.label or f'{name}[{{key}}].').format(key=key)}"
        item = (f"{prefix.rstrip(' .:/')}:" if isinstance(member, BaseModel)
                else f"{where}{name}: {key}")
        if key not in new and d.looser is Looser.FEWER:
            out.append(f"{item} removed")
        elif key not in old and d.looser is Looser.MORE:
            out.append(f"{item} added")
        elif key in old and key in new and isinstance(member, BaseModel):
            out += _model(old[key], new[key], prefix)
    return out


def _keyed(members: Any, key: str | None) -> dict:
    if isinstance(members, dict):
        return dict(members)
    return {(getattr(m, key) if key else m): m for m in members}


def _words(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, BaseModel):
        return "set"
    if v is None:
        return "unset"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
