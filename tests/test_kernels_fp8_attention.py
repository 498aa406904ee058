"""The e4m3 attention kernel (``kernels.fp8_attention``): on this CPU through JAX's GPU
interpreter against float64 (exact attention, and a float64 emulation of the kernel's own
e4m3 data path) on fresh random inputs; the native path by lowering for CUDA; refusals.

The interpreter replaces the two ``wgmma`` by float32 ``dot_general`` on the same e4m3
shared-memory tiles, so what is checked here is the data path (quantisation scales,
V's transpose, GQA mapping, masks, the online softmax, ``P``'s rounding and scale, the
output's dequantisation); the ``gpu`` run (``kernels.tools.fp8_attention_run``) checks the
tensor cores' own accumulation.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import fp8_attention as fp8
from kernels.tools import fp8_attention_run as run
from tests.kernels_helpers import mosaic_module_text

EXACT_RMS_BOUND = 0.1
"""e4m3 keeps 3 significand bits: each of q, k, v and P is off by up to 2⁻⁴ of itself.
On unit-normal inputs the output's RMS error against exact attention measures about 0.05
of its RMS (the emulation alike); a broken scale, mask or mapping gives O(1)."""


def _rng() -> np.random.Generator:
    seed = secrets.randbits(32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x))))


def _inputs(rng, b, lq, lk, h, hk, scale=1.0, d=128):
    return tuple(jnp.asarray(scale * rng.standard_normal(s), jnp.bfloat16)
                 for s in ((b, lq, h, d), (b, lk, hk, d), (b, lk, hk, d)))


@pytest.mark.parametrize("b, lq, lk, h, hk, causal, kv_len", [
    (1, 256, 256, 2, 2, False, None),
    (2, 128, 384, 4, 2, False, None),  # GQA, several key blocks
    (1, 256, 256, 2, 1, True, None),
    (2, 128, 256, 2, 2, False, 150),  # keys past 150 masked, in the second block
])
def test_matches_its_float64_emulation_and_stays_near_exact_attention(b, lq, lk, h, hk,
                                                                      causal, kv_len):
    rng = _rng()
    q, k, v = _inputs(rng, b, lq, lk, h, hk)
    lengths = None if kv_len is None else jnp.full((b,), kv_len, jnp.int32)
    out = np.asarray(fp8.fp8_attention(q, k, v, causal=causal, kv_lengths=lengths,
                                       interpret=True), np.float64)
    emulated = run.reference(q, k, v, causal, kv_len, emulate=True)
    exact = run.reference(q, k, v, causal, kv_len, emulate=False)
    assert np.isfinite(out).all()
    assert _rms(out - emulated) <= run.EMULATION_BOUND * _rms(emulated)
    assert _rms(out - exact) <= EXACT_RMS_BOUND * _rms(exact)


def test_the_emulation_bound_catches_a_planted_fault():
    """The emulation check is a judge: the same output with V's dequantisation scale
    off by half an e4m3 step (1.0625x) must fail it, where the kernel's own passes."""
    rng = _rng()
    q, k, v = _inputs(rng, 1, 256, 256, 2, 2)
    out = np.asarray(fp8.fp8_attention(q, k, v, interpret=True), np.float64)
    emulated = run.reference(q, k, v, False, None, emulate=True)
    assert _rms(out * 1.0625 - emulated) > run.EMULATION_BOUND * _rms(emulated)
    assert _rms(out - emulated) <= run.EMULATION_BOUND * _rms(emulated)


def test_large_logits_keep_the_largest_key_and_a_row_with_no_key_is_zero():
    """q = k = v near bf16's top for one key: the output is v itself (the exponent of
    the largest logit is exactly 0); a batch row whose length is 0 returns zeros."""
    x = 1.3e5
    q = jnp.full((2, 64, 1, 128), x, jnp.bfloat16)
    k = jnp.full((2, 128, 1, 128), x, jnp.bfloat16)
    v = jnp.full((2, 128, 1, 128), x, jnp.bfloat16)
    out = np.asarray(fp8.fp8_attention(q, k, v, kv_lengths=jnp.array([1, 0], jnp.int32),
                                       interpret=True), np.float64)
    assert np.isfinite(out).all()
    expected = float(jnp.asarray(x, jnp.bfloat16))
    np.testing.assert_allclose(out[0], expected, rtol=2 ** -4)
    assert np.all(out[1] == 0.0)


