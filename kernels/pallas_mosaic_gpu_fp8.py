"""The e4m3 attention kernel as a registered kernel (``pallas_mosaic_gpu_fp8``): the
contract's calls mapped onto ``kernels.fp8_attention``.

What the contract asks and the kernel does not do itself is done here:

- **Padding is not data.** Query rows at or past ``q_lengths`` and key/value rows at or
  past ``kv_lengths`` are zeroed *before* quantisation: the per-head scale is the head's
  amax, and a padded position holding the dtype's maximum or NaN would otherwise set the
  scale of every valid row (or make it NaN). Masked keys are also masked in the kernel.
- **Lengths that are not tile multiples.** ``q_len`` is zero-padded to a multiple of 64
  and ``kv_len`` to one of 128; the padded keys are masked through the kernel's
  ``kv_lengths`` (the true ``kv_len`` when none was given), the padded rows sliced off.
- **head_dim below the kernel's.** Q, K and V get zero columns up to the next of
  ``HEAD_DIMS`` (128 or 256: e4m3 rows of whole 128-byte swizzle groups), sliced off the
  output. Exact: zero columns add nothing to ``Q Kᵀ`` or to a head's amax, and the logit
  scale is the contract's (of the true head_dim). The padded work is paid in time: at
  head_dim 64 half the products, at MiniLM's 32 three quarters, are zeros, which the
  gate's speed criteria see.
- **Rows that see no key** (``row_has_key``) come out as zeros.

Capability: bf16/f16 at head_dim <= 256, GQA, causal (top-left, any ``q_len``/``kv_len``,
with lengths), native on Hopper only: a CPU host is refused (tests run
``kernels.fp8_attention`` itself in JAX's GPU interpret mode). Untiled (64 x 128 tiles,
2 pipeline slots). ``auto`` never picks it: an FP8 kernel trades accuracy for speed, which
a registration judges (the gate's thresholds), not an order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.contract import AttentionSpec, row_has_key, zero_padding
from kernels.fp8_attention import BLOCK_KV, BLOCK_Q, HEAD_DIMS, KERNEL_NAME, fp8_attention
from kernels.gpu_limits import hopper_refusal
from kernels.kernel import Capability, Kernel, round_up

_GPU_PLATFORMS = ("gpu", "cuda")


def fp8_contract_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None,
                           interpret: bool = False):
    """The contract's call on the e4m3 kernel.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]`` bf16/f16, head_dim <= 256.
        k, v: ``[batch, kv_len, num_kv_heads, head_dim]``, q's dtype.
        causal: top-left causal mask.
        scale: the logit scale (a Python float).
        q_lengths, kv_lengths: int32 ``[batch]`` or None.
        config: ignored (untiled).
        interpret: JAX's GPU interpret mode (CPU tests).

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in q's dtype; rows that see no key are 0.

    Raises:
        TypeError, ValueError: as ``kernels.fp8_attention.check_fp8_shapes`` after
            padding (a dtype or head_dim it does not serve, a bad GQA grouping).
    """
    del config
    batch, q_len, _, head_dim = q.shape
    kv_len = k.shape[1]
    q = zero_padding(q, q_lengths)
    k, v = zero_padding(k, kv_lengths), zero_padding(v, kv_lengths)
    q_pad, kv_pad = round_up(q_len, BLOCK_Q), round_up(kv_len, BLOCK_KV)
    d_pad = next((d for d in HEAD_DIMS if d >= head_dim), head_dim)  # past 256: refused
    q = jnp.pad(q, ((0, 0), (0, q_pad - q_len), (0, 0), (0, d_pad - head_dim)))
    widths = ((0, 0), (0, kv_pad - kv_len), (0, 0), (0, d_pad - head_dim))
    k, v = jnp.pad(k, widths), jnp.pad(v, widths)
    # traced lengths past kv_len are not refused by the contract's check: clipped here, as
    # the reference's mask reads them, or the zero keys padded to kv_pad would be attended
    lengths = None if kv_lengths is None else jnp.minimum(kv_lengths, kv_len)
    if lengths is None and kv_pad != kv_len:
        lengths = jnp.full((batch,), kv_len, jnp.int32)
    out = fp8_attention(q, k, v, causal=bool(causal), kv_lengths=lengths,
                        sm_scale=float(scale), interpret=interpret)[:, :q_len, :, :head_dim]
    if q_lengths is None and kv_lengths is None:
        return out
    rows = row_has_key(q_len, q_lengths=q_lengths, kv_lengths=kv_lengths)
    return jnp.where(rows, out, jnp.zeros((), out.dtype)).astype(q.dtype)


fp8_contract_attention = jax.named_call(fp8_contract_attention, name=KERNEL_NAME)


class PallasMosaicGpuFp8Kernel(Kernel):
    """The registry's ``pallas_mosaic_gpu_fp8``: flash attention with both products on
    Hopper's e4m3 ``wgmma`` (``kernels.fp8_attention``); bf16/f16 at head_dim <= 256
    (padded to 128 or 256);
    native on sm_90 only; untiled; not in ``auto``'s order."""

    name = "pallas_mosaic_gpu_fp8"
    description = "flash attention with Q K^T and P V on e4m3 wgmma (Pallas/Mosaic GPU, Hopper)"
    native_platforms = ("gpu",)
    capability = Capability(dtypes=("bfloat16", "float16"), max_head_dim=max(HEAD_DIMS))
    forward = staticmethod(fp8_contract_attention)
    operand_dtype = "float8_e4m3fn"
    trace_name = KERNEL_NAME
    ours = True

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise when it cannot run ``spec`` on ``backend``.

        Raises:
            ValueError: block sizes were given (it does not tile).
            NotImplementedError: a dtype other than bf16/f16 or head_dim above 256 (e4m3
                rows of at most two 128-byte swizzle groups); a backend other than an
                NVIDIA GPU; a GPU that is not Hopper (sm_90: e4m3 ``wgmma``).
        """
        self.config_from(config)
        why = self.capability.refusal(spec.dtype, spec.head_dim)
        if why is not None:
            raise NotImplementedError(f"{self.name} {why} (e4m3 rows of at most two "
                                      "128-byte swizzle groups: head_dim <= 256, bf16/f16 "
                                      "inputs)")
        if backend not in _GPU_PLATFORMS:
            raise NotImplementedError(
                f"{self.name} is native to NVIDIA Hopper GPUs (e4m3 wgmma) and has no CPU "
                f"mode; backend {backend!r}")
        not_hopper = hopper_refusal(self.name, "e4m3 wgmma")
        if not_hopper is not None:
            raise NotImplementedError(not_hopper)
