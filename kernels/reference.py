"""Float64 NumPy reference attention: the correctness oracle for every kernel.

One reference for the whole project (tests, benchmark, autotune, evaluation). For long
sequences ``rows`` selects a sample of query rows: each is still exact attention
against *every* key, at a cost linear in the sequence length per row.
"""

from __future__ import annotations

import functools
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
    q, k, v, group, scale, row_index = _float64_operands(q, k, v, scale, rows)
    batch, q_len = q.shape[:2]
    kv_len = k.shape[1]
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


def _float64_operands(q, k, v, scale, rows):
    """``(q, k, v)`` as float64, the GQA group size, the resolved scale (1/sqrt(head_dim)
    by default) and the query rows (``rows`` or all), shared by both references."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    row_index = np.arange(q.shape[1]) if rows is None else np.asarray(rows, dtype=np.int64)
    return q, k, v, q.shape[2] // k.shape[2], scale, row_index


REFERENCE_ROW_BLOCK = 512
"""Query rows per step of ``attention_reference_jax``: bounds the float64 logits it holds
at once to ``batch * heads * 512 * kv_len * 8`` bytes (1 GiB at 16 heads x 16384 keys)."""


def attention_reference_jax(q, k, v, *, causal: bool = False, scale: float | None = None,
                            q_lengths=None, kv_lengths=None, rows=None) -> np.ndarray:
    """``attention_reference`` computed by JAX in float64 on the default device.

    The same formula as the NumPy reference (materialised logits, max-subtracted exp,
    masked keys at ``-inf``, rows that see no key are 0), evaluated in blocks of
    ``REFERENCE_ROW_BLOCK`` query rows against every key, so a 16384 x 16384 case needs
    no quadratic buffer. On a GPU float64 is native (an H200 does about 67 TFLOP/s in
    float64 on its tensor cores), which turns minutes of host NumPy into milliseconds.

    Args and returns: as ``attention_reference`` (float64 NumPy array out).

    Raises:
        NotImplementedError: on a TPU, which has no native float64 (JAX would emulate it
            in float32 pairs; use the NumPy reference there).
    """
    import jax
    import jax.numpy as jnp

    if jax.default_backend() == "tpu":
        raise NotImplementedError("TPUs have no native float64: use attention_reference (NumPy)")
    q, k, v, group, scale, row_index = _float64_operands(q, k, v, scale, rows)
    batch, q_len = q.shape[:2]
    kv_len = k.shape[1]
    q_lens = np.full(batch, q_len) if q_lengths is None else np.asarray(q_lengths)
    kv_lens = np.full(batch, kv_len) if kv_lengths is None else np.asarray(kv_lengths)
    step = min(REFERENCE_ROW_BLOCK, len(row_index))
    padded = np.resize(row_index, -(-len(row_index) // step) * step)  # pad by repeating rows
    with jax.enable_x64(True):
        block = functools.partial(_reference_rows_jit, causal=causal, scale=scale, group=group)
        kd, vd = jnp.asarray(k), jnp.asarray(v)
        qlen_d, kvlen_d = jnp.asarray(q_lens, jnp.int64), jnp.asarray(kv_lens, jnp.int64)
        parts = [np.asarray(block(jnp.asarray(q[:, padded[i:i + step]]), kd, vd,
                                  jnp.asarray(padded[i:i + step]), qlen_d, kvlen_d))
                 for i in range(0, len(padded), step)]
    return np.concatenate(parts, axis=1)[:, :len(row_index)]


def _reference_rows(q, k, v, rows, q_lens, kv_lens, *, causal, scale, group):
    """float64 attention of the query rows ``rows`` (``q``: ``[b, r, h, d]``) against all keys."""
    import jax.numpy as jnp

    b, r, h, d = q.shape
    qg = q.reshape(b, r, h // group, group, d)
    logits = jnp.einsum("brngd,bknd->bngrk", qg, k) * scale
    kj = jnp.arange(k.shape[1])
    mask = (rows[None, :, None] < q_lens[:, None, None]) & (kj[None, None, :] < kv_lens[:, None, None])
    if causal:
        mask &= kj[None, None, :] <= rows[None, :, None]
    logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    p = jnp.exp(logits - jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    denom = p.sum(axis=-1, keepdims=True)
    out = jnp.einsum("bngrk,bknd->brngd", p / jnp.where(denom == 0, 1.0, denom), v)
    return out.reshape(b, r, h, d)


UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
"""Unit roundoff u (half the machine epsilon) of each storage dtype the contract accepts."""


def rounding_floor(dtype, kv_len: int) -> float:
    """The relative error a correct implementation may show from rounding alone:
    ``u_dtype + u_float32 * sqrt(kv_len)`` (dimensionless, for ``relative_error``).

    * ``u_dtype``: rounding the output (and, for bf16/f16, the probabilities before the
      value product) to the storage dtype; a correctly rounded result already has a
      relative error up to ``u_dtype`` (about ``u_dtype / sqrt(3)`` on random data).
    * ``u_float32 * sqrt(kv_len)``: the float32 accumulation of the softmax sum and the
      value product over ``kv_len`` keys. ``u * sqrt(n)`` is the usual probabilistic
      estimate of recursive summation of ``n`` terms (rounding errors as a random walk;
      Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J.
      Sci. Comput. 41(5), 2019), where the worst case is ``u * n``. A flash kernel sums
      block by block in sequence, a materialised softmax often pairwise; both are exact
      algorithms and the difference between them is this term.

    Measured on the CPU (float32, head_dim 64, random normal q/k/v): naive's error is
    0.1-0.4 of this floor from 16 to 8192 keys, pallas_gpu's (interpret mode, 64-key
    blocks) 0.3-0.6, and the float64 result rounded to float32 about 2.5e-8 (0.01-0.1).
    TF32 products (u = 2^-11; 2-5e-4 measured on the H200) stay 25x or more above it at
    16384 keys, so a float32 kernel that silently uses TF32 is still caught. Used as the floor of the error ratio to the
    baseline (``evaluation.accuracy``) and in the benchmarks.

    Raises:
        KeyError: a dtype the contract does not accept.
    """
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return UNIT_ROUNDOFF[name] + UNIT_ROUNDOFF["float32"] * math.sqrt(max(int(kv_len), 1))


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


def _reference_rows_jit(*args, causal, scale, group):
    import jax

    global _JITTED
    if _JITTED is None:  # one jitted function: shapes seen before are not compiled again
        _JITTED = jax.jit(_reference_rows, static_argnames=("causal", "scale", "group"))
    return _JITTED(*args, causal=causal, scale=scale, group=group)


_JITTED = None