N128 = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"
N256 = "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"


@pytest.mark.parametrize("q_shape, kv_shape, per_block", [
    # head_dim 128: Q K^T over 128 columns and P V over 128 keys, k32 each: 4 + 4 of n128
    ((2, 1024, 4, 128), (2, 1024, 2, 128), {N128: 8}),
    # head_dim 256: Q K^T is 8 k32 steps of n128; P V 4 of n256 (the head_dim as N)
    ((1, 512, 2, 256), (1, 512, 2, 256), {N128: 8, N256: 4}),
])
def test_lowers_for_cuda_to_e4m3_wgmma_with_float32_accumulation(monkeypatch, q_shape,
                                                                   kv_shape, per_block):
    q = jax.ShapeDtypeStruct(q_shape, jnp.bfloat16)
    kv = jax.ShapeDtypeStruct(kv_shape, jnp.bfloat16)
    _, module = mosaic_module_text(monkeypatch, lambda q, k, v: fp8.fp8_attention(q, k, v),
                                   q, kv, kv)
    assert Counter(re.findall(r"wgmma\.mma_async\S*", module)) == per_block


def test_head_dim_256_matches_its_float64_emulation_and_stays_near_exact_attention():
    """Two 128-byte swizzle groups per e4m3 row: ``Q Kᵀ`` contracts over both, ``P V``
    writes 256 output columns. Causal and GQA, so masks and mapping are exercised too."""
    rng = _rng()
    q, k, v = _inputs(rng, 1, 128, 256, 4, 2, d=256)
    out = np.asarray(fp8.fp8_attention(q, k, v, causal=True, interpret=True), np.float64)
    emulated = run.reference(q, k, v, True, None, emulate=True)
    exact = run.reference(q, k, v, True, None, emulate=False)
    assert out.shape == (1, 128, 4, 256)
    assert _rms(out - emulated) <= run.EMULATION_BOUND * _rms(emulated)
    assert _rms(out - exact) <= EXACT_RMS_BOUND * _rms(exact)


@pytest.mark.parametrize("shape_q, shape_kv, dtype, error, named", [
    ((1, 128, 2, 64), (1, 128, 2, 64), jnp.bfloat16, ValueError, "head_dim in"),
    ((1, 128, 2, 192), (1, 128, 2, 192), jnp.bfloat16, ValueError, "head_dim in"),
    ((1, 100, 2, 128), (1, 128, 2, 128), jnp.bfloat16, ValueError, "q_len 100"),
    ((1, 128, 2, 128), (1, 200, 2, 128), jnp.bfloat16, ValueError, "kv_len 200"),
    ((1, 128, 3, 128), (1, 128, 2, 128), jnp.bfloat16, ValueError, "multiple of num_kv_heads"),
    ((1, 128, 2, 128), (1, 128, 2, 128), jnp.float32, TypeError, "bfloat16 or float16"),
])
def test_what_it_cannot_serve_is_refused_by_name(shape_q, shape_kv, dtype, error, named):
    q = jax.ShapeDtypeStruct(shape_q, dtype)
    kv = jax.ShapeDtypeStruct(shape_kv, dtype)
    with pytest.raises(error, match=named):
        jax.eval_shape(lambda q, k, v: fp8.fp8_attention(q, k, v, interpret=True), q, kv, kv)


# ------------------------------------------------------------ the registered kernel

