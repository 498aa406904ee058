"""A thresholds file's bytes to the mapping ``gates.thresholds`` validates (pure).

Duplicate keys are refused: PyYAML's ``safe_load`` silently keeps the last of two equal
keys in one mapping, so ``{value: 2.0, value: 1.0e+6}`` would judge by a bound a reader of
the entry does not see first.

Schema versions:

* **2** (current): version 1's fields, each declaring its looser direction in the schema
  (``gates.directions``), so ``gates.loosening`` is derived from the schema.
* **1**: registrations already stored in MLflow stores. They still parse: the mapping goes
  through :func:`upgrade_v1` before validation, so a family's chain compares a v1
  registration with a v2 one field by field.

The v1 -> v2 mapping (:func:`upgrade_v1`): ``schema_version: 1`` becomes ``2``; no field
is renamed, moved or re-defaulted (future renames go there, as pure edits of the mapping).
Registration hashes the stored bytes, never the upgraded mapping: nothing here changes what
is hashed (``Thresholds.source_sha256``), and ``Thresholds.source_schema_version`` says
which version a file was written in.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

_MERGE = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing a mapping that repeats a key (``<<`` merges, which
    may be overridden by design, are left to PyYAML)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """Raises ``ConstructorError`` naming the repeated key and both lines (1-based)."""
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    repeated = key in first
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if repeated:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} at line {line} (first at line "
                        f"{first[key]})", key_node.start_mark)
                first[key] = line
        return super().construct_mapping(node, deep=deep)


SCHEMA_VERSION = 2
"""The version of the thresholds schema this code writes and validates."""


def upgrade_v1(raw: dict) -> dict:
    """The v1 -> v2 mapping of a parsed thresholds mapping (pure; ``raw`` is not changed).

    Raises:
        ValueError: ``raw`` is not a version 1 mapping.
    """
    if raw.get("schema_version") != 1 or isinstance(raw.get("schema_version"), bool):
        raise ValueError(f"upgrade_v1 takes schema_version 1, got {raw.get('schema_version')!r}")
    return {**raw, "schema_version": 2}


def read_mapping(data: bytes, *, source: str = "<bytes>") -> tuple[dict, int]:
    """The version-2 mapping of a thresholds file's bytes, and the version it was written in.

    Raises:
        ValueError: invalid YAML (a repeated key included: the message names the key and
            its lines), not a mapping, or a schema version other than 1 and 2; the
            message names ``source``.
    """
    try:
        raw = load_unique(data)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: a thresholds file must be a YAML mapping")
    version = raw.get("schema_version")
    if isinstance(version, bool) or version not in (1, SCHEMA_VERSION):
        raise ValueError(f"{source}: schema_version must be {SCHEMA_VERSION} (or 1, upgraded "
                         f"when read), got {version!r}")
    return (upgrade_v1(raw) if version == 1 else raw), version


def load_unique(data: bytes | str) -> Any:
    """``yaml.load`` with :class:`UniqueKeyLoader`.

    Raises:
        yaml.YAMLError: invalid YAML, or a mapping repeats a key (the message names the
            key and its lines).
    """
    return yaml.load(data, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
