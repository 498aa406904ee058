"""Variant switches of the Mosaic GPU flash-attention forward (issue 24), and the lazy
rescale rule of its online softmax.

:class:`MosaicVariant` holds the techniques of FlashAttention-3 (Shah et al., 2024,
arXiv:2407.08608) and FlashAttention-4 that ``kernels.pallas_mosaic_gpu`` can switch on
one at a time, so that one benchmark call times each by itself
(``kernels.tools.variants``). Every field default keeps the kernel's behaviour before the
switches existed (the lowered kernel is the same); a variant becomes a default only by a
change of this file (:data:`DEFAULT_SWITCHES_BY_PADDED_HEAD_DIM`, per head_dim), which
changes the kernels' source digest (``kernels.build``).

Already in the kernel, so not switches: two consumer warpgroups in ping-pong (one's
softmax under the other's ``wgmma``), ``exp2`` with the scale folded into ``log2 e``
(``p = exp2(s * c - m)``, one FMA per logit), larger tiles (``BlockSizes``: block_q 128,
block_kv 256 are legal tilings already).

The lazy rescale rule (FlashAttention-4's "conditional rescaling", Tri Dao et al., 2025,
described in the FA4 write-ups; written here from the description): the online softmax
keeps a running max ``m`` per row and rescales the output accumulator by
``exp2(m_old - m_new)`` whenever ``m`` grows. With a threshold ``t`` (log2 units), ``m``
is only moved when the block's max exceeds it by more than ``t``; otherwise the stale
``m`` stays, the block's ``p = exp2(s - m)`` may reach ``2**t``, and no rescale is
needed. The result is exact: the row sum ``l`` and the accumulator are both relative to
the same (stale) ``m``, and the final ``acc / l`` cancels it. ``t <= 8`` keeps
``p <= 256``, far inside float16's 65504 (``P`` is rounded to the input dtype for the
second matrix product). The price is headroom: the float32 accumulator may hold up to
``2**t`` times ``l * max|v|``, so bf16 values within ``2**-t`` of float32's range
(``|v| > ~1e36 / l`` at ``t = 8``) could overflow where the eager rescale does not;
float16 values (<= 65504) cannot.
"""

from __future__ import annotations

import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict, Field, model_validator

REGISTER_FILE_PER_THREAD_SLOT = 512
"""An sm_90 SM has 65536 32-bit registers; one warpgroup is 128 threads, so the three
warpgroups' per-thread counts may add up to at most 65536 / 128 = 512."""
SETMAXNREG_RANGE = (24, 256)
"""``setmaxnreg`` (PTX ISA 8.0) takes a count in [24, 256], a multiple of 8."""
MAX_LAZY_RESCALE_LOG2 = 8.0
"""Largest lazy-rescale threshold (log2 units): ``p <= 2**8`` inside float16's range."""


DEFAULT_SWITCHES_BY_PADDED_HEAD_DIM: dict[int, dict[str, float]] = {
    256: {"lazy_rescale_log2": 8.0},
}
"""Switches the kernel runs with when no variant is asked for, per padded head_dim (a
multiple of 64). Only what was measured to pay on the H200 and passed the `gpu` tests
there (2026-12-01, ``kernels/tools/bench_results/h200-2026-12-01-session5/fa3-grid``):
the lazy rescale at head_dim 256, +4 to +8 % on each of the bf16 grid's four rows (1.01 /
0.92 / 1.10 / 1.13 of cuDNN: full 16k and 4k, causal 16k and 4k), where at head_dim 128
it changed nothing (within +-1 %) and at head_dim 64 it lost 12 %; every
poisoned-padding and extreme-magnitude case of ``tests/test_kernels_mosaic_variants.py``
passed with it in bf16 and f16."""


def registered_default(padded_head_dim: int) -> MosaicVariant:
    """The switches of the kernel as registered at ``padded_head_dim`` (what
    ``variant=None`` means): :data:`DEFAULT_SWITCHES_BY_PADDED_HEAD_DIM`, else every switch
    off (:class:`MosaicVariant`'s field defaults)."""
    return MosaicVariant(**DEFAULT_SWITCHES_BY_PADDED_HEAD_DIM.get(padded_head_dim, {}))


