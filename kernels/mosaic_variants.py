"""Variant switches of the Mosaic GPU flash-attention forward, and the lazy rescale rule
of its online softmax.

:class:`MosaicVariant` holds the techniques of FlashAttention-3 (Shah et al., 2024,
arXiv:2407.08608) and FlashAttention-4 that ``kernels.pallas_mosaic_gpu`` can switch on
one at a time, so that one benchmark call times each by itself
(``kernels.tools.variants``). Every field default keeps the kernel's behaviour before the
switches existed (the lowered kernel is the same); a variant becomes a default only by a
change of this file (:data:`REGISTERED_SWITCHES`, per head_dim, mask and length), which
changes the kernels' source digest (``kernels.build``).

Already in the kernel, so not switches: two consumer warpgroups in ping-pong (one's
softmax under the other's ``wgmma``), ``exp2`` with the scale folded into ``log2 e``
(``p = exp2((s - m) * c)`` with ``m`` in raw-logit units, :func:`softmax_block`; it was
one FMA per logit, ``exp2(s * c - m * c)``, until that FMA was found to lose the row's
largest logit at large magnitudes), larger tiles (``MosaicConfig``: block_q 128, block_kv
256 are legal tilings already).

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

Kept whole, over 350 lines: the switches, their registered defaults and the softmax block
they alter are one concept, and the kernel reads all three from here.
"""

from __future__ import annotations

import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict, Field, model_validator

_LOG2_E = 1.4426950408889634

REGISTER_FILE_PER_THREAD_SLOT = 512
"""An sm_90 SM has 65536 32-bit registers; one warpgroup is 128 threads, so the three
warpgroups' per-thread counts may add up to at most 65536 / 128 = 512."""
SETMAXNREG_RANGE = (24, 256)
"""``setmaxnreg`` (PTX ISA 8.0) takes a count in [24, 256], a multiple of 8."""
MAX_LAZY_RESCALE_LOG2 = 8.0
"""Largest lazy-rescale threshold (log2 units): ``p <= 2**8`` inside float16's range."""
OUTPUT_CHUNK_COLS = 64
"""An output chunk is a whole number of 64-column swizzle tiles (128 bytes of bf16/f16
per row: the ``(8, 64)`` shared-memory tiling and the TMA box along head_dim)."""
MAX_OUTPUT_CHUNKS = 4


def tile_registers(block_q: int, block_kv: int, head_dim: int) -> int:
    """32-bit registers per consumer thread the tiles need (NOTES-gpu.md's count, a
    warpgroup is 128 threads): the float32 logits ``S`` (``block_q * block_kv / 128``),
    ``P`` in bf16/f16 (half that) and the float32 output accumulator
    (``block_q * head_dim / 128``). The intra-warpgroup pipeline needs the same: the
    next block's ``S``, this block's ``P`` (read by its ``P V`` in flight) and the
    accumulator. Addresses, the softmax state and loop counters come on top."""
    s = block_q * block_kv // 128
    return s + s // 2 + block_q * head_dim // 128


