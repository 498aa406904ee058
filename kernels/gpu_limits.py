"""Shared memory on NVIDIA GPUs: what a pallas_gpu tiling needs, and what a device grants
(its shared memory per block, its compute capability: the Hopper check the sm_90 kernels share).

Why this exists. On an H200 the Triton compile of ``pallas_gpu`` failed with
``RESOURCE_EXHAUSTED: Shared memory size limit exceeded`` for float32 at head_dim 128
with the default 128x128 tiling, and for float32 at head_dim 256 with a tiling the
selection table had measured for bf16 at head_dim 128. This module lets every chooser
of a tiling (the kernel default, the table, the autotuner) check a tiling *before*
launch, for the call's dtype and head_dim, against the device's budget.

The model (:func:`shared_memory_bytes`). Triton stages the K and V tiles of the key/value
loop in shared memory (``cp.async``/TMA software pipelining, ``num_stages`` deep), plus
whatever the matrix products need there. With ``d`` = head_dim padded to a power of two,
``b`` = bytes per element of the input dtype, ``bq``/``bkv`` = block_q/block_kv and
``s`` = num_stages:

* tensor-core path (bf16/f16: Hopper ``wgmma`` reads its B operand, and here also Q,
  from shared memory; P stays in registers). The pipeliner keeps one extra buffer for
  loads feeding an asynchronous ``wgmma``, so ``s`` buffers per operand::

      bytes = s * 2 * bkv * d * b  +  bq * d * b  +  4 * bq

* FMA path (float32 with ``Precision.HIGHEST``: Triton's ``input_precision="ieee"``
  runs the products on the CUDA cores, both operands converted to the dot layout
  through shared memory). ``max(s - 1, 1)`` buffers per operand, plus Q, the float32
  P tile, and one more V tile in the masked loop (V is rewritten by ``jnp.where``
  before its product, so it is staged again)::

      bytes = max(s-1, 1) * 2 * bkv * d * 4  +  bq * d * 4  +  bq * bkv * 4
              +  bkv * d * 4  +  4 * bq

The last term of each (``4 * bq``) is a row of float32 reduction scratch (row max / row
sum across warps). The masked-loop term is always counted (conservative: every causal
call, every call with lengths or a ragged tail has that loop).

Calibration against the measured failures and successes on the H200
(``kernels/tools/NOTES-gpu.md``; JAX 0.11.2; the unmasked/masked figures are the non-causal and
causal calls of one sweep):

========================================  ==================  ==========================
config (bq x bkv, stages), dtype, d       Triton requested    this model
========================================  ==================  ==========================
128x128 s3, float32, d128 (non-causal)    393216              459264 (>=, +66048: the
                                                              masked-loop V tile)
128x128 s3, float32, d128 (causal)        458752              459264 (+512 scratch)
64x64 s3, float32, d256 (non-causal)      344320              409856 (>=, masked-loop V)
64x64 s3, float32, d256 (causal)          409856              409856 (exact)
128x128 s3, bf16, d128 (ncu: 229.4 KB)    229376 (ran)        229888 (fits 232448)
========================================  ==================  ==========================

so the model is exact or above on every measured point and still admits the fastest
measured bf16 tiling. Every tiling of ``kernels/gpu_table.json`` that ran on the H200 fits
under the model (``tests/test_kernels_gpu_limits.py`` checks it). The model is an
estimate of Triton's allocator, not a copy of it: if a compile still fails,
``kernels.dispatch`` falls back at run time (``auto``) or names the limit (explicit).

The budget (:func:`shared_memory_budget`): the maximum dynamic shared memory per thread
block with opt-in (``cudaFuncAttributeMaxDynamicSharedMemorySize``), per compute
capability, from the CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability" (the figure XLA/Triton compare against: ``available: 232448`` on the H200).
Unknown GPUs get 48 KiB, the per-block limit every CUDA GPU grants without opt-in. A
host without a GPU (interpret mode, ``jax.export`` for CUDA) plans for
:data:`TARGET_DEVICE`, the H200 this project deploys to.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict

from kernels.config import KernelConfig

MAX_SMEM_PER_BLOCK_BY_CC: dict[tuple[int, int], int] = {
    (7, 0): 96 * 1024,    # V100
    (7, 2): 96 * 1024,    # Xavier
    (7, 5): 64 * 1024,    # Turing
    (8, 0): 163 * 1024,   # A100
    (8, 6): 99 * 1024,    # GA10x
    (8, 7): 163 * 1024,   # Orin
    (8, 9): 99 * 1024,    # Ada
    (9, 0): 227 * 1024,   # H100, H200 (232448)
    (10, 0): 227 * 1024,  # B200
    (12, 0): 99 * 1024,   # RTX 50xx
}
"""Maximum shared memory per thread block with opt-in, bytes (CUDA C++ Programming Guide,
technical specifications per compute capability)."""

UNKNOWN_GPU_SMEM_BYTES = 48 * 1024
"""Budget for a GPU whose compute capability is not in the table: the 48 KiB every CUDA
GPU grants a block without opt-in (conservative: smaller tiles, never a failed compile)."""

TARGET_DEVICE = ("NVIDIA H200", (9, 0))
"""The GPU a host without one plans for (device kind, compute capability)."""


class SharedMemoryBudget(BaseModel):
    """Shared memory one thread block may use on a device (bytes), and where the figure
    comes from (for error messages and lineage)."""

    model_config = ConfigDict(frozen=True)

    bytes: int
    device_kind: str
    compute_capability: tuple[int, int] | None
    source: str

    def describe(self) -> str:
        cc = ("unknown compute capability" if self.compute_capability is None
              else f"compute capability {self.compute_capability[0]}.{self.compute_capability[1]}")
        return f"{self.bytes} bytes per block on {self.device_kind} ({cc}; {self.source})"


def _parse_cc(value: Any) -> tuple[int, int] | None:
    """``(major, minor)`` from a reported compute capability (``"9.0"``, ``"9.0a"``, a
    pair), or None when there is none or it is not one (``"gfx942"``, ROCm's names)."""
    if value is None:
        return None
    if isinstance(value, tuple | list) and len(value) >= 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
    found = re.match(r"(\d+)\.(\d+)", str(value))
    return (int(found[1]), int(found[2])) if found else None


def hopper_refusal(kernel: str, needs: str, *, only_sm90: bool = False) -> str | None:
    """Why ``kernel`` cannot run on the default GPU for want of Hopper, or None.

    The one check the Hopper-only kernels share (``pallas_mosaic_gpu`` and its e4m3
    sibling need ``wgmma``/TMA: any compute capability 9.x; the ``fa3`` wheel is compiled
    for sm90 alone, so ``only_sm90`` asks for exactly 9.0). Off a GPU it says nothing:
    each kernel refuses other backends in words of its own. A GPU that reports no
    capability passes unless ``only_sm90``; one that reports something other than a CUDA
    ``major.minor`` (a ROCm ``gfx…`` name) is refused.

    Args:
        kernel: the registered kernel's name, for the message.
        needs: what Hopper provides that the kernel uses (``"wgmma"``), for the message.
        only_sm90: accept compute capability 9.0 only.

    Returns:
        The refusal, naming the constraint and the capability as the device reports it,
        or None.
    """
    if jax.default_backend() not in ("gpu", "cuda"):
        return None
    reported = getattr(jax.devices()[0], "compute_capability", None)
    cc = _parse_cc(reported)
    if reported is None:
        fits = not only_sm90
    else:
        fits = cc == (9, 0) if only_sm90 else (cc is not None and cc[0] == 9)
    if fits:
        return None
    wanted = "compute capability 9.0" if only_sm90 else "compute capability 9.x"
    shown = "none reported" if reported is None else reported
    return (f"{kernel} needs an sm_90 (Hopper) GPU for {needs} ({wanted}); this device has "
            f"compute capability {shown}")


def budget_for(device_kind: str, compute_capability: tuple[int, int] | None,
               source: str = "CUDA opt-in limit per block") -> SharedMemoryBudget:
    """The budget of a GPU given its compute capability (48 KiB when unknown)."""
    if compute_capability in MAX_SMEM_PER_BLOCK_BY_CC:
        return SharedMemoryBudget(bytes=MAX_SMEM_PER_BLOCK_BY_CC[compute_capability],
                                  device_kind=device_kind,
                                  compute_capability=compute_capability, source=source)
    return SharedMemoryBudget(bytes=UNKNOWN_GPU_SMEM_BYTES, device_kind=device_kind,
                              compute_capability=compute_capability,
                              source="unknown GPU: 48 KiB without opt-in (conservative)")


def shared_memory_budget(device: Any = None) -> SharedMemoryBudget:
    """The shared-memory budget per block of ``device`` (default: the first device when
    the default backend is a GPU, else :data:`TARGET_DEVICE`)."""
    if device is None:
        if jax.default_backend() not in ("gpu", "cuda"):
            kind, cc = TARGET_DEVICE
            return budget_for(kind, cc, source="no GPU on this host: planned for the target "
                                               "device (CUDA opt-in limit per block)")
        device = jax.devices()[0]
    return budget_for(getattr(device, "device_kind", "unknown GPU"),
                      _parse_cc(getattr(device, "compute_capability", None)))


def padded_head_dim(head_dim: int) -> int:
    """head_dim as the kernel lays it out: a power of two, at least 16 (Triton tensors
    need power-of-two extents and ``tl.dot`` a contraction of at least 16)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def uses_tensor_cores(dtype: Any) -> bool:
    """Whether pallas_gpu's products run on tensor cores for ``dtype``: bf16/f16 yes;
    float32 no (``Precision.HIGHEST`` lowers to Triton's IEEE FMA path)."""
    return jnp.dtype(dtype) != jnp.dtype(jnp.float32)


def shared_memory_bytes(config: KernelConfig, *, dtype: Any, head_dim: int) -> int:
    """Modelled shared memory (bytes) of one pallas_gpu program with ``config``.

    Args:
        config: a complete ``kernels.pallas_gpu.TritonConfig`` (every field set; e.g.
            ``PallasGpuKernel.resolve_config``'s result).
        dtype: the call's input dtype (float32, bfloat16, float16).
        head_dim: the call's head_dim (padded here as the kernel pads it).

    Raises:
        ValueError: a field of ``config`` is unset.
    """
    missing = [k for k, v in config.model_dump().items() if v is None]
    if missing:
        raise ValueError(f"shared_memory_bytes needs a complete config; {missing} unset")
    d = padded_head_dim(head_dim)
    bq, bkv, stages = config.block_q, config.block_kv, config.num_stages
    item = jnp.dtype(dtype).itemsize
    if uses_tensor_cores(dtype):
        return stages * 2 * bkv * d * item + bq * d * item + 4 * bq
    buffers = max(stages - 1, 1)
    return (buffers * 2 * bkv * d * item + bq * d * item + bq * bkv * 4 + bkv * d * item
            + 4 * bq)


def effective_config(config: KernelConfig, q_len: int, kv_len: int) -> KernelConfig:
    """``config`` with its blocks clamped to the (power-of-two padded) sequence lengths,
    as the kernel clamps them: a 128-row tile over 40 rows is a 64-row tile."""
    def clamp(block: int, length: int) -> int:
        return min(block, max(16, 1 << (length - 1).bit_length()))
    return config.model_copy(update={"block_q": clamp(config.block_q, q_len),
                                     "block_kv": clamp(config.block_kv, kv_len)})


def fit_config(wanted: KernelConfig, default: KernelConfig, *, dtype: Any, head_dim: int,
               budget: SharedMemoryBudget, q_len: int | None = None,
               kv_len: int | None = None) -> KernelConfig | None:
    """The tiling closest to ``wanted`` (unset fields from ``default``) that fits ``budget``.

    Fields set in ``wanted`` are kept; only the others are adjusted, in this order:
    fewer pipeline stages (down to 2), then halve the larger of the adjustable tiles (K/V
    first on a tie: it is staged ``num_stages`` times) with the stages restored, and so
    on down to 16-row tiles; last, a single stage. ``num_warps`` shrinks with block_q
    (at least 16 query rows per warp). ``None`` when nothing fits.

    Raises:
        ValueError: ``wanted`` merged over ``default`` leaves a field unset.
    """
    cfg = wanted.merged_over(default)
    if any(v is None for v in cfg.model_dump().values()):
        raise ValueError(f"fit_config needs a complete default tiling, got {default}")
    fixed = {k for k, v in wanted.model_dump().items() if v is not None}

    def fits(c: KernelConfig) -> bool:
        c_eff = effective_config(c, q_len, kv_len) if q_len and kv_len else c
        return shared_memory_bytes(c_eff, dtype=dtype, head_dim=head_dim) <= budget.bytes

    stages0 = cfg.num_stages
    while True:
        stage_options = ([cfg.num_stages] if "num_stages" in fixed
                         else list(range(stages0, min(stages0, 2) - 1, -1)))
        for stages in stage_options:
            candidate = cfg.model_copy(update={"num_stages": stages})
            if fits(candidate):
                return candidate
        shrinkable = [k for k in ("block_kv", "block_q")
                      if k not in fixed and getattr(cfg, k) > 16]
        if not shrinkable:
            break
        key = max(shrinkable, key=lambda k: getattr(cfg, k))
        update = {key: getattr(cfg, key) // 2}
        if key == "block_q" and "num_warps" not in fixed:
            update["num_warps"] = max(1, min(cfg.num_warps, update[key] // 16))
        cfg = cfg.model_copy(update=update)
    if "num_stages" not in fixed:
        last = cfg.model_copy(update={"num_stages": 1})
        if fits(last):
            return last
    return None
