"""Float64 NumPy reference attention: the correctness oracle for every kernel."""

from __future__ import annotations

import math

import numpy as np


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        q_lengths=None, kv_lengths=None) -> np.ndarray:
    """Exact attention in float64 with the contract of ``kernels.contract``.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]`` (any float dtype; upcast to float64).
        k, v: ``[batch, kv_len, num_kv_heads, head_dim]``.
        causal, scale, q_lengths, kv_lengths: as ``kernels.attention``.

    Returns:
        float64 ``[batch, q_len, num_heads, head_dim]``; rows that see no key are 0.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    qi = np.arange(q_len)[:, None]
    kj = np.arange(kv_len)[None, :]
    mask = np.broadcast_to(kj <= qi if causal else np.ones((q_len, kv_len), bool),
                           (batch, 1, q_len, kv_len)).copy()
    if q_lengths is not None:
        mask &= (qi[None, None] < np.asarray(q_lengths)[:, None, None, None])
    if kv_lengths is not None:
        mask &= (kj[None, None] < np.asarray(kv_lengths)[:, None, None, None])
    logits = np.where(mask, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(logits - row_max)
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p / np.where(denom == 0, 1.0, denom), v)
    return out


def relative_error(out, ref) -> float:
    """``||out - ref||_2 / ||ref||_2`` in float64 (``inf`` if ``out`` is non-finite;
    the absolute norm when ``ref`` is all zeros)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    num = np.linalg.norm(out - ref)
    den = np.linalg.norm(ref)
    return float(num / den) if den > 0 else float(num)
