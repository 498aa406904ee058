"""One attention test case: its description (manifest entry) and its arrays.

Shared by the test-set builder (``evaluation.testset``), the validation suite and
the accuracy/performance evaluators.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Category = Literal["ordinary", "hard", "adversarial"]
CATEGORIES: tuple[Category, ...] = ("ordinary", "hard", "adversarial")
Split = Literal["tuning", "heldout", "confirmation"]
SPLITS: tuple[Split, ...] = ("tuning", "heldout", "confirmation")
SPLIT_NAME_PATTERN = r"^(?:tuning|heldout|confirmation(?:-[1-9][0-9]{0,3})?)$"
"""A split's name: one of ``SPLITS``, or ``confirmation-<k>`` for the k-th fresh
confirmation draw (``evaluation.testset.draws``)."""


def confirmation_draw_name(k: int) -> str:
    """The name of confirmation draw ``k``: ``confirmation`` for 0, else ``confirmation-<k>``."""
    if not 0 <= k <= 9999:
        raise ValueError(f"confirmation draw must be in [0, 9999], got {k}")
    return "confirmation" if k == 0 else f"confirmation-{k}"


def split_kind(name: str) -> Split:
    """The split ``name`` is one of: ``tuning``, ``heldout`` or ``confirmation`` (any draw).

    Raises:
        ValueError: ``name`` is not a split name (``SPLIT_NAME_PATTERN``).
    """
    if not re.match(SPLIT_NAME_PATTERN, name):
        raise ValueError(f"split must be one of {list(SPLITS)} or confirmation-<k> (k >= 1), "
                         f"got {name!r}")
    return "confirmation" if name.startswith("confirmation") else name
ARRAY_NAMES = ("q", "k", "v", "q_lengths", "kv_lengths")


class CaseSpec(BaseModel):
    """Manifest entry of one case.

    Attributes:
        case_id: unique within the test set, e.g. ``heldout/hard/gqa3-0007``.
        category: ordinary (real model), hard, or adversarial.
        tags: what the case exercises (``gqa``, ``causal``, ``padding``, ``long``...).
        q_shape: ``[batch, q_len, num_heads, head_dim]``; kv_shape: ``[batch, kv_len, num_kv_heads, head_dim]``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        causal, scale: attention arguments (``scale=None`` = ``1/sqrt(head_dim)``).
        has_lengths: whether ``q_lengths``/``kv_lengths`` arrays are stored.
        source: ``seed:<n>`` or ``document:<name>#<sha256 prefix>``.
        digest: sha256 over the case's arrays (see ``case_digest``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    case_id: str
    category: Category
    tags: tuple[str, ...] = ()
    q_shape: tuple[int, int, int, int]
    kv_shape: tuple[int, int, int, int]
    dtype: Literal["float32", "bfloat16", "float16"]
    causal: bool = False
    scale: float | None = None
    has_lengths: bool = False
    source: str
    digest: str = Field(description="sha256 hex of the case arrays")


@dataclass(frozen=True)
class TestCase:
    """A case with its arrays (NumPy; bf16 via ``ml_dtypes``).

    ``q``: ``[batch, q_len, num_heads, head_dim]``; ``k``, ``v``:
    ``[batch, kv_len, num_kv_heads, head_dim]``; ``q_lengths``/``kv_lengths``:
    int32 ``[batch]`` or ``None``.
    """

    __test__ = False  # not a pytest class

    spec: CaseSpec
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_lengths: np.ndarray | None = None
    kv_lengths: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The non-``None`` arrays by name."""
        return {n: getattr(self, n) for n in ARRAY_NAMES if getattr(self, n) is not None}


def case_digest(arrays: dict[str, np.ndarray], *, causal: bool, scale: float | None) -> str:
    """sha256 over names, dtypes, shapes and bytes of the arrays plus the attention
    arguments, so equal content gives an equal digest on any machine."""
    h = hashlib.sha256()
    h.update(f"causal={causal};scale={scale!r}".encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.name}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def make_case(*, case_id: str, category: Category, tags: tuple[str, ...], q, k, v,
              q_lengths=None, kv_lengths=None, causal: bool = False,
              scale: float | None = None, source: str) -> TestCase:
    """A ``TestCase`` whose spec (shapes, dtype, digest) is derived from its arrays."""
    arrays = {"q": q, "k": k, "v": v}
    if q_lengths is not None:
        arrays["q_lengths"] = np.asarray(q_lengths, np.int32)
    if kv_lengths is not None:
        arrays["kv_lengths"] = np.asarray(kv_lengths, np.int32)
    spec = CaseSpec(
        case_id=case_id, category=category, tags=tuple(tags), q_shape=q.shape,
        kv_shape=k.shape, dtype=np.dtype(q.dtype).name, causal=causal, scale=scale,
        has_lengths=q_lengths is not None or kv_lengths is not None, source=source,
        digest=case_digest(arrays, causal=causal, scale=scale))
    return TestCase(spec=spec, q=q, k=k, v=v, q_lengths=arrays.get("q_lengths"),
                    kv_lengths=arrays.get("kv_lengths"))
