"""The looser-direction vocabulary: every field of the thresholds schema says, where it is
defined, which change of it makes the thresholds looser (pure, no I/O).

A field is declared with :func:`limit` instead of pydantic's ``Field`` (it takes the same
keyword arguments); the direction is stored in the field's JSON schema as ``"looser"``, so
``Thresholds.model_json_schema()`` shows it. ``gates.loosening`` walks the models and
compares each field by its direction; ``tests/test_gates_loosening.py`` fails when a field
of the schema declares none, so a limit added later cannot slip past the loosening rule.

"Looser" means: a candidate that failed before could pass now, or a check that could stop
a rollout no longer can (``gates.loosening``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo


class Looser(StrEnum):
    """Which change of a field loosens the thresholds."""

    HIGHER = "higher"
    """A number whose raise loosens (a ``max_*`` limit, an allowed regression, a floor)."""
    LOWER = "lower"
    """A number whose lowering loosens (a required improvement, a sample size, an alpha)."""
    TRUE_TO_FALSE = "true_to_false"
    """A switch that guards when on (``require_signed``)."""
    FALSE_TO_TRUE = "false_to_true"
    """A switch that waives a guard when on (``auto_approve``)."""
    FEWER = "fewer"
    """A set (or a dict, or a list of models matched by ``key``) whose members each guard
    something: a member removed loosens; matched members are compared field by field."""
    MORE = "more"
    """A set (or list of models matched by ``key``) whose members each waive something
    (trusted approvers): a member added loosens; matched members are compared field by field."""
    ANY_CHANGE = "any_change"
    """An identity field: a change means a different test, looser or not, so it needs a
    named approval (metric, op, what a change criterion compares, the kind of test)."""
    BY_OP = "by_op"
    """A bound whose direction follows the model's ``op`` field: ``<=``/``<`` as
    :attr:`HIGHER`, ``>=``/``>`` as :attr:`LOWER`, ``==`` as :attr:`ANY_CHANGE`."""
    NESTED = "nested"
    """A sub-model: its own fields declare their directions."""
    NOT_A_LIMIT = "not_a_limit"
    """Judges nothing (a name, a description, a match key); needs ``why``."""


@dataclass(frozen=True)
class Direction:
    """A field's declared direction (see :class:`Looser`).

    ``key``: for a list of models (:attr:`Looser.FEWER`/:attr:`Looser.MORE`), the field
    its items are matched by. ``label``: how a matched item is named in messages, a format
    string of ``key`` (default ``"<field>[<key>]."``). ``compare``: the attribute compared
    instead of the raw field (e.g. a property resolving a default). ``why``: the reason a
    field is :attr:`Looser.NOT_A_LIMIT`.
    """

    looser: Looser
    key: str | None = None
    label: str | None = None
    compare: str | None = None
    why: str | None = None


def limit(looser: Looser, *, key: str | None = None, label: str | None = None,
          compare: str | None = None, why: str | None = None, **field_kwargs: Any) -> Any:
    """A pydantic ``Field(**field_kwargs)`` that declares its looser direction.

    Raises:
        TypeError: ``not_a_limit`` without a ``why``, or ``why`` on a limit (at import).
    """
    if (looser is Looser.NOT_A_LIMIT) != bool(why and why.strip()):
        raise TypeError("a not_a_limit field needs a why, and only it has one")
    extra = {"looser": looser.value, "key": key, "label": label, "compare": compare,
             "why": why}
    return Field(json_schema_extra={k: v for k, v in extra.items() if v is not None},
                 **field_kwargs)


def direction_of(field: FieldInfo) -> Direction | None:
    """The direction a model field declared with :func:`limit`, or None if it declares none."""
    extra = field.json_schema_extra
    if not isinstance(extra, dict) or "looser" not in extra:
        return None
    return Direction(looser=Looser(extra["looser"]), key=extra.get("key"),
                     label=extra.get("label"), compare=extra.get("compare"),
                     why=extra.get("why"))
