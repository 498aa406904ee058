"""One attention problem shape, its FLOP count, and the random inputs every timing uses.

``AttentionShape`` is the single shape type of the project: the build's example
problem, the benchmark grid, the autotuner's shapes and the evaluation's latency
shapes are all instances of it.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[DType, ...] = ("float32", "bfloat16", "float16")


class AttentionShape(BaseModel):
    """q ``[batch, q_len, num_heads, head_dim]``, k/v ``[batch, kv_len, num_kv_heads,
    head_dim]`` in ``dtype``, optionally causal (sizes in elements).

    ``kv_fill``: where set, every batch row's keys past ``ceil(kv_fill * kv_len)`` are
    padding, passed to the kernel as ``kv_lengths`` (:meth:`kv_lengths`): the calls of an
    encoder serving documents padded to a length bucket, where a kernel that skips padded
    key blocks does less work than the bare shape says. ``None`` (the default): no lengths,
    and the field is left out of the model's dump, so records made before it existed keep
    their canonical JSON and fingerprints. :meth:`flops` counts the padded shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: PositiveInt
    q_len: PositiveInt
    kv_len: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    dtype: DType = "float32"
    causal: bool = False
    kv_fill: float | None = Field(None, gt=0, le=1, strict=True,
                                  description="valid share of each row's keys")

    @model_serializer(mode="wrap")
    def _without_unset_fill(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        if dumped.get("kv_fill", 0) is None:
            del dumped["kv_fill"]
        return dumped

    def kv_lengths(self) -> jax.Array | None:
        """int32 ``[batch]``: ``ceil(kv_fill * kv_len)`` (at least 1) for every row, or
        ``None`` without a fill."""
        if self.kv_fill is None:
            return None
        # rounded first: 0.07 * 100 is 7.000000000000001 in binary and its ceiling 8
        valid = max(1, min(self.kv_len, math.ceil(round(self.kv_fill * self.kv_len, 9))))
        return jnp.full((self.batch,), valid, jnp.int32)

    @model_validator(mode="after")
    def _gqa(self) -> AttentionShape:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        return self

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.q_len, self.num_heads, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv_len, self.num_kv_heads, self.head_dim)

    def flops(self) -> float:
        """Forward FLOPs ``4 * B * H * Sq * Skv * D``, halved when causal (the
        FlashAttention-2 convention, Dao 2023): two matmuls of 2 FLOPs per MAC."""
        f = 4.0 * self.batch * self.num_heads * self.q_len * self.kv_len * self.head_dim
        return f / 2 if self.causal else f

    @property
    def label(self) -> str:
        """A short readable name, e.g. ``bfloat16 d128 causal B1 S4096x4096 H16/16``."""
        fill = "" if self.kv_fill is None else f" fill {self.kv_fill:g}"
        return (f"{self.dtype} d{self.head_dim} {'causal' if self.causal else 'full'} "
                f"B{self.batch} S{self.q_len}x{self.kv_len} H{self.num_heads}/{self.num_kv_heads}"
                f"{fill}")

    def structs(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """``(q, k, v)`` as ``jax.ShapeDtypeStruct``."""
        dtype = jnp.dtype(self.dtype)
        kv = jax.ShapeDtypeStruct(self.kv_shape, dtype)
        return jax.ShapeDtypeStruct(self.q_shape, dtype), kv, kv


def random_inputs(shape: AttentionShape, seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Fresh standard-normal ``(q, k, v)`` for ``shape`` on the default device (never
    zeros: zeros hide unwritten outputs and run faster than real data)."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    dtype = jnp.dtype(shape.dtype)
    return jax.block_until_ready((jax.random.normal(kq, shape.q_shape, dtype),
                                  jax.random.normal(kk, shape.kv_shape, dtype),
                                  jax.random.normal(kv, shape.kv_shape, dtype)))
