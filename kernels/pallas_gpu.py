"""Flash-attention forward kernel for NVIDIA GPUs, written with Pallas (Triton lowering).

Algorithm: FlashAttention-2 forward (Dao, 2023, arXiv:2307.08691). Each program of the
launch grid owns one block of ``block_q`` query rows of one (batch, head) pair and walks
the key/value sequence in blocks of ``block_kv`` rows, keeping a running maximum ``m``,
a running sum ``l`` and an unnormalised float32 accumulator in registers (online
softmax); the ``[q_len, kv_len]`` logits matrix is never materialised. Exponentials are
taken in base 2 with ``scale * log2(e)`` folded in, one fused multiply-add per logit.

The key/value walk is split in two loops: blocks every query row of the program may
fully see run without any mask; only the blocks that straddle the causal diagonal or the
example's ``kv_length`` (and padding) pay for the mask. Blocks entirely above the causal
diagonal or past ``kv_length`` are never loaded.

Why the Triton lowering (not Mosaic GPU): it compiles with JAX 0.10.2 and 0.11.2
alike, runs on the CPU in Pallas interpret mode for the tests, and Triton emits Hopper
``wgmma`` for the tile products on sm_90. BENCHMARKS.md has the measured comparison.

Contract (``kernels.contract``): q ``[batch, q_len, num_heads, head_dim]``, k/v
``[batch, kv_len, num_kv_heads, head_dim]``; GQA reads kv head
``h // (num_heads // num_kv_heads)`` through the BlockSpec index map, so repeated K/V
are never materialised; causal is top-left (key ``j > i`` masked); a query row that
sees no key returns zeros; output shaped and typed like q.

Off-GPU the kernel runs in Pallas interpret mode (tests); the class's
``export_context("cuda")`` and ``export_disabled_checks("cuda")`` let ``jax.export``
serialise the native Triton kernel from a CPU-only host.

Config and tuning: :class:`TritonConfig` (block_q, block_kv, num_warps, num_stages) checks
itself; :class:`PallasGpuKernel` holds the default tiling per head_dim, the autotuner's
search space and the fitting of a measured tiling to the device. Shared memory: a tiling
is checked against the device's budget for the call's dtype and head_dim before launch
(``kernels.gpu_limits``), and the default tiling is shrunk until it fits
(``PallasGpuKernel.resolve_config``).

Kept in one module (over 350 lines) because a kernel file holds the kernel, its config
type, its tilings and its capability check, and nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from pydantic import Field, field_validator

from kernels.config import KernelConfig
from kernels.contract import AttentionSpec
from kernels.gpu_limits import (
    SharedMemoryBudget,
    effective_config,
    fit_config,
    padded_head_dim,
    shared_memory_budget,
    shared_memory_bytes,
)
from kernels.kernel import Capability, Kernel, round_up

KERNEL_NAME = "kernelgate_flash_attention_fwd_gpu"
"""Name of the ``pallas_call``: visible in HLO dumps and profiler traces."""

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
MAX_HEAD_DIM = 256
_GPU_PLATFORMS = ("gpu", "cuda")
_RUNNABLE_PLATFORMS = (*_GPU_PLATFORMS, "cpu")  # cpu: Pallas interpret mode
_LOG2_E = math.log2(math.e)

_TRITON_LOWERING = jax.make_user_context(default_value=False)

FLOAT32_PRECISIONS = {
    "highest": lax.Precision.HIGHEST,
    "tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
    "bf16x6": lax.DotAlgorithmPreset.BF16_BF16_F32_X6,
}
"""How float32 products may be lowered by Pallas' Triton backend (JAX 0.10-0.11,
``jax/_src/pallas/triton/lowering.py``, ``_dot_general_lowering``):

* ``Precision.HIGHEST`` -> ``tt.dot(input_precision=ieee)``: Triton does not use tensor
  cores for IEEE float32; it emits an FMA dot on the CUDA cores (about 67 TFLOP/s peak on
  an H200), exact float32 products with float32 accumulation: the same arithmetic as
  XLA's ``HIGHEST`` (cuBLAS FP32) baseline. This is what the kernel uses (the registry
  declares ``highest``), so the candidate and the baseline are compared at equal precision.
