"""The attention contract: input validation and the visibility mask every
implementation agrees on.

Conventions follow ``jax.nn.dot_product_attention``: ``q`` is
``[batch, q_len, num_heads, head_dim]``, ``k``/``v`` are
``[batch, kv_len, num_kv_heads, head_dim]``; causal masking is top-left aligned
(query ``i`` sees key ``j`` only when ``j <= i``). With per-example lengths, query
``i`` of example ``b`` sees key ``j`` iff ``i < q_lengths[b]``,
``j < kv_lengths[b]`` and, when causal, ``j <= i``. A query row that sees no key
returns zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from kernels.shapes import AttentionShape

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@dataclass(frozen=True)
class AttentionSpec:
    """Static facts about one validated call (all sizes in elements)."""

    batch: int
    q_len: int
    kv_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: jnp.dtype
    causal: bool
    scale: float
    has_lengths: bool

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 = multi-head, num_heads = multi-query)."""
        return self.num_heads // self.num_kv_heads

    @property
    def shape(self) -> AttentionShape:
        """The call's problem shape (the single shape type, with the FLOP formula)."""
        return AttentionShape(batch=self.batch, q_len=self.q_len, kv_len=self.kv_len,
                              num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                              head_dim=self.head_dim, dtype=self.dtype.name, causal=self.causal)

    def flops(self) -> float:
        """Forward FLOPs (``AttentionShape.flops``)."""
        return self.shape.flops()


def _check_lengths(name: str, lengths, batch: int, limit: int):
    if lengths is None:
        return None
    if not hasattr(lengths, "shape"):
        lengths = np.asarray(lengths)
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"{name} must have shape [batch]=({batch},), got {tuple(lengths.shape)}")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {lengths.dtype}")
    if not isinstance(lengths, jax.core.Tracer):
        values = np.asarray(lengths)
        if values.size and (values.min() < 0 or values.max() > limit):
            raise ValueError(
                f"{name} must lie in [0, {limit}] (the padded sequence length), "
                f"got values in [{values.min()}, {values.max()}]"
            )
    return jnp.asarray(lengths, dtype=jnp.int32)


def validate(q, k, v, *, causal: bool = False, scale: float | None = None,
             q_lengths=None, kv_lengths=None):
    """Validate an attention call and resolve its defaults.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]``, float32/bfloat16/float16.
        k: ``[batch, kv_len, num_kv_heads, head_dim]``, same dtype as ``q``.
        v: same shape and dtype as ``k``.
        causal: top-left causal mask.
        scale: logit scale; ``None`` means ``1/sqrt(head_dim)``.
        q_lengths, kv_lengths: optional int ``[batch]`` valid lengths.

    Returns:
        ``(spec, q_lengths, kv_lengths)`` with lengths as int32 arrays or ``None``.

    Raises:
        ValueError: naming the violated constraint (rank, dtype, shapes, head
            divisibility, scale, lengths range).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(
                f"{name} must have rank 4 [batch, seq, heads, head_dim], got shape "
                f"{getattr(x, 'shape', None)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
        raise ValueError(f"dtype must be one of float32, bfloat16, float16, got {q.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    batch, q_len, num_heads, head_dim = q.shape
    kb, kv_len, num_kv_heads, k_dim = k.shape
    if kb != batch:
        raise ValueError(f"q and k/v must have the same batch size, got {batch} and {kb}")
    if k_dim != head_dim:
        raise ValueError(f"q and k/v must have the same head_dim, got {head_dim} and {k_dim}")
    if min(q_len, kv_len, head_dim, num_heads, num_kv_heads) == 0:
        raise ValueError(f"sequence lengths, heads and head_dim must be non-zero: q {q.shape}, k {k.shape}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) "
            "for grouped-query attention"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite positive number, got {scale}")
    q_lengths = _check_lengths("q_lengths", q_lengths, batch, q_len)
    kv_lengths = _check_lengths("kv_lengths", kv_lengths, batch, kv_len)
    spec = AttentionSpec(
        batch=batch, q_len=q_len, kv_len=kv_len, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=jnp.dtype(q.dtype),
        causal=bool(causal), scale=scale,
        has_lengths=q_lengths is not None or kv_lengths is not None,
    )
    return spec, q_lengths, kv_lengths


def visibility_mask(q_len: int, kv_len: int, *, causal: bool, q_lengths=None, kv_lengths=None):
    """Boolean ``[batch or 1, 1, q_len, kv_len]``: True where query ``i`` sees key ``j``."""
    qi = jnp.arange(q_len)[:, None]
    kj = jnp.arange(kv_len)[None, :]
    mask = jnp.ones((q_len, kv_len), bool)
    if causal:
        mask = kj <= qi
    mask = mask[None, None]
    if q_lengths is not None:
        mask = mask & (qi[None, None] < q_lengths[:, None, None, None])
    if kv_lengths is not None:
        mask = mask & (kj[None, None] < kv_lengths[:, None, None, None])
    return mask


def row_has_key(q_len: int, *, q_lengths=None, kv_lengths=None):
    """Boolean ``[batch or 1, q_len, 1, 1]``: True where a query row sees at least one key.

    With top-left causal masking key 0 is visible to every query row, so a row is
    empty only through padding.
    """
    rows = jnp.ones((1, q_len), bool)
    qi = jnp.arange(q_len)[None, :]
    if q_lengths is not None:
        rows = rows & (qi < q_lengths[:, None])
    if kv_lengths is not None:
        rows = rows & (kv_lengths[:, None] > 0)
    return rows[:, :, None, None]


def zero_padding(x, lengths):
    """``x`` (``[batch, seq, heads, head_dim]``) with every row at or past ``lengths``
    (int ``[batch]``; ``None``: no padding) set to zero.

    Padding is not data: a padded position may hold anything (NaN, inf, the dtype's
    maximum), and a masked probability of 0 times NaN is still NaN. Adapters whose
    library multiplies masked positions (the materialised baseline, XLA's and cuDNN's
    fused attention) zero them first; the Pallas kernels zero them inside the blocks
    that reach past a length, where it costs nothing extra.
    """
    if lengths is None:
        return x
    rows = jnp.arange(x.shape[1])[None, :] < jnp.asarray(lengths)[:, None]
    return jnp.where(rows[:, :, None, None], x, jnp.zeros((), x.dtype))
