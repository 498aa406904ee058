"""A variant of ``pallas_mosaic_gpu`` against float64 on a small shape of its own: causal,
GQA, lengths that are no tile multiples, one example padded (``kernels.tools.variants``
runs it beside each timed row)."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from kernels.mosaic_variants import MosaicVariant
from kernels.naive import naive_attention
from kernels.pallas_mosaic_gpu import MosaicConfig, pallas_mosaic_gpu_attention
from kernels.reference import attention_reference, relative_error
from kernels.tools import bench


def small_check(variant: MosaicVariant, config: MosaicConfig | None, head_dim: int,
                dtype: str, seed: int, *, seqs: tuple[int, int] = (1000, 1100),
                interpret: bool = False) -> dict[str, Any]:
    """The variant on a small causal GQA shape (B2, H4/2, ``seqs`` = (q_len, kv_len)
    with lengths that are no tile multiples, the second example padded) against float64;
    ``correct``: finite, within ``bench.ERROR_RATIO_LIMIT`` of naive's error (floor
    ``bench.ERROR_FLOOR``), padded query rows exactly zero."""
    rng = np.random.default_rng(seed)
    (b, h, hkv), (sq, skv) = (2, 4, 2), seqs
    q = jnp.asarray(rng.standard_normal((b, sq, h, head_dim)), dtype)
    k = jnp.asarray(rng.standard_normal((b, skv, hkv, head_dim)), dtype)
    v = jnp.asarray(rng.standard_normal((b, skv, hkv, head_dim)), dtype)
    ql = jnp.array([sq, (sq * 3) // 5], jnp.int32)
    kl = jnp.array([skv, (skv * 2) // 3], jnp.int32)
    scale = 1.0 / math.sqrt(head_dim)
    out = pallas_mosaic_gpu_attention(q, k, v, causal=True, scale=scale, q_lengths=ql,
                                      kv_lengths=kl, config=config, variant=variant,
                                      interpret=interpret)
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = attention_reference(q, k, v, causal=True, scale=scale, q_lengths=ql, kv_lengths=kl)
    naive = naive_attention(q, k, v, causal=True, scale=scale, q_lengths=ql, kv_lengths=kl)
    err = relative_error(out, ref)
    base = max(relative_error(np.asarray(jnp.asarray(naive, jnp.float32), np.float64), ref),
               bench.ERROR_FLOOR[dtype])
    padded = np.arange(sq)[None, :] >= np.asarray(ql)[:, None]
    return {"rel_error": err, "error_ratio": err / base,
            "correct": bool(np.isfinite(err) and err / base <= bench.ERROR_RATIO_LIMIT
                            and np.all(out[padded] == 0.0))}