class SwitchRule(BaseModel):
    """One registered choice of switches: the kernel runs ``switches`` at
    ``padded_head_dim`` where ``causal`` (``None``: either) and ``min_kv_len <= kv_len <=
    max_kv_len`` (``None``: no bound on that side) hold. A rule with a condition applies
    only where the caller knows the condition (:func:`registered_default`).

    Raises:
        pydantic.ValidationError: ``min_kv_len > max_kv_len`` (a rule for no length)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    padded_head_dim: int = Field(gt=0, multiple_of=64)
    switches: dict[str, bool | int | float]
    causal: bool | None = None
    max_kv_len: int | None = Field(default=None, gt=0)
    min_kv_len: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _lengths_ordered(self) -> SwitchRule:
        if None not in (self.min_kv_len, self.max_kv_len) and self.min_kv_len > self.max_kv_len:
            raise ValueError(f"min_kv_len {self.min_kv_len} > max_kv_len {self.max_kv_len}: "
                             "the rule would apply to no length")
        return self

    def applies(self, padded_head_dim: int, causal: bool | None, kv_len: int | None) -> bool:
        """Whether this rule names ``padded_head_dim`` and its conditions are known and met."""
        if padded_head_dim != self.padded_head_dim:
            return False
        if self.causal is not None and causal != self.causal:
            return False
        if self.min_kv_len is not None and (kv_len is None or kv_len < self.min_kv_len):
            return False
        return self.max_kv_len is None or (kv_len is not None and kv_len <= self.max_kv_len)


REGISTERED_SWITCHES: tuple[SwitchRule, ...] = (
    SwitchRule(padded_head_dim=64, min_kv_len=16384,
               switches={"rowsum_before_handover": False, "pingpong_across_tiles": True,
                         "bounded_fma_exponent": True}),
    SwitchRule(padded_head_dim=64,
               switches={"rowsum_before_handover": False, "pingpong_across_tiles": True}),
    SwitchRule(padded_head_dim=128, causal=False,
               switches={"rowsum_before_handover": False, "checked_fma_exponent": True}),
    SwitchRule(padded_head_dim=128, causal=True, min_kv_len=16384,
               switches={"rowsum_before_handover": False, "checked_fma_exponent": True}),
    SwitchRule(padded_head_dim=128, min_kv_len=16384,
               switches={"rowsum_before_handover": False, "bounded_fma_exponent": True}),
    SwitchRule(padded_head_dim=128, switches={"rowsum_before_handover": False}),
    SwitchRule(padded_head_dim=256, causal=False, max_kv_len=4096,
               switches={"lazy_rescale_log2": 8.0, "rowsum_before_handover": True,
                         "output_chunks": 2}),
    SwitchRule(padded_head_dim=256, switches={"lazy_rescale_log2": 8.0, "output_chunks": 2}),
)
"""The switches the kernel runs with when no variant is asked for; the first rule that
applies wins, none: every switch off. Only what was measured to pay on the H200 and
passed the `gpu` tests there (``kernels/tools/bench_results/``; NOTES-gpu.md):

* head_dim 256: the lazy rescale (the H200 grid of 2026-12-01, ``fa3-grid``: +4 to +8 %
  on each bf16 grid row; at 128 it changed nothing, at 64 it lost 12 %), and, without a
  causal mask at kv_len <= 4096, the row sum before the hand-over as well (the
  ``d256-switches`` run of 2026-12-01: full S = 4096 B4 1.086 / 1.081 of the lazy rescale
  alone in bf16 / f16, i.e. 1.004 / 0.997 of cuDNN against 0.925 / 0.922, while at
  S = 16384 it lost 4 % and under the causal mask 0-1.4 %; lengths between 4096 and 16384
  were not measured, so the rule stops at the measured one);
* head_dim 64 and 128: the row sum after the hand-over (the same day's ``grid-d64-d128``:
  +1.2 to +3.2 % on 13 of the 16 bf16/f16 rows, -0.7 to -2.6 % on three causal ones,
  every row still ahead of cuDNN; an earlier f16 d128 run had found the same, +0.8 to
  +2.9 % on three of four rows);
