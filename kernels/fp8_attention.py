"""Flash-attention forward with both matrix products on Hopper's float8 (e4m3) ``wgmma``:
a first, correctness-first FP8 kernel for the gate to judge (Pallas Mosaic GPU).

Algorithm: FlashAttention-2's online softmax (Dao 2023) with FlashAttention-3's FP8 data
path (Shah et al. 2024, arXiv:2407.08608, section 3.3): ``S = Q Kᵀ`` and ``O += P V`` run
on e4m3 tensor cores with float32 accumulators; the softmax stays float32.

Data path, per call:

- **Quantisation (XLA, before the kernel).** Q, K and V (bf16 or f16, ``(B, S, H, D)``)
  get one float32 scale per (batch, head): ``scale = amax / 448`` (448: e4m3's largest
  finite value; 1 for an all-zero head) and are stored as e4m3 ``x / scale``, head-major.
  V is stored transposed, ``(D, S_kv)`` per head: 8-bit ``wgmma`` takes no transposed
  operand, so both operands must be K-major in shared memory, and for ``P V`` the
  contraction runs over the keys (``kernels.fp8_probe`` has the instruction's limits).
  FA3 likewise transposes V for FP8.
- **Kernel.** One warpgroup per CTA owns ``block_q`` (64) query rows of one (batch, head):
  its query tile is loaded once by TMA, the key and transposed value tiles stream through
  ``plgpu.emit_pipeline`` (``stages`` slots). Per key block: ``S`` on e4m3 ``wgmma``, the
  online softmax in float32 registers with ``m`` in raw units of ``S`` and ``p = exp2((s -
  m) * c)``, ``c = sm_scale · log2 e · scale_q · scale_k`` (the subtraction before the
  multiplication: no FMA can lose the largest logit, see
  ``kernels.mosaic_variants.softmax_block``), then ``P · 256`` rounded to e4m3 into
  shared memory (256, a power of two: exact to undo; ``p <= 1`` so at most 256 < 448) and
  ``O += P Vᵀᵀ`` on e4m3 ``wgmma``. The row sum ``l`` adds the float32 ``p`` before
  rounding. At the end ``O · scale_v / (256 · l)``, in the input dtype.
- **Masks.** ``causal`` is top-left (``col <= row``) and ``kv_lengths`` masks keys at or
  past each batch row's length; both cut the key blocks streamed (the pipeline's grid is
  dynamic) and set masked logits to ``-inf``. A row that sees no key returns zeros (its
  running max stays ``-inf`` and is replaced by 0 where it is used, so no ``-inf - -inf``).
  GQA by index mapping (query head ``h`` reads K/V head ``h // group``).

Accuracy. What it costs is the point of the kernel: e4m3 keeps 3 significand bits, so
each input element is off by up to 2⁻⁴ of its value, and Hopper's e4m3 ``wgmma``
accumulates with about 14 bits (measured, ``kernels.fp8_probe``). It is not meant to meet
the bf16 kernels' tolerance; the gate's registered FP8 criteria decide whether it is good
enough.

Limits (:func:`check_fp8_shapes`): bf16/f16 inputs; head_dim 128 (one 128-byte swizzle
group of e4m3 per row; FA3's FP8 peer is head_dim 128 too); ``q_len`` a multiple of 64
and ``kv_len`` of 128 (no padding here: a caller pads or the kernel class refuses); a
Hopper GPU (sm_90). JAX's GPU interpret mode runs it on a CPU for tests, with the two
``wgmma`` replaced by ``lax.dot_general`` on the e4m3 shared-memory tiles (its ``wgmma``
takes no transposed refs); the native path is checked there by lowering for CUDA.

Sources: the papers above; the Mosaic GPU API as in ``kernels.pallas_mosaic_gpu`` and
``kernels.fp8_probe``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = 448.0
"""e4m3's largest finite value: the quantisation scale maps a head's amax onto it."""
P_SCALE = 256.0
"""``P`` is stored as ``p · P_SCALE`` in e4m3: a power of two (exact to undo) under 448,
so ``p = 1`` keeps 3 significand bits and ``p`` down to 2⁻¹⁴ stays normal."""
HEAD_DIMS = (128,)
"""head_dims served: one 128-byte swizzle group of e4m3 per row."""
BLOCK_Q = 64
BLOCK_KV = 128
SWIZZLE = 128
KERNEL_NAME = "kernelgate_fp8_attention"


def check_fp8_shapes(q_shape, k_shape, v_shape, dtype, block_q: int = BLOCK_Q,
                     block_kv: int = BLOCK_KV) -> None:
    """Refuse what the kernel cannot serve, naming the constraint.

    Args: ``(B, S, H, D)`` shapes of q, k, v and the inputs' dtype.

    Raises:
        TypeError: dtype not bfloat16/float16.
        ValueError: ranks, batch, head or head_dim mismatches; head_dim not in
            :data:`HEAD_DIMS`; ``H`` not a multiple of the K/V heads; ``q_len`` not a
            multiple of ``block_q`` or ``kv_len`` not a multiple of ``block_kv``.
    """
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise TypeError(f"fp8 attention takes bfloat16 or float16 inputs, got {jnp.dtype(dtype)}")
    if len(q_shape) != 4 or len(k_shape) != 4 or tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"q, k, v must be (B, S, H, D) with k and v alike, got {q_shape}, "
                         f"{k_shape}, {v_shape}")
    (b, lq, h, d), (bk, lk, hk, dk) = q_shape, k_shape
    if b != bk or d != dk:
        raise ValueError(f"batch and head_dim must match: q {q_shape}, k {k_shape}")
    if d not in HEAD_DIMS:
        raise ValueError(f"fp8 attention serves head_dim in {HEAD_DIMS}, got {d}")
    if hk == 0 or h % hk:
        raise ValueError(f"num_heads {h} must be a multiple of num_kv_heads {hk} (GQA)")
    if lq % block_q or lq == 0:
        raise ValueError(f"q_len {lq} must be a positive multiple of {block_q}")
    if lk % block_kv or lk == 0:
        raise ValueError(f"kv_len {lk} must be a positive multiple of {block_kv}")


def quantize_per_head(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(x_e4m3, scale)`` for ``x`` of shape ``(B, S, H, D)``: head-major ``(B·H, S, D)``
    e4m3 holding ``x / scale`` and ``scale`` ``(B·H,)`` float32, ``amax / 448`` per
    (batch, head) (1 where a head is all zero). Raises nothing of its own."""
    b, s, h, d = x.shape
    xf = jnp.transpose(x.astype(jnp.float32), (0, 2, 1, 3)).reshape(b * h, s, d)
    amax = jnp.max(jnp.abs(xf), axis=(1, 2))
    scale = jnp.where(amax > 0, amax / jnp.float32(E4M3_MAX), jnp.float32(1.0))
    return (xf / scale[:, None, None]).astype(E4M3), scale


