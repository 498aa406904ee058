"""Adapters from ``jax.nn.dot_product_attention`` (XLA and cuDNN) to the contract.

``jax.nn.dot_product_attention`` already follows the layout, GQA and causal
conventions; the adapters add the contract's rule that a query row which sees no
key (padding) returns zeros, since the library leaves such rows unspecified.

Precision: the XLA adapter computes float32 calls at full float32 precision on every
backend: the library call runs inside ``jax.default_matmul_precision("highest")``, so its
einsums (which take the default precision) never use TF32 on a GPU or bf16 passes on a
TPU (TF32 gave 2-5e-4 relative error on an H200). The context is part of
``jax.jit``'s trace context, so it applies under ``jit`` too. cuDNN runs bf16/f16 only.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from kernels.contract import AttentionSpec, row_has_key, zero_padding
from kernels.kernel import Capability, Kernel

FLOAT32_PRECISION = "highest"
"""``jax.default_matmul_precision`` of float32 calls (declared in the registry)."""


def _dot_product_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, implementation):
    if q.dtype == jnp.float16 and implementation == "xla" and jax.default_backend() == "cpu":
        # XLA:CPU has no f16 x f16 -> f32 dot (the library asks for f32 accumulation);
        # computing in f32 and rounding once keeps the contract's f32 accumulation.
        out = _dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                     v.astype(jnp.float32), causal=causal, scale=scale,
                                     q_lengths=q_lengths, kv_lengths=kv_lengths,
                                     implementation=implementation)
        return out.astype(q.dtype)
    batch, q_len = q.shape[0], q.shape[1]
    kv_len = k.shape[1]
    # Padding is not data: the library multiplies masked positions (0 * NaN = NaN).
    q, k, v = zero_padding(q, q_lengths), zero_padding(k, kv_lengths), zero_padding(v, kv_lengths)
    # The library requires both lengths when either is given.
    ql = q_lengths if q_lengths is not None or kv_lengths is None else jnp.full((batch,), q_len, jnp.int32)
    kl = kv_lengths if kv_lengths is not None or q_lengths is None else jnp.full((batch,), kv_len, jnp.int32)
    with (jax.default_matmul_precision(FLOAT32_PRECISION) if q.dtype == jnp.float32
          else contextlib.nullcontext()):
        out = jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=causal,
            query_seq_lengths=ql, key_value_seq_lengths=kl, implementation=implementation,
        )
    if q_lengths is None and kv_lengths is None:
        return out
    return jnp.where(row_has_key(q_len, q_lengths=q_lengths, kv_lengths=kv_lengths), out, 0).astype(q.dtype)


def xla_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """``jax.nn.dot_product_attention(implementation="xla")`` under the contract.

    Shapes as ``kernels.attention``; ``config`` is ignored (XLA picks its own tiling).
    Float32 calls run under ``jax.default_matmul_precision("highest")``: full float32
    products on every backend (never TF32/bf16).
    """
    del config
    return _dot_product_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                                  kv_lengths=kv_lengths, implementation="xla")


def cudnn_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """``jax.nn.dot_product_attention(implementation="cudnn")`` (NVIDIA's fused
    flash attention) under the contract. GPU only; bf16/f16; see
    ``CudnnKernel.check_supported`` for the shape limits."""
    del config
    return _dot_product_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                                  kv_lengths=kv_lengths, implementation="cudnn")


xla_attention = jax.named_call(xla_attention, name="kernelgate_xla_attention")
cudnn_attention = jax.named_call(cudnn_attention, name="kernelgate_cudnn_attention")


class XlaKernel(Kernel):
    """The registry's ``xla``: every call on every backend, untiled (a config with any
    block size is refused: XLA picks its own tiling); float32 at HIGHEST. ``auto`` runs it
    first on a CPU host and after the flash kernels elsewhere."""

    name = "xla"
    description = "jax.nn.dot_product_attention(implementation='xla')"
    native_platforms = ("cpu", "gpu", "tpu")
    forward = staticmethod(xla_attention)
    auto_priority = {"cpu": 10, "gpu": 80, "tpu": 80}
    float32_matmul_precision = FLOAT32_PRECISION
    trace_name = "kernelgate_xla_attention"


class CudnnKernel(Kernel):
    """The registry's ``cudnn``: NVIDIA's fused flash attention, bf16/f16 on a GPU
    (``auto`` tries it right after pallas_gpu there, unless the measured table puts
    another kernel first); its lowering queries the local cuDNN, so it exports only from
    a GPU host."""

    name = "cudnn"
    description = "jax.nn.dot_product_attention(implementation='cudnn')"
    native_platforms = ("gpu",)
    capability = Capability(dtypes=("bfloat16", "float16"), max_head_dim=256,
                            head_dim_multiple=8)
    forward = staticmethod(cudnn_attention)
    auto_priority = {"gpu": 20}
    trace_name = "kernelgate_cudnn_attention"
    export_needs_local_device = True
    # XLA builds and deserializes cuDNN graphs at executable load, which crashes the
    # process when other threads compile or load at the same time (Kernel docstring)
    concurrent_first_call = False

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise ``NotImplementedError`` with the reason when cuDNN cannot run ``spec``.

        Raises:
            NotImplementedError: not a GPU, a dtype other than bf16/f16, or a head_dim cuDNN
                does not take (a multiple of 8, at most 256).
            ValueError: block sizes were given (cuDNN picks its own tiling).
        """
        self.config_from(config)
        if backend != "gpu":
            raise NotImplementedError(f"cudnn needs an NVIDIA GPU; the backend is {backend}")
        if spec.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise NotImplementedError(f"cudnn flash attention supports bf16/f16, not {spec.dtype}")
        if spec.head_dim % 8 or spec.head_dim > 256:
            raise NotImplementedError(
                f"cudnn needs head_dim a multiple of 8 and <= 256, got {spec.head_dim}")
