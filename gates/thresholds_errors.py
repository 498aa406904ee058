"""A thresholds file's schema errors as a person reads them: where, what, what was meant.

Pydantic names an error by its path through the parsed mapping (``platforms.tpu.value.0
.metirc``), once per path. A YAML alias (``gpu: *native``) repeats the anchored block under
another path, so one typo shows up once per platform that shares it, under paths the
person never typed, and none of them says on which line. :func:`explain` turns the errors
into one line each per distinct place in the file: ``file:line``, the path as typed (the
paths that reach the same lines through an alias named beside it), pydantic's message,
and for an unknown key the closest field name of the schema (``did you mean 'metric'?``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kernels.errors import KernelgateError


class InvalidThresholds(KernelgateError, ValueError):
    """A thresholds file does not match the schema (the message locates every problem)."""


def _fields(schema: Any, out: set[str]) -> set[str]:
    if isinstance(schema, dict):
        out |= set(schema.get("properties", {}))
        for value in schema.values():
            _fields(value, out)
    elif isinstance(schema, list):
        for value in schema:
            _fields(value, out)
    return out


def schema_fields(model: type[BaseModel]) -> set[str]:
    """Every field name of ``model`` and the models it nests (its JSON schema's keys)."""
    return _fields(model.model_json_schema(), set())


def _child(node: yaml.Node, step: int | str) -> tuple[yaml.Node | None, yaml.Node | None]:
    """``(key node, value node)`` of ``step`` under ``node`` (no key node for an index)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(step):
                return key, value
    elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) \
            and 0 <= step < len(node.value):
        return None, node.value[step]
    return None, None


def locate(root: yaml.Node | None, loc: Iterable[int | str]) -> tuple[yaml.Node | None, int | None]:
    """The deepest node of ``root`` that ``loc`` reaches, and the 1-based line of the
    key or item ``loc`` ends at (a missing key: the line of the mapping that lacks it)."""
    node, line = root, (root.start_mark.line + 1) if root is not None else None
    for step in loc:
        key, value = _child(node, step) if node is not None else (None, None)
        if value is None:
            break
        node, line = value, (key or value).start_mark.line + 1
    return node, line


def _path(loc: Iterable[int | str]) -> str:
    return ".".join(str(step) for step in loc) or "(top level)"


def explain(error: ValidationError, data: bytes | str, *, source: str,
            model: type[BaseModel]) -> str:
    """One line per distinct problem of ``error`` (raised validating the YAML ``data`` of
    the file ``source`` against ``model``): ``source:line: path: message``, problems that
    YAML aliases repeat said once, an unknown key with the closest field names of
    ``model`` suggested. The first line says how many problems there are."""
    try:
        root = yaml.compose(data, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # the file parsed already; only a different loader could differ
        root = None
    known = schema_fields(model)
    errors = error.errors(include_url=False)
    missing = {(tuple(e["loc"][:-1]), e["loc"][-1]) for e in errors
               if e["type"] == "missing" and e["loc"]}
    meant: set[tuple] = set()  # missing fields an unknown key beside them was meant to be
    seen: dict[tuple, list[str]] = {}  # one problem -> the alias paths that repeat it
    said: dict[tuple, tuple[tuple, str]] = {}  # one problem -> (its loc, its line)
    for err in errors:
        loc = tuple(err["loc"])
        node, line = locate(root, loc)
        keyed = err["type"] in ("extra_forbidden", "missing") and bool(loc)
        shown = _path(loc[:-1] if keyed else loc)
        # the same node, reached through an alias, is the same problem in the file
        key = (line, id(node) if node is not None else None, err["type"], loc[-1:] if loc else ())
        if key in seen:
            seen[key].append(shown)
            continue
        message = err["msg"]
        if err["type"] == "extra_forbidden" and loc:
            message = f"unknown key {loc[-1]!r}"
            here = sorted(field for parent, field in missing if parent == loc[:-1])
            close = (difflib.get_close_matches(str(loc[-1]), here, n=1, cutoff=0.6)
                     or difflib.get_close_matches(str(loc[-1]), sorted(known), n=2, cutoff=0.7))
            if close:
                message += f"; did you mean {' or '.join(repr(c) for c in close)}?"
                meant |= {(loc[:-1], c) for c in close}
        elif err["type"] == "missing" and loc:
            message = f"{loc[-1]!r} is required here and missing"
        else:
            message = message.removeprefix("Value error, ")  # a validator's own sentence
            value = err.get("input")
            if isinstance(value, str | int | float | bool) and repr(value) not in message:
                message += f" (got {value!r})"
        seen[key] = []
        said[key] = (loc, (f"{source}:{line}" if line is not None else source)
                     + f": {shown}: {message}")
    out = []
    for key, (loc, text) in said.items():
        if key[2] == "missing" and (loc[:-1], loc[-1]) in meant:
            continue  # said with the misspelt key that was meant to be it
        if seen[key]:
            text += f" (also {', '.join(seen[key])}: the same lines, through a YAML alias)"
        out.append("  " + text)
    count = len(out)
    return (f"{source} is not a valid thresholds file ({count} problem"
            f"{'s' if count != 1 else ''}):\n" + "\n".join(out))
