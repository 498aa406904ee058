"""The e4m3 wgmma probe (``kernels.fp8_probe``): lowering for CUDA from this CPU host
names an 8-bit float wgmma; ``gpu`` tests run it natively against float64.

The float64 reference is taken from the e4m3-rounded inputs, so the asserted error is
the kernel's own (accumulation), bounded per element by ``K · 2⁻¹³ · Σ|a·b|``: products
of e4m3 values are exact in float32, and Hopper's FP8 accumulator is reported to keep
about 14 bits (the module docstring); how the error compares with the float32 bound
``K · 2⁻²⁴ · Σ|a·b|`` is printed. Small integers, whose partial sums every such
accumulator holds exactly, must come out exact. Fresh random inputs each run; the seed
is printed.
"""

from __future__ import annotations

import secrets

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import fp8_probe
from kernels.tools import fp8_probe_run
from tests.kernels_helpers import mosaic_module_text

ON_GPU = jax.default_backend() in ("gpu", "cuda")
E4M3 = fp8_probe.E4M3


def _mosaic_module(monkeypatch, fn, *args) -> str:
    """The Mosaic GPU module of ``fn(*args)`` lowered for CUDA, as text (after its wgmma
    lowering: the PTX instruction is in it)."""
    return mosaic_module_text(monkeypatch, fn, *args)[1]


def _seed() -> np.random.Generator:
    seed = secrets.randbits(32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- CPU


def test_the_matmul_lowers_to_an_e4m3_wgmma_with_float32_accumulation(monkeypatch):
    a = jax.ShapeDtypeStruct((256, 512), E4M3)
    b = jax.ShapeDtypeStruct((128, 512), E4M3)
    module = _mosaic_module(monkeypatch, fp8_probe.e4m3_matmul, a, b)
    instr = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
    assert instr in module
    # Per K step of 128: two 64-row groups (tile_m 128) times four k32 instructions.
    assert module.count(instr) % 8 == 0
    assert "xf8E4M3FN, #gpu.address_space<workgroup>>" in module  # the operand tiles
    assert "bf16" not in module and "e5m2" not in module


def test_the_score_tile_lowers_to_an_e4m3_wgmma(monkeypatch):
    q = jax.ShapeDtypeStruct((128, 128), E4M3)
    k = jax.ShapeDtypeStruct((256, 128), E4M3)
    scale = jax.ShapeDtypeStruct((), jnp.float32)
    module = _mosaic_module(monkeypatch, fp8_probe.e4m3_scores, q, k, scale, scale)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in module


@pytest.mark.parametrize("a_shape, b_shape, dtype, error, named", [
    ((128, 128), (128, 256), E4M3, ValueError, "contraction sizes differ"),
    ((128, 100), (128, 100), E4M3, ValueError, "K=100"),
    ((96, 128), (128, 128), E4M3, ValueError, "M=96"),
    ((128, 128), (128, 128), jnp.bfloat16, TypeError, "float8_e4m3fn"),
    ((128,), (128, 128), E4M3, ValueError, "2-D"),
])
def test_shapes_and_dtypes_the_instruction_cannot_take_are_refused(a_shape, b_shape, dtype,
                                                                   error, named):
    a = jax.ShapeDtypeStruct(a_shape, dtype)
    b = jax.ShapeDtypeStruct(b_shape, dtype)
    with pytest.raises(error, match=named):
        jax.eval_shape(fp8_probe.e4m3_matmul, a, b)


@pytest.mark.parametrize("tiles, named", [
    (dict(tile_m=96), "tile_m"), (dict(tile_n=260), "tile_n"), (dict(tile_k=64), "tile_k"),
])
def test_tiles_that_break_a_wgmma_constraint_are_refused(tiles, named):
    a = jax.ShapeDtypeStruct((384, 384), E4M3)
    with pytest.raises(ValueError, match=named):
        jax.eval_shape(lambda x, y: fp8_probe.e4m3_matmul(x, y, **tiles), a, a)


def test_quantize_maps_the_largest_magnitude_to_448_and_back():
    rng = _seed()
    x = jnp.asarray(5 * rng.standard_normal((64, 64)), jnp.float32)
    q, scale = fp8_probe.quantize_e4m3(x)
    assert q.dtype == E4M3
    assert float(jnp.max(jnp.abs(q.astype(jnp.float32)))) == 448.0
    back = np.asarray(q.astype(jnp.float32)) * float(scale)
    # e4m3 keeps 3 fraction bits: half an ulp is 2^-4 relative, for normal values.
    tiny = 2.0 ** -6 * float(scale)  # below e4m3's smallest normal, absolute spacing
    assert np.all(np.abs(back - np.asarray(x)) <= 2.0 ** -4 * np.abs(np.asarray(x)) + tiny)


def test_the_accuracy_measure_finds_a_wrong_product():
    rng = _seed()
    a8 = fp8_probe_run.rounded(rng.standard_normal((64, 128)))
    b8 = fp8_probe_run.rounded(rng.standard_normal((32, 128)))
    exact = a8.astype(np.float64) @ b8.astype(np.float64).T
    assert fp8_probe_run.matmul_accuracy(a8, b8, exact)["reduced_bound_ratio"] == 0.0
    swapped = exact[:, ::-1].copy()  # columns in the wrong place: an indexing error
    assert fp8_probe_run.matmul_accuracy(a8, b8, swapped)["reduced_bound_ratio"] > 1.0


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("m, n, k", [(128, 128, 128), (256, 384, 1024), (384, 256, 4096)])
def test_the_matmul_matches_float64_of_the_rounded_inputs(m, n, k):
    row = fp8_probe_run.run_matmul(m, n, k, _seed())
    print(row)
    assert row["finite"]
    assert row["reduced_bound_ratio"] <= 1.0, row
    # The quantisation cost is reported, not bounded tightly: it must be rounding-sized.
    assert row["max_abs_error_vs_unrounded"] < 0.25 * row["max_abs_ref"]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_small_integer_products_come_out_exact():
    """Integers in [-3, 3] are exact in e4m3, and with K = 256 every partial sum is an
    integer below 2304 < 2^12: exact in any accumulator of 14 or more bits."""
    rng = _seed()
    a = rng.integers(-3, 4, (256, 256)).astype(np.float32)
    b = rng.integers(-3, 4, (128, 256)).astype(np.float32)
    out = fp8_probe.e4m3_matmul(jnp.asarray(a).astype(E4M3), jnp.asarray(b).astype(E4M3))
    np.testing.assert_array_equal(np.asarray(out), a.astype(np.float64) @ b.T)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_the_score_tile_matches_float64_of_the_rounded_inputs_times_the_scales():
    row = fp8_probe_run.run_scores(256, 512, 256, _seed())
    print(row)
    assert row["finite"]
    assert row["reduced_bound_ratio"] <= 1.0, row
    assert row["max_abs_error_vs_unrounded"] < 0.25 * row["max_abs_ref"]