def _build(*, batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, d: int,
           causal: bool, has_lengths: bool, out_dtype, block_q: int, block_kv: int,
           stages: int, interpret: bool):
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    group = heads // kv_heads
    tiles8 = (plgpu.TilingTransform((8, SWIZZLE)), plgpu.SwizzleTransform(SWIZZLE))
    out_swizzle = plgpu.find_swizzle(d * 16)  # 16-bit output rows, in bits
    tiles16 = (plgpu.TilingTransform((8, out_swizzle // 2)), plgpu.SwizzleTransform(out_swizzle))
    wgmma_layout = None if interpret else plgpu.Layout.WGMMA

    def layout(x, lay):
        return x if interpret else plgpu.layout_cast(x, lay)

    def iota(shape, dim):
        if interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=wgmma_layout)

    def product(a_smem, b_smem, acc):
        """``acc + A Bᵀ`` (float32) with ``b_smem`` stored ``(N, K)``, K-major."""
        if interpret:
            return acc + lax.dot_general(a_smem[...], b_smem[...], (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)

        def body(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, plgpu.transpose_ref(b_smem, (1, 0)))
            plgpu.wgmma_wait(0)

        return pl.run_state(body)(plgpu.ACC.init(acc))

    def kernel(*refs):
        if has_lengths:
            kv_len_ref, *refs = refs
        q_ref, k_ref, vt_ref, c_ref, ov_ref, o_ref, q_smem, p_smem, o_smem, q_bar = refs
        qb, bh = lax.axis_index("qb"), lax.axis_index("bh")
        b = lax.div(bh, jnp.int32(heads))
        kvh = b * kv_heads + lax.div(lax.rem(bh, jnp.int32(heads)), jnp.int32(group))
        row0 = qb * block_q
        kv_end = kv_len_ref[b] if has_lengths else jnp.int32(kv_len)
        n_blocks = lax.div(kv_end + block_kv - 1, jnp.int32(block_kv))
        if causal:
            n_blocks = jnp.minimum(n_blocks, lax.div(row0 + block_q + block_kv - 1,
                                                     jnp.int32(block_kv)))
        n_blocks = jnp.maximum(n_blocks, 1)  # an empty row still writes its zeros
        c = c_ref[bh]

        plgpu.copy_gmem_to_smem(q_ref.at[bh, pl.ds(row0, block_q)], q_smem, q_bar)
        plgpu.barrier_wait(q_bar)

        def step(idx, k_smem, vt_smem, carry):
            (ki,) = idx
            acc, m_i, l_i = carry
            zeros = layout(jnp.zeros((block_q, block_kv), jnp.float32), wgmma_layout)
            s = product(q_smem, k_smem, zeros)
            if causal or has_lengths:
                cols = ki * block_kv + iota((block_q, block_kv), 1)
                visible = cols < kv_end
                if causal:
                    visible = jnp.logical_and(visible, cols <= row0 + iota((block_q, block_kv), 0))
                s = jnp.where(visible, s, -jnp.inf)
            m_new = jnp.maximum(m_i, s.max(axis=1))
            m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with no key yet
            alpha = jnp.exp2((m_i - m_use) * c)
            p = jnp.exp2((s - lax.broadcast_in_dim(m_use, s.shape, [0])) * c)
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            p_smem[...] = (p * P_SCALE).astype(E4M3)
            plgpu.commit_smem()
            acc = product(p_smem, vt_smem, acc)
            return acc, m_new, l_i

        rows = plgpu.Layout.WGMMA.reduce(1) if not interpret else None
        init = (layout(jnp.zeros((block_q, d), jnp.float32), wgmma_layout),
                layout(jnp.full((block_q,), -jnp.inf, jnp.float32), rows),
                layout(jnp.zeros((block_q,), jnp.float32), rows))
        pipeline = plgpu.emit_pipeline(
            step, grid=(n_blocks,),
            in_specs=[plgpu.BlockSpec((block_kv, d), lambda ki: (ki, 0), transforms=tiles8),
                      plgpu.BlockSpec((d, block_kv), lambda ki: (0, ki), transforms=tiles8)],
            max_concurrent_steps=stages, init_carry=init)
        acc, _, l_i = pipeline(k_ref.at[kvh], vt_ref.at[kvh])
        inv_l = jnp.where(l_i > 0.0, ov_ref[bh] / jnp.where(l_i > 0.0, l_i, 1.0), 0.0)
        o_smem[...] = (acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])).astype(out_dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bh, pl.ds(row0, block_q)])
        plgpu.wait_smem_to_gmem(0)

    params: Any = interpret
    if interpret:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        params = InterpretGPUParams()
    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((batch * heads, q_len, d), out_dtype),
        scratch_types=[plgpu.SMEM((block_q, d), E4M3, transforms=tiles8),
                       plgpu.SMEM((block_q, block_kv), E4M3, transforms=tiles8),
                       plgpu.SMEM((block_q, d), out_dtype, transforms=tiles16),
                       plgpu.Barrier()],
        grid=(q_len // block_q, batch * heads),
        grid_names=("qb", "bh"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=params,
        kernel_name=KERNEL_NAME,
    )


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale", "stages", "interpret"))
def fp8_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
                  kv_lengths: jax.Array | None = None, sm_scale: float | None = None,
                  stages: int = 2, interpret: bool = False) -> jax.Array:
    """Attention ``softmax(Q Kᵀ · sm_scale) V`` with both products in e4m3.

    Args:
        q: ``(B, Lq, H, D)`` bfloat16 or float16.
        k, v: ``(B, Lk, Hkv, D)``, same dtype; ``H`` a multiple of ``Hkv`` (GQA).
        causal: top-left causal mask (``col <= row``).
        kv_lengths: optional ``(B,)`` int32, keys at or past it masked.
        sm_scale: default ``1 / sqrt(D)``.
        stages: shared-memory slots of the key/value pipeline.
        interpret: run in JAX's GPU interpret mode (CPU tests).

    Returns:
        ``(B, Lq, H, D)`` in the inputs' dtype.

    Raises:
        TypeError, ValueError: as :func:`check_fp8_shapes`.
    """
    check_fp8_shapes(q.shape, k.shape, v.shape, q.dtype)
    batch, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    sm = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    q8, sq = quantize_per_head(q)
    k8, sk = quantize_per_head(k)
    v8, sv = quantize_per_head(v)
    vt8 = jnp.swapaxes(v8, 1, 2)  # (B·Hkv, D, Lk): K-major for P V
    group = heads // kv_heads
    kv_of_q = (jnp.arange(batch * heads) // heads) * kv_heads + (jnp.arange(batch * heads)
                                                                 % heads) // group
    c = sq * sk[kv_of_q] * jnp.float32(sm * math.log2(math.e))
    out_scale = sv[kv_of_q] / jnp.float32(P_SCALE)
    call = _build(batch=batch, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len,
                  d=d, causal=causal, has_lengths=kv_lengths is not None, out_dtype=q.dtype,
                  block_q=BLOCK_Q, block_kv=BLOCK_KV, stages=stages, interpret=interpret)
    operands = [q8, k8, vt8, c, out_scale]
    if kv_lengths is not None:
        operands.insert(0, jnp.asarray(kv_lengths, jnp.int32))
    out = call(*operands)
    return jnp.transpose(out.reshape(batch, heads, q_len, d), (0, 2, 1, 3))
