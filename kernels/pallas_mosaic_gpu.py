"""Flash-attention forward for NVIDIA Hopper GPUs, written with Pallas' Mosaic GPU backend.

Algorithm: FlashAttention-3 forward (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024,
arXiv:2407.08608), exact attention with an online softmax (FlashAttention-2, Dao 2023):

- **Warp specialisation.** Each CTA runs three warpgroups (``plgpu.kernel(num_threads=3)``).
  Warpgroup 2 is the *producer*: it lowers its register budget to 40 and issues TMA
  copies (``plgpu.copy_gmem_to_smem``) of the query tiles and of the key/value tiles into
  a ring of ``kv_ring_depth`` shared-memory slots. Warpgroups 0 and 1 are *consumers*
  (232 registers each): each owns ``block_q`` query rows, runs ``wgmma`` for
  ``S = Q Kᵀ`` and ``O += P V`` with float32 accumulators, and keeps the softmax state
  (running max ``m``, running sum ``l``) in registers.
- **Barrier discipline.** Per ring slot, ``k_ready``/``v_ready`` barriers complete when
  the TMA bytes have landed, and ``k_free``/``v_free`` (two arrivals: one per consumer)
  when both consumers are done with the slot; the producer waits ``*_free`` before
  refilling a slot. Per consumer, ``q_ready`` completes when its query tile has landed
  and ``q_free`` is arrived at once per tile, right after its last ``Q Kᵀ``, so the
  producer loads the next tile's queries while the consumer still finishes the current
  one. Mosaic GPU tracks barrier parity per thread, so every waiter waits every phase
  of its barriers exactly once, in order; the block counter ``g`` carried across tiles
  keeps the ring's slot and phase continuous over the persistent loop.
- **Ping-pong.** A two-arrival ``schedule`` barrier orders the two consumers' tensor-core
  work: consumer 1 starts one phase behind, and each consumer passes the barrier once
  after issuing ``Q Kᵀ`` and once at the end of its softmax, so one consumer's softmax
  (exp2, max, sum on the CUDA cores) overlaps the other's ``P V`` and next ``Q Kᵀ``.
  Both consumers iterate over the same key/value blocks of a tile (the pair's bound),
  so their barrier counts always match.
- **Persistent grid.** ``min(#SMs, #tiles)`` CTAs walk the tiles (batch, head, query
  pair of ``2 * block_q`` rows) with ``plgpu.nd_loop``; the key/value ring keeps
  streaming across tile boundaries. Tiles of one head are consecutive (they share K/V
  in L2). With ``causal``, ``kernels.tile_schedule`` gives each CTA a heavy and a light
  query pair of one head in turn (``Q-1-i`` then ``i``), so every CTA does about the
  same causal work (max/mean per-CTA K/V blocks 1.03 instead of 1.57 at B1 H16 S16384).
- **Causal** (top-left): blocks above the diagonal are never loaded; blocks every row
  of a consumer sees run without a mask; the rest apply ``col <= row``. Within a pair,
  consumer 0 also runs the (fully masked, p = 0) block(s) only consumer 1 needs, to keep
  the ping-pong in step (at most ``ceil(block_q / block_kv)`` blocks per tile).
- **Softmax** (``kernels.mosaic_variants.softmax_block``). ``m`` is kept in raw-logit
  units and ``p = exp2((s - m) * c)`` with ``c = scale * log2(e)``: the row's largest
  logit gets exactly ``exp2(0) = 1`` at any magnitude. (The folded form
  ``exp2(s * c - m * c)`` is one FMA under Mosaic GPU's ``contract`` flags, and that
  FMA gave the largest logit an exponent of up to half an ulp of ``m * c``: ``inf`` or 0
  for one key once ``|m * c| >= 2**31``, e.g. q = k = 1.3e5 in bf16 at head_dim 64.)
  ``exp2(-inf) = 0`` with ``approx_math``. Block 0 always contains key 0, which every
  row sees, so ``m`` is finite after the first block and ``-inf - -inf`` never occurs.
  ``P`` is rounded to the input dtype (bf16 or f16) for the second ``wgmma``.
- **Variants** (``kernels.mosaic_variants.MosaicVariant``; off by default except where
  ``mosaic_variants.REGISTERED_SWITCHES`` registers them; ``kernels.tools.variants`` times
  each by itself): a lazy rescale of the
  accumulator (the running max moves only when a block's max exceeds it by more than a
  threshold; the rescale is skipped when no row of the warpgroup moved), the row sum
  before or after the ping-pong hand-over, the consumer/producer register split, and
  intra-warpgroup pipelining (FA3 section 3.2 in its code's order: one turn issues
  ``Q Kᵀ`` of block j+1 and ``P V`` of block j, and block j+1's softmax runs while that
  ``P V`` is in flight; ``P`` is carried across steps; turns pass between the consumers
  through two one-arrival barriers, for the whole kernel), the ping-pong's phase offset
  set once per kernel instead of per tile (FA3's ``mma_init``; registered at head_dim
  64; calls with lengths keep it per tile, since a tile they leave empty would deadlock
  it), the output staged through ``head_dim / n``-column buffers in ``n`` stores
  (registered at 256, where whole output buffers do not fit, so the query tile is freed
  after the last ``Q Kᵀ``), and one FMA per logit where a per-call bound on the logits
  allows it (``bounded_fma_exponent``: ``mosaic_variants.softmax_block_fma``, the exact
  form otherwise; one flag per call chooses each tile's loops; registered at head_dim 64
  and 128 from 16384 keys, where the bound's read of Q and K is a small share of the
  call), or the same FMA checked after the blocks instead of bounded before them
  (``checked_fma_exponent``: each row's final max and finiteness, ``fma_rows_unsafe``,
  written beside the output; a second launch of the exact form rewrites the output in
  place, through a JAX ``Ref``, only where a row was flagged).
- **Contract.** GQA by index mapping (query head ``h`` streams K/V head
  ``h // group``; nothing is repeated). ``kv_lengths``: keys at or past the length are
  masked and the blocks past it never loaded; V rows past it are zeroed before the
  kernel (one pass over V, only when ``kv_lengths`` is given) because ``0 * NaN`` in
  ``P V`` would leak garbage from padding. ``q_lengths``: query pairs past the length are
  skipped and padded rows written as zeros. A row that sees no key (``l = 0``) returns
  zeros. Lengths that are not multiples of the tiles, and head_dim that is not a
  multiple of 64, are zero-padded here and masked (head_dim padding is exact: zero
  columns add nothing to ``Q Kᵀ`` and are sliced off the output), except K and V along
  the sequence on a GPU where :func:`kv_rows` says the TMA may read past their end
  (it fills those rows with zeros; the kernel masks their columns).

Sources. The paper above for the design. From JAX's own example
(``jax/experimental/pallas/ops/gpu/attention_mgpu.py``) I learned the Mosaic GPU API
(``plgpu.kernel`` with a warpgroup axis, ``plgpu.ACC``/``run_state`` for ``wgmma``,
``Layout.WGMMA`` row reductions, the two-arrival schedule barrier, the ``(8, 64)`` tiling
with a 128-byte swizzle); its shared-memory scratch is hard-coded ``float16``, which is
why it fails on bf16 inputs ("src had type bfloat16 and dst had type float16"): here
every buffer takes the input dtype. From tokamax's SM90 kernel
(``tokamax/_src/ops/attention/pallas_mosaic_gpu_kernel_sm90.py``) I took the ideas of a
persistent ``nd_loop`` over (head, query-pair) tiles with a block counter carried across
tiles, a separate output staging buffer so the next query tile can load early, and
key ranges (``k_end``) for padding; tokamax synchronises with named hardware barriers
(inline PTX); this kernel keeps to ``plgpu.Barrier`` (mbarriers) only.

Config (:class:`MosaicConfig`, checked when it is made):
    ``block_q``: query rows per consumer warpgroup (64 or 128; a CTA tile is
    ``2 * block_q`` rows); ``block_kv``: key/value rows per ring slot, a multiple of 64
    of at most 256 (64, 128, 192 or 256); ``kv_ring_depth``: slots of the K/V ring
    (2..4). The warp count is not a setting: always ``NUM_WARPS`` (three warpgroups).
    Shared memory (``smem_bytes``) must fit 227 KiB. Older records name the ring depth
    ``num_stages`` and record ``num_warps`` 12: :class:`MosaicConfig` reads them.

Limits: NVIDIA Hopper (compute capability 9.x: ``wgmma`` and TMA; not Blackwell, whose
MMA is ``tcgen05``); bf16 and f16 only (float32 stays with ``pallas_gpu``); head_dim
<= 256; forward only. The persistent grid size comes from the device's SM count on a
GPU host and defaults to ``DEFAULT_NUM_SMS`` (the H100/H200 SXM's 132) when exporting
from a host without one. JAX's GPU interpret mode (private in 0.10.2:
``jax._src.pallas.mosaic_gpu.interpret``) runs the kernel on a CPU for tests with the
two ``wgmma`` replaced by ``lax.dot_general`` on the shared-memory tiles (its ``wgmma``
takes neither register operands nor transposed refs), so the protocol, indices and
masking are tested without a GPU; the ``wgmma`` path is checked by lowering only.

Kept in one module (over 350 lines) because the producer, the consumers and their
barrier protocol are one kernel whose halves must agree on every count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from pydantic import Field, field_validator

from kernels.config import KernelConfig
from kernels.contract import AttentionSpec
from kernels.gpu_limits import hopper_refusal
from kernels.kernel import Capability, Kernel, round_up
from kernels.mosaic_variants import (
    OUTPUT_CHUNK_COLS,
    MosaicVariant,
    fma_exponent_is_safe,
    fma_rows_unsafe,
    registered_candidates,
    softmax_block,
    softmax_block_fma,
)
from kernels.tile_schedule import tile_schedule

KERNEL_NAME = "kernelgate_flash_fwd_mosaic_gpu"
"""Name of the Mosaic GPU kernel (visible in profiles)."""

SUPPORTED_DTYPES = ("bfloat16", "float16")
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 64
"""head_dim is padded to a multiple of this (a 128-byte swizzled row of bf16/f16)."""
NUM_WARPS = 12
"""Three warpgroups of four warps: one producer, two consumers."""
DEFAULT_NUM_SMS = 132
"""Persistent grid size when no GPU is attached (H100/H200 SXM: 132 SMs)."""
SMEM_LIMIT_BYTES = 227 * 1024
"""Largest dynamic shared memory of one CTA on sm_90."""
BLOCK_Q_CHOICES = (64, 128)
BLOCK_KV_MULTIPLE = 64
"""block_kv is the K dimension of the ``P V`` wgmma: with the 128-byte swizzle it is
consumed in groups of ``swizzle // itemsize`` = 64 bf16/f16 elements (Mosaic GPU's
``wgmma.py``: ``k_group_elems``), so it must be a multiple of 64."""
MAX_BLOCK_KV = 256
"""block_kv is also the N dimension of the ``Q Kᵀ`` wgmma, at most 256."""
BLOCK_KV_CHOICES = tuple(range(BLOCK_KV_MULTIPLE, MAX_BLOCK_KV + 1, BLOCK_KV_MULTIPLE))
"""(64, 128, 192, 256). 192 is FlashAttention-3's head_dim-128 tile (176 keys) rounded
up to the multiple of 64 the ``P V`` wgmma takes."""
STAGE_RANGE = (2, 4)
_GPU_PLATFORMS = ("gpu", "cuda")
_LOG2_E = math.log2(math.e)
TMA_ROW_TILE = 8
"""Rows of one tile of the shared-memory tiling ``(8, 64)``; Mosaic GPU tiles the global
K/V the same way for the TMA descriptor, so an unpadded sequence must be a multiple."""
REDUCTION_SCRATCH_BYTES = 128 * 4 * 4
"""Mosaic GPU's default ``CompilerParams.reduction_scratch_bytes`` (JAX 0.10/0.11): the
shared memory a cross-warp reduction (a row vector to a scalar) is given."""


# ----------------------------------------------------------------------------- config


class MosaicConfig(KernelConfig):
    """pallas_mosaic_gpu's tiling (``None``: the kernel's default for the head_dim).

    Attributes:
        block_q: query rows per consumer warpgroup, one of ``BLOCK_Q_CHOICES`` (a
            ``wgmma`` M-tile is 64 rows per warpgroup; a CTA tile is ``2 * block_q``).
        block_kv: key/value rows per ring slot, one of ``BLOCK_KV_CHOICES``: a multiple of
            ``BLOCK_KV_MULTIPLE`` (64: the ``P V`` wgmma's K groups under the 128-byte
            swizzle) of at most ``MAX_BLOCK_KV`` (256: ``Q Kᵀ``'s wgmma N).
        kv_ring_depth: shared-memory slots of the K/V ring the producer fills, in
            ``STAGE_RANGE`` (a ring needs two slots to overlap).

    Older records hold the shared block-size shape: their ``num_stages`` is the ring
    depth, and their ``num_warps`` is always ``NUM_WARPS`` (the warpgroup layout is
    fixed; any other value is refused).

    Raises (when made):
        ValueError: a value outside those choices (the message names the constraint).
    """

    legacy_names = {"num_stages": "kv_ring_depth"}
    legacy_fixed = {"num_warps": NUM_WARPS}

    block_q: int | None = Field(None, description="query rows per consumer warpgroup")
    block_kv: int | None = Field(None, description="key/value rows per ring slot")
    kv_ring_depth: int | None = Field(None, description="slots of the K/V ring")

    @field_validator("block_q")
    @classmethod
    def _wgmma_m(cls, value: int | None) -> int | None:
        if value is not None and value not in BLOCK_Q_CHOICES:
            raise ValueError(f"pallas_mosaic_gpu: block_q must be one of {BLOCK_Q_CHOICES} "
                             f"(wgmma M-tiles of 64 rows per consumer warpgroup), got {value}")
        return value

    @field_validator("block_kv")
    @classmethod
    def _wgmma_k(cls, value: int | None) -> int | None:
        if value is not None and value not in BLOCK_KV_CHOICES:
            raise ValueError(f"pallas_mosaic_gpu: block_kv must be a multiple of "
                             f"{BLOCK_KV_MULTIPLE} of at most {MAX_BLOCK_KV}, one of "
                             f"{BLOCK_KV_CHOICES} (the P V wgmma's K groups of 64 under the "
                             f"128-byte swizzle, Q K^T's wgmma N <= 256), got {value}")
        return value

    @field_validator("kv_ring_depth")
    @classmethod
    def _ring(cls, value: int | None) -> int | None:
        lo, hi = STAGE_RANGE
        if value is not None and not lo <= value <= hi:
            raise ValueError(f"pallas_mosaic_gpu: kv_ring_depth (the K/V ring depth) must lie "
                             f"in [{lo}, {hi}], got {value}")
        return value


TUNING_GRID = ((64, 256, 2), (64, 128, 2), (64, 128, 3), (64, 64, 2), (64, 64, 3),
               (64, 64, 4), (128, 64, 2), (128, 128, 2))
"""(block_q, block_kv, kv_ring_depth) the autotuner tries beside the default: 64- or
128-row consumer tiles, 64..256-row K/V tiles, ring depth 2..4 (FlashAttention-3 and
tokamax's SM90 sweep bracket these). The 64 x 256 tile comes first, so a spread of a few
tilings always keeps it: on the H200 it beat the tuned tiling by 6-10 % at head_dim 64
without a mask (bf16 and f16, ``kernels.tools.variants``; BENCHMARKS.md), where an even
spread over the grid had left it out of the table's tuning."""


def _smem(config: MosaicConfig, head_dim: int, itemsize: int, staging_cols: int,
          scratch_bytes: int = 0) -> int:
    d = padded_head_dim(head_dim)
    q_and_o = 2 * config.block_q * (d + staging_cols)
    tiles = (q_and_o + 2 * config.kv_ring_depth * config.block_kv * d) * itemsize
    barriers = 8 * (4 + 4 * config.kv_ring_depth + 1)
    return tiles + barriers + scratch_bytes


def fma_check_scratch_bytes(block_q: int) -> int:
    """Shared memory ``checked_fma_exponent`` adds, as Mosaic GPU allocates it: the row
    flags (one float32 per query row of each consumer, staged for their TMA store),
    placed on a 1024-byte boundary, and the cross-warp reduction scratch
    (``REDUCTION_SCRATCH_BYTES``), which Mosaic GPU reserves in every kernel. The base
    count (:func:`smem_bytes`) leaves that reserve out unless the lazy rescale counts it:
    no tiling without those two switches comes within 2 KiB of the limit (checked over
    the tiling space by a test), while the flags' kilobyte is what decides whether the
    3-deep ring fits at head_dim 128 (a test compares both counts with Mosaic GPU's own
    for the tilings where it does)."""
    return round_up(2 * block_q * 4, 1024) + REDUCTION_SCRATCH_BYTES


def variant_scratch_bytes(variant: MosaicVariant | None,
                          block_q: int = max(BLOCK_Q_CHOICES)) -> int:
    """Shared memory a variant adds (bytes): the lazy rescale's warpgroup-wide max
    uses Mosaic GPU's cross-warp reduction scratch (``REDUCTION_SCRATCH_BYTES``; counted
    under the pipeline too, which skips that max), the intra-warpgroup pipeline's
    two turn barriers take 8 bytes each, and the checked FMA exponent stages each
    consumer's row flags (:func:`fma_check_scratch_bytes` at ``block_q``; the largest
    choice when the tiling is not known)."""
    extra = 0
    if variant is not None and variant.lazy_rescale_log2 is not None:
        extra += REDUCTION_SCRATCH_BYTES
    if variant is not None and variant.intra_wg_pipeline:
        extra += 2 * 8
    if variant is not None and variant.checked_fma_exponent:
        extra += fma_check_scratch_bytes(block_q)
        if variant.lazy_rescale_log2 is not None:  # the reserve is counted once
            extra -= REDUCTION_SCRATCH_BYTES
    return extra


def output_staging_cols(config: MosaicConfig, head_dim: int, itemsize: int = 2,
                        scratch_bytes: int = 0, output_chunks: int = 1) -> int:
    """Columns of each consumer's own output staging buffer; 0 when the output is
    staged in the query tile instead.

    ``output_chunks == 1`` (``MosaicVariant``'s default): the whole padded head_dim
    where two such buffers fit shared memory beside the rest, else 0 (e.g. at head_dim
    256: the next tile's queries then load only after the output's store has read the
    query tile). ``output_chunks > 1``: ``head_dim / output_chunks`` columns, stored in
    that many TMA copies per tile (the caller checks that it fits).
    """
    d = padded_head_dim(head_dim)
    if output_chunks > 1:
        return d // output_chunks
    return d if _smem(config, head_dim, itemsize, d, scratch_bytes) <= SMEM_LIMIT_BYTES else 0


def separate_output(config: MosaicConfig, head_dim: int, itemsize: int = 2,
                    scratch_bytes: int = 0, output_chunks: int = 1) -> bool:
    """Whether the output is staged in its own buffers (so the next query tile can load
    while a consumer finishes the current one) or in the query buffers (when the
    separate ones would not fit shared memory, e.g. at head_dim 256 with one chunk);
    :func:`output_staging_cols`."""
    return output_staging_cols(config, head_dim, itemsize, scratch_bytes, output_chunks) > 0


def smem_bytes(config: MosaicConfig, head_dim: int, itemsize: int = 2,
               scratch_bytes: int = 0, output_chunks: int = 1) -> int:
    """Shared memory one CTA allocates for ``config`` (bytes): two query tiles, two
    output staging buffers unless the output must share the query tiles
    (:func:`output_staging_cols`), the K and V rings, and the barriers (8 bytes each).
    ``config`` must be resolved (every field set). ``scratch_bytes``: what a variant
    adds (:func:`variant_scratch_bytes`); ``output_chunks``: the variant's
    (``MosaicVariant.output_chunks``)."""
    return _smem(config, head_dim, itemsize,
                 output_staging_cols(config, head_dim, itemsize, scratch_bytes, output_chunks),
                 scratch_bytes)


def registered_variant(config: MosaicConfig, head_dim: int, itemsize: int = 2, *,
                       causal: bool | None = None, kv_len: int | None = None) -> MosaicVariant:
    """The switches a call without ``variant`` runs: the registered ones
    (:func:`kernels.mosaic_variants.registered_default` at the padded head_dim, mask and
    ``kv_len``) less what ``config`` cannot hold: a rule with ``checked_fma_exponent``
    is passed over for the next one that applies where its row flags would not fit
    shared memory beside the buffers the rule has without them (:func:`_flags_fit`);
    ``output_chunks`` back to 1 where its
    chunks do not split the padded head_dim into whole 64-column tiles or its staging
    buffers would not fit shared memory beside the rest, and
    ``pingpong_across_tiles`` off where the output is then staged in the query tiles
    (the kernel refuses that pair when it is asked for explicitly). ``config`` must be
    resolved (every field set); ``itemsize`` in bytes (2 for bf16/f16)."""
    for variant in registered_candidates(padded_head_dim(head_dim), causal=causal,
                                         kv_len=kv_len):
        if _flags_fit(variant, config, head_dim, itemsize):
            break  # the first registered rule whose row flags (if any) fit
    extra = variant_scratch_bytes(variant, config.block_q)
    if padded_head_dim(head_dim) % (variant.output_chunks * OUTPUT_CHUNK_COLS):
        variant = variant.model_copy(update={"output_chunks": 1})  # chunks must tile it
    if variant.output_chunks > 1 and _smem(
            config, head_dim, itemsize, padded_head_dim(head_dim) // variant.output_chunks,
            extra) > SMEM_LIMIT_BYTES:
        variant = variant.model_copy(update={"output_chunks": 1})
    if variant.pingpong_across_tiles and not output_staging_cols(
            config, head_dim, itemsize, extra, variant.output_chunks):
        variant = variant.model_copy(update={"pingpong_across_tiles": False})
    return variant


def _flags_fit(variant: MosaicVariant, config: MosaicConfig, head_dim: int,
               itemsize: int) -> bool:
    """Whether ``variant``'s row flags (``checked_fma_exponent``; True without it) fit
    shared memory with ``config`` and leave the output staged as without them: a rule
    measured with its own output buffers must not run with the output in the query tiles
    (a layout nobody measured with the flags)."""
    if not variant.checked_fma_exponent:
        return True
    plain = variant.model_copy(update={"checked_fma_exponent": False})
    with_flags = variant_scratch_bytes(variant, config.block_q)
    without = variant_scratch_bytes(plain, config.block_q)
    chunks = variant.output_chunks
    return (smem_bytes(config, head_dim, itemsize, with_flags, chunks) <= SMEM_LIMIT_BYTES
            and output_staging_cols(config, head_dim, itemsize, with_flags, chunks)
            == output_staging_cols(config, head_dim, itemsize, without, chunks))


def padded_head_dim(head_dim: int) -> int:
    """head_dim as the kernel lays it out: the smallest multiple of ``HEAD_DIM_MULTIPLE``
    (64 elements, one 128-byte swizzled bf16/f16 row) not below ``head_dim`` (96 -> 128);
    the tiling, the shared-memory budget and the registered variant are chosen by it.
    Head_dims over ``MAX_HEAD_DIM`` are padded too (the kernel's ``check_supported``
    refuses them).

    Raises:
        ValueError: ``head_dim`` below 1.
    """
    if head_dim < 1:
        raise ValueError(f"pallas_mosaic_gpu: head_dim must be at least 1, got {head_dim}")
    return round_up(head_dim, HEAD_DIM_MULTIPLE)


def kv_rows(kv_len: int, head_dim: int, block_kv: int, *, interpret: bool,
            has_kv_lengths: bool) -> int:
    """Rows K and V have along the sequence when the kernel reads them: ``kv_len`` (left
    as they are) or ``round_up(kv_len, block_kv)`` (zero-padded here, one copy of each).

    The rule, in one place. The last K/V block may end past ``kv_len``; its columns at or
    past the end are masked in the softmax (``p = 0``), and its V rows must be finite so
    that ``0 * v`` stays 0. On a GPU the producer's TMA load of that block may run past
    the end of an unpadded K/V: Mosaic GPU skips the bounds check for TMA copies
    (``launch_context.py``: "TMA supports OOB indices"), the hardware fills rows out of
    bounds with zeros, and the ``k_ready``/``v_ready`` barriers still expect the full
    block's bytes (``copy_gmem_to_smem`` arrives with the destination's size; the TMA
    counts the zero-filled bytes too). That saves the pad's copy of K and V (estimated,
    not measured: about 7 % of the kernel's time at S = 4096 with 192-key blocks, two
    extra passes over K and V). K and V are still padded where:

    - ``interpret``: JAX's GPU interpreter (0.10.2) raises ``IndexError`` on an
      out-of-bounds read by default, in the producer's thread, and the consumers then
      wait forever on the block's barrier. Told to read such rows as zeros
      (``out_of_bounds_reads="uninitialized"``, ``uninitialized_memory="zero"``) it
      does what the TMA does (``test_unpadded_kv_in_the_interpreter_with_the_tmas_zero_fill``),
      but that also zeroes its NaN-filled fresh shared memory, which the other tests
      rely on, so the interpreter gets padded operands;
    - head_dim is not a multiple of ``HEAD_DIM_MULTIPLE``: K and V are copied for the
      head_dim pad anyway, and the sequence pad rides along in that copy;
    - ``has_kv_lengths``: V is rewritten (zeroed past the lengths) before the kernel
      anyway, and these calls keep the operands the `gpu` tests ran them with;
    - ``kv_len`` is not a multiple of ``TMA_ROW_TILE`` (Mosaic GPU refuses to tile such a
      global ref), or shorter than one block (a TMA box longer than the whole sequence
      was never run).

    Where ``kv_len`` is a multiple of ``block_kv`` both are the same: nothing is padded.

    Args:
      kv_len: keys per example (rows of K and V as given).
      head_dim: as given (before :func:`padded_head_dim`).
      block_kv: key rows per ring slot (the resolved tiling's).
      interpret: the call runs in JAX's GPU interpret mode.
      has_kv_lengths: the call passes ``kv_lengths``.
    """
    padded = round_up(kv_len, block_kv)
    unpadded_ok = (not interpret and not has_kv_lengths
                   and head_dim == padded_head_dim(head_dim)
                   and kv_len % TMA_ROW_TILE == 0 and kv_len >= block_kv)
    return kv_len if unpadded_ok else padded


# ----------------------------------------------------------------------------- the kernel


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static facts of one launch (sizes in elements)."""

    batch: int
    num_heads: int
    group: int
    q_len: int
    kv_len: int
    q_pad: int
    kv_pad: int  # rows of K and V as the kernel gets them (kv_rows: kv_len or padded)
    head_dim: int  # padded
    block_q: int
    block_kv: int
    stages: int
    causal: bool
    qk_scale_log2: float
    has_q_lengths: bool
    has_kv_lengths: bool
    num_ctas: int
    dtype: Any
    interpret: bool
    output_cols: int  # columns of each consumer's output staging buffer; 0: the query tile
    variant: MosaicVariant = MosaicVariant()
    guarded: bool = False  # the exact rerun: runs only where its flag operand is nonzero

    @property
    def checks_fma(self) -> bool:
        """The launch runs the FMA form throughout and writes each row's check."""
        return self.variant.checked_fma_exponent

    @property
    def separate_output(self) -> bool:
        return self.output_cols > 0

    @property
    def num_q_pairs(self) -> int:
        return self.q_pad // (2 * self.block_q)


def _min(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else jnp.minimum(a, b)


def _max(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else jnp.maximum(a, b)


def _loop(lo, hi, body, state):
    """``lax.fori_loop(lo, hi, body, state)``, skipped when the range is statically
    empty (a traced empty range, ``lo >= hi``, runs no step)."""
    if isinstance(lo, int) and isinstance(hi, int) and lo >= hi:
        return state
    return lax.fori_loop(lo, hi, body, state)


def _div(a, d: int):
    return a // d if isinstance(a, int) else lax.div(a, jnp.int32(d))


def _cdiv(a, d: int):
    return _div(a + d - 1, d)


class _Ops:
    """The few operations that differ between the native kernel and its CPU interpretation:
    the two matrix products (``wgmma`` natively; ``lax.dot_general`` on the shared-memory
    tiles in JAX's GPU interpreter, whose ``wgmma`` accepts neither register operands nor
    transposed refs) and layout annotations (which the interpreter has no rule for)."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        import jax.experimental.pallas as pl
        import jax.experimental.pallas.mosaic_gpu as plgpu

        self.pl, self.plgpu = pl, plgpu

    def layout(self, x, layout):
        return x if self.interpret else self.plgpu.layout_cast(x, layout)

    def iota(self, shape, dim):
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return self.plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.plgpu.Layout.WGMMA)

    def qk(self, q_tile, k_tile, block_kv: int, after_issue):
        """``q_tile @ k_tileᵀ`` in float32; ``after_issue()`` runs while it is in flight."""
        if self.interpret:
            after_issue()
            return lax.dot_general(q_tile[...], k_tile[...], (((1,), (1,)), ((), ())),
                                   preferred_element_type=jnp.float32)
        plgpu, pl = self.plgpu, self.pl

        def body(acc_ref):
            plgpu.wgmma(acc_ref, q_tile, plgpu.transpose_ref(k_tile, (1, 0)))
            after_issue()
            return acc_ref[...]

        return pl.run_scoped(body, plgpu.ACC((q_tile.shape[0], block_kv), jnp.float32))

    def qk_and_pv(self, q_tile, k_tile, acc, p, v_tile, block_kv: int, *, after_issue,
                  during, during_init):
        """Issue ``S = q_tile @ k_tileᵀ`` and then ``acc + p @ v_tile`` (float32), run
        ``after_issue()``, wait for ``S`` alone (``wgmma.wait_group 1``: the groups
        complete in issue order, so the ``P V`` stays in flight), run ``during(S)``, then
        wait for the ``P V``. Returns ``(acc + p @ v_tile, during(S))``; ``during``
        returns arrays shaped, typed and laid out like ``during_init`` (they leave the
        accumulators' scope as the final values of state refs initialised with it)."""
        if self.interpret:
            s = lax.dot_general(q_tile[...], k_tile[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
            after_issue()
            out = during(s)
            return acc + lax.dot_general(p, v_tile[...], (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32), out
        plgpu, pl = self.plgpu, self.pl
        s0 = self.layout(jnp.zeros((q_tile.shape[0], block_kv), jnp.float32),
                         plgpu.Layout.WGMMA)

        def body(refs):
            o_ref, s_ref, *out_refs = refs
            plgpu.wgmma(s_ref, q_tile, plgpu.transpose_ref(k_tile, (1, 0)))
            plgpu.wgmma(o_ref, p, v_tile)
            after_issue()
            s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            for ref, value in zip(out_refs, during(s), strict=True):
                ref[...] = value

        acc, _, *out = pl.run_state(body)((plgpu.ACC.init(acc), plgpu.ACC.init(s0),
                                           *during_init))
        return acc, tuple(out)

    def pv(self, acc, p, v_tile, after_issue):
        """``acc + p @ v_tile`` in float32; ``after_issue()`` runs while it is in flight."""
        if self.interpret:
            after_issue()
            return acc + lax.dot_general(p, v_tile[...], (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)
        plgpu, pl = self.plgpu, self.pl

        def body(acc_ref):
            plgpu.wgmma(acc_ref, p, v_tile)
            after_issue()

        return pl.run_state(body)(plgpu.ACC.init(acc))


def _tile_coords(plan: _Plan, index):
    """(batch, head, query pair) of an ``nd_loop`` step (:func:`tile_schedule`)."""
    (step,) = index
    bh, qi = tile_schedule(step, batch_heads=plan.batch * plan.num_heads,
                           num_q_pairs=plan.num_q_pairs, num_ctas=plan.num_ctas,
                           causal=plan.causal)
    return lax.div(bh, jnp.int32(plan.num_heads)), lax.rem(bh, jnp.int32(plan.num_heads)), qi


def _tile_bounds(plan: _Plan, b, qi, q_len_ref, kv_len_ref):
    """``(pair_row0, kv_end, q_end, ub)`` of one tile, computed identically by every
    warpgroup: the pair's first query row, the end of its example's keys and of its
    query rows, and the number of K/V blocks the pair streams (0 for a pair wholly past
    ``q_lengths``). Python ints where everything is static, int32 scalars otherwise."""
    pair_row0 = qi * (2 * plan.block_q)
    kv_end = jnp.minimum(kv_len_ref[b], plan.kv_len) if plan.has_kv_lengths else plan.kv_len
    q_end = jnp.minimum(q_len_ref[b], plan.q_len) if plan.has_q_lengths else plan.q_len
    limit = kv_end
    if plan.causal:
        # Rows at or past q_end are written as zeros, so their keys need not be read.
        limit = _min(limit, _min(pair_row0 + 2 * plan.block_q, q_end))
    ub = _cdiv(limit, plan.block_kv)
    if plan.has_q_lengths:
        ub = jnp.where(pair_row0 < q_end, ub, 0)
    return pair_row0, kv_end, q_end, ub


def _build_kernel(plan: _Plan):
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    ops = _Ops(plan.interpret)
    block_q, block_kv, stages, d = plan.block_q, plan.block_kv, plan.stages, plan.head_dim
    c = plan.qk_scale_log2
    lazy = plan.variant.lazy_rescale_log2
    rowsum_early = plan.variant.rowsum_early(d)
    pipelined = plan.variant.intra_wg_pipeline
    # Across tiles only where no tile can be empty (ub = 0 needs lengths): a consumer 0
    # that skips an empty tile reaches its next Q K^T only after the producer has
    # loaded that tile's K/V, which follows consumer 1's release of the empty tile's
    # queries, which follows consumer 1's last hand-over of the tile before it, which
    # waits for that Q K^T: a cycle. With lengths the offset is set per tile.
    across_tiles = (plan.variant.pingpong_across_tiles
                    and not (plan.has_q_lengths or plan.has_kv_lengths))
    o_cols = plan.output_cols or d  # staged in the query tile: the whole head_dim
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    loop_grid = (plan.batch * plan.num_heads * plan.num_q_pairs,)

    def kernel(*refs, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free,
               v_free, schedule, o_smem=None, turn=None, flag_smem=None):
        refs = list(refs)
        q_len_ref = refs.pop(0) if plan.has_q_lengths else None
        kv_len_ref = refs.pop(0) if plan.has_kv_lengths else None
        fma_ref = refs.pop(0) if plan.variant.bounded_fma_exponent else None
        redo_ref = refs.pop(0) if plan.guarded else None
        flags_ref = refs.pop() if plan.checks_fma else None
        q_ref, k_ref, v_ref, o_ref = refs
        wg = lax.axis_index("wg")

        def schedule_sync():
            plgpu.barrier_arrive(schedule)
            plgpu.barrier_wait(schedule)

        def slot_of(step):
            return lax.rem(step, jnp.int32(stages))

        # ------------------------------------------------------------------ consumers
        def consumer():
            plgpu.set_max_registers(plan.variant.consumer_registers, action="increase")
            q_tile = q_smem.at[wg]
            o_tile = o_smem.at[wg] if plan.separate_output else q_tile
            early_q_free = plan.separate_output
            if pipelined:  # consumer 0 takes the first turn (FA3's mma_init)
                pl.when(wg == 1)(lambda: plgpu.barrier_arrive(turn.at[0]))
            elif across_tiles:  # FA3's mma_init: the phase offset once per kernel
                pl.when(wg == 1)(schedule_sync)

            @plgpu.nd_loop(loop_grid, collective_axes="sm", init_carry=jnp.int32(0))
            def tile(info, carry):
                g0 = carry
                b, h, qi = _tile_coords(plan, info.index)
                pair_row0, kv_end, q_end, ub = _tile_bounds(plan, b, qi, q_len_ref, kv_len_ref)
                row0 = pair_row0 + wg * block_q
                # Blocks [0, n_full) are visible to every row of this warpgroup.
                n_full = _div(kv_end, block_kv)
                if plan.causal:
                    n_full = _min(n_full, _div(row0 + 1, block_kv))
                n_full = _min(n_full, ub)

                plgpu.barrier_wait(q_ready.at[wg])

                if early_q_free:
                    @pl.when(ub == 0)
                    def _():  # nothing to stream: the query tile is free at once
                        plgpu.barrier_arrive(q_free.at[wg])

                @pl.when(ub > 0)
                def _():
                    plgpu.barrier_wait(k_ready.at[slot_of(g0)])

                if not (across_tiles or pipelined):
                    pl.when(wg == 1)(schedule_sync)  # consumer 1 runs one phase behind

                def mask(ki, s):
                    """Block ``ki``'s logits with the keys past ``kv_end`` (and, causal,
                    above the diagonal) at ``-inf``."""
                    cols = ki * block_kv + ops.iota((block_q, block_kv), 1)
                    visible = cols < kv_end
                    if plan.causal:
                        rows = row0 + ops.iota((block_q, block_kv), 0)
                        visible = jnp.logical_and(visible, cols <= rows)
                    return jnp.where(visible, s, -jnp.inf)

                def exponent(m_i, s, fma):
                    """``softmax_block``: m in raw-logit units, p = exp2((s - m) * c), no
                    multiplication feeding a subtraction that Mosaic GPU's `contract`
                    flags would fuse into an FMA (softmax_block says what that FMA broke);
                    with ``fma`` (the call's bound allows it) ``softmax_block_fma``."""
                    return (softmax_block_fma if fma else softmax_block)(
                        m_i, s, c, lazy,
                        lambda row, shape: lax.broadcast_in_dim(row, shape, [0]))

                def softmax(ki, s, acc, m_i, l_i, *, masked, fma):
                    """The online softmax of block ``ki`` on its logits ``s`` (this
                    consumer's phase between the schedule barrier's two passes)."""
                    s = mask(ki, s) if masked else s
                    m_new, moved, alpha, p = exponent(m_i, s, fma)
                    if lazy is None:
                        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                    else:
                        # Rows that did not move have alpha == 1: skip the whole
                        # rescale when no row of this warpgroup moved. The max over the
                        # rows is a cross-warp reduction through Mosaic GPU's one
                        # reduction scratch in shared memory, shared by both consumers:
                        # safe because it runs inside this consumer's softmax phase,
                        # which the ping-pong schedule barrier makes exclusive (the
                        # other consumer's softmax ends with its arrival on `schedule`
                        # before this phase opens, and this one's ends before that
                        # consumer's next phase can open).
                        any_moved = jnp.max(jnp.where(moved, 1.0, 0.0)) > 0.0
                        acc = lax.cond(
                            any_moved,
                            lambda a: a * lax.broadcast_in_dim(alpha, a.shape, [0]),
                            lambda a: a, acc)
                    l_i = l_i * alpha
                    p_lo = p.astype(plan.dtype)
                    if rowsum_early:
                        # Finish the row sums and rescaling before the hand-over, so this
                        # consumer's next turn on the tensor core starts right away (the
                        # order JAX's example found fastest for head_dim <= 128).
                        l_i = l_i + p.sum(axis=1)
                        acc, l_i, m_new, p_lo = lax.optimization_barrier((acc, l_i, m_new, p_lo))
                    return acc, m_new, l_i, p, p_lo

                def handover(slot, l_i, p):
                    """End this consumer's softmax phase and wait for its turn on the
                    tensor core (and for the block's V)."""
                    plgpu.barrier_arrive(schedule)  # softmax done
                    plgpu.barrier_wait(v_ready.at[slot])
                    plgpu.barrier_wait(schedule)  # the other consumer has issued its Q K^T
                    if not rowsum_early:
                        l_i = l_i + p.sum(axis=1)
                    return l_i

                def qk_done(ki, slot):
                    """Q K^T of block ``ki`` (in K ring ``slot``) has completed: free the
                    slot (and, after the tile's last one, the query tile)."""
                    if early_q_free:
                        @pl.when(ki == ub - 1)
                        def _():  # last Q K^T of this tile done: the producer may reload Q
                            plgpu.barrier_arrive(q_free.at[wg])

                    plgpu.barrier_arrive(k_free.at[slot])

                def kv_step(ki, state, *, masked, fma):
                    acc, m_i, l_i = state
                    step = g0 + ki
                    slot = slot_of(step)
                    s = ops.qk(q_tile, k_smem.at[slot], block_kv, schedule_sync)
                    qk_done(ki, slot)
                    acc, m_new, l_i, p, p_lo = softmax(ki, s, acc, m_i, l_i, masked=masked,
                                                       fma=fma)
                    l_i = handover(slot, l_i, p)

                    def prefetch_wait():
                        @pl.when(ki + 1 < ub)
                        def _():
                            plgpu.barrier_wait(k_ready.at[slot_of(step + 1)])

                    acc = ops.pv(acc, p_lo, v_smem.at[slot], prefetch_wait)
                    plgpu.barrier_arrive(v_free.at[slot])
                    return acc, m_new, l_i


                def turn_wait():
                    plgpu.barrier_wait(turn.at[wg])

                def turn_pass():
                    plgpu.barrier_arrive(turn.at[1 - wg])

                def block_softmax(ki, s, m_i, l_i, *, masked, fma):
                    """The pipelined order's softmax of block ``ki`` (its ``P V`` comes
                    one step later): ``(m, l, alpha, p)``, the accumulator's rescale
                    ``alpha`` left for the step that issues this block's ``P V``. No
                    warpgroup-wide reduction: both consumers' softmaxes may overlap here,
                    and Mosaic GPU's reduction scratch is shared."""
                    s = mask(ki, s) if masked else s
                    m_new, _, alpha, p = exponent(m_i, s, fma)
                    return m_new, l_i * alpha + p.sum(axis=1), alpha, p

                def first_block(ki, state, *, masked, fma):
                    """Block 0 (ub >= 1): its ``Q K^T`` alone in this consumer's first
                    turn of the tile, then its softmax."""
                    acc, m_i, l_i, _, p_lo = state
                    slot = slot_of(g0)
                    turn_wait()
                    s = ops.qk(q_tile, k_smem.at[slot], block_kv, turn_pass)
                    qk_done(ki, slot)
                    m_i, l_i, alpha, p = block_softmax(ki, s, m_i, l_i, masked=masked, fma=fma)
                    return acc, m_i, l_i, alpha, p.astype(plan.dtype)

                def overlapped_step(ki, state, *, masked, fma, s_init):
                    """Blocks ki + 1 and ki (FA3 section 3.2, its code's order): in one turn
                    issue ``Q K^T`` of block ki + 1, then ``P V`` of block ki; the softmax of
                    block ki + 1 runs while that ``P V`` (and the other consumer's turn)
                    occupies the tensor core. ``masked`` is block ki + 1's."""
                    acc, m_i, l_i, alpha, p_lo = state
                    step = g0 + ki
                    slot, next_slot = slot_of(step), slot_of(step + 1)
                    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                    plgpu.barrier_wait(k_ready.at[next_slot])
                    plgpu.barrier_wait(v_ready.at[slot])
                    turn_wait()

                    def during(s):
                        qk_done(ki + 1, next_slot)
                        return block_softmax(ki + 1, s, m_i, l_i, masked=masked, fma=fma)

                    acc, (m_i, l_i, alpha, p) = ops.qk_and_pv(
                        q_tile, k_smem.at[next_slot], acc, p_lo, v_smem.at[slot], block_kv,
                        after_issue=turn_pass, during=during,
                        during_init=(m_i, l_i, alpha, s_init))
                    plgpu.barrier_arrive(v_free.at[slot])
                    return acc, m_i, l_i, alpha, p.astype(plan.dtype)

                def last_pv(ki, state):
                    """Block ub - 1's ``P V`` alone, in this consumer's last turn of the
                    tile."""
                    acc, m_i, l_i, alpha, p_lo = state
                    slot = slot_of(g0 + ki)
                    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                    plgpu.barrier_wait(v_ready.at[slot])
                    turn_wait()
                    acc = ops.pv(acc, p_lo, v_smem.at[slot], turn_pass)
                    plgpu.barrier_arrive(v_free.at[slot])
                    return acc, m_i, l_i, alpha, p_lo

                def split(lo, hi, cut, body, state, **kw):
                    """``body`` over [lo, hi): unmasked below ``cut``, masked from it."""
                    state = _loop(lo, _min(hi, cut),
                                  functools.partial(body, masked=False, **kw), state)
                    return _loop(_max(lo, cut), hi, functools.partial(body, masked=True, **kw),
                                 state)

                def blocks(state, *, fma):
                    """Every K/V block of the tile; ``(acc, m, l)`` at the end."""
                    if not pipelined:
                        state = lax.fori_loop(
                            0, n_full, functools.partial(kv_step, masked=False, fma=fma), state)
                        static_done = (isinstance(n_full, int) and isinstance(ub, int)
                                       and n_full == ub)
                        if not static_done:
                            state = lax.fori_loop(
                                n_full, ub, functools.partial(kv_step, masked=True, fma=fma),
                                state)
                        return state
                    # Turns per tile: block 0's Q K^T, then ub - 1 overlapped steps, then
                    # block ub - 1's P V; none when ub = 0 (both consumers alike). Step ki
                    # softmaxes block ki + 1, so its unmasked steps end at n_full - 1.
                    ones = ops.layout(jnp.ones((block_q,), jnp.float32), row_layout)
                    s_init = ops.layout(jnp.zeros((block_q, block_kv), jnp.float32),
                                        plgpu.Layout.WGMMA)
                    state = (*state, ones, s_init.astype(plan.dtype))
                    state = split(0, _min(ub, 1), n_full, first_block, state, fma=fma)
                    state = split(0, _max(ub - 1, 0), n_full - 1,
                                  functools.partial(overlapped_step, s_init=s_init), state,
                                  fma=fma)
                    state = _loop(_max(ub - 1, 0), ub, last_pv, state)
                    acc, m_i, l_i, _, _ = state
                    return acc, m_i, l_i

                state = (ops.layout(jnp.zeros((block_q, d), jnp.float32), plgpu.Layout.WGMMA),
                         ops.layout(jnp.full((block_q,), -jnp.inf, jnp.float32), row_layout),
                         ops.layout(jnp.zeros((block_q,), jnp.float32), row_layout))
                if plan.variant.bounded_fma_exponent:
                    # One flag for the call (the inputs' bound), the same in every tile.
                    def acc_and_l(state, fma):  # the running max stays inside the cond
                        acc, _, l_i = blocks(state, fma=fma)
                        return acc, l_i

                    acc, l_i = lax.cond(fma_ref[0] != 0,
                                        functools.partial(acc_and_l, fma=True),
                                        functools.partial(acc_and_l, fma=False), state)
                else:  # checked: the FMA form throughout, each row's check stored below
                    acc, m_i, l_i = blocks(state, fma=plan.checks_fma)
                if not (across_tiles or pipelined):
                    pl.when(wg == 0)(schedule_sync)  # closes consumer 1's last phase

                inv_l = jnp.where(l_i > 0.0, 1.0 / jnp.where(l_i > 0.0, l_i, 1.0), 0.0)
                out = acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])
                if plan.has_q_lengths:
                    rows = row0 + ops.iota((block_q, d), 0)
                    out = jnp.where(rows < q_end, out, 0.0)
                rows_out = pl.ds(row0, block_q)
                if plan.checks_fma:  # before the output: its waits then cover this store
                    unsafe = fma_rows_unsafe(m_i, l_i, acc)
                    if plan.has_q_lengths:  # padding rows are written as zeros either way
                        unsafe = unsafe * jnp.max(jnp.where(rows < q_end, 1.0, 0.0), axis=1)
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # previous tile's
                    flag_smem.at[wg][...] = unsafe
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(flag_smem.at[wg], flags_ref.at[b, h, rows_out])
                if o_cols == d:  # one store of the whole tile
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # previous tile's store
                    o_tile[...] = out.astype(plan.dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(o_tile, o_ref.at[b, rows_out, h])
                else:  # output_chunks: each fill waits for the previous store's read
                    for j in range(d // o_cols):
                        cols = slice(j * o_cols, (j + 1) * o_cols)
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                        o_tile[...] = out[:, cols].astype(plan.dtype)
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(
                            o_tile, o_ref.at[b, rows_out, h, pl.ds(cols.start, o_cols)])
                if not early_q_free:  # the output was staged in the query tile
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    plgpu.barrier_arrive(q_free.at[wg])
                return g0 + ub

            if pipelined:  # consumer 1's last turn passed: every phase is observed
                pl.when(wg == 0)(lambda: plgpu.barrier_wait(turn.at[0]))
            elif across_tiles:  # closes consumer 1's last phase of the kernel
                pl.when(wg == 0)(schedule_sync)
            plgpu.wait_smem_to_gmem(0)

        # ------------------------------------------------------------------ producer
        def producer():
            plgpu.set_max_registers(plan.variant.producer_registers, action="decrease")

            @plgpu.nd_loop(loop_grid, collective_axes="sm",
                           init_carry=(jnp.int32(0), jnp.int32(0)))
            def tiles(info, carry):
                g0, tiles_done = carry
                b, h, qi = _tile_coords(plan, info.index)
                pair_row0, _, _, ub = _tile_bounds(plan, b, qi, q_len_ref, kv_len_ref)
                for w in range(2):
                    # Consumer w has finished reading its previous query tile.
                    pl.when(info.local_index > 0)(
                        functools.partial(plgpu.barrier_wait, q_free.at[w]))
                    plgpu.copy_gmem_to_smem(
                        q_ref.at[b, pl.ds(pair_row0 + w * block_q, block_q), h],
                        q_smem.at[w], q_ready.at[w])
                kv_head = lax.div(h, jnp.int32(plan.group))

                @pl.loop(0, ub)
                def _(ki):
                    step = g0 + ki
                    slot = slot_of(step)
                    rows = pl.ds(ki * block_kv, block_kv)
                    for src, dst, ready, free in ((k_ref, k_smem, k_ready, k_free),
                                                  (v_ref, v_smem, v_ready, v_free)):
                        # Both consumers are done with this slot's previous tenant.
                        pl.when(step >= stages)(
                            functools.partial(plgpu.barrier_wait, free.at[slot]))
                        plgpu.copy_gmem_to_smem(src.at[b, rows, kv_head], dst.at[slot],
                                                ready.at[slot])

                return g0 + ub, tiles_done + 1

            # Drain: observe the phases no refill waited for (the last tenant of each
            # slot, the last query tiles), so every barrier ends with all phases seen.
            total, tiles_done = tiles

            @pl.loop(jnp.maximum(total - stages, 0), total)
            def _(step):
                plgpu.barrier_wait(k_free.at[slot_of(step)])
                plgpu.barrier_wait(v_free.at[slot_of(step)])

            @pl.when(tiles_done > 0)
            def _():
                for w in range(2):
                    plgpu.barrier_wait(q_free.at[w])

        def warpgroups():
            pl.when(wg < 2)(consumer)
            pl.when(wg == 2)(producer)

        if plan.guarded:  # the exact rerun: nothing to do unless a row was flagged
            pl.when(redo_ref[0] != 0)(warpgroups)
        else:
            warpgroups()

    return kernel


def _scratch(plan: _Plan) -> dict[str, Any]:
    import jax.experimental.pallas.mosaic_gpu as plgpu

    swizzle = 128  # bytes: one 64-element row of bf16/f16
    transforms = (plgpu.TilingTransform((8, swizzle // jnp.dtype(plan.dtype).itemsize)),
                  plgpu.SwizzleTransform(swizzle))

    def tiles(n, rows, cols=plan.head_dim):
        return plgpu.SMEM((n, rows, cols), plan.dtype, transforms=transforms)

    scratch = dict(
        q_smem=tiles(2, plan.block_q),
        k_smem=tiles(plan.stages, plan.block_kv),
        v_smem=tiles(plan.stages, plan.block_kv),
        q_ready=plgpu.Barrier(num_barriers=2),
        q_free=plgpu.Barrier(num_barriers=2),
        k_ready=plgpu.Barrier(num_barriers=plan.stages),
        v_ready=plgpu.Barrier(num_barriers=plan.stages),
        k_free=plgpu.Barrier(num_arrivals=2, num_barriers=plan.stages),
        v_free=plgpu.Barrier(num_arrivals=2, num_barriers=plan.stages),
        schedule=plgpu.Barrier(num_arrivals=2),
    )
    if plan.variant.intra_wg_pipeline:
        # Its ping-pong: consumer w waits turn[w] before issuing its wgmma, then arrives
        # on turn[1 - w] (FA3's two named scheduler barriers, as mbarriers).
        scratch["turn"] = plgpu.Barrier(num_barriers=2)
    if plan.separate_output:
        scratch["o_smem"] = tiles(2, plan.block_q, plan.output_cols)
    if plan.checks_fma:
        scratch["flag_smem"] = plgpu.SMEM((2, plan.block_q), jnp.float32)
    return scratch


def _rerun_in_place(plan: _Plan, out, operands, mesh: dict, params, interpret):
    """The exact form's launch under ``checked_fma_exponent``: ``out`` becomes a JAX
    ``Ref`` that the kernel reads and writes (Pallas lowers it to an output-operand alias,
    so XLA can hand the first launch's buffer over instead of copying it), and the
    kernel's CTAs return at once unless the flag operand (``operands[-4]``) is set.
    ``plgpu.kernel`` wraps its body in ``custom_vmap``, which takes no ``Ref``, so this
    calls ``pl.kernel`` with the same mesh and scoped scratch. On a GPU the ``Ref`` lives
    inside ``pl.run_state`` (one made by ``jax.new_ref`` cannot be discharged under the
    ``custom_vmap`` of :func:`_folding_vmap`); JAX's GPU interpreter takes a ``Ref`` only
    in GMEM, so there it is a jitted ``jax.new_ref``."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    body, scratch = _build_kernel(plan), _scratch(plan)

    def scoped(*refs):
        pl.run_scoped(functools.partial(body, *refs), collective_axes="wg", **scratch)

    launch = pl.kernel(scoped, out_type=(), compiler_params=params, interpret=interpret,
                       mesh=plgpu.Mesh(**mesh), name=KERNEL_NAME + "_exact")

    if not interpret:
        return pl.run_state(lambda out_ref: launch(*operands, out_ref))(out)

    @jax.jit  # JAX's GPU interpreter takes a Ref only in GMEM, which exists only under jit
    def rerun(out, *operands):
        out_ref = jax.new_ref(out, memory_space=plgpu.GMEM)
        launch(*operands, out_ref)
        return out_ref[...]

    return rerun(out, *operands)


def _num_sms() -> int:
    if jax.default_backend() in _GPU_PLATFORMS:
        count = getattr(jax.devices()[0], "core_count", None)
        if count:
            return int(count)
    return DEFAULT_NUM_SMS


def pallas_mosaic_gpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                                scale: float, q_lengths: jax.Array | None,
                                kv_lengths: jax.Array | None, config: MosaicConfig | None = None,
                                interpret: Any = False, num_sms: int | None = None,
                                variant: MosaicVariant | None = None) -> jax.Array:
    """Flash-attention forward (FlashAttention-3 design) on a Hopper GPU via Mosaic GPU.

    Args:
      q: ``[batch, q_len, num_heads, head_dim]`` bfloat16 or float16.
      k, v: ``[batch, kv_len, num_kv_heads, head_dim]``, same dtype;
        ``num_heads % num_kv_heads == 0`` (GQA by index mapping).
      causal: mask key ``j > i`` for query ``i`` (top-left aligned).
      scale: logit scale (the contract resolves ``None`` to ``1/sqrt(head_dim)``).
      q_lengths, kv_lengths: optional int32 ``[batch]``; rows/keys at or past them are
        padding (padded query rows and rows that see no key return zeros).
      config: :class:`MosaicConfig`; unset fields take the head_dim's default
        (``PallasMosaicGpuKernel.default_config``).
      interpret: run in JAX's (private) GPU interpret mode on the CPU, with
        ``lax.dot_general`` in place of ``wgmma`` (tests only): ``True``, or the
        interpreter's ``InterpretGPUParams`` (e.g. ``detect_races=True``).
      num_sms: persistent CTAs to launch; default the device's SM count
        (``DEFAULT_NUM_SMS`` off-GPU, e.g. when exporting from a CPU host), and one CTA
        in interpret mode.
      variant: ``kernels.mosaic_variants.MosaicVariant`` switches (lazy rescale,
        row-sum order, register split, ...); ``None`` = the kernel as registered at
        this head_dim, mask and ``kv_len`` (``mosaic_variants.REGISTERED_SWITCHES``).

    Returns:
      Array shaped and typed like ``q``; logits, softmax state and accumulator float32.

    Raises:
      NotImplementedError: a dtype other than bf16/f16, or head_dim > ``MAX_HEAD_DIM``.
      ValueError: ``config`` breaks a tiling or shared-memory constraint.
    """
    batch, q_len, num_heads, head_dim = q.shape
    _, kv_len, num_kv_heads, _ = k.shape
    if jnp.dtype(q.dtype).name not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"pallas_mosaic_gpu supports {SUPPORTED_DTYPES}, got {q.dtype}")
    if head_dim > MAX_HEAD_DIM:
        raise NotImplementedError(f"pallas_mosaic_gpu supports head_dim <= {MAX_HEAD_DIM}, "
                                  f"got {head_dim}")
    cfg = (config or MosaicConfig()).merged_over(
        PallasMosaicGpuKernel().default_config(head_dim))
    if variant is None:  # the switches this head_dim, mask and length are registered with
        variant = registered_variant(cfg, head_dim, jnp.dtype(q.dtype).itemsize,
                                     causal=bool(causal), kv_len=kv_len)
    variant.check_tiling(cfg.block_q, cfg.block_kv, padded_head_dim(head_dim))
    extra = variant_scratch_bytes(variant, cfg.block_q)
    itemsize = jnp.dtype(q.dtype).itemsize
    need = smem_bytes(cfg, head_dim, itemsize, extra, variant.output_chunks)
    if need > SMEM_LIMIT_BYTES:
        flags = (f", {fma_check_scratch_bytes(cfg.block_q)} of them for "
                 f"checked_fma_exponent's row flags and Mosaic GPU's reduction reserve"
                 if variant.checked_fma_exponent else "")
        raise ValueError(f"pallas_mosaic_gpu: {cfg.model_dump()} at head_dim {head_dim} "
                         f"(output_chunks={variant.output_chunks}) needs {need} bytes of "
                         f"shared memory{flags}, over {SMEM_LIMIT_BYTES}")
    output_cols = output_staging_cols(cfg, head_dim, itemsize, extra, variant.output_chunks)
    if variant.pingpong_across_tiles and not output_cols:
        raise ValueError(
            f"pallas_mosaic_gpu: pingpong_across_tiles needs the output staged in its own "
            f"buffers, but {cfg.model_dump()} at head_dim {head_dim} stages it in the query "
            f"tiles (the producer's next K/V blocks would wait for consumer 1's output "
            f"store, which waits for consumer 0's next Q K^T, which waits for those "
            f"blocks); set output_chunks > 1 or use a shallower K/V ring")
    call = functools.partial(_attention, causal=bool(causal), scale=scale, cfg=cfg,
                             variant=variant, interpret=interpret, num_sms=num_sms,
                             output_cols=output_cols)
    if variant.checked_fma_exponent and not interpret:
        # Its in-place launch has no vmap rule of its own. (The interpreter's in-place
        # launch is a jitted Ref, which custom_vmap cannot hold: there, vmap over more
        # than one example is refused by Pallas.)
        return _folding_vmap(call)(q, k, v, q_lengths, kv_lengths)
    return call(q, k, v, q_lengths, kv_lengths)


def _folding_vmap(call):
    """``call(q, k, v, q_lengths, kv_lengths)`` (batch first) under ``jax.vmap`` as one
    call over the mapped axis folded into the batch: the examples are independent, so
    ``[n, batch, ...]`` runs as ``[n * batch, ...]`` (unmapped operands broadcast). Nested
    maps fold one at a time."""

    @jax.custom_batching.custom_vmap
    def folded(q, k, v, q_lengths, kv_lengths):
        return call(q, k, v, q_lengths, kv_lengths)

    @folded.def_vmap
    def _rule(axis_size, in_batched, *args):
        def fold(x, mapped):
            if x is None:
                return None
            x = x if mapped else jnp.broadcast_to(x, (axis_size, *x.shape))
            return x.reshape((axis_size * x.shape[1], *x.shape[2:]))

        out = folded(*(fold(x, b) for x, b in zip(args, in_batched, strict=True)))
        return out.reshape((axis_size, -1, *out.shape[1:])), True

    return folded


def _attention(q, k, v, q_lengths, kv_lengths, *, causal: bool, scale: float,
               cfg: MosaicConfig, variant: MosaicVariant, interpret, num_sms,
               output_cols: int):
    """:func:`pallas_mosaic_gpu_attention` once its config and switches are resolved and
    checked: padding, the launch (two under ``checked_fma_exponent``), the slice back."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    batch, q_len, num_heads, head_dim = q.shape
    _, kv_len, num_kv_heads, _ = k.shape
    itemsize = jnp.dtype(q.dtype).itemsize
    # The bound at the real head_dim, before any padding (keys past kv_lengths count too:
    # they can only send the call to the exact form).
    fma_safe = fma_exponent_is_safe(q, k, scale) if variant.bounded_fma_exponent else None
    d_pad = padded_head_dim(head_dim)
    q_pad = round_up(q_len, 2 * cfg.block_q)
    kv_pad = kv_rows(kv_len, head_dim, cfg.block_kv, interpret=bool(interpret),
                     has_kv_lengths=kv_lengths is not None)
    if kv_lengths is not None:
        # 0 * NaN is NaN: padding rows of V must hold finite values for P V.
        keep = jnp.arange(kv_len)[None, :, None, None] < kv_lengths[:, None, None, None]
        v = jnp.where(keep, v, jnp.zeros_like(v))
    if (q_pad, d_pad) != (q_len, head_dim):
        q = jnp.pad(q, ((0, 0), (0, q_pad - q_len), (0, 0), (0, d_pad - head_dim)))
    if (kv_pad, d_pad) != (kv_len, head_dim):
        widths = ((0, 0), (0, kv_pad - kv_len), (0, 0), (0, d_pad - head_dim))
        k, v = jnp.pad(k, widths), jnp.pad(v, widths)

    num_tiles = batch * num_heads * (q_pad // (2 * cfg.block_q))
    num_ctas = min(num_sms or (1 if interpret else _num_sms()), num_tiles)
    plan = _Plan(batch=batch, num_heads=num_heads, group=num_heads // num_kv_heads,
                 q_len=q_len, kv_len=kv_len, q_pad=q_pad, kv_pad=kv_pad, head_dim=d_pad,
                 block_q=cfg.block_q, block_kv=cfg.block_kv, stages=cfg.kv_ring_depth,
                 causal=causal, qk_scale_log2=float(scale) * _LOG2_E,
                 has_q_lengths=q_lengths is not None, has_kv_lengths=kv_lengths is not None,
                 num_ctas=num_ctas, dtype=q.dtype, interpret=bool(interpret),
                 output_cols=output_cols, variant=variant)
    operands = [jnp.asarray(x, jnp.int32) for x in (q_lengths, kv_lengths) if x is not None]
    if variant.bounded_fma_exponent:
        operands.append(fma_safe.astype(jnp.int32).reshape(1))
    interpret_params = interpret
    if interpret is True:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        interpret_params = InterpretGPUParams()
    mesh = dict(grid=(num_ctas,), grid_names=("sm",), num_threads=3, thread_name="wg")
    params = plgpu.CompilerParams(approx_math=True)
    out_type = jax.ShapeDtypeStruct(q.shape, q.dtype)
    if not plan.checks_fma:
        out = plgpu.kernel(_build_kernel(plan), out_type=out_type,
                           scratch_types=_scratch(plan), compiler_params=params,
                           interpret=interpret_params, kernel_name=KERNEL_NAME,
                           **mesh)(*operands, q, k, v)
    else:
        flags_type = jax.ShapeDtypeStruct((batch, num_heads, q_pad), jnp.float32)
        out, flags = plgpu.kernel(_build_kernel(plan), out_type=(out_type, flags_type),
                                  scratch_types=_scratch(plan), compiler_params=params,
                                  interpret=interpret_params, kernel_name=KERNEL_NAME,
                                  **mesh)(*operands, q, k, v)
        exact = variant.model_copy(update={"checked_fma_exponent": False})
        rerun = dataclasses.replace(
            plan, variant=exact, guarded=True,
            output_cols=output_staging_cols(cfg, head_dim, itemsize,
                                            variant_scratch_bytes(exact, cfg.block_q),
                                            exact.output_chunks))
        # Every tile stores its rows' flags, so no unwritten memory is read here.
        redo = jnp.any(flags > 0.0).astype(jnp.int32).reshape(1)
        out = _rerun_in_place(rerun, out, [*operands, redo, q, k, v], mesh, params,
                              interpret_params)
    if (q_pad, d_pad) != (q_len, head_dim):
        out = out[:, :q_len, :, :head_dim]
    return out


class PallasMosaicGpuKernel(Kernel[MosaicConfig]):
    """The registry's ``pallas_mosaic_gpu``: native on a Hopper GPU only (no CPU mode),
    bf16/f16, head_dim <= 256; a :class:`MosaicConfig`; tuned by the GPU table; ``auto``
    tries it after cuDNN on a GPU unless the measured table puts it first. Mosaic GPU is
    imported inside the call, so declaring the class costs a CPU host nothing. Its export
    needs no hook: it always traces natively, and ``mosaic_gpu_v2`` is on ``jax.export``'s
    list of custom calls with a compatibility guarantee (JAX 0.10.2 and 0.11)."""

    name = "pallas_mosaic_gpu"
    description = ("warp-specialised flash attention in Pallas/Mosaic GPU for Hopper "
                   "(FlashAttention-3 design; bf16/f16)")
    native_platforms = ("gpu",)
    capability = Capability(dtypes=SUPPORTED_DTYPES, max_head_dim=MAX_HEAD_DIM)
    forward = staticmethod(pallas_mosaic_gpu_attention)
    auto_priority = {"gpu": 30}
    variant_fields = tuple(MosaicVariant.model_fields)
    trace_name = KERNEL_NAME
    tuned = True
    ours = True

    def default_config(self, head_dim: int) -> MosaicConfig:
        """Documented default tiling (``gpu_table.json`` takes precedence where the
        autotuner measured the kernel): 64-row consumer tiles (one ``wgmma`` M-tile per
        warpgroup), 128-row K/V tiles with a 2-deep ring at head_dim <= 128, 64-row K/V
        tiles at 256 so the float32 accumulator and logits fit the consumers'
        registers."""
        block_kv = 128 if padded_head_dim(head_dim) <= 128 else 64
        return MosaicConfig(block_q=64, block_kv=block_kv, kv_ring_depth=2)

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise when this kernel cannot run ``spec`` on ``backend`` with ``config``.

        Raises:
            NotImplementedError: a backend other than an NVIDIA GPU (there is no public
                GPU interpret mode, so unlike ``pallas_gpu`` it does not run on a CPU), a
                GPU that is not Hopper (compute capability 9.x), a dtype other than
                bf16/f16 (float32 stays with ``pallas_gpu``), or head_dim above
                ``MAX_HEAD_DIM``.
            ValueError: ``config`` is not a legal :class:`MosaicConfig`, or its buffers
                (with the switches registered for the call) exceed ``SMEM_LIMIT_BYTES``.
        """
        if backend not in _GPU_PLATFORMS:
            raise NotImplementedError(
                f"pallas_mosaic_gpu is native to NVIDIA Hopper GPUs (Mosaic GPU: wgmma and "
                f"TMA) and has no CPU mode (JAX's GPU interpret mode is private); backend "
                f"{backend!r}")
        not_hopper = hopper_refusal("pallas_mosaic_gpu", "wgmma and TMA")
        if not_hopper is not None:
            raise NotImplementedError(not_hopper)
        name = jnp.dtype(spec.dtype).name
        if name not in SUPPORTED_DTYPES:
            raise NotImplementedError(
                f"pallas_mosaic_gpu supports {SUPPORTED_DTYPES} (wgmma with bf16/f16 "
                f"operands); got {name} (pallas_gpu runs float32)")
        if spec.head_dim > MAX_HEAD_DIM:
            raise NotImplementedError(
                f"pallas_mosaic_gpu supports head_dim <= {MAX_HEAD_DIM} (the float32 output "
                f"accumulator must fit a consumer's registers), got {spec.head_dim}")
        resolved = self.resolve_config(spec, config)
        itemsize = jnp.dtype(spec.dtype).itemsize
        variant = registered_variant(resolved, spec.head_dim, itemsize, causal=spec.causal,
                                     kv_len=spec.kv_len)
        extra = variant_scratch_bytes(variant, resolved.block_q)
        need = smem_bytes(resolved, spec.head_dim, itemsize, extra, variant.output_chunks)
        if need > SMEM_LIMIT_BYTES:
            raise ValueError(
                f"pallas_mosaic_gpu: block_q={resolved.block_q}, block_kv={resolved.block_kv}, "
                f"kv_ring_depth={resolved.kv_ring_depth} at head_dim {spec.head_dim} need "
                f"{need} bytes of shared memory, over the {SMEM_LIMIT_BYTES} of an sm_90 CTA")

    def candidate_configs(self, shape, quick: bool = False) -> list[MosaicConfig]:
        """Tilings the autotuner tries on ``shape``: the default first, then
        ``TUNING_GRID`` (``quick``: its first two), leaving out those over the
        shared-memory limit at the head_dim: at head_dim 128 a 256-row K/V tile does not
        fit, nor does a 3-deep ring of 128 rows with separate output buffers (the kernel
        then stages the output in the query buffers)."""
        grid = TUNING_GRID[:2] if quick else TUNING_GRID
        configs = [self.default_config(shape.head_dim)]
        for bq, bkv, depth in grid:
            cfg = MosaicConfig(block_q=bq, block_kv=bkv, kv_ring_depth=depth)
            if smem_bytes(cfg, shape.head_dim) <= SMEM_LIMIT_BYTES and cfg not in configs:
                configs.append(cfg)
        return configs
