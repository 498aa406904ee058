"""Naive attention: materialise the logits, softmax, multiply. The baseline.

It builds the full ``[batch, heads, q_len, kv_len]`` logits tensor, so its memory
grows with ``q_len * kv_len``; that is the cost flash attention removes.

Precision: float32 inputs are multiplied at full float32 precision on every backend
(``precision=Precision.HIGHEST``, float32 accumulation). JAX's default would let a GPU
use TF32 (relative error 2-5e-4 measured on an H200, 0.83 on large logits) and a TPU
bf16 passes, which would make the baseline, and every error ratio to it, 100x looser
than float32 (TF32 was measured doing exactly that on the H200). bf16/f16 products take the backend's native path with float32
accumulation, as the contract says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.contract import row_has_key, visibility_mask, zero_padding
from kernels.kernel import Kernel

FLOAT32_PRECISION = jax.lax.Precision.HIGHEST
"""Matrix-product precision of float32 calls (declared in the registry as ``highest``)."""


def naive_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Materialised attention (validated inputs; see ``kernels.attention``).

    Logits and softmax are computed in float32; the probabilities are cast back
    to the input dtype for the value product (float32 accumulation), as a plain
    ``softmax(q k^T) v`` written in JAX would do. Float32 products run at
    ``Precision.HIGHEST`` (full float32, never TF32 or bf16 passes) on every backend.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]``; k, v: ``[batch, kv_len, num_kv_heads, head_dim]``.
        config: ignored (no tiling).

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in ``q.dtype``.
    """
    del config
    # masked probabilities are 0, but 0 * NaN is NaN: padded keys/values must be zeros
    k, v = zero_padding(k, kv_lengths), zero_padding(v, kv_lengths)
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    precision = FLOAT32_PRECISION if q.dtype == jnp.float32 else None
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision,
                        preferred_element_type=jnp.float32) * scale
    mask = visibility_mask(q.shape[1], k.shape[1], causal=causal,
                           q_lengths=q_lengths, kv_lengths=kv_lengths)
    logits = jnp.where(mask, logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    p = jnp.exp(logits - row_max)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = (p / jnp.where(denom == 0, 1.0, denom)).astype(q.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=precision,
                     preferred_element_type=jnp.float32)
    out = jnp.where(row_has_key(q.shape[1], q_lengths=q_lengths, kv_lengths=kv_lengths), out, 0.0)
    return out.astype(q.dtype)


naive_attention = jax.named_call(naive_attention, name="kernelgate_naive_attention")


class NaiveKernel(Kernel):
    """The registry's ``naive``: every call on every backend, untiled (the baseline, and
    ``auto``'s last resort everywhere); a config with any block size is refused."""

    name = "naive"
    description = "materialised logits, softmax, matmul (the baseline)"
    native_platforms = ("cpu", "gpu", "tpu")
    forward = staticmethod(naive_attention)
    auto_priority = {"cpu": 90, "gpu": 90, "tpu": 90}
    float32_matmul_precision = "highest"
    trace_name = "kernelgate_naive_attention"
