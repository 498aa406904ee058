"""The persistent tile schedule of ``kernels.pallas_mosaic_gpu``: which (batch-head,
query pair) each CTA computes at each step, balanced for causal masks.

Pure index arithmetic on int32 arrays (no Mosaic GPU import), so it is tested on a CPU
(``tests/test_kernels_pallas_mosaic_gpu.py``) and the kernel calls it with scalars.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def tile_schedule(step, *, batch_heads: int, num_q_pairs: int, num_ctas: int, causal: bool):
    """``(flat batch·head, query pair)`` of persistent step ``step`` (an int32 array:
    a scalar in the kernel, a vector in tests). ``plgpu.nd_loop`` hands step ``t`` to
    CTA ``t mod num_ctas``, so this bijection decides what each CTA computes.

    Without ``causal`` (every tile the same work): head-major, query pairs in order.

    With ``causal`` and an even ``num_q_pairs`` (``Q``): the query pairs of a head form
    *units* ``(Q-1-i, i)``, a heavy and a light pair whose K/V block counts add up to
    (nearly) the same number for every ``i``: ``(Q + 1) · 2·block_q / block_kv`` when
    ``block_kv`` divides ``2·block_q``, ``Q/2 + 1`` at 64/256. Unit ``u`` of each
    round of ``num_ctas`` units goes to CTA ``u mod num_ctas``, which runs its heavy pair
    at step ``2r`` and its light pair at step ``2r + 1``, so every CTA does the same
    causal work up to one unit. The last, partial round is split so that the CTAs that
    get a tile there get either a whole unit or a single pair. This is the heavy/light
    pairing of the "zigzag" causal load balancing used for context parallelism (e.g.
    Megatron-LM's context parallel, ring-flash-attention's ``zigzag_ring_flash_attn``;
    Brandon et al. 2023, "Striped Attention", arXiv:2311.09431, discuss the imbalance),
    applied to a static persistent grid. FlashAttention-3's persistent schedulers
    (``hopper/tile_scheduler.hpp``, ``DynamicPersistentTileScheduler``) instead hand
    tiles out longest-processing-time-first through an atomic counter, over sections of
    heads sized for L2; with this kernel's static strided hand-out, longest-first alone
    left CTAs with 435 to 1568 K/V blocks at causal B1 H16 S16384 (mean 1001;
    kernels/tools/NOTES-gpu.md).
    Consecutive units are consecutive pairs of one head, so the tiles in flight at one
    time still come from about ``num_ctas / (Q/2)`` heads (their K/V shared in L2).

    Causal with an odd ``Q`` keeps the plain rotation, heaviest pair first.
    """
    step = jnp.asarray(step, jnp.int32)

    def div(a, d):
        return lax.div(a, jnp.int32(d))

    def rem(a, d):
        return lax.rem(a, jnp.int32(d))

    q = num_q_pairs
    if not causal or q % 2:
        qi = rem(step, q)
        return div(step, q), (q - 1 - qi) if causal else qi
    half = q // 2
    p = num_ctas
    full_rounds, rest = divmod(batch_heads * half, p)  # batch_heads * half units
    paired_in_tail = max(2 * rest - p, 0)  # tail CTAs that get a whole unit
    k, j = div(step, p), rem(step, p)
    tail_base = full_rounds * p
    single = j - paired_in_tail  # index among the tail's single pairs
    in_tail = k >= 2 * full_rounds
    tail_pair = j < paired_in_tail
    unit = jnp.where(in_tail,
                     jnp.where(tail_pair, tail_base + j, tail_base + paired_in_tail
                               + div(jnp.maximum(single, 0), 2)),
                     div(k, 2) * p + j)
    light = jnp.where(in_tail,
                      jnp.where(tail_pair, k - 2 * full_rounds, rem(jnp.maximum(single, 0), 2)),
                      rem(k, 2))
    i = rem(unit, half)
    return div(unit, half), jnp.where(light == 1, i, q - 1 - i)
