"""A minimal float8 (e4m3) matrix product on Hopper's ``wgmma``, the first step towards
FP8 attention: no softmax, no pipeline beyond the K loop, one warpgroup per CTA.

Two functions, both Pallas Mosaic GPU kernels (``jax.experimental.pallas.mosaic_gpu``):

- :func:`e4m3_matmul`: ``C = A Bᵀ`` with ``A`` of shape ``(M, K)`` and ``B`` of shape
  ``(N, K)``, both ``float8_e4m3fn``; ``C`` is ``(M, N)`` float32.
- :func:`e4m3_scores`: one attention score tile ``S = (Q Kᵀ) · scale_q · scale_k ·
  sm_scale`` with ``Q`` ``(Lq, D)`` and ``K`` ``(Lk, D)`` in ``float8_e4m3fn`` holding
  ``Q / scale_q`` and ``K / scale_k`` (per-tensor scales, float32 scalars read in the
  kernel); ``S`` is ``(Lq, Lk)`` float32 logits in the same units as ``Q Kᵀ · sm_scale``
  computed from the unquantised tensors.

Each CTA owns one ``tile_m x tile_n`` output tile (default 128 x 128; ``tile_m`` rows are
``tile_m / 64`` wgmma row groups of the one warpgroup) and loops over K in
``tile_k``-element steps (``plgpu.emit_pipeline``: TMA copies of the next step's tiles
while the current step's wgmma runs, ``max_concurrent_steps`` slots). The accumulator is
float32 in registers (``plgpu.ACC``); each step waits for its wgmma before its slot is
reused (``wgmma_wait(0)``: correct first, the overlap of consecutive wgmmas is left out).

Instruction constraints relied on (JAX 0.10.2 and 0.11.2,
``jax/experimental/mosaic/gpu/wgmma.py`` and the PTX ISA's ``wgmma.mma_async``):

- e4m3 operands are accepted with a float32 (or float16) accumulator; A and B must have
  the same element type. The instruction is ``wgmma.mma_async.sync.aligned.m64nNk32
  .f32.e4m3.e4m3``: K = 32 per instruction (32 bytes), M = 64 per instruction.
- 8-bit operands cannot be transposed ("Only f16 WGMMA supports transposes"): both must
  be K-major in shared memory. So ``A`` is stored ``(M, K)`` and ``B`` as ``(N, K)``,
  passed to ``plgpu.wgmma`` as ``plgpu.transpose_ref(b, (1, 0))``: exactly the ``Q Kᵀ``
  of attention. (``P V`` in fp8 would need ``V`` stored transposed.)
- Shared-memory tiles use the 128-byte swizzle with ``(8, 128)`` tiling: one swizzle
  group is 128 e4m3 elements, so ``tile_k`` must be a multiple of 128; ``tile_m`` a
  multiple of 64; ``tile_n`` a multiple of 8 and at most 256.

Accuracy (measured in ``kernels/tools/fp8_probe_run.py``): each product of two e4m3
values is exact in float32 (4 + 4 significand bits), so with true float32 accumulation
the only error is summation rounding, at most about ``K · 2⁻²⁴ · Σ|a·b|`` per element.
Hopper's FP8 tensor cores are reported to accumulate with fewer bits (about 14:
DeepSeek-V3 technical report, section 3.3.2), so the tests bound the error by the
looser ``K · 2⁻¹³ · Σ|a·b|`` and report how it compares with the float32 bound, and
check exactness on small integers, whose sums every such accumulator holds exactly. On
an H200 (JAX 0.11.2) the error exceeded the float32 bound up to 29-fold and stayed 11-12
bits below ``Σ|a·b|`` at K from 128 to 4096: the reduced accumulation, measured
(``kernels/tools/bench_results/h200-2026-12-04-fp8-probe/``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

E4M3 = jnp.float8_e4m3fn
SWIZZLE_BYTES = 128
"""The shared-memory swizzle of every operand tile: 128 e4m3 elements per row group."""
WGMMA_M = 64
"""Rows of one wgmma instruction (Hopper's fixed M)."""
MAX_TILE_N = 256


def _check_tiles(m: int, n: int, k: int, tile_m: int, tile_n: int, tile_k: int) -> None:
    if tile_m % WGMMA_M or tile_m <= 0:
        raise ValueError(f"tile_m={tile_m} must be a positive multiple of {WGMMA_M}")
    if tile_n % 8 or not 0 < tile_n <= MAX_TILE_N:
        raise ValueError(f"tile_n={tile_n} must be a multiple of 8 in (0, {MAX_TILE_N}]")
    if tile_k % SWIZZLE_BYTES or tile_k <= 0:
        raise ValueError(f"tile_k={tile_k} must be a positive multiple of {SWIZZLE_BYTES} "
                         "(one 128-byte swizzle group of e4m3)")
    for name, size, tile in (("M", m, tile_m), ("N", n, tile_n), ("K", k, tile_k)):
        if size % tile:
            raise ValueError(f"{name}={size} is not a multiple of its tile {tile}")


def _check_operands(a: jax.Array, b: jax.Array) -> tuple[int, int, int]:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"operands must be 2-D, got {a.shape} and {b.shape}")
    if a.dtype != E4M3 or b.dtype != E4M3:
        raise TypeError(f"operands must be float8_e4m3fn, got {a.dtype} and {b.dtype}")
    (m, k), (n, k2) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"contraction sizes differ: A {a.shape}, B {b.shape} (B is (N, K))")
    return m, n, k