def test_the_contract_adapter_pads_masks_and_keeps_poisoned_padding_out_of_the_scales():
    """Odd lengths (q 100, kv 200: both padded inside), GQA, lengths whose padding holds
    NaN and the dtype's maximum: the output matches the emulation of the valid rows and
    keys, padded query rows are zero. A padded maximum inside the amax would shrink
    every valid value to e4m3's subnormals; NaN would poison the whole head."""
    from kernels.pallas_mosaic_gpu_fp8 import fp8_contract_attention

    rng = _rng()
    q, k, v = _inputs(rng, 2, 100, 200, 4, 2)
    q_lengths, kv_lengths = jnp.array([100, 70], jnp.int32), jnp.array([200, 130], jnp.int32)
    big = jnp.finfo(jnp.bfloat16).max
    q = q.at[1, 70:].set(big)
    k = k.at[1, 130:].set(jnp.nan)
    v = v.at[1, 130:].set(big)
    out = np.asarray(fp8_contract_attention(q, k, v, causal=False, scale=128 ** -0.5,
                                            q_lengths=q_lengths, kv_lengths=kv_lengths,
                                            interpret=True), np.float64)
    assert out.shape == (2, 100, 4, 128) and np.isfinite(out).all()
    assert np.all(out[1, 70:] == 0.0)
    for b, (ql, kl) in enumerate(((100, 200), (70, 130))):
        one = [x[b:b + 1, :n] for x, n in ((q, ql), (k, kl), (v, kl))]
        emulated = run.reference(*one, False, None, emulate=True)[0]
        exact = run.reference(*one, False, None, emulate=False)[0]
        got = out[b, :ql]
        assert _rms(got - emulated) <= run.EMULATION_BOUND * _rms(emulated), b
        assert _rms(got - exact) <= EXACT_RMS_BOUND * _rms(exact), b


@pytest.mark.parametrize("d, causal", [(32, False), (64, True), (200, False)])
def test_the_contract_adapter_pads_head_dim_with_zero_columns(d, causal):
    """MiniLM's 32, the long profiles' 64 and an odd 200 on the kernel's 128 and 256: the
    output has the true head_dim, matches the emulation of the zero-padded inputs at the
    true scale, and stays near exact attention. A wrong scale (the padded head_dim's),
    columns not zero or sliced wrong give O(1) errors."""
    from kernels.pallas_mosaic_gpu_fp8 import fp8_contract_attention

    rng = _rng()
    q, k, v = _inputs(rng, 1, 128, 256, 2, 2, d=d)
    scale = d ** -0.5
    out = np.asarray(fp8_contract_attention(q, k, v, causal=causal, scale=scale,
                                            q_lengths=None, kv_lengths=None,
                                            interpret=True), np.float64)
    assert out.shape == (1, 128, 2, d)
    wide = 128 if d <= 128 else 256
    padded = [jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, wide - d))) for x in (q, k, v)]
    emulated = run.reference(*padded, causal, None, emulate=True, scale=scale)[..., :d]
    exact = run.reference(q, k, v, causal, None, emulate=False, scale=scale)
    assert _rms(out - emulated) <= run.EMULATION_BOUND * _rms(emulated)
    assert _rms(out - exact) <= EXACT_RMS_BOUND * _rms(exact)


def test_the_registered_kernel_refuses_a_cpu_host_and_what_it_cannot_serve():
    from kernels.contract import validate
    from kernels.registry import IMPLEMENTATIONS

    kernel = IMPLEMENTATIONS["pallas_mosaic_gpu_fp8"]
    ok, _, _ = validate(jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16),
                        jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16),
                        jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16), causal=False)
    with pytest.raises(NotImplementedError, match="no CPU mode"):
        kernel.check_supported(ok, "cpu")
    kernel.check_supported(ok, "gpu")  # what it serves, where it is native
    for served in (32, 64, 200, 256):  # padded to 128 or 256 by the adapter
        spec, _, _ = validate(*(jax.ShapeDtypeStruct((1, 128, 2, served), jnp.bfloat16),) * 3,
                              causal=False)
        kernel.check_supported(spec, "gpu")
    d320, _, _ = validate(*(jax.ShapeDtypeStruct((1, 128, 2, 320), jnp.bfloat16),) * 3,
                          causal=False)
    with pytest.raises(NotImplementedError, match="head_dim <= 256"):
        kernel.check_supported(d320, "gpu")
    f32, _, _ = validate(*(jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.float32),) * 3,
                         causal=False)
    with pytest.raises(NotImplementedError, match="dtypes"):
        kernel.check_supported(f32, "gpu")
    with pytest.raises(ValueError, match="no block sizes"):
        kernel.check_supported(ok, "gpu", {"block_q": 64})


# ------------------------------------------------------------ magnitudes and scales