* head_dim 256: the output staged through half-width buffers, ``output_chunks`` 2 (the
  ``switches-grid-bf16`` run of 2026-12-02: +0.6 / +3.2 % full S = 16384 / 4096, +1.0 /
  +2.8 % causal, bf16: the query tile is freed after a tile's last ``Q K^T`` instead of
  after the output's store);
* head_dim 64: the ping-pong's phase offset once per kernel, ``pingpong_across_tiles``
  (the same call: +1.1 to +1.5 % on each of the four bf16 rows; at head_dim 128 it lost
  0.7-2.3 %, with the half-width output at 256 0.4-1.6 % on three rows, so it stays off
  there). The new registration beside the one before, one call, bf16 and f16
  (``registered-vs-before``): 0.990-1.025 per row, 15 of 16 rows >= 1.0;
* head_dim 64 and 128 at kv_len >= 16384: one FMA per logit where the call's bound
  allows it, ``bounded_fma_exponent`` (three H100 calls of 2026-12-07 at d128, bf16 and
  f16, one at d64 bf16, ``h100-2026-12-07-bounded-fma``: at S = 16384, full and causal,
  +0.6 to +5.5 % on each of the 15 rows, median +1.9 %; at S = 4096 B4 it lost 1.2 to
  7 % on 13 of 14 rows, the bound's read of Q and K, about 45 µs, being 5-9 % of a 0.5-1
  ms call there and about 1-2.5 % at 16384; lengths between were not measured, so the rule
  starts at the measured one; at head_dim 256 it lost 2.6-13 %, so it stays off there);
  at head_dim 128 it runs from 16384 keys where a tiling cannot hold the next switch's row
  flags, and where the mask is not known;
* head_dim 128 without a causal mask, and causal from 16384 keys: the same FMA checked
  after the blocks instead of bounded before them, ``checked_fma_exponent`` (one H100 call
  of 2026-12-07, ``h100-2026-12-07-checked-fma``, bf16 and f16, beside the registration
  before it: +1.3 / +1.9 % full at S = 4096 B4, +0.3 / +2.9 % full and +3.7 / +4.3 %
  causal at S = 16384, f16 / bf16; causal at S = 4096 it lost 1.5 / 1.0 %, the two small
  launches it adds being a larger share of a 0.5 ms call, so causal calls under 16384
  keys keep the exact form; lengths between were not measured). Its `gpu` extreme-value
  tests at head_dim 128 (``checked-fma-extremes``) passed in the same call. Its row flags
  need 3 KiB of shared memory more than the exact form, which the 3-deep K/V ring of the
  H200's tuned tilings (causal at 16384 keys in both dtypes, f16 full at 4096) and the
  64 x 192 tile do not leave: there the first rule that fits runs
  (``pallas_mosaic_gpu.registered_variant``), the bounded FMA from 16384 keys as before,
  the exact form under it. So with the committed table the causal rule runs on no tuned
  row yet; the H100 call measured it with a 2-deep ring.

The runs are in ``kernels/tools/bench_results/`` and BENCHMARKS.md.

``pallas_mosaic_gpu.registered_variant`` drops what a tiling cannot hold (the half-width
output where it would not fit shared memory, the offset once per kernel where the output
is staged in the query tiles), and the kernel sets the offset per tile in calls with
lengths (a tile they leave empty would deadlock it).

Every poisoned-padding and extreme-magnitude case of ``tests/test_kernels_mosaic_variants.py``
passed on the H200 in bf16 and f16 with each switch by itself (70 passed); the
combination at head_dim 256, kv_len <= 4096 passed the grid's float64 checks there, and its
own `gpu` cases (``lazy-8-rowsum-before`` in ``fa3_variants.json``) passed in a later call.
The two switches registered on 2026-12-02 (``output_chunks``, ``pingpong_across_tiles``)
passed the grid's float64 checks on all 24 rows and the bf16-long rollout; their own
`gpu` cases had not run on a GPU when they were registered (the first attempt failed in the
test before any kernel check); in the interpreter they pass against float64. A change of
this table changes the kernels' source digest (``kernels.build``)."""


def registered_default(padded_head_dim: int, *, causal: bool | None = None,
                       kv_len: int | None = None) -> MosaicVariant:
    """The switches of the kernel as registered at ``padded_head_dim`` for a call with
    ``causal`` and ``kv_len`` (what ``variant=None`` means): the first
    :data:`REGISTERED_SWITCHES` rule that applies, else every switch off
    (:class:`MosaicVariant`'s field defaults). Unknown conditions (``None``) leave the
    conditional rules out."""
    return next(registered_candidates(padded_head_dim, causal=causal, kv_len=kv_len))


def registered_candidates(padded_head_dim: int, *, causal: bool | None = None,
                          kv_len: int | None = None):
    """Every :data:`REGISTERED_SWITCHES` rule that applies, in order, as switches, then
    every switch off: the kernel takes the first one its tiling can hold
    (``pallas_mosaic_gpu.registered_variant``)."""
    for rule in REGISTERED_SWITCHES:
        if rule.applies(padded_head_dim, causal, kv_len):
            yield MosaicVariant(**rule.switches)
    yield MosaicVariant()


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
        pingpong_across_tiles: ``False`` (default): the ping-pong's phase offset is set
            and closed per tile (consumer 1 passes the schedule barrier once before
            each tile's first block, consumer 0 once after its last), so both consumers'
            tiles drain together: consumer 0 waits for consumer 1's last softmax before
            its epilogue, and the tensor core idles through that softmax, both
            epilogues and the next tile's first softmax. ``True``: the offset is set
            once per kernel and closed once at its end, as FlashAttention-3's code
            does (its consumers call ``mma_init``, whose second warpgroup arrives on
            the scheduler barrier, once before the persistent tile loop; ping-pong
            scheduling itself is arXiv:2407.08608, section 3.1), so the alternation
            runs on across tile boundaries: consumer 0
            starts the next tile's ``Q K^T`` while consumer 1 finishes the last softmax.
            Needs the output staged in its own buffers (the query tile freed after a
            tile's last ``Q K^T``): with the output staged in the query tile, the
            producer's next K/V blocks wait for consumer 1's epilogue, which waits for
            consumer 0's next ``Q K^T``, which waits for those blocks (refused by
            ``kernels.pallas_mosaic_gpu``). For the same reason it applies only to
            calls without ``q_lengths``/``kv_lengths``: a tile that lengths leave
            empty would close that cycle through consumer 1's release of the empty
            tile's queries; such calls set the offset per tile.
        output_chunks: ``1`` (default): the output is staged in a buffer of the whole
            head_dim per consumer where it fits shared memory, else in the query tile
            (at head_dim 256: the next tile's queries load only after the output's
            store has read the tile). ``n > 1``: a staging buffer of ``head_dim / n``
            columns per consumer, filled and stored ``n`` times per tile (each fill
            waits for the previous store to have read the buffer), so the query tile
            is freed after the tile's last ``Q K^T`` even where a whole output buffer
            does not fit (head_dim 256: 32 KiB of staging instead of 64).
            ``head_dim / n`` must be a multiple of 64 (:meth:`check_tiling`).
        intra_wg_pipeline: ``False`` (default): each consumer issues ``Q K^T`` of a
            block, waits for it, runs the softmax, then issues and waits for the
            block's ``P V``; the ping-pong passes the two-arrival ``schedule`` barrier
            twice per block. ``True``: FlashAttention-3's intra-warpgroup pipelining
            (arXiv:2407.08608, section 3.2) in its code's order: in one turn on the
            tensor core a consumer issues ``Q K^T`` of block j+1 and then ``P V`` of
            block j, waits for the first alone (``wgmma.wait_group 1``) and runs block
            j+1's softmax while block j's ``P V`` is in flight; the accumulator's
            rescale by block j+1's factor is applied before the next turn. ``P``
            (bf16/f16), not the float32 logits, is carried across steps, so the tiles
            need no more registers than without the pipeline. Turns alternate through
            two one-arrival barriers (consumer w waits ``turn[w]``, then arrives on
            ``turn[1 - w]``; FA3's two named scheduler barriers), carried across tiles
            for the whole kernel; the two consumers' softmaxes may overlap, so the
            lazy rescale's warpgroup-wide skip is not taken (the rescale by 1 of rows
            that did not move is). Only for tilings whose tiles fit the consumer's
            registers (:meth:`check_tiling`).
        bounded_fma_exponent: ``False`` (default): the exponent is ``(s - m) * c``, two
            float32 operations per logit, exact at any magnitude
            (:func:`softmax_block`). ``True``: the call also computes a bound on every
            logit's ``|s * c|`` from the inputs (:func:`fma_exponent_is_safe`: one read of
            Q and K); where it is under ``FMA_EXPONENT_BOUND`` the consumers run
            :func:`softmax_block_fma`, one FMA per logit (the form FlashAttention-3 runs),
            and otherwise the exact form, chosen per tile by that one flag.
        checked_fma_exponent: ``True``: one FMA per logit without reading the inputs
            first: the consumers always run :func:`softmax_block_fma` and write, per
            query row, whether its result could differ from the exact form's
            (:func:`fma_rows_unsafe`: the final running max past
            ``FMA_EXPONENT_BOUND``, or a non-finite row); where any row of the call is
            flagged, a second launch of the kernel with the exact form rewrites the
            whole output in place, and otherwise that launch returns at once. Not with
            ``bounded_fma_exponent`` (two ways to decide the same thing).

    Raises:
        pydantic.ValidationError: a threshold outside (0, 8], a register count that is
            not a multiple of 8 in [24, 256], or budgets over the register file
            (``producer + 2 * consumer > 512``), or both FMA switches on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lazy_rescale_log2: float | None = Field(
        None, gt=0, le=MAX_LAZY_RESCALE_LOG2,
        description="rescale only when the running max grows by more than this (log2)")
    rowsum_before_handover: bool | None = Field(
        None, description="row sum before (True) or after (False) the ping-pong hand-over")
    consumer_registers: int = Field(232, description="setmaxnreg of each consumer")
    producer_registers: int = Field(40, description="setmaxnreg of the producer")
    intra_wg_pipeline: bool = Field(
        False, description="issue Q K^T of block j+1 with P V of block j (FA3 section 3.2)")
    pingpong_across_tiles: bool = Field(
        False, description="set the ping-pong's phase offset once per kernel, not per tile")
    output_chunks: int = Field(
        1, ge=1, le=MAX_OUTPUT_CHUNKS,
        description="stage the output through a buffer of head_dim / n columns, n stores")
    bounded_fma_exponent: bool = Field(
        False, description="one FMA per logit where a bound on |logit * c| allows it")
    checked_fma_exponent: bool = Field(
        False, description="one FMA per logit, checked per row after; exact rerun if flagged")

    @model_validator(mode="after")
    def _registers_fit(self) -> MosaicVariant:
        lo, hi = SETMAXNREG_RANGE
        for name in ("consumer_registers", "producer_registers"):
            value = getattr(self, name)
            if value % 8 or not lo <= value <= hi:
                raise ValueError(f"{name} must be a multiple of 8 in [{lo}, {hi}] "
                                 f"(setmaxnreg), got {value}")
        if self.bounded_fma_exponent and self.checked_fma_exponent:
            raise ValueError("bounded_fma_exponent and checked_fma_exponent both choose "
                             "where the one-FMA exponent runs: set at most one")
        total = self.producer_registers + 2 * self.consumer_registers
        if total > REGISTER_FILE_PER_THREAD_SLOT:
            raise ValueError(
                f"producer_registers + 2 * consumer_registers = {total} exceeds the "
                f"{REGISTER_FILE_PER_THREAD_SLOT} registers per thread slot of an sm_90 "
                f"SM (65536 registers / 128 threads per warpgroup)")
        return self

    def check_tiling(self, block_q: int, block_kv: int, padded_head_dim: int) -> None:
        """Raise ``ValueError`` when this variant cannot run the tiling: ``output_chunks``
        must split ``padded_head_dim`` into chunks of a multiple of
        ``OUTPUT_CHUNK_COLS`` (64) columns; with
        ``intra_wg_pipeline`` the tiles' registers (:func:`tile_registers`) must not
        exceed ``consumer_registers``. The bound is the one the H200
        drew without the pipeline (the first register measurements of the variants):
        224 registers of tiles (head_dim 64, 64 x 256) built without a spill under 232,
        256 (128 x 128) spilled."""
        if padded_head_dim % (self.output_chunks * OUTPUT_CHUNK_COLS):
            raise ValueError(
                f"output_chunks={self.output_chunks}: padded head_dim {padded_head_dim} "
                f"does not split into {self.output_chunks} chunks of a multiple of "
                f"{OUTPUT_CHUNK_COLS} columns (the 128-byte swizzle tile of the output's "
                f"staging buffer and of its TMA store)")
        if not self.intra_wg_pipeline:
            return
        need = tile_registers(block_q, block_kv, padded_head_dim)
        if need > self.consumer_registers:
            raise ValueError(
                f"intra_wg_pipeline: block_q={block_q}, block_kv={block_kv} at padded "
                f"head_dim {padded_head_dim} need {need} registers per consumer thread "
                f"for their tiles (the float32 logits, P, the accumulator), over "
                f"consumer_registers={self.consumer_registers}; use a smaller block_kv")

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


FMA_EXPONENT_BOUND = 2.0 ** 24
"""Largest ``|max(s) * c|`` at which :func:`softmax_block_fma` runs: below ``2**24`` a
float32 holds every integer, so rounding ``max(s) * c`` moves it by at most 1/2, and the
row's largest ``p`` stays within ``[2**-0.5, 2**0.5]`` (a common factor of the row, which
the rescale cancels). Beyond ``2**31`` the rounding reaches 128 and ``p`` overflows or
flushes to zero: the extreme-value failure :func:`softmax_block` removed."""


def fma_exponent_is_safe(q, k, scale: float):
    """Whether every logit of ``q kᵀ * scale`` lies within ``FMA_EXPONENT_BOUND`` in log2
    units: ``head_dim * max|q| * max|k| * |scale| * log2(e) < FMA_EXPONENT_BOUND`` (the
    Cauchy-Schwarz bound of a dot product by its elements' largest magnitudes), in
    float32. An infinity anywhere, or a product past float32, gives ``False`` (the exact
    form then runs). NaN elements are left out of the maxima (``nanmax``): a NaN logit is
    NaN in either form, so they decide nothing; all-NaN inputs give ``False``.

    Args:
      q: ``[..., head_dim]`` queries; k: ``[..., head_dim]`` keys (any float dtype), as
        the caller passes them: keys past a length count too, which can only make the
        bound larger (the exact form runs then).
      scale: the logit scale.

    Returns:
      A scalar bool array (traceable).
    """
    head_dim = q.shape[-1]
    largest = (jnp.nanmax(jnp.abs(q)).astype(jnp.float32)
               * jnp.nanmax(jnp.abs(k)).astype(jnp.float32))
    bound = largest * jnp.float32(head_dim * abs(scale) * _LOG2_E)
    return bound < jnp.float32(FMA_EXPONENT_BOUND)


def softmax_block_fma(m_old, s, scale_log2: float, threshold: float | None, broadcast=None):
    """One K/V block of the online softmax with one FMA per logit, for logits
    :func:`fma_exponent_is_safe` bounds (the kernel's fast form under
    ``bounded_fma_exponent``; FlashAttention-3's form).

    The running max ``M`` is kept in log2 units, rounded: ``M = max(s) * c`` in float32,
    and ``p = exp2(s * c - M)``, which Mosaic GPU's ``contract`` flags fuse into one FMA
    (``s * c`` unrounded). The row's largest logit gets ``exp2(delta)``, ``delta = max(s)
    * c - M``, instead of 1; ``|delta| <= 1/2`` below ``FMA_EXPONENT_BOUND``. That factor is
    common to the row's block, and the rescale ``alpha = exp2(M_old - M_new)`` is computed
    from the same rounded maxima, so the output ``acc / l`` does not see it.

    Args: as :func:`softmax_block`, except that ``m_old`` is the running max in log2
      units (``M``, ``-inf`` before the first block) and ``threshold`` compares log2 units.

    Returns:
      ``(M_new, moved, alpha, p)``, float32, ``M`` in log2 units.
    """
    m_block = jnp.maximum(m_old, s.max(axis=1) * scale_log2)
    m_new, moved = lazy_max(m_old, m_block, threshold)
    alpha = jnp.exp2(m_old - m_new)
    m_wide = m_new[:, None] if broadcast is None else broadcast(m_new, s.shape)
    p = jnp.exp2(s * scale_log2 - m_wide)
    return m_new, moved, alpha, p


def fma_rows_unsafe(m_last, row_sum, acc):
    """Per query row, ``1.0`` where :func:`softmax_block_fma`'s result could differ from
    :func:`softmax_block`'s, else ``0.0`` (float32 ``[rows]``; the consumers' check
    under ``checked_fma_exponent``).

    Why this suffices: every ``p`` of a row is ``exp2(s * c - M_j)`` with the FMA's
    product unrounded, and each rescale is ``exp2(M_old - M_new)``, so whatever the
    rounded maxima ``M_j``, the accumulated terms are ``exp2(s * c - M_last)``: exact up to
    rounding, unless a ``p`` over- or underflowed. A block's largest ``p`` is
    ``exp2(delta)`` with ``|delta|`` at most half an ulp of its ``M_j`` (at most 1 below
    ``2 * FMA_EXPONENT_BOUND``), and the limits are far: ``|delta|`` reaches f16's ``P``
    range only from ``|M_j| >= 2**28``, float32's from about ``2**31``. With ``M_last``
    within the bound:
      * every ``M_j`` within a few hundred of ``M_last`` (the blocks whose terms can
        matter) has ``|M_j| < 2**25``, so ``|delta| <= 1``: nothing over- or underflows;
      * an ``M_j`` far below it has its terms scaled by ``exp2(M_j - M_last)`` later:
        underflow there loses nothing, and an overflow (``inf``, or ``inf * 0`` after
        the rescale) leaves the row non-finite.
    So a row is flagged when its final max is neither ``-inf`` (no key seen, zeros either
    way) nor within the bound (``+inf`` and NaN included), or when its accumulator's row
    sum or its ``l`` is not finite (an overflow; also a row whose inputs make the exact
    form non-finite too, which the rerun then reproduces).

    Args:
      m_last: ``[rows]`` float32 final running max in log2 units (``M``).
      row_sum: ``[rows]`` float32 final row sums (``l``).
      acc: ``[rows, head_dim]`` float32 unnormalised output accumulator.

    Returns:
      ``[rows]`` float32, 1.0 for a flagged row.
    """
    bound = jnp.float32(FMA_EXPONENT_BOUND)
    in_range = jnp.logical_or(m_last == -jnp.inf, jnp.abs(m_last) < bound)
    finite = jnp.logical_and(jnp.abs(acc.sum(axis=1)) < jnp.inf, jnp.abs(row_sum) < jnp.inf)
    return jnp.where(jnp.logical_and(in_range, finite), 0.0, 1.0).astype(jnp.float32)


def lazy_max(m_old, m_block, threshold: float | None, *, scale: float | None = None):
    """The running max after one K/V block, and which rows moved.

    Args:
      m_old: ``[rows]`` float32 running max (``-inf`` before the first block), in the
        units of the logits it is the max of: log2 units when ``scale`` is None, raw-logit
        units (as the kernel keeps it, :func:`softmax_block`) with ``scale`` the factor
        that takes them to log2 units.
      m_block: ``[rows]`` float32 ``max(m_old, max of the block's logits)``, same units.
      threshold: ``None``: always move (``m_new = m_block``, the classic online
        softmax); else move a row only when ``(m_block - m_old) * scale > threshold``
        (the threshold is in log2 units whatever the max's units).
      scale: factor from the max's units to log2 units (``scale * log2(e)`` of the
        logits); ``None`` when they are log2 units already.

    Returns:
      ``(m_new, moved)``: the max the block's ``p = exp2((s - m_new) * scale)`` and the
      rescale ``exp2((m_old - m_new) * scale)`` use (``m_new <= m_block`` and
      ``(m_block - m_new) * scale <= threshold``), and a bool ``[rows]`` of the rows whose
      max moved (their accumulator must be rescaled; the others' factor is exactly 1). A
      row at ``-inf`` always moves to a finite block max.
    """
    if threshold is None:
        return m_block, m_block > m_old
    growth = m_block - m_old
    moved = (growth if scale is None else growth * scale) > threshold
    return jnp.where(moved, m_block, m_old), moved


def softmax_block(m_old, s, scale_log2: float, threshold: float | None, broadcast=None):
    """One K/V block of the kernel's online softmax (the arithmetic
    ``kernels.pallas_mosaic_gpu`` runs, written once so that it can be checked here).

    The running max is kept in raw-logit units and the exponent is
    ``(s - m) * scale_log2``: a subtraction, then a multiplication. Mosaic GPU marks its
    float ops ``contract`` (``fragmented_array.py``: "We allow contractions, to
    potentially take advantage of FMA instructions"), so the former exponent
    ``s * c - m`` with ``m = max(s) * c`` (the scale folded into ``c = scale * log2 e``,
    ``m`` in those units) became one FMA, ``fma(s, c, -round(max(s) * c))``: the row's
    largest logit got the exponent ``max(s) * c - round(max(s) * c)`` instead of 0, up to
    half an ulp of ``max(s) * c``, which reaches 128 from ``|max(s) * c| >= 2**31`` (e.g.
    q = k = 1.3e5 in bf16 at head_dim 64: ``s * c ~ 1.95e11``, an ulp of 16384), so
    ``p = exp2(...)`` was ``inf`` (output NaN) or 0 (output 0, the empty-row rule) for
    one key; float16's ``P`` (at most 65504) broke from ``|max(s) * c| >= 2**28``. Here
    ``s - m`` is exactly 0 for the row's largest logit (``p = 1``) and no multiplication
    feeds an addition, so contraction has nothing to fuse. Cost: one more float32
    operation per logit than the FMA (a subtraction and a multiplication).

    Args:
      m_old: ``[rows]`` float32 running max of the raw logits (``-inf`` before the first
        block).
      s: ``[rows, keys]`` float32 raw logits ``Q K^T`` of the block (masked keys
        ``-inf``).
      scale_log2: ``scale * log2(e)``.
      threshold: the lazy rescale's (:func:`lazy_max`, log2 units) or ``None``.
      broadcast: ``f(row_vector, shape)`` that broadcasts ``[rows]`` along the keys (the
        kernel's ``lax.broadcast_in_dim`` in its register layout); default
        ``row[:, None]``.

    Returns:
      ``(m_new, moved, alpha, p)``: the new running max (raw units), the rows whose max
      moved, the accumulator's and row sum's rescale ``exp2((m_old - m_new) *
      scale_log2)`` and the block's ``p = exp2((s - m_new) * scale_log2)``, float32.
    """
    m_block = jnp.maximum(m_old, s.max(axis=1))
    m_new, moved = lazy_max(m_old, m_block, threshold, scale=scale_log2)
    alpha = jnp.exp2((m_old - m_new) * scale_log2)
    m_wide = m_new[:, None] if broadcast is None else broadcast(m_new, s.shape)
    p = jnp.exp2((s - m_wide) * scale_log2)
    return m_new, moved, alpha, p