def _build(m: int, n: int, k: int, tile_m: int, tile_n: int, tile_k: int, stages: int,
           scaled: bool, sm_scale: float):
    """The ``plgpu.kernel`` call for one problem size (imports Pallas only when used)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    in_transforms = (plgpu.TilingTransform((8, SWIZZLE_BYTES)),
                     plgpu.SwizzleTransform(SWIZZLE_BYTES))
    out_swizzle = plgpu.find_swizzle(tile_n * 32)  # float32 rows, in bits
    out_transforms = (plgpu.TilingTransform((8, out_swizzle // 4)),
                      plgpu.SwizzleTransform(out_swizzle))

    def body(*refs):
        if scaled:
            a_gmem, b_gmem, scale_gmem, out_gmem, out_smem = refs
        else:
            a_gmem, b_gmem, out_gmem, out_smem = refs
        mi, ni = jax.lax.axis_index("m"), jax.lax.axis_index("n")

        def product(acc_ref):
            def k_step(_, a_smem, b_smem):
                plgpu.wgmma(acc_ref, a_smem, plgpu.transpose_ref(b_smem, (1, 0)))
                plgpu.wgmma_wait(0)

            pipeline = plgpu.emit_pipeline(
                k_step,
                grid=(k // tile_k,),
                in_specs=[
                    plgpu.BlockSpec((tile_m, tile_k), lambda ki: (mi, ki),
                                    transforms=in_transforms),
                    plgpu.BlockSpec((tile_n, tile_k), lambda ki: (ni, ki),
                                    transforms=in_transforms),
                ],
                max_concurrent_steps=stages,
            )
            pipeline(a_gmem, b_gmem)
            return acc_ref[...]

        acc = pl.run_scoped(product, plgpu.ACC((tile_m, tile_n), jnp.float32))
        if scaled:
            acc = acc * (scale_gmem[0] * scale_gmem[1] * jnp.float32(sm_scale))
        out_smem[...] = acc
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(
            out_smem, out_gmem.at[pl.ds(mi * tile_m, tile_m), pl.ds(ni * tile_n, tile_n)])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_types=[plgpu.SMEM((tile_m, tile_n), jnp.float32, transforms=out_transforms)],
        grid=(m // tile_m, n // tile_n),
        grid_names=("m", "n"),
    )


def e4m3_matmul(a: jax.Array, b: jax.Array, *, tile_m: int = 128, tile_n: int = 128,
                tile_k: int = 128, stages: int = 2) -> jax.Array:
    """``A Bᵀ`` on Hopper's e4m3 ``wgmma`` with a float32 accumulator.

    Args:
        a: ``(M, K)`` ``float8_e4m3fn``, row-major (K-major, as 8-bit wgmma requires).
        b: ``(N, K)`` ``float8_e4m3fn``: the second operand stored transposed (K-major).
        tile_m, tile_n, tile_k: the CTA's output tile and K step, in elements (see the
            module docstring's constraints).
        stages: shared-memory slots of the K loop's pipeline (``max_concurrent_steps``).

    Returns:
        ``(M, N)`` float32: ``C[i, j] = Σ_k a[i, k] · b[j, k]``, in the inputs' units.

    Raises:
        TypeError: an operand is not ``float8_e4m3fn``.
        ValueError: an operand is not 2-D, the K sizes differ, a size is not a multiple
            of its tile, or a tile breaks a wgmma constraint.
    """
    m, n, k = _check_operands(a, b)
    _check_tiles(m, n, k, tile_m, tile_n, tile_k)
    return _build(m, n, k, tile_m, tile_n, tile_k, stages, False, 1.0)(a, b)


def e4m3_scores(q: jax.Array, k: jax.Array, scale_q: jax.Array | float,
                scale_k: jax.Array | float, *, sm_scale: float | None = None,
                tile_m: int = 128, tile_n: int = 128, tile_k: int = 128,
                stages: int = 2) -> jax.Array:
    """One attention score tile from e4m3 queries and keys with per-tensor scales:
    ``S = (Q Kᵀ) · scale_q · scale_k · sm_scale``, the scaling done in the kernel.

    Args:
        q: ``(Lq, D)`` ``float8_e4m3fn`` holding ``Q / scale_q``.
        k: ``(Lk, D)`` ``float8_e4m3fn`` holding ``K / scale_k``.
        scale_q, scale_k: float32 scalars (arrays or Python floats; traced values are
            fine), the dequantisation factors.
        sm_scale: the softmax scale, a Python float; default ``1 / sqrt(D)``.
        tile_m, tile_n, tile_k, stages: as :func:`e4m3_matmul` (``tile_k`` divides ``D``).

    Returns:
        ``(Lq, Lk)`` float32 logits in the units of ``Q Kᵀ · sm_scale``.

    Raises:
        TypeError: ``q`` or ``k`` is not ``float8_e4m3fn``.
        ValueError: as :func:`e4m3_matmul`; a scale is not a scalar.
    """
    lq, lk, d = _check_operands(q, k)
    _check_tiles(lq, lk, d, tile_m, tile_n, tile_k)
    scales = jnp.stack([jnp.asarray(scale_q, jnp.float32), jnp.asarray(scale_k, jnp.float32)])
    if scales.shape != (2,):
        raise ValueError(f"scale_q and scale_k must be scalars, got shape {scales.shape[1:]}")
    sm = float(d) ** -0.5 if sm_scale is None else float(sm_scale)
    return _build(lq, lk, d, tile_m, tile_n, tile_k, stages, True, sm)(q, k, scales)


def quantize_e4m3(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-tensor e4m3 quantisation: ``(x / scale).astype(e4m3), scale`` with ``scale =
    max|x| / 448`` (448: e4m3's largest finite value), float32; ``scale = 1`` for an
    all-zero ``x``. Any shape; ``x`` any float dtype. Raises nothing of its own."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    scale = jnp.where(amax > 0, amax / jnp.float32(448.0), jnp.float32(1.0))
    return (x.astype(jnp.float32) / scale).astype(E4M3), scale