* ``TF32_TF32_F32_X3`` -> ``input_precision=tf32x3``: three TF32 tensor-core products
  (hi*hi + hi*lo + lo*hi), relative error per product about 2^-21 instead of 2^-24.
* ``BF16_BF16_F32_X6`` -> six bf16 tensor-core products over a three-way bf16 split of
  each operand (Pallas emits them), close to float32 accuracy.
* ``DEFAULT``/``HIGH`` -> ``input_precision=tf32``: one TF32 product (2^-11; the
  2-5e-4 relative errors measured on the H200), never used here.

The two emulations trade accuracy for tensor-core speed; ``kernels.tools.bench_serving`` times
and scores them at the serving shapes so the choice is made on measurements.
"""


class TritonConfig(KernelConfig):
    """pallas_gpu's tiling and Triton launch parameters (``None``: the kernel's default
    for the call, fitted to the device's shared memory).

    Attributes:
        block_q: query rows per program (tokens), a power of two in [16, 256] (Triton
            tensor extents are powers of two; ``tl.dot`` needs at least 16).
        block_kv: key/value rows per loop step (tokens), a power of two in [16, 256].
        num_warps: warps per program, in [1, 16].
        num_stages: software-pipeline depth of the key/value loop, in [1, 8].

    Raises (when made):
        ValueError: a value outside those ranges (the message names it).
    """

    block_q: int | None = Field(None, description="query rows per program")
    block_kv: int | None = Field(None, description="key/value rows per loop step")
    num_warps: int | None = Field(None, description="warps per program")
    num_stages: int | None = Field(None, description="pipeline depth of the key/value loop")

    @field_validator("block_q", "block_kv")
    @classmethod
    def _triton_tile(cls, value: int | None, info) -> int | None:
        if value is not None and (value & (value - 1) or not 16 <= value <= 256):
            raise ValueError(f"pallas_gpu: {info.field_name} must be a power of two in "
                             f"[16, 256] (Triton tiles), got {value}")
        return value

    @field_validator("num_warps")
    @classmethod
    def _warps(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 16:
            raise ValueError(f"pallas_gpu: num_warps must lie in [1, 16], got {value}")
        return value

    @field_validator("num_stages")
    @classmethod
    def _stages(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 8:
            raise ValueError(f"pallas_gpu: num_stages must lie in [1, 8], got {value}")
        return value


def _tiling(bq: int, bkv: int, warps: int, stages: int) -> TritonConfig:
    return TritonConfig(block_q=bq, block_kv=bkv, num_warps=warps, num_stages=stages)


SERVING_HEAD_DIM = 32
"""Head dims up to this are tuned with the serving grid (MiniLM: 32)."""
TUNING_GRIDS = {
    64: [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 128, 4, 3),
         (128, 64, 8, 3), (64, 32, 4, 4), (128, 64, 4, 3)],
    128: [(128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3),
          (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 2)],
    256: [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 3)],
}
"""(block_q, block_kv, num_warps, num_stages) the autotuner tries beside the default, per
largest head_dim (FlashAttention-2 style: 64/128-row query tiles, 32..128-row key tiles,
4 or 8 warps, 2..4 stages). Pruned with the first H200 sweep (NOTES-gpu.md): 64-row tiles
with 4 warps lead at head_dim 64, 128x128 with 8 warps and 3 stages at 128; the rest
bracket them."""


def triton_lowering():
    """Context manager: trace the kernel for the Triton lowering (a real NVIDIA GPU)
    even on a host without one, e.g. around ``jax.export.export(..., platforms=["cuda"])``.

    The flag is a ``jax.make_user_context``, part of jit's cache key, so a function
    traced for the interpreter is re-traced inside it rather than reused.
    """
    return _TRITON_LOWERING(True)


TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"
"""Custom-call target of a Pallas Triton kernel in lowered HLO."""


def check_shared_memory(config: TritonConfig, *, dtype, head_dim: int, q_len: int, kv_len: int,
                        budget: SharedMemoryBudget | None = None) -> None:
    """Raise ``ValueError`` naming the limit when the complete tiling ``config`` (blocks
    clamped to the sequence, as the kernel clamps them) needs more shared memory than
    ``budget`` grants (``kernels.gpu_limits``)."""
    budget = budget or shared_memory_budget()
    need = shared_memory_bytes(effective_config(config, q_len, kv_len), dtype=dtype,
                               head_dim=head_dim)
    if need > budget.bytes:
        raise ValueError(
            f"pallas_gpu: tiling {config.model_dump()} needs about {need} bytes of shared "
            f"memory for {jnp.dtype(dtype).name} at head_dim {head_dim} (model in "
            f"kernels.gpu_limits), over the device limit of {budget.describe()}; use "
            f"fewer num_stages or smaller blocks")


def _is_gpu_backend() -> bool:
    return jax.default_backend() in _GPU_PLATFORMS


def _dot(a, b, *, contract_rhs: int, precision):
    # lax.dot_general (pl.dot raises in JAX 0.11): float32 accumulation; contracting
    # the rhs on dim 1 is q @ k^T without materialising the transpose.
    return lax.dot_general(a, b, (((1,), (contract_rhs,)), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)


def _online_softmax_step(carry, s, v, *, qk_scale_log2, mask, precision):
    """One key/value block of the FlashAttention-2 recurrence (float32 state).

    ``s``: raw logits ``[block_q, block_kv]``; the running max ``m`` is kept in raw
    logit units so that ``exp2(s * c - m * c)`` is one fused multiply-add per element
    (``c = scale * log2(e) > 0`` preserves the max). ``mask`` is None for blocks every
    row fully sees. Masked entries become -inf; a row with every key masked so far
    keeps ``m = -inf``, and the guard keeps ``exp2(-inf - -inf)`` from making NaN.
    """
    acc, m_prev, l_prev = carry
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
    m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next) if mask is not None else m_next
    m_scaled = m_safe * qk_scale_log2
    alpha = jnp.exp2(m_prev * qk_scale_log2 - m_scaled)
    p = jnp.exp2(s * qk_scale_log2 - m_scaled[:, None])
    l_next = l_prev * alpha + jnp.sum(p, axis=1)
    pv = _dot(p.astype(v.dtype), v, contract_rhs=0, precision=precision)
    acc = acc * alpha[:, None] + pv
    return acc, m_next, l_next


def _flash_fwd_kernel(*refs, causal: bool, qk_scale_log2: float, block_q: int,
                      block_kv: int, num_q_blocks: int, q_len: int, kv_len: int,
                      has_q_lengths: bool, has_kv_lengths: bool, precision):
    refs = list(refs)
    q_len_ref = refs.pop(0) if has_q_lengths else None
    kv_len_ref = refs.pop(0) if has_kv_lengths else None
    q_ref, k_ref, v_ref, o_ref = refs

    q_block = pl.program_id(0)
    if causal:
        # Blocks near the bottom of the causal triangle carry the most work: launch them
        # first so the short ones fill the tail of the wave.
        q_block = num_q_blocks - 1 - q_block
    q_start = q_block * block_q

    # kv_end: keys at or past it are padding (static when no kv_lengths are given).
    kv_end = jnp.minimum(kv_len_ref[0], kv_len) if has_kv_lengths else kv_len
    q_end = jnp.minimum(q_len_ref[0], q_len) if has_q_lengths else q_len

    q = q_ref[...]
    rows = q_start + lax.broadcasted_iota(jnp.int32, (block_q, block_kv), 0)
    cols0 = lax.broadcasted_iota(jnp.int32, (block_q, block_kv), 1)

    def block_body(j, carry, masked):
        start = pl.multiple_of(j * block_kv, block_kv)
        k = k_ref[pl.ds(start, block_kv), :]
        v = v_ref[pl.ds(start, block_kv), :]
        s = _dot(q, k, contract_rhs=1, precision=precision)
        mask = None
        if masked:
            cols = start + cols0
            mask = cols < kv_end
            if causal:
                mask = jnp.logical_and(mask, cols <= rows)
            # Padding rows of V may hold garbage (even NaN); p = 0 there, but 0 * NaN
            # is NaN, so zero them in the (few) blocks that reach past kv_end.
            v_rows = start + lax.broadcasted_iota(jnp.int32, (block_kv, v.shape[-1]), 0)
            v = jnp.where(v_rows < kv_end, v, jnp.zeros_like(v))
        return _online_softmax_step(carry, s, v, qk_scale_log2=qk_scale_log2, mask=mask,
                                    precision=precision)

    # Blocks [0, n_full) are visible to every row of this query block; [n_full, n_end)
    # straddle the diagonal or kv_end; blocks from n_end on are skipped entirely.
    if causal:
        visible_end = jnp.minimum(kv_end, q_start + block_q)
        full_end = jnp.minimum(kv_end, q_start + 1)
    else:
        visible_end = kv_end
        full_end = kv_end
    n_end = _floor_div(visible_end + block_kv - 1, block_kv)
    n_full = _floor_div(full_end, block_kv)

    head_dim = q.shape[-1]
    carry = (jnp.zeros((block_q, head_dim), jnp.float32),
             jnp.full((block_q,), -jnp.inf, jnp.float32),
             jnp.zeros((block_q,), jnp.float32))
    carry = lax.fori_loop(0, n_full, functools.partial(block_body, masked=False), carry)
    static_no_tail = isinstance(n_full, int) and isinstance(n_end, int) and n_full == n_end
    if not static_no_tail:
        carry = lax.fori_loop(n_full, n_end, functools.partial(block_body, masked=True),
                              carry)
    acc, _, l_sum = carry

    # Rows that saw no key (l == 0) and query padding return zeros by contract.
    out_rows = q_start + lax.broadcasted_iota(jnp.int32, (block_q,), 0)
    keep = jnp.logical_and(l_sum > 0.0, out_rows < q_end)
    inv_l = jnp.where(keep, 1.0 / jnp.where(l_sum > 0.0, l_sum, 1.0), 0.0)
    # A select, not a product: a padded query row may hold NaN/inf (so may its acc),
    # and 0 * NaN is NaN.
    o_ref[...] = jnp.where(keep[:, None], acc * inv_l[:, None], 0.0).astype(o_ref.dtype)


def _floor_div(x, divisor: int):
    # Operands are non-negative, so truncating lax.div is floor division; it lowers to
    # one Triton divsi where jnp's floor_divide adds sign fix-ups.
    return x // divisor if isinstance(x, int) else lax.div(x, jnp.int32(divisor))


def pallas_gpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                         scale: float, q_lengths: jax.Array | None,
                         kv_lengths: jax.Array | None, config: TritonConfig | None = None,
                         interpret: bool | None = None,
                         float32_precision: str = "highest") -> jax.Array:
    """Flash-attention forward (FlashAttention-2) on an NVIDIA GPU through Pallas/Triton.

    Args:
      q: ``[batch, q_len, num_heads, head_dim]`` bfloat16/float16/float32.
      k, v: ``[batch, kv_len, num_kv_heads, head_dim]``, same dtype;
        ``num_heads % num_kv_heads == 0`` (GQA).
      causal: mask key ``j > i`` for query ``i`` (top-left aligned).
      scale: logit scale (the contract resolves ``None`` to ``1/sqrt(head_dim)``).
      q_lengths, kv_lengths: optional int32 ``[batch]``; rows/keys at or past them are
        padding (padded query rows return zeros).
      config: :class:`TritonConfig`; unset fields (or ``None``) take the head_dim's
        default (``PallasGpuKernel.default_config``) fitted to the device's shared memory.
      interpret: run in Pallas interpret mode; ``None`` means "when the default backend
        is not a GPU and no :func:`triton_lowering` context is active".
      float32_precision: how float32 products run (:data:`FLOAT32_PRECISIONS`):
        ``"highest"`` (the registry's choice: IEEE float32 on the CUDA cores) or the
        tensor-core emulations ``"tf32x3"``/``"bf16x6"`` (benchmark experiments only).

    Returns:
      Array shaped and typed like ``q``. Logits, softmax state and the accumulator are
      float32; float32 inputs use IEEE (not TF32) products by default.

    Raises:
      ValueError: illegal block sizes, or (natively) a tiling that needs more shared
        memory than the device grants (``kernels.gpu_limits``; the message names both).

    Lengths that are not multiples of the block sizes, and head_dim that is not a power
    of two, are zero-padded here and masked inside the kernel.
    """
    batch, q_len, num_heads, head_dim = q.shape
    _, kv_len, num_kv_heads, _ = k.shape
    if interpret is None:
        interpret = not (_is_gpu_backend() or _TRITON_LOWERING.value)
    declared = PallasGpuKernel()  # the class holds the tilings (defined below)
    cfg = (declared.fitted_config(q.dtype, head_dim, q_len, kv_len, config)
           or (config or TritonConfig()).merged_over(declared.default_config(head_dim)))
    if not interpret:  # a tiling that cannot fit is refused before Triton sees it
        check_shared_memory(cfg, dtype=q.dtype, head_dim=head_dim, q_len=q_len, kv_len=kv_len)
    group = num_heads // num_kv_heads

    # Blocks never larger than the (padded) sequence: tiny inputs stay tiny.
    block_q = min(cfg.block_q, max(16, 1 << (q_len - 1).bit_length()))
    block_kv = min(cfg.block_kv, max(16, 1 << (kv_len - 1).bit_length()))
    d_pad = padded_head_dim(head_dim)
    q_pad, kv_pad = round_up(q_len, block_q), round_up(kv_len, block_kv)
    if (q_pad, d_pad) != (q_len, head_dim):
        q = jnp.pad(q, ((0, 0), (0, q_pad - q_len), (0, 0), (0, d_pad - head_dim)))
    if (kv_pad, d_pad) != (kv_len, head_dim):
        widths = ((0, 0), (0, kv_pad - kv_len), (0, 0), (0, d_pad - head_dim))
        k, v = jnp.pad(k, widths), jnp.pad(v, widths)

    num_q_blocks = q_pad // block_q
    precision = None
    if q.dtype == jnp.float32:
        precision = FLOAT32_PRECISIONS[float32_precision]
        if interpret and float32_precision == "tf32x3":
            precision = lax.Precision.HIGHEST  # XLA:CPU has no TF32; the interpreter stays IEEE
    kernel = functools.partial(
        _flash_fwd_kernel, causal=causal, qk_scale_log2=float(scale) * _LOG2_E,
        block_q=block_q, block_kv=block_kv, num_q_blocks=num_q_blocks, q_len=q_len,
        kv_len=kv_len, has_q_lengths=q_lengths is not None,
        has_kv_lengths=kv_lengths is not None, precision=precision)

    def q_map(i, h, b):
        return (b, num_q_blocks - 1 - i if causal else i, h, 0)

    def kv_map(i, h, b):
        return (b, 0, h // group, 0)

    def len_map(i, h, b):
        return (b,)

    operands, in_specs = [], []
    for lengths in (q_lengths, kv_lengths):
        if lengths is not None:
            operands.append(jnp.asarray(lengths, jnp.int32))
            in_specs.append(pl.BlockSpec((1,), len_map))
    operands += [q, k, v]
    in_specs += [pl.BlockSpec((None, block_q, None, d_pad), q_map),
                 pl.BlockSpec((None, kv_pad, None, d_pad), kv_map),
                 pl.BlockSpec((None, kv_pad, None, d_pad), kv_map)]

    compiler_params = None
    if not interpret:
        from jax.experimental.pallas import triton as pl_triton

        compiler_params = pl_triton.CompilerParams(num_warps=cfg.num_warps,
                                                   num_stages=cfg.num_stages)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(num_q_blocks, num_heads, batch),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, block_q, None, d_pad), q_map),
        compiler_params=compiler_params,
        interpret=interpret,
        name=KERNEL_NAME,
    )(*operands)
    if (q_pad, d_pad) != (q_len, head_dim):
        out = out[:, :q_len, :, :head_dim]
    return out


class PallasGpuKernel(Kernel[TritonConfig]):
    """The registry's ``pallas_gpu``: native on an NVIDIA GPU (Triton lowering), Pallas
    interpret mode on a CPU; a :class:`TritonConfig`; tuned by the GPU table; the flash
    kernel a GPU rollout builds for ``auto`` and the first of ``auto``'s GPU order (after
    what the measured table puts first); its Triton custom call is exported with the
    compatibility check waived."""

    name = "pallas_gpu"
    description = "flash attention in Pallas for NVIDIA GPUs"
    native_platforms = ("gpu",)
    capability = Capability(dtypes=SUPPORTED_DTYPES, max_head_dim=MAX_HEAD_DIM)
    forward = staticmethod(pallas_gpu_attention)
    auto_priority = {"gpu": 0}
    rollout_default_on = ("gpu",)
    float32_matmul_precision = "highest"
    trace_name = KERNEL_NAME
    tuned = True
    ours = True
    lowers_at_trace_time = True

    def default_config(self, head_dim: int) -> TritonConfig:
        """Documented preferred tiling when no measured entry applies (before the
        shared-memory fit of :meth:`fitted_config`).

        The winners of the first H200 sweep (JAX 0.11.2, bf16, seq 1024..16384; see
        kernels/tools/NOTES-gpu.md): 64x64 tiles with 4 warps and 3 stages at head_dim <= 64,
        128x128 tiles with 8 warps (two warpgroups of 64 rows) and 3 stages at 128; at 256
        smaller tiles so the accumulator and the K/V stages fit registers and shared
        memory (not measured). Measured choices in gpu_table.json take precedence. For
        float32 at head_dim 128 the 128x128 tiling does not fit an H200's shared memory
        (a failed compile on the H200 showed it); :meth:`resolve_config` shrinks it.
        """
        padded = padded_head_dim(head_dim)
        if padded <= 64:
            return _tiling(64, 64, 4, 3)
        if padded <= 128:
            return _tiling(128, 128, 8, 3)
        return _tiling(64, 32, 4, 2)

    def fitted_config(self, dtype, head_dim: int, q_len: int, kv_len: int,
                      config: TritonConfig | None = None,
                      budget: SharedMemoryBudget | None = None) -> TritonConfig | None:
        """``config``'s values where set; the other fields from :meth:`default_config`,
        shrunk until the tiling fits ``budget`` (default: this host's GPU, or the target
        GPU without one) for ``dtype`` and ``head_dim`` (``kernels.gpu_limits.fit_config``:
        fewer stages, then smaller tiles). ``None`` when no tiling with ``config``'s
        fixed fields fits."""
        return fit_config(config or TritonConfig(), self.default_config(head_dim),
                          dtype=dtype, head_dim=head_dim,
                          budget=budget or shared_memory_budget(), q_len=q_len, kv_len=kv_len)

    def resolve_config(self, spec: AttentionSpec, config=None) -> TritonConfig:
        """The tiling a call runs with: ``config``'s values where set, elsewhere the
        head_dim default fitted to the GPU's shared memory for the call's dtype
        (:meth:`fitted_config`). When nothing fits, the unfitted merge
        (:meth:`check_supported` refuses it with the reason).

        Raises:
            ValueError: ``config`` is not a legal :class:`TritonConfig`.
        """
        cfg = self.config_from(config) or TritonConfig()
        fitted = self.fitted_config(spec.dtype, spec.head_dim, spec.q_len, spec.kv_len, cfg)
        return fitted if fitted is not None else cfg.merged_over(
            self.default_config(spec.head_dim))

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise when this kernel cannot run ``spec`` on ``backend`` with ``config``.

        ``"gpu"``/``"cuda"`` run natively, ``"cpu"`` in Pallas interpret mode (slow; for
        tests). ``auto`` stays off pallas_gpu on CPU through its ``auto_priority``, not
        through this check. On a GPU backend the resolved tiling must fit the device's
        shared memory (``kernels.gpu_limits``; on a host without a GPU, the target
        GPU's): interpret mode has no such limit.

        Raises:
            NotImplementedError: another backend, an unsupported dtype, head_dim above
                ``MAX_HEAD_DIM``, or (GPU) no tiling with ``config``'s set fields fits the
                device's shared memory.
            ValueError: ``config`` is not a legal :class:`TritonConfig`, or (GPU) the
                tiling ``config`` fixes needs more shared memory than the device grants
                (the message names both figures).
        """
        if backend not in _RUNNABLE_PLATFORMS:
            raise NotImplementedError(
                f"pallas_gpu is native to NVIDIA GPUs (Triton lowering) and runs interpreted "
                f"on the CPU for tests; backend {backend!r} is neither")
        name = jnp.dtype(spec.dtype).name
        if name not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"pallas_gpu supports {SUPPORTED_DTYPES}, got {name}")
        if spec.head_dim > MAX_HEAD_DIM:
            raise NotImplementedError(
                f"pallas_gpu supports head_dim <= {MAX_HEAD_DIM} (accumulator must fit "
                f"registers), got {spec.head_dim}")
        config = self.config_from(config)
        if backend not in _GPU_PLATFORMS:
            return
        budget = shared_memory_budget()
        fitted = self.fitted_config(spec.dtype, spec.head_dim, spec.q_len, spec.kv_len, config,
                                    budget)
        if fitted is not None:
            return
        if config is None or config.is_empty():
            raise NotImplementedError(
                f"pallas_gpu: no tiling fits {budget.describe()} for {name} at head_dim "
                f"{spec.head_dim} (model in kernels.gpu_limits)")
        check_shared_memory(config.merged_over(self.default_config(spec.head_dim)),
                            dtype=spec.dtype, head_dim=spec.head_dim, q_len=spec.q_len,
                            kv_len=spec.kv_len, budget=budget)
        raise ValueError(f"pallas_gpu: no tiling with {config.fields_set()} fits "
                         f"{budget.describe()} for {name} at head_dim {spec.head_dim}")

    def candidate_configs(self, shape, quick: bool = False) -> list[TritonConfig]:
        """Tilings the autotuner tries on ``shape``: the fitted default first, then
        ``TUNING_GRIDS``' entry for the head_dim, only those that fit the device's shared
        memory for the shape's dtype and head_dim (``kernels.gpu_limits``). Head dims up
        to ``SERVING_HEAD_DIM`` (MiniLM, the serving workload) get the serving grid:
        block_q in {16, 32, 64, 128} x block_kv in {16, 32, 64, 128} x warps in {1, 2, 4}
        (at least 16 query rows per warp), 2 stages, 36 tilings plus the default: short
        sequences give few programs per (batch, head), so smaller query tiles and fewer
        warps can keep the GPU's 132 SMs busy where 64-128-row tiles leave them idle; the
        pipeline depth is tuned second (:meth:`refined_candidates`). ``quick``: two
        small tilings (a CPU run)."""
        if quick:
            return [TritonConfig(block_q=16, block_kv=16), TritonConfig(block_q=32, block_kv=16)]
        head_dim = shape.head_dim
        configs = [self.default_config(head_dim)]
        if head_dim <= SERVING_HEAD_DIM:
            configs += [_tiling(bq, bkv, warps, 2) for bq, bkv, warps in itertools.product(
                (16, 32, 64, 128), (16, 32, 64, 128), (1, 2, 4)) if warps * 16 <= bq]
        else:
            grid = next(g for d, g in sorted(TUNING_GRIDS.items()) if head_dim <= d or d == 256)
            configs += [_tiling(*t) for t in grid]
        return self._fitting(configs, shape)

    def refined_candidates(self, tried, shape, quick: bool = False) -> list[TritonConfig]:
        """Second pass of the serving search (head_dim up to ``SERVING_HEAD_DIM``, not
        ``quick``): the three fastest tilings of ``tried`` (config, TFLOP/s) with 1 and 3
        pipeline stages, those not yet tried and that fit the device. The key loop has
        1-16 iterations at the serving shapes, so the depth is tuned around the fastest
        tile shapes only."""
        if quick or shape.head_dim > SERVING_HEAD_DIM:
            return []
        ranked = sorted((t for t in tried if t[1]), key=lambda t: -t[1])[:3]
        seen = [config for config, _ in tried]
        out: list[TritonConfig] = []
        for config, _ in ranked:
            for stages in (1, 3):
                cfg = config.model_copy(update={"num_stages": stages})
                if cfg not in seen and cfg not in out:
                    out.append(cfg)
        return self._fitting(out, shape, with_default=False)

    def _fitting(self, configs, shape, with_default: bool = True) -> list[TritonConfig]:
        """Distinct tilings in order, only those that fit the device for ``shape``'s dtype
        and head_dim (and, with ``with_default``, the fitted default first)."""
        budget = shared_memory_budget()
        fits = [c for c in configs if shared_memory_bytes(
            c, dtype=shape.dtype, head_dim=shape.head_dim) <= budget.bytes]
        fitted = self.fitted_config(shape.dtype, shape.head_dim, 4096, 4096, budget=budget)
        out: list[TritonConfig] = []
        for cfg in ([fitted] if fitted is not None and with_default else []) + fits:
            if cfg not in out:
                out.append(cfg)
        return out

    def fit_to_device(self, config: TritonConfig, shape) -> tuple[TritonConfig | None, str]:
        """``config`` when it fits the device's shared memory for ``shape``'s dtype and
        head_dim, else the closest tiling that does (``None`` when none does), and a note
        saying what was changed and why ("" when nothing was). The nearest measured entry
        may have been measured for another dtype or head_dim (a bf16 head_dim-128 tiling
        applied to a float32 head_dim-256 call overflowed on the H200)."""
        budget = shared_memory_budget()
        full = config.merged_over(self.default_config(shape.head_dim))
        fitted = fit_config(TritonConfig(), full, dtype=shape.dtype, head_dim=shape.head_dim,
                            budget=budget, q_len=shape.q_len, kv_len=shape.kv_len)
        if fitted == full:
            return config, ""
        need = shared_memory_bytes(effective_config(full, shape.q_len, shape.kv_len),
                                   dtype=shape.dtype, head_dim=shape.head_dim)
        note = (f"table tiling {config.model_dump()} needs about {need} bytes of shared "
                f"memory for {shape.dtype} at head_dim {shape.head_dim}, over "
                f"{budget.describe()}: ")
        if fitted is None:
            return None, note + "no tiling fits"
        return fitted, note + f"using {fitted.model_dump()}"

    def export_context(self, platform: str) -> contextlib.AbstractContextManager:
        """:func:`triton_lowering` for the ``jax.export`` platform ``"cuda"``, nothing
        otherwise (other platforms get the interpreter, which is what runs there)."""
        return triton_lowering() if platform == "cuda" else contextlib.nullcontext()

    def export_disabled_checks(self, platform: str) -> list:
        """``disabled_checks`` for ``jax.export.export`` on ``platform``. The Triton custom
        call embeds Triton IR that is tied to the jaxlib that lowered it, so JAX gives it
        no compatibility guarantee and refuses to serialise it unless this check is
        disabled. An artifact exported this way should be loaded with the same jaxlib
        version."""
        if platform != "cuda":
            return []
        from jax import export as jax_export

        return [jax_export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)]
