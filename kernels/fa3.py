"""FlashAttention-3 as a registered kernel (``fa3``), through the flash-attn3-jax wheel.

FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024, "FlashAttention-3:
Fast and Accurate Attention with Asynchrony and Low-precision", arXiv:2407.08608) is
the Hopper (sm90) forward kernel with warp-specialised TMA loads, ``wgmma`` and softmax
overlapped with the matrix products. The ``flash-attn3-jax`` package (kyutai-labs,
BSD-3-Clause) binds its CUDA library to JAX through an XLA FFI custom call; its
published wheel is compiled for sm90 and head_dim 128 only, bf16/f16 inputs, with a
float32 accumulator and softmax.

What this kernel serves is exactly what that wheel serves, refused by name otherwise:

* an NVIDIA GPU of compute capability 9.0 (Hopper) with the optional extra installed
  (``pip install kernelgate[fa3]``); a CPU host has no wheel and is refused naming it;
* head_dim 128, bf16 or f16 (``Capability``);
* GQA/MQA as the wheel takes them (``num_heads`` a multiple of ``num_kv_heads``: the
  contract's grouping, query head ``h`` reads key/value head ``h // group``);
* ``causal`` only with ``q_len == kv_len``: FlashAttention aligns the causal mask to
  the bottom right (query ``i`` sees key ``j <= i + kv_len - q_len``), the contract to
  the top left (``j <= i``); the two agree only on square calls;
* lengths without ``causal``: ``kv_lengths`` through the wheel's variable-length entry
  (each example a full padded slot of the packed layout, ``seqused_k`` its valid
  keys), padded key/value rows zeroed first (padding is not data: a masked
  probability times NaN is NaN); rows at or past ``q_lengths`` and rows of an example
  with no valid key are set to zero afterwards. Causal calls with lengths are refused:
  with per-example key counts the wheel's bottom-right alignment moves per example.

Shapes and dtypes follow the contract (``kernels.contract``): q ``[batch, q_len,
num_heads, 128]``, k/v ``[batch, kv_len, num_kv_heads, 128]`` bf16/f16, lengths int32
``[batch]``; the output is shaped and typed like q. The wheel chooses its own tiles, so
the kernel is untiled (block sizes are refused, as for cuDNN).

``auto`` never picks it (no ``auto_priority``): a third-party kernel earns a place in
the order through evidence (the benchmark grid, where it appears as every GPU-native
kernel does, and a rollout through the gate), not by being declared first. Its wheel's
compiled library is outside the code digest, so a build records the installed
distribution's name, version and sha256 (``Kernel.third_party``) and a version's runner
refuses other bytes (``Kernel.check_third_party``).
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp

from kernels.contract import AttentionSpec, row_has_key, zero_padding
from kernels.gpu_limits import hopper_refusal
from kernels.kernel import Capability, Kernel

DISTRIBUTION = "flash-attn3-jax"
"""The wheel's distribution name (the ``fa3`` extra pins its version)."""
MODULE = "flash_attn3_jax"
"""The wheel's import name."""
EXTRA_HINT = "fa3 needs the optional extra: pip install kernelgate[fa3]"
"""The refusal on a host without the wheel (a CPU host always)."""
HEAD_DIM = 128
"""The only head_dim the published wheel is compiled for."""
COMPUTE_CAPABILITY = "9.0"
"""Hopper: the only architecture the published wheel is compiled for."""


