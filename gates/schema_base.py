"""What every thresholds model shares: strict frozen models, names, finite floats.

A leaf of ``gates`` (the thresholds schema is split by concept: criteria in
``gates.thresholds``, the canary plan in ``gates.canary_plan``, the approval policy in
``gates.approval_policy``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gates.directions import Looser as L

_N = L.NOT_A_LIMIT


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Criterion and canary-step names become MLflow metric/tag keys and Prefect keys: letters,
digits, ``_``, ``.``, ``-`` (no ``%``, spaces or slashes), at most 64 characters."""

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
_KEY = "the key items are matched by: a renamed item reads as one removed and one added"


