"""Flash-attention forward for TPU, written in Pallas (Mosaic TPU).

Exact attention by tiling (FlashAttention: Dao et al. 2022; FlashAttention-2:
Dao 2023): Q is split into blocks of ``block_q`` rows and K/V into blocks of
``block_kv`` rows; for each query block the kernel walks the key blocks, keeping
a running row max, a running row sum and an output accumulator in VMEM (the
online softmax of Milakov & Gimelshein 2018), so the ``q_len x kv_len`` logits
never exist outside one ``block_q x block_kv`` tile.

Grid ``(batch, heads, q_blocks, kv_blocks)``; the key-block axis is innermost and
"arbitrary" (it carries the accumulator), the others are "parallel". Work that
cannot contribute is skipped, not masked:

* causal: key blocks entirely above the diagonal of the query block;
* padding: key blocks at or beyond ``kv_lengths[b]`` and query blocks at or
  beyond ``q_lengths[b]``.

The lengths arrive by scalar prefetch (``pltpu.PrefetchScalarGridSpec``) so that
both the kernel body (``pl.when``) and the K/V ``index_map`` can read them: for a
skipped step the index map repeats the block index of the last useful step, and
the Pallas pipeline issues no DMA when consecutive steps name the same block
(the technique of JAX's own TPU flash attention). GQA reads K/V head
``h // group`` in the index map, so repeated K/V are never materialised.

Numerics: logits, the softmax statistics and the output accumulator are float32
for every input dtype. For bf16/f16 inputs the probabilities are cast to the
input dtype before the P·V matmul (the MXU's native input type; accumulation
stays float32) — the same rounding the naive baseline applies. For float32
inputs the matmuls request ``Precision.HIGHEST`` so a TPU does not round the
operands to bf16. A query row that sees no key returns zeros.

Off-TPU the kernel runs in Pallas' TPU interpret mode (slow, exact, with
out-of-bounds checks; see ``pltpu.force_tpu_interpret_mode``), or, inside
``kernels.interpreters.interpreter("generic_interpret")``, under Pallas' generic
``interpret=True`` lowering (the same numbers, compiled by XLA; what each checks:
``kernels.interpreters``). The choice is made when tracing; inside ``mosaic_lowering()``
a CPU host traces the real Mosaic kernel, which is how ``jax.export(...,
platforms=["tpu"])`` validates it here.

Kept in one module (over 350 lines) because a kernel file holds the kernel, its tiling
config and its capability check, and nothing else.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from pydantic import Field, field_validator

from kernels import interpreters
from kernels.config import KernelConfig
from kernels.contract import AttentionSpec
from kernels.kernel import Kernel, round_up

KERNEL_NAME = "kernelgate_flash_attention_tpu"
"""Name of the ``pallas_call``; it shows in lowered HLO and in profiler traces."""

LANES = 128
"""TPU vreg lane count: the minor tile dimension (head_dim and block_kv align to it)."""
SUBLANES = 8
"""TPU vreg sublane count: the second-minor tile dimension (block_q aligns to it)."""
VMEM_BUDGET_BYTES = 16 * 2**20
"""Scoped VMEM a kernel may use by default on the smallest current TPU (v5e: 16 MiB)."""



class TpuConfig(KernelConfig):
    """pallas_tpu's tiling (sizes in tokens; ``None``: the default, 128 x 128).

    ``block_q`` must be a multiple of ``SUBLANES`` (8) and ``block_kv`` a multiple of
    ``LANES`` (128): a ``block_q x block_kv`` logits tile then maps onto whole vregs and
    ``block_kv`` rows of K/V onto whole sublane tiles. A TPU kernel has no warps or
    pipeline stages (GPU launch parameters): a config naming them is refused.

    Raises (when made):
        ValueError: a block size that breaks the TPU tiling (the message names it).
    """

    block_q: int | None = Field(None, gt=0, le=4096, description="query rows per tile")
    block_kv: int | None = Field(None, gt=0, le=4096, description="key/value rows per tile")

    @field_validator("block_q")
    @classmethod
    def _sublanes(cls, value: int | None) -> int | None:
        if value is not None and value % SUBLANES:
            raise ValueError(f"pallas_tpu: block_q must be a multiple of {SUBLANES} (TPU "
                             f"sublanes), got {value}")
        return value

    @field_validator("block_kv")
    @classmethod
    def _lanes(cls, value: int | None) -> int | None:
        if value is not None and value % LANES:
            raise ValueError(f"pallas_tpu: block_kv must be a multiple of {LANES} (TPU "
                             f"lanes), got {value}")
        return value


DEFAULT_CONFIG = TpuConfig(block_q=128, block_kv=128)
"""The tiling of a call that asks for none."""
SUPPORTED_BACKENDS = ("tpu", "cpu")
"""Native on TPU; interpreted on CPU. A GPU host should use ``pallas_gpu``."""

_MOSAIC_LOWERING = jax.make_user_context(default_value=False)


def mosaic_lowering():
    """Context manager: trace the kernel for Mosaic (a real TPU) even on a host
    without one, e.g. around ``jax.export.export(..., platforms=["tpu"])``.

    The flag is a ``jax.make_user_context``, part of jit's cache key, so a
    function traced for the interpreter is re-traced inside it rather than reused.
    (``lax.platform_dependent`` cannot choose between the two at lowering time:
    the interpreter's branch carries ordered IO effects the Mosaic branch lacks.)
    """
    return _MOSAIC_LOWERING(True)


def _interpret_params() -> pltpu.InterpretParams | bool:
    """``False`` (Mosaic) on a TPU or under ``mosaic_lowering()``; else ``True`` (the
    generic lowering) under ``interpreters.interpreter("generic_interpret")``, TPU
    interpret mode otherwise. An enclosing ``pltpu.force_tpu_interpret_mode(params)``
    still takes precedence inside ``pallas_call`` (e.g. ``detect_races=True``)."""
    if _MOSAIC_LOWERING.value or jax.default_backend() == "tpu":
        return False
    if interpreters.current() == interpreters.GENERIC_INTERPRET:
        return True
    return pltpu.InterpretParams()


@dataclass(frozen=True)
class Tiling:
    """The padded problem one ``pallas_call`` sees (sizes in elements).

    Attributes:
        block_q, block_kv: effective tile sizes after clamping to the sequence.
        q_len_padded, kv_len_padded: sequence lengths rounded up to the tiles.
        head_dim_padded: head_dim rounded up to ``LANES`` (zero padding of q/k
            leaves the logits unchanged; padded v columns are sliced off).
    """

    block_q: int
    block_kv: int
    q_len_padded: int
    kv_len_padded: int
    head_dim_padded: int

    @property
    def grid_q(self) -> int:
        return self.q_len_padded // self.block_q

    @property
    def grid_kv(self) -> int:
        return self.kv_len_padded // self.block_kv

    def vmem_bytes(self, itemsize: int) -> int:
        """Upper bound of the kernel's VMEM use in bytes: double-buffered q, k, v
        and output blocks, float32 scratch (accumulator, max and sum), and the
        float32 logits/probabilities tile of one step. Independent of the
        sequence lengths, unlike the S x S logits of the naive baseline."""
        d = self.head_dim_padded
        blocks = 2 * itemsize * (2 * self.block_q * d + 2 * self.block_kv * d)
        scratch = 4 * (self.block_q * d + 2 * self.block_q * LANES)
        tile = 2 * 4 * self.block_q * self.block_kv
        return blocks + scratch + tile


def plan_tiling(q_len: int, kv_len: int, head_dim: int, config: TpuConfig | None = None,
                itemsize: int = 4) -> Tiling:
    """Effective tiles for one problem: ``config``'s blocks (unset: ``DEFAULT_CONFIG``'s)
    clamped to the (rounded-up) sequence so a short sequence is not padded to a full
    default tile. Sizes in elements, ``itemsize`` in bytes.

    Raises:
        ValueError: tiles whose VMEM need exceeds ``VMEM_BUDGET_BYTES`` (an illegal
            block size is refused when its ``TpuConfig`` is made).
    """
    config = (config or TpuConfig()).merged_over(DEFAULT_CONFIG)
    block_q = min(config.block_q, round_up(q_len, SUBLANES))
    block_kv = min(config.block_kv, round_up(kv_len, LANES))
    tiling = Tiling(block_q=block_q, block_kv=block_kv,
                    q_len_padded=round_up(q_len, block_q),
                    kv_len_padded=round_up(kv_len, block_kv),
                    head_dim_padded=round_up(head_dim, LANES))
    need = tiling.vmem_bytes(itemsize)
    if need > VMEM_BUDGET_BYTES:
        raise ValueError(
            f"pallas_tpu: block_q={block_q}, block_kv={block_kv} with head_dim "
            f"{tiling.head_dim_padded} need about {need} bytes of VMEM, over the "
            f"{VMEM_BUDGET_BYTES}-byte budget; choose smaller blocks")
    return tiling


def _last_kv_block(q_block, kv_len, *, causal: bool, block_q: int, block_kv: int):
    """Index of the last key block query block ``q_block`` needs (-1 when none).

    Shared by the kernel body (which steps run) and the K/V index map (which
    block to fetch), so the two can never disagree.
    """
    # lax.div truncates; both numerators are >= 0, and unlike `//` (floor
    # division, which needs sign()) it lowers without knowing the TPU generation.
    last = lax.div(kv_len + (block_kv - 1), block_kv) - 1
    if causal:
        last = jnp.minimum(last, lax.div((q_block + 1) * block_q - 1, block_kv))
    return last


def kv_block_index(q_block, kv_block, kv_len, *, causal: bool, block_q: int, block_kv: int):
    """The K/V block the pipeline fetches at grid step ``(q_block, kv_block)``.

    Useful steps fetch their own block; a skipped step (above the causal diagonal
    or past ``kv_len``) repeats the last useful block index, and the Pallas
    pipeline issues no DMA when consecutive steps name the same block.
    """
    last = _last_kv_block(q_block, kv_len, causal=causal, block_q=block_q, block_kv=block_kv)
    return jnp.maximum(jnp.minimum(kv_block, last), 0)


def _flash_kernel(q_lengths_ref, kv_lengths_ref, q_ref, k_ref, v_ref, o_ref,
                  m_scratch, l_scratch, acc_scratch, *, causal: bool, scale: float,
                  block_q: int, block_kv: int, precision):
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    q_len, kv_len = q_lengths_ref[b], kv_lengths_ref[b]
    q_start, k_start = i * block_q, j * block_kv

    @pl.when(j == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def step(masked: bool):
        q = q_ref[...]
        k = k_ref[...]
        # q @ k^T without an explicit transpose: contract the head_dim of both.
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.float32) * scale
        if masked:
            cols = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            visible = cols < kv_len
            if causal:
                rows = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
                visible = visible & (cols <= rows)
            s = jnp.where(visible, s, -jnp.inf)
        m_prev = m_scratch[:, :1]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        # A row that has seen no visible key yet keeps m = -inf; shifting by 0
        # instead keeps exp() at exactly 0 for it rather than NaN (-inf - -inf).
        m_shift = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        p = jnp.exp(s - m_shift)
        alpha = jnp.exp(m_prev - m_shift)
        l_next = alpha * l_scratch[:, :1] + jnp.sum(p, axis=1, keepdims=True)
        v = v_ref[...]
        if masked:
            # Padded value rows may hold NaN/inf; p = 0 there, but 0 * NaN is NaN.
            v_rows = k_start + lax.broadcasted_iota(jnp.int32, v.shape, 0)
            v = jnp.where(v_rows < kv_len, v, jnp.zeros((), v.dtype))
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             precision=precision, preferred_element_type=jnp.float32)
        acc_scratch[...] = alpha * acc_scratch[...] + pv
        # The statistics live lane-replicated in [block_q, LANES] (one vreg column
        # per row) so every store is a whole-vreg store.
        m_scratch[...] = jnp.broadcast_to(m_next, m_scratch.shape)
        l_scratch[...] = jnp.broadcast_to(l_next, l_scratch.shape)

    last = _last_kv_block(i, kv_len, causal=causal, block_q=block_q, block_kv=block_kv)
    live = (j <= last) & (q_start < q_len)
    # Only tiles that straddle kv_len or the diagonal pay for the element mask.
    straddles = k_start + block_kv > kv_len
    if causal:
        straddles = straddles | (k_start + block_kv - 1 > q_start)
    pl.when(live & straddles)(functools.partial(step, True))
    pl.when(live & jnp.logical_not(straddles))(functools.partial(step, False))

    @pl.when(j == pl.num_programs(3) - 1)
    def _finalize():
        row_sum = l_scratch[:, :1]
        # Exact division (not an approximate reciprocal): float32 must stay far below 1e-5.
        out = acc_scratch[...] / jnp.where(row_sum == 0.0, 1.0, row_sum)
        rows = q_start + lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
        o_ref[...] = jnp.where(rows < q_len, out, 0.0).astype(o_ref.dtype)


def _flash_call(q, k, v, q_lengths, kv_lengths, *, causal: bool, scale: float,
                tiling: Tiling, group: int, interpret):
    """One ``pallas_call`` on padded ``[batch, heads, seq, head_dim]`` operands."""
    batch, num_heads, _, d = q.shape
    bq, bkv = tiling.block_q, tiling.block_kv

    def q_map(b, h, i, j, q_lengths_ref, kv_lengths_ref):
        return b, h, i, 0

    def kv_map(b, h, i, j, q_lengths_ref, kv_lengths_ref):
        block = kv_block_index(i, j, kv_lengths_ref[b], causal=causal, block_q=bq, block_kv=bkv)
        return b, lax.div(h, group), block, 0

    sq = pl.squeezed
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(batch, num_heads, tiling.grid_q, tiling.grid_kv),
        in_specs=[pl.BlockSpec((sq, sq, bq, d), q_map),
                  pl.BlockSpec((sq, sq, bkv, d), kv_map),
                  pl.BlockSpec((sq, sq, bkv, d), kv_map)],
        out_specs=pl.BlockSpec((sq, sq, bq, d), q_map),
        scratch_shapes=[pltpu.VMEM((bq, LANES), jnp.float32),
                        pltpu.VMEM((bq, LANES), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32)],
    )
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    kernel = functools.partial(_flash_kernel, causal=causal, scale=scale, block_q=bq,
                               block_kv=bkv, precision=precision)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name=KERNEL_NAME,
    )(q_lengths, kv_lengths, q, k, v)


def pallas_tpu_attention(q, k, v, *, causal: bool, scale: float, q_lengths=None,
                         kv_lengths=None, config: TpuConfig | None = None) -> jax.Array:
    """Flash attention (validated inputs; see ``kernels.attention`` for the contract).

    Args:
        q: ``[batch, q_len, num_heads, head_dim]``, float32/bfloat16/float16.
        k, v: ``[batch, kv_len, num_kv_heads, head_dim]``, same dtype.
        causal: top-left causal mask; key blocks above the diagonal are skipped.
        scale: logit scale (already resolved by ``kernels.contract.validate``).
        q_lengths, kv_lengths: int32 ``[batch]`` or ``None`` (full length).
        config: ``TpuConfig``; ``None`` (or unset fields) = ``DEFAULT_CONFIG`` (128 x 128).
            Blocks are clamped to short sequences; sequences are padded to whole
            blocks and head_dim to ``LANES`` inside this wrapper, then masked/sliced.

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in ``q.dtype``; rows that see no key are 0.

    Raises:
        ValueError: illegal block sizes (the message names the constraint).

    On a TPU the kernel is compiled by Mosaic; on any other platform it runs in
    TPU interpret mode (``pltpu.InterpretParams()``, or the parameters of an
    enclosing ``pltpu.force_tpu_interpret_mode``, e.g. ``detect_races=True``), or under
    the generic lowering inside ``interpreters.interpreter("generic_interpret")``.
    """
    batch, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    tiling = plan_tiling(q_len, kv_len, head_dim, config, jnp.dtype(q.dtype).itemsize)
    if q_lengths is None:
        q_lengths = jnp.full((batch,), q_len, jnp.int32)
    if kv_lengths is None:
        kv_lengths = jnp.full((batch,), kv_len, jnp.int32)
    q_lengths = jnp.asarray(q_lengths, jnp.int32)
    kv_lengths = jnp.asarray(kv_lengths, jnp.int32)

    def to_tiles(x, seq_padded):
        # [b, s, h, d] -> [b, h, s_padded, d_padded]; XLA fuses the pad into the transpose.
        x = jnp.transpose(x, (0, 2, 1, 3))
        return jnp.pad(x, ((0, 0), (0, 0), (0, seq_padded - x.shape[2]),
                           (0, tiling.head_dim_padded - head_dim)))

    qt = to_tiles(q, tiling.q_len_padded)
    kt = to_tiles(k, tiling.kv_len_padded)
    vt = to_tiles(v, tiling.kv_len_padded)
    out = _flash_call(qt, kt, vt, q_lengths, kv_lengths, causal=bool(causal),
                      scale=float(scale), tiling=tiling, group=num_heads // num_kv_heads,
                      interpret=_interpret_params())
    return jnp.transpose(out[:, :, :q_len, :head_dim], (0, 2, 1, 3))


class PallasTpuKernel(Kernel[TpuConfig]):
    """The registry's ``pallas_tpu``: native on a TPU, TPU interpret mode on a CPU (where
    it is also what a rollout builds for ``auto``: a CPU host has no flash kernel of its
    own); block_q/block_kv only (:class:`TpuConfig`); lowers natively or interpreted when
    traced, so its TPU export traces inside :func:`mosaic_lowering`."""

    name = "pallas_tpu"
    description = "flash attention in Pallas/Mosaic TPU (interpreted off-TPU)"
    native_platforms = ("tpu",)
    forward = staticmethod(pallas_tpu_attention)
    auto_priority = {"tpu": 0}
    rollout_default_on = ("tpu", "cpu")
    float32_matmul_precision = "highest"
    trace_name = KERNEL_NAME
    lowers_at_trace_time = True

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise when it cannot run ``spec`` on ``backend`` with ``config``.

        Raises:
            NotImplementedError: ``backend`` is neither ``tpu`` (native) nor ``cpu``
                (TPU interpret mode).
            ValueError: ``config`` breaks a TPU tiling constraint (:class:`TpuConfig`),
                or its tiles need more VMEM than ``VMEM_BUDGET_BYTES``.
        """
        if backend not in SUPPORTED_BACKENDS:
            raise NotImplementedError(
                f"pallas_tpu is a Mosaic TPU kernel: native on tpu, interpreted on cpu; "
                f"not available on {backend} (use pallas_gpu or cudnn there)")
        config = self.config_from(config)
        if config is not None:
            plan_tiling(spec.q_len, spec.kv_len, spec.head_dim, config, spec.dtype.itemsize)

    def default_config(self, head_dim: int) -> TpuConfig:
        """``DEFAULT_CONFIG`` (128 x 128) whatever the head_dim: head_dim is padded to
        ``LANES`` and the default tiles fit ``VMEM_BUDGET_BYTES`` up to head_dim 256."""
        del head_dim
        return DEFAULT_CONFIG

    def export_context(self, platform: str) -> contextlib.AbstractContextManager:
        """:func:`mosaic_lowering` for the ``jax.export`` platform ``"tpu"`` (so a CPU
        host exports the Mosaic kernel, not its interpreter), nothing otherwise."""
        return mosaic_lowering() if platform == "tpu" else contextlib.nullcontext()


__all__ = [
    "DEFAULT_CONFIG", "KERNEL_NAME", "LANES", "PallasTpuKernel", "SUBLANES", "Tiling",
    "TpuConfig", "VMEM_BUDGET_BYTES", "kv_block_index", "mosaic_lowering",
    "pallas_tpu_attention", "plan_tiling",
]