def fa3_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """FlashAttention-3 under the contract (the wheel imported here, on first trace).

    Args:
        q: ``[batch, q_len, num_heads, 128]`` bf16/f16.
        k, v: ``[batch, kv_len, num_kv_heads, 128]``, q's dtype.
        causal: top-left causal mask (the caller has checked ``q_len == kv_len``).
        scale: the logit scale (a Python float).
        q_lengths, kv_lengths: int32 ``[batch]`` or None (not with ``causal``).
        config: ignored (the wheel tiles itself).

    Returns:
        ``[batch, q_len, num_heads, 128]`` in q's dtype; rows that see no key are 0.
    """
    del config
    from flash_attn3_jax import flash_mha, flash_mha_varlen

    batch, q_len, heads, dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    if kv_lengths is None:
        out = flash_mha(q, k, v, softmax_scale=float(scale), is_causal=bool(causal))
    else:
        # Each example keeps its padded slot in the packed layout; the wheel masks keys
        # at or past seqused_k, and the zeroed padding keeps NaN out of P @ V.
        k, v = zero_padding(k, kv_lengths), zero_padding(v, kv_lengths)
        starts = jnp.arange(batch + 1, dtype=jnp.int32)
        out = flash_mha_varlen(
            q.reshape(batch * q_len, heads, dim), k.reshape(batch * kv_len, kv_heads, dim),
            v.reshape(batch * kv_len, kv_heads, dim), starts * q_len, starts * kv_len,
            seqused_k=jnp.asarray(kv_lengths, jnp.int32), max_seqlen_q=q_len,
            max_seqlen_k=kv_len, softmax_scale=float(scale), is_causal=False,
        ).reshape(batch, q_len, heads, dim)
    if q_lengths is None and kv_lengths is None:
        return out
    rows = row_has_key(q_len, q_lengths=q_lengths, kv_lengths=kv_lengths)
    return jnp.where(rows, out, jnp.zeros((), out.dtype)).astype(q.dtype)


fa3_attention = jax.named_call(fa3_attention, name="kernelgate_fa3_attention")


class Fa3Kernel(Kernel):
    """The registry's ``fa3``: FlashAttention-3 (arXiv:2407.08608) from the
    flash-attn3-jax wheel, native on Hopper (sm90) only; bf16/f16 at head_dim 128;
    untiled; not in ``auto``'s order (see the module docstring)."""

    name = "fa3"
    description = "FlashAttention-3 (flash-attn3-jax wheel, sm90, head_dim 128)"
    native_platforms = ("gpu",)
    capability = Capability(dtypes=("bfloat16", "float16"), max_head_dim=HEAD_DIM,
                            head_dim_multiple=HEAD_DIM, causal_needs_square=True,
                            causal_with_lengths=False)
    forward = staticmethod(fa3_attention)
    trace_name = "kernelgate_fa3_attention"
    export_needs_local_device = True
    third_party = (DISTRIBUTION,)

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise with the reason when the wheel cannot run ``spec`` on ``backend``: first
        what the call asks (the same answer on every host), then the host.

        Raises:
            ValueError: block sizes were given (the wheel tiles itself).
            NotImplementedError: a dtype other than bf16/f16; head_dim other than 128;
                ``causal`` with ``q_len != kv_len`` (bottom-right vs top-left alignment)
                or with lengths; the wheel not installed (naming the extra); a backend
                other than a GPU; a local GPU that is not sm90.
        """
        self.config_from(config)
        why = self.capability.refusal(spec.dtype, spec.head_dim)
        if why is not None:
            raise NotImplementedError(f"fa3 {why} (the flash-attn3-jax wheel is compiled "
                                      f"for bf16/f16 at head_dim {HEAD_DIM} only)")
        if spec.causal and self.capability.causal_needs_square and spec.q_len != spec.kv_len:
            raise NotImplementedError(
                f"fa3 refuses causal with q_len != kv_len (got {spec.q_len} and "
                f"{spec.kv_len}): FlashAttention aligns the causal mask bottom-right, "
                "the contract top-left")
        if spec.causal and not self.capability.causal_with_lengths and spec.has_lengths:
            raise NotImplementedError(
                "fa3 refuses causal with q_lengths/kv_lengths: per-example lengths move "
                "FlashAttention's bottom-right causal alignment away from the contract's "
                "top-left one")
        if importlib.util.find_spec(MODULE) is None:
            raise NotImplementedError(f"{EXTRA_HINT} (the {DISTRIBUTION} wheel is not "
                                      f"installed; backend {backend})")
        if backend != "gpu":
            raise NotImplementedError(f"fa3 needs an NVIDIA Hopper GPU (sm90); the backend "
                                      f"is {backend}")
        not_sm90 = hopper_refusal("fa3", "its wheel, compiled for sm90 only", only_sm90=True)
        if not_sm90 is not None:
            raise NotImplementedError(not_sm90)
