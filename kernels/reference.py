"""Float64 NumPy reference attention: the correctness oracle for every kernel.

One reference for the whole project (tests, benchmark, autotune, evaluation). For long
sequences ``rows`` selects a sample of query rows: each is still exact attention
against *every* key, at a cost linear in the sequence length per row.
"""

from __future__ import annotations

import math

import numpy as np


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        q_lengths=None, kv_lengths=None, rows=None) -> np.ndarray:
    """Exact attention in float64 with the contract of ``kernels.contract``.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]`` (any float dtype; upcast to float64).
        k, v: ``[batch, kv_len, num_kv_heads, head_dim]``.
        causal, scale, q_lengths, kv_lengths: as ``kernels.attention``.
        rows: optional int array of query row indices (absolute, into ``q_len``); only
            those rows are computed, each against all keys.

    Returns:
        float64 ``[batch, q_len or len(rows), num_heads, head_dim]``; rows that see no
        key are 0.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    row_index = np.arange(q_len) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows is not None:
        q = q[:, row_index]
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    qi = row_index[:, None]
    kj = np.arange(kv_len)[None, :]
    visible = kj <= qi if causal else np.ones((len(row_index), kv_len), bool)
    mask = np.broadcast_to(visible, (batch, 1, len(row_index), kv_len)).copy()
    if q_lengths is not None:
        mask &= (qi[None, None] < np.asarray(q_lengths)[:, None, None, None])
    if kv_lengths is not None:
        mask &= (kj[None, None] < np.asarray(kv_lengths)[:, None, None, None])
    logits = np.where(mask, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    p = np.exp(logits - row_max)
    denom = p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p / np.where(denom == 0, 1.0, denom), v)


def relative_error(out, ref) -> float:
    """``||out - ref||_2 / ||ref||_2`` in float64, the project's one error measure.

    ``inf`` when ``out`` has a non-finite value; the absolute norm ``||out||`` when
    ``ref`` is all zeros (so a kernel that writes garbage where the answer is 0 fails).
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    num = np.linalg.norm(out - ref)
    den = np.linalg.norm(ref)
    return float(num / den) if den > 0 else float(num)
