"""The serving contract applied to one evaluation: which cases are drawn, which the
candidate refused.

``evaluation`` does not import ``gates``: the contract arrives as any object with
``outside(dtype, head_dim, q_len, kv_len) -> str | None`` and ``model_dtype``
(``gates.serving_contract.ServingContract`` is one). Cases outside it are not drawn
(the test set stays as built; its digests are those of the whole split). A case inside
it that a kernel refuses (``NotImplementedError``, in this process or reported by a
version's own process) is *refused*: scored as a failed case, as any error, and
counted by ``coverage.refused_cases``, which the profile's coverage criterion judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from evaluation.cases import TestCase

REFUSAL = "NotImplementedError"


class Contract(Protocol):
    """What an evaluation reads of a serving contract."""

    model_dtype: str

    def outside(self, dtype: str, head_dim: int, q_len: int, kv_len: int,
                causal: bool | None = None) -> str | None: ...

    def describe(self) -> str: ...


def is_refusal(error: str | None) -> bool:
    """Whether a recorded error (``"<Type>: <message>"``) is a refusal by contract: a
    ``NotImplementedError`` raised here or relayed (``"v3: NotImplementedError: ..."``)."""
    return error is not None and (error.startswith(f"{REFUSAL}:") or f": {REFUSAL}:" in error)


def why_outside(case: TestCase, contract: Contract | None) -> str | None:
    """Why ``case`` is outside ``contract`` (None: served; no contract serves all)."""
    if contract is None:
        return None
    spec = case.spec
    return contract.outside(spec.dtype, spec.q_shape[3], spec.q_shape[1], spec.kv_shape[1],
                            causal=spec.causal)


def split_by_contract(cases: Sequence[TestCase], contract: Contract | None
                      ) -> tuple[list[TestCase], dict[str, str]]:
    """``(served cases, case_id -> why it is not drawn)``, in the split's order."""
    served: list[TestCase] = []
    left: dict[str, str] = {}
    for case in cases:
        why = why_outside(case, contract)
        if why is None:
            served.append(case)
        else:
            left[case.spec.case_id] = why
    return served, left