@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_values_at_the_dtypes_maximum_stay_finite_and_inside_vs_range(dtype):
    """A constant V at the dtype's maximum comes out finite, at most that maximum and
    within e4m3's 2⁻⁴ of it; random V near it stays inside its range. Before the output
    was clipped to V's range, the weights summing to 1 ± 2⁻⁴ (l adds the unrounded p)
    turned 41 % of such f16 outputs into inf."""
    rng = _rng()
    q, k, _ = _inputs(rng, 1, 128, 128, 2, 2)
    q, k = q.astype(dtype), k.astype(dtype)
    top = float(jnp.finfo(jnp.dtype(dtype)).max)
    v = jnp.full((1, 128, 2, 128), top, dtype)
    out = np.asarray(fp8.fp8_attention(q, k, v, interpret=True), np.float64)
    assert np.isfinite(out).all() and out.max() <= top
    assert np.abs(out - top).max() <= 2 ** -4 * top
    v = jnp.asarray(top * rng.uniform(-1, 1, (1, 128, 2, 128)), dtype)
    out = np.asarray(fp8.fp8_attention(q, k, v, interpret=True), np.float64)
    assert np.isfinite(out).all()
    assert np.abs(out).max() <= np.abs(np.asarray(v, np.float64)).max()


@pytest.mark.parametrize("q_scale, v_scale, causal", [
    (1e-17, 1.0, False), (1e-17, 1.0, True), (1.0, 3.9e-35, False), (1.0, 3.9e-36, False)])
def test_small_heads_neither_vanish_nor_turn_nan(q_scale, v_scale, causal):
    """Normal bf16 values whose per-head scales would flush to zero in float32 (XLA
    flushes subnormals): logits that underflow give uniform attention (finite, near
    exact, masked keys included: -inf times a logit scale of 0 would be NaN), a V head of
    amax 4e-35 or 4e-36 is reproduced, not zeroed or NaN."""
    rng = _rng()
    q, k, v = _inputs(rng, 1, 128, 256, 2, 2)
    q = (q.astype(jnp.float32) * q_scale).astype(jnp.bfloat16)
    k = (k.astype(jnp.float32) * q_scale).astype(jnp.bfloat16)
    v = (v.astype(jnp.float32) * v_scale).astype(jnp.bfloat16)
    out = np.asarray(fp8.fp8_attention(q, k, v, causal=causal, interpret=True), np.float64)
    exact = run.reference(q, k, v, causal, None, emulate=False)
    assert np.isfinite(out).all()
    assert _rms(out - exact) <= EXACT_RMS_BOUND * _rms(exact)


def test_a_non_default_scale_is_applied_and_a_bad_one_refused():
    """scale 0.5 (four times sharper than 1/sqrt(128) ~ 0.088) against the emulation at
    the same scale; the default's emulation differs from it by far more than the bound,
    so a kernel that ignored the scale would fail."""
    rng = _rng()
    q, k, v = _inputs(rng, 1, 128, 256, 2, 2)
    out = np.asarray(fp8.fp8_attention(q, k, v, sm_scale=0.5, interpret=True), np.float64)
    emulated = run.reference(q, k, v, False, None, emulate=True, scale=0.5)
    default = run.reference(q, k, v, False, None, emulate=True)
    assert _rms(out - emulated) <= run.EMULATION_BOUND * _rms(emulated)
    assert _rms(default - emulated) > 10 * run.EMULATION_BOUND * _rms(emulated)
    for bad in (0.0, -0.05, float("inf")):
        with pytest.raises(ValueError, match="sm_scale must be a finite positive"):
            fp8.fp8_attention(q, k, v, sm_scale=bad, interpret=True)


def test_lengths_past_the_keys_are_clipped_to_them():
    """kv_lengths 400 on 256 keys reads no block past the keys' end (the interpreter
    raises IndexError on one) and equals the call without lengths."""
    rng = _rng()
    q, k, v = _inputs(rng, 2, 128, 256, 2, 2)
    clipped = fp8.fp8_attention(q, k, v, kv_lengths=jnp.array([400, 256], jnp.int32),
                                interpret=True)
    whole = fp8.fp8_attention(q, k, v, interpret=True)
    np.testing.assert_array_equal(np.asarray(clipped), np.asarray(whole))


