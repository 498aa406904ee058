"""A registration's serving contract: what the registered kernel must run.

A kernel's *capability* (``kernels.kernel.Capability``) says what its class can run; a
registration's *serving contract* says what the family serves, and so what the kernel is
judged on: the dtypes, the head_dim range, the sequence range and the masks (full,
causal) of the calls it must run, whether the serving model (MiniLM) is served and
checked, and the dtype it runs its attention in. Cases of the test set outside the
contract are not drawn (the held-out split, the confirmation draws);
cases inside it that a kernel refuses are recorded per case as *refused* and fail the
profile's coverage criterion (metric ``coverage.refused_cases``).

Narrower is looser: a contract serving fewer dtypes or masks, a smaller head_dim or
sequence range, or no MiniLM, asks the kernel to run less, so every field declares that
direction (a dtype or mask removed, a lower bound raised, an upper bound lowered or set,
the model check turned off loosens).

The default contract serves everything (every dtype, any head_dim, any length) with a
float32 serving model: a profile written before contracts existed judges exactly what
it judged before.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from gates.directions import Looser as L
from gates.directions import limit
from gates.schema_base import _Strict

Dtype = Literal["float32", "bfloat16", "float16"]
ALL_DTYPES: tuple[Dtype, ...] = ("float32", "bfloat16", "float16")
Mask = Literal["full", "causal"]
ALL_MASKS: tuple[Mask, ...] = ("full", "causal")


class ServingContract(_Strict):
    """What a registration serves (see the module docstring). A call is inside when its
    dtype is listed, its mask (full or causal) is listed,
    ``min_head_dim <= head_dim <= max_head_dim`` and
    ``min_seq <= max(q_len, kv_len) <= max_seq`` (an unset maximum: no limit)."""

    dtypes: list[Dtype] = limit(L.FEWER, default_factory=lambda: list(ALL_DTYPES),
                                min_length=1, description="input dtypes served")
    min_head_dim: int = limit(L.HIGHER, default=1, ge=1)
    max_head_dim: int | None = limit(L.LOWER, default=None, ge=1,
                                     description="None: no upper limit")
    min_seq: int = limit(L.HIGHER, default=1, ge=1,
                         description="shortest sequence served, max(q_len, kv_len)")
    max_seq: int | None = limit(L.LOWER, default=None, ge=1,
                                description="longest sequence served; None: no upper limit")
    model_dtype: Dtype = limit(
        L.ANY_CHANGE, default="float32",
        description="the dtype the serving model (MiniLM) runs its attention in: the MiniLM "
        "check and the recorded traffic run in it (a different dtype is a different test)")
    masks: list[Mask] = limit(
        L.FEWER, default_factory=lambda: list(ALL_MASKS), min_length=1,
        description="the attention masks served: full (non-causal, an encoder's) and causal")
    model_check: bool = limit(
        L.TRUE_TO_FALSE, default=True,
        description="whether the serving model (MiniLM, head_dim 32) is served, and so "
        "checked (the model.* criteria); false for a family that serves another model, "
        "e.g. a head_dim-128 kernel behind the long-document encoder of `canary.workload`")

    @model_validator(mode="after")
    def _consistent(self) -> ServingContract:
        if len(set(self.dtypes)) != len(self.dtypes):
            raise ValueError(f"serving.dtypes lists a dtype twice: {self.dtypes}")
        if len(set(self.masks)) != len(self.masks):
            raise ValueError(f"serving.masks lists a mask twice: {self.masks}")
        if self.max_head_dim is not None and self.max_head_dim < self.min_head_dim:
            raise ValueError(f"serving: max_head_dim {self.max_head_dim} < min_head_dim "
                             f"{self.min_head_dim}")
        if self.max_seq is not None and self.max_seq < self.min_seq:
            raise ValueError(f"serving: max_seq {self.max_seq} < min_seq {self.min_seq}")
        if self.model_dtype not in self.dtypes:
            raise ValueError(f"serving.model_dtype {self.model_dtype} is not a served dtype "
                             f"{self.dtypes}")
        return self

    def outside(self, dtype: str, head_dim: int, q_len: int, kv_len: int,
                causal: bool | None = None) -> str | None:
        """Why a call is outside the contract, or None when it is served (``causal``
        None: the mask is not asked about)."""
        seq = max(q_len, kv_len)
        if dtype not in self.dtypes:
            return f"dtype {dtype} not served {self.dtypes}"
        mask = None if causal is None else ("causal" if causal else "full")
        if mask is not None and mask not in self.masks:
            return f"{mask} mask not served {self.masks}"
        if not self.min_head_dim <= head_dim <= (self.max_head_dim or head_dim):
            return f"head_dim {head_dim} outside {self._range(self.min_head_dim, self.max_head_dim)}"
        if not self.min_seq <= seq <= (self.max_seq or seq):
            return f"sequence {seq} outside {self._range(self.min_seq, self.max_seq)}"
        return None

    def serves(self, dtype: str, head_dim: int, q_len: int, kv_len: int,
               causal: bool | None = None) -> bool:
        """Whether the contract serves a call (``evaluation`` filters cases by it)."""
        return self.outside(dtype, head_dim, q_len, kv_len, causal) is None

    def describe(self) -> str:
        """One line for people, e.g. ``bfloat16, head_dim 64..256, seq >= 1024; model bfloat16``
        (the masks and the model check said only where they narrow it)."""
        masks = "" if set(self.masks) == set(ALL_MASKS) else f", {'/'.join(self.masks)} masks"
        model = f"model {self.model_dtype}" if self.model_check else "no MiniLM check"
        return (f"{', '.join(self.dtypes)}, head_dim {self._range(self.min_head_dim, self.max_head_dim)}, "
                f"seq {self._range(self.min_seq, self.max_seq)}{masks}; {model}")

    @staticmethod
    def _range(low: int, high: int | None) -> str:
        return f">= {low}" if high is None else f"{low}..{high}"


COVERAGE_METRIC = "coverage.refused_cases"
"""Cases inside the contract that the candidate refused (``NotImplementedError``), the
MiniLM check included; a profile's coverage criterion requires ``== 0``."""


def named_refusals(reason: str, refused: dict[str, str] | None, limit_shown: int = 8) -> str:
    """``reason`` with the refused cases named (the gate decision's coverage line)."""
    if not refused:
        return reason
    shown = "; ".join(f"{case}: {why}" for case, why in list(refused.items())[:limit_shown])
    more = f"; and {len(refused) - limit_shown} more" if len(refused) > limit_shown else ""
    return f"{reason}; refused inside the serving contract: {shown}{more}"