class MosaicVariant(BaseModel):
    """Switches of ``kernels.pallas_mosaic_gpu`` (defaults: its behaviour before them).

    Attributes:
        lazy_rescale_log2: ``None`` (default): rescale the accumulator at every K/V
            block. A float ``t`` in (0, ``MAX_LAZY_RESCALE_LOG2``]: move a row's running
            max only when a block's max exceeds it by more than ``t`` (log2 units of
            the scaled logits, :func:`lazy_max`), and skip the accumulator's rescale
            for a block when no row of the consumer warpgroup moved (one warpgroup-wide
            max of the rows' flags, in shared memory; its softmax phase is exclusive
            under the ping-pong schedule).
        rowsum_before_handover: where the softmax's row sum ``l += sum(p)`` runs:
            ``True`` before the consumer hands the tensor core to the other consumer,
            ``False`` after (under the other's ``wgmma``), ``None`` (default): before at
            padded head_dim <= 128 and after above it (JAX's example's order).
        consumer_registers: per-thread register budget of each consumer warpgroup
            (``setmaxnreg.inc``); default 232.
        producer_registers: per-thread budget of the TMA producer warpgroup
            (``setmaxnreg.dec``); default 40. FlashAttention-3 runs 240/24 (a
            producer needs few registers; two consumers get 8 more each).

    Raises:
        pydantic.ValidationError: a threshold outside (0, 8], a register count that is
            not a multiple of 8 in [24, 256], or budgets over the register file
            (``producer + 2 * consumer > 512``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lazy_rescale_log2: float | None = Field(
        None, gt=0, le=MAX_LAZY_RESCALE_LOG2,
        description="rescale only when the running max grows by more than this (log2)")
    rowsum_before_handover: bool | None = Field(
        None, description="row sum before (True) or after (False) the ping-pong hand-over")
    consumer_registers: int = Field(232, description="setmaxnreg of each consumer")
    producer_registers: int = Field(40, description="setmaxnreg of the producer")

    @model_validator(mode="after")
    def _registers_fit(self) -> MosaicVariant:
        lo, hi = SETMAXNREG_RANGE
        for name in ("consumer_registers", "producer_registers"):
            value = getattr(self, name)
            if value % 8 or not lo <= value <= hi:
                raise ValueError(f"{name} must be a multiple of 8 in [{lo}, {hi}] "
                                 f"(setmaxnreg), got {value}")
        total = self.producer_registers + 2 * self.consumer_registers
        if total > REGISTER_FILE_PER_THREAD_SLOT:
            raise ValueError(
                f"producer_registers + 2 * consumer_registers = {total} exceeds the "
                f"{REGISTER_FILE_PER_THREAD_SLOT} registers per thread slot of an sm_90 "
                f"SM (65536 registers / 128 threads per warpgroup)")
        return self

    def is_default(self) -> bool:
        """Whether every switch has its default (the kernel as before the switches)."""
        return self == MosaicVariant()

    def label(self) -> str:
        """A short name of the switches that differ from the defaults ("default" if none)."""
        changed = self.model_dump(exclude_defaults=True)
        return ",".join(f"{k}={v}" for k, v in sorted(changed.items())) or "default"

    def rowsum_early(self, padded_head_dim: int) -> bool:
        """Whether the row sum runs before the hand-over at this padded head_dim."""
        if self.rowsum_before_handover is None:
            return padded_head_dim <= 128
        return self.rowsum_before_handover


def lazy_max(m_old, m_block, threshold: float | None):
    """The running max after one K/V block, and which rows moved.

    Args:
      m_old: ``[rows]`` float32 running max (scaled log2 units; ``-inf`` before the
        first block).
      m_block: ``[rows]`` float32 ``max(m_old, max of the block's scaled logits)``.
      threshold: ``None``: always move (``m_new = m_block``, the classic online
        softmax); else move a row only when ``m_block - m_old > threshold``.

    Returns:
      ``(m_new, moved)``: the max the block's ``p = exp2(s - m_new)`` and the rescale
      ``exp2(m_old - m_new)`` use (``m_new <= m_block <= m_new + threshold``), and a bool
      ``[rows]`` of the rows whose max moved (their accumulator must be rescaled; the
      others' factor is exactly 1). A row at ``-inf`` always moves to a finite block max.
    """
    if threshold is None:
        return m_block, m_block > m_old
    moved = m_block - m_old > threshold
    return jnp.where(moved, m_block, m_old), moved