@pytest.mark.parametrize("q_len, kv_len", [(100, 200), (200, 100)])
def test_causal_with_unequal_lengths_in_float16_through_the_contract(q_len, kv_len):
    """Top-left causal with q_len != kv_len (both ways), odd lengths padded inside, f16."""
    from kernels.pallas_mosaic_gpu_fp8 import fp8_contract_attention

    rng = _rng()
    q, k, v = (x.astype(jnp.float16) for x in _inputs(rng, 1, q_len, kv_len, 2, 1))
    out = np.asarray(fp8_contract_attention(q, k, v, causal=True, scale=128 ** -0.5,
                                            q_lengths=None, kv_lengths=None,
                                            interpret=True), np.float64)
    exact = run.reference(q, k, v, True, None, emulate=False)
    assert np.isfinite(out).all()
    assert _rms(out - exact) <= EXACT_RMS_BOUND * _rms(exact)


def _quantiser_error_ok(x, x8, amax) -> bool:
    """Each dequantised element within half an e4m3 step of its input: 2⁻⁴ of it where
    normal, 2⁻¹⁰ of the head's scale (amax / 448) in e4m3's subnormal range."""
    b, seq, h, d = x.shape
    exact = np.transpose(np.asarray(jnp.asarray(x, jnp.float32), np.float64),
                         (0, 2, 1, 3)).reshape(b * h, seq, d)
    scale = np.asarray(amax, np.float64)[:, None, None] / fp8.E4M3_MAX
    back = np.asarray(x8.astype(jnp.float32), np.float64) * scale
    bound = np.maximum(2.0 ** -4 * np.abs(exact), 2.0 ** -10 * scale) * (1 + 1e-6)
    return bool(np.all(np.abs(back - exact) <= bound))


@pytest.mark.parametrize("magnitude", (1.0, 3e38, 1e-30))
def test_the_quantiser_rounds_each_element_to_a_nearest_e4m3_step(magnitude):
    """The quantiser the kernel and the emulation share, against exact rounding, at
    ordinary magnitudes and at bf16's extremes; and the check fails on a planted fault
    (a scale one e4m3 step off)."""
    rng = _rng()
    x = jnp.asarray(magnitude * rng.uniform(-1, 1, (2, 64, 3, 128)), jnp.bfloat16)
    x8, amax = fp8.quantize_per_head(x)
    assert _quantiser_error_ok(x, x8, amax)
    assert not _quantiser_error_ok(x, x8, amax * 1.125)


def test_traced_lengths_past_kv_len_read_as_kv_len_not_as_the_padded_keys():
    """kv_len 200 is padded to 256 inside; a traced length of 256 (the contract checks
    only concrete ones) must mean every real key, not the 56 zero keys past them."""
    from kernels.pallas_mosaic_gpu_fp8 import fp8_contract_attention

    rng = _rng()
    q, k, v = _inputs(rng, 1, 64, 200, 2, 2)

    @jax.jit
    def call(lengths):
        return fp8_contract_attention(q, k, v, causal=False, scale=128 ** -0.5,
                                      q_lengths=None, kv_lengths=lengths, interpret=True)

    past = np.asarray(call(jnp.array([256], jnp.int32)), np.float64)
    whole = np.asarray(call(jnp.array([200], jnp.int32)), np.float64)
    np.testing.assert_array_equal(past, whole)


def test_the_gpu_run_measures_the_head_dim_asked_and_refuses_one_the_kernel_lacks(capsys):
    """``fp8_attention_run --head-dim``: a case at 256 runs the kernel at 256 (interpreted
    here) within its emulation bound; a head_dim the kernel does not serve is a usage
    error naming the ones it does."""
    row = run.accuracy((1, 128, 128, 2, 2, False, None), _rng(), interpret=True, head_dim=256)
    assert row["case"] == "B1 Lq128 Lk128 H2/2 d256" and row["ok"], row
    assert row["vs_float64_rms"] < EXACT_RMS_BOUND
    with pytest.raises(SystemExit) as exit_:
        run.main(["--head-dim", "64"])
    assert exit_.value.code == 2
    assert "choose from 128, 256" in capsys.readouterr().err
