"""Flash-attention forward with both matrix products on Hopper's float8 (e4m3) ``wgmma``:
a first, correctness-first FP8 kernel for the gate to judge (Pallas Mosaic GPU).

Algorithm: FlashAttention-2's online softmax (Dao 2023) with FlashAttention-3's FP8 data
path (Shah et al. 2024, arXiv:2407.08608, section 3.3): ``S = Q Kᵀ`` and ``O += P V`` run
on e4m3 tensor cores with float32 accumulators; the softmax stays float32.

Data path, per call:

- **Quantisation (XLA, before the kernel).** Q, K and V (bf16 or f16, ``(B, S, H, D)``)
  are stored as e4m3 ``x / amax · 448`` per (batch, head) (448: e4m3's largest finite
  value; ``amax`` the head's largest ``|x|``, 1 for an all-zero head), head-major; the
  division by ``amax`` comes first, so no scale can flush to zero for a small head.
  V is stored transposed, ``(D, S_kv)`` per head: 8-bit ``wgmma`` takes no transposed
  operand, so both operands must be K-major in shared memory, and for ``P V`` the
  contraction runs over the keys (``kernels.fp8_probe`` has the instruction's limits).
  FA3 likewise transposes V for FP8.
- **Kernel.** One warpgroup per CTA owns ``block_q`` (64) query rows of one (batch, head):
  its query tile is loaded once by TMA, the key and transposed value tiles stream through
  ``plgpu.emit_pipeline`` (``stages`` slots). Per key block: ``S`` on e4m3 ``wgmma``, the
  online softmax in float32 registers with ``m`` in raw units of ``S`` and ``p = exp2((s -
  m) * c)``, ``c = sm_scale · log2 e · amax_q · amax_k / 448²`` (the subtraction before the
  multiplication: no FMA can lose the largest logit, see
  ``kernels.mosaic_variants.softmax_block``; ``c`` is clipped to float32's normal range,
  and where it would underflow every visible key gets ``p = 1``, the limit), then ``P · 256``
  rounded to e4m3 into shared memory (256, a power of two: exact to undo; ``p <= 1`` so
  at most 256 < 448) and ``O += P Vᵀᵀ`` on e4m3 ``wgmma``. The row sum ``l`` adds the
  float32 ``p`` before rounding. At the end ``O / (l · 448 · 256)``, clipped to [-1, 1]
  (the rounded weights may sum to 1 ± 2⁻⁴, and attention's output lies within V's range),
  times ``amax_v``, in the input dtype.
- **Masks.** ``causal`` is top-left (``col <= row``) and ``kv_lengths`` masks keys at or
  past each batch row's length; both cut the key blocks streamed (the pipeline's grid is
  dynamic) and set masked logits to ``-inf``, in the blocks that need it only (a block
  every row of the tile sees wholly skips the mask's per-element work). Under ``causal``
  the grid's query blocks run heaviest first (the last CTAs launched are the lightest).
  A row that sees no key returns zeros (its running max stays ``-inf`` and is replaced
  by 0 where it is used, so no ``-inf - -inf``).
  GQA by index mapping (query head ``h`` reads K/V head ``h // group``).

Accuracy. What it costs is the point of the kernel: e4m3 keeps 3 significand bits, so
each input element is off by up to 2⁻⁴ of its value, and Hopper's e4m3 ``wgmma``
accumulates with about 14 bits (measured, ``kernels.fp8_probe``). It is not meant to meet
the bf16 kernels' tolerance; the gate's registered FP8 criteria decide whether it is good
enough.

Limits (:func:`check_fp8_shapes`): bf16/f16 inputs; head_dim 128 or 256 (e4m3 rows of one
or two 128-byte swizzle groups; FA3's FP8 peer is head_dim 128 too); ``q_len`` a multiple of 64
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
HEAD_DIMS = (128, 256)
"""head_dims served: e4m3 rows of whole 128-byte swizzle groups (one or two); a caller
pads smaller head_dims with zero columns (``kernels.pallas_mosaic_gpu_fp8``)."""
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
    """``(x_e4m3, amax)`` for ``x`` of shape ``(B, S, H, D)``: head-major ``(B·H, S, D)``
    e4m3 holding ``x · 448 / amax`` (so ``x ≈ x_e4m3 · amax / 448``) and ``amax`` ``(B·H,)``
    float32, the largest ``|x|`` per (batch, head) (1 where a head is all zero).

    ``x · 448 / amax`` is taken as ``x · 2^-h · 2^-(e-h) · (448 / mantissa)`` (``amax =
    mantissa · 2^e``, ``jnp.frexp``, ``h = e // 2``), three multiplications by per-head
    float32 factors that are all normal: XLA turns a division by a broadcast value into a
    multiplication by its reciprocal, and ``1 / amax`` flushes to zero (XLA flushes
    subnormals) for ``amax`` above about 8.5e37 (bf16's top: every element became 0), as a
    scale ``amax / 448`` does below about 5e-36 (every element ``x / 0``); a single factor
    ``2^-e`` would be subnormal at ``e > 126``. The powers of two are exact; ``448 /
    mantissa`` lies in (448, 896]. (An element-wise ``jnp.ldexp`` did the same exactly but
    lowers to a ``power`` per element, the suspect for the 10-24 % of its TFLOP/s the
    kernel lost on an H100 after it went in.) Subnormal inputs are flushed to zero before
    any of this where XLA flushes subnormals (its CPU backend, at the conversion to
    float32): a head of subnormals only quantises to zeros there. Raises nothing of its
    own."""
    b, s, h, d = x.shape
    xf = jnp.transpose(x.astype(jnp.float32), (0, 2, 1, 3)).reshape(b * h, s, d)
    amax = jnp.max(jnp.abs(xf), axis=(1, 2))
    amax = jnp.where(amax > 0, amax, jnp.float32(1.0))
    mantissa, exponent = jnp.frexp(amax)
    half = exponent // 2
    one = jnp.float32(1.0)
    first, second = jnp.ldexp(one, -half), jnp.ldexp(one, half - exponent)
    unit = (xf * first[:, None, None]) * second[:, None, None]  # x / 2^e, exact
    scale = jnp.float32(E4M3_MAX) / mantissa
    return (unit * scale[:, None, None]).astype(E4M3), amax


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
        q_ref, k_ref, vt_ref, c_ref, vmax_ref, o_ref, q_smem, p_smem, o_smem, q_bar = refs
        qb, bh = lax.axis_index("qb"), lax.axis_index("bh")
        if causal:  # heavy query blocks first: the grid's last CTAs are the lightest
            qb = jnp.int32(q_len // block_q - 1) - qb
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
                def masked(s):
                    cols = ki * block_kv + iota((block_q, block_kv), 1)
                    visible = cols < kv_end
                    if causal:
                        rows = row0 + iota((block_q, block_kv), 0)
                        visible = jnp.logical_and(visible, cols <= rows)
                    return jnp.where(visible, s, -jnp.inf)

                # Only blocks some row cannot see wholly are masked: under causal those
                # crossing the diagonal (every block past the first row's), with lengths
                # the one holding kv_end. The others skip the iota, compare and select.
                last_col = (ki + 1) * block_kv - 1
                seen = last_col < kv_end
                if causal:
                    seen = jnp.logical_and(seen, last_col <= row0)
                s = lax.cond(seen, lambda s: s, masked, s)
            m_new = jnp.maximum(m_i, s.max(axis=1))
            m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row with no key yet
            # the first block's rescale is 0 whatever c (c may be 0: logits that
            # underflow float32, where -inf * 0 would be NaN)
            alpha = jnp.where(m_i == -jnp.inf, 0.0, jnp.exp2((m_i - m_use) * c))
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
        # acc / l is in units of V's e4m3 values times P_SCALE: bring it to [-1, 1]
        # first, then times V's amax (a scale amax / (448 · 256) would flush to zero for
        # small heads). The clip keeps the output inside V's range, as attention's is:
        # l sums the unrounded p while acc took p rounded to e4m3, so the weights may sum
        # to 1 ± 2^-4 and a V near the dtype's maximum would otherwise overflow to inf.
        inv_l = jnp.where(l_i > 0.0, 1.0 / jnp.where(l_i > 0.0, l_i, 1.0), 0.0)
        unit = acc * lax.broadcast_in_dim(inv_l * (1.0 / (E4M3_MAX * P_SCALE)), acc.shape, [0])
        vmax = vmax_ref[bh]
        out = jnp.minimum(jnp.maximum(unit, -1.0), 1.0) * vmax
        o_smem[...] = out.astype(out_dtype)
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
        kv_lengths: optional ``(B,)`` int32, keys at or past it masked (clipped to
            ``[0, Lk]``).
        sm_scale: default ``1 / sqrt(D)``; finite and positive.
        stages: shared-memory slots of the key/value pipeline.
        interpret: run in JAX's GPU interpret mode (CPU tests).

    Returns:
        ``(B, Lq, H, D)`` in the inputs' dtype.

    Raises:
        TypeError, ValueError: as :func:`check_fp8_shapes`; ``sm_scale`` not finite and
            positive.
    """
    check_fp8_shapes(q.shape, k.shape, v.shape, q.dtype)
    batch, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    sm = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    if not (math.isfinite(sm) and sm > 0):
        raise ValueError(f"sm_scale must be a finite positive float, got {sm_scale}")
    q8, amax_q = quantize_per_head(q)
    k8, amax_k = quantize_per_head(k)
    v8, amax_v = quantize_per_head(v)
    vt8 = jnp.swapaxes(v8, 1, 2)  # (B·Hkv, D, Lk): K-major for P V
    group = heads // kv_heads
    kv_of_q = (jnp.arange(batch * heads) // heads) * kv_heads + (jnp.arange(batch * heads)
                                                                 % heads) // group
    # logits in raw e4m3 units times c are the true logits in log2 units. Kept finite:
    # where q and k are so large that the true logits pass float32, the largest logit
    # still gets p = 1 and the others 0 (attention's limit); where c underflows to 0,
    # every visible key gets p = 1 (the limit of logits that vanish). The floor is the
    # smallest normal float32, not 0: a masked logit (-inf) times 0 would be NaN.
    c = amax_q * amax_k[kv_of_q] * jnp.float32(sm * math.log2(math.e) / E4M3_MAX ** 2)
    c = jnp.clip(c, jnp.finfo(jnp.float32).tiny, jnp.finfo(jnp.float32).max)
    call = _build(batch=batch, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len,
                  d=d, causal=causal, has_lengths=kv_lengths is not None, out_dtype=q.dtype,
                  block_q=BLOCK_Q, block_kv=BLOCK_KV, stages=stages, interpret=interpret)
    operands = [q8, k8, vt8, c, amax_v[kv_of_q]]
    if kv_lengths is not None:  # past kv_len would stream blocks past the keys' end
        operands.insert(0, jnp.clip(jnp.asarray(kv_lengths, jnp.int32), 0, kv_len))
    out = call(*operands)
    return jnp.transpose(out.reshape(batch, heads, q_len, d), (0, 2, 1, 3))
