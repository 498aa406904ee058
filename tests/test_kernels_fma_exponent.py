"""pallas_mosaic_gpu's ``bounded_fma_exponent`` switch: the bound that decides per call,
the one-FMA softmax step it permits (against float64 where bounded, failing past the bound
under the CPU's contraction, as on the GPU), the kernel's routing by the flag in JAX's GPU
interpreter (both ways), and its CUDA lowering (both exponent forms present)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import pallas_mosaic_gpu
from kernels.mosaic_variants import (
    FMA_EXPONENT_BOUND,
    MosaicVariant,
    fma_exponent_is_safe,
    softmax_block,
    softmax_block_fma,
)
from kernels.pallas_mosaic_gpu import pallas_mosaic_gpu_attention
from kernels.reference import attention_reference, relative_error
from tests.test_kernels_pallas_mosaic_gpu import _mosaic_module, exp2_arguments

LOG2_E = math.log2(math.e)
ON = MosaicVariant(bounded_fma_exponent=True)


def _bound(head_dim: int, q_max: float, k_max: float, scale: float) -> float:
    return head_dim * q_max * k_max * scale * LOG2_E


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_bound_is_head_dim_times_the_largest_magnitudes(head_dim):
    """Safe exactly where ``head_dim * max|q| * max|k| * scale * log2 e`` is under 2**24:
    the magnitudes straddling it (computed here in float64) land on each side, one
    element carrying each maximum among small random ones."""
    scale = head_dim ** -0.5
    edge = math.sqrt(FMA_EXPONENT_BOUND / (head_dim * scale * LOG2_E))
    rng = np.random.default_rng()
    for x, safe in ((edge * 0.99, True), (edge * 1.01, False)):
        q = rng.uniform(-1, 1, (2, 64, 3, head_dim)).astype(np.float32)
        k = rng.uniform(-1, 1, (2, 96, 1, head_dim)).astype(np.float32)
        q[1, 7, 2, 5], k[0, 50, 0, 9] = -x, x
        assert (_bound(head_dim, x, x, scale) < FMA_EXPONENT_BOUND) is safe
        assert bool(fma_exponent_is_safe(jnp.asarray(q), jnp.asarray(k), scale)) is safe


def test_inf_and_the_bug_report_s_magnitude_are_not_safe_and_nan_decides_nothing():
    q = np.ones((1, 8, 1, 64), np.float32)
    for bad, safe in ((np.inf, False), (-np.inf, False), (np.nan, True)):
        poisoned = q.copy()
        poisoned[0, 3, 0, 1] = bad
        assert bool(fma_exponent_is_safe(jnp.asarray(poisoned), jnp.asarray(q), 0.125)) is safe
        assert bool(fma_exponent_is_safe(jnp.asarray(q), jnp.asarray(poisoned), 0.125)) is safe
    report = jnp.full((1, 8, 1, 64), 130048.0, jnp.bfloat16)  # 64 * x**2 / 8 * log2 e: 2e11
    assert not bool(fma_exponent_is_safe(report, report, 0.125))
    assert bool(fma_exponent_is_safe(report, jnp.asarray(q), 0.125))  # 1.5e6: under 2**24
    nan_beside_big = np.full((1, 8, 1, 64), 130048.0, np.float32)
    nan_beside_big[0, 1, 0, 0] = np.nan
    assert not bool(fma_exponent_is_safe(jnp.asarray(nan_beside_big), report, 0.125))
    all_nan = jnp.full((1, 8, 1, 64), jnp.nan, jnp.float32)
    assert not bool(fma_exponent_is_safe(all_nan, all_nan, 0.125))
    big = jnp.full((1, 8, 1, 64), 3e38, jnp.float32)  # the product past float32: inf
    assert not bool(fma_exponent_is_safe(big, big, 0.125))


def _two_blocks(step, s1, s2, c):
    """Weights of the two blocks' keys after the online softmax of ``step`` (jitted on
    this CPU, whose XLA contracts ``s * c - m`` into one FMA as the GPU does)."""
    step = jax.jit(functools.partial(step, scale_log2=c, threshold=None))
    m0 = jnp.full((s1.shape[0],), -jnp.inf, jnp.float32)
    m1, _, _, p1 = step(m0, jnp.asarray(s1))
    m2, _, alpha2, p2 = step(m1, jnp.asarray(s2))
    p1, p2, alpha2 = (np.asarray(a, np.float64) for a in (p1, p2, alpha2))
    weights = np.concatenate([p1 * alpha2[:, None], p2], axis=1)
    return weights / weights.sum(axis=1, keepdims=True), np.asarray(p1)


@pytest.mark.parametrize("offset", [0.0, 1e3, 2.0 ** 22])
def test_the_fma_step_is_the_softmax_where_the_bound_holds(offset):
    """Two blocks of logits whose ``|s * c|`` reaches ``offset`` (up to 2**22 in log2 units,
    under the bound): the one-FMA step's weights equal float64's softmax, as the exact
    step's do, and each row's largest p is within [2**-0.5, 2**0.5] (the rounding of the
    row max in log2 units), not necessarily 1."""
    c = np.float32(LOG2_E / 8.0)
    rng = np.random.default_rng()
    s = (offset / c + rng.normal(0.0, 8.0, (6, 64))).astype(np.float32)
    s1, s2 = s[:, :32], s[:, 32:]
    expected = np.exp2((s.astype(np.float64) - s.max(axis=1, keepdims=True)) * float(c))
    expected /= expected.sum(axis=1, keepdims=True)
    got, p1 = _two_blocks(softmax_block_fma, s1, s2, float(c))
    exact, _ = _two_blocks(softmax_block, s1, s2, float(c))
    np.testing.assert_allclose(exact, expected, rtol=2e-5, atol=1e-12)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-12)
    assert np.all(p1.max(axis=1) >= 2 ** -0.5) and np.all(p1.max(axis=1) <= 2 ** 0.5)


def test_past_the_bound_the_fma_step_loses_the_row_which_is_why_it_is_bounded():
    """At the bug report's q = k = 130048 (bf16), head_dim 64, one key: the FMA step's
    only p is 0 or inf (the exponent is the rounding of ``max(s) * c``, -4293 here), so
    the kernel must not run it there; the exact step gives 1."""
    c = float(np.float32(LOG2_E / 8.0))
    s = np.full((1, 8), -np.inf, np.float32)
    s[0, 0] = np.float32(64.0 * 130048.0 ** 2)
    m0 = jnp.full((1,), -jnp.inf, jnp.float32)
    fma = jax.jit(functools.partial(softmax_block_fma, scale_log2=c, threshold=None))
    exact = jax.jit(functools.partial(softmax_block, scale_log2=c, threshold=None))
    p_fma = float(np.asarray(fma(m0, jnp.asarray(s))[3])[0, 0])
    p_exact = float(np.asarray(exact(m0, jnp.asarray(s))[3])[0, 0])
    assert p_exact == 1.0
    assert p_fma in (0.0, math.inf)


def _call(q, k, v, variant, *, causal=True, kv_lengths=None):
    return pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=q.shape[-1] ** -0.5,
                                       q_lengths=None, kv_lengths=kv_lengths, interpret=True,
                                       variant=variant)


def _inputs(scale=1.0, seed=None):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((1, 256, 2, 64)) * scale, jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((1, 320, 1, 64)) * scale, jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((1, 320, 1, 64)), jnp.bfloat16)
    return q, k, v


def test_the_kernel_takes_the_fma_form_exactly_where_the_flag_allows(monkeypatch):
    """Routing, both ways, in the interpreter: with the FMA step planted to return NaN,
    ordinary inputs (bounded) come out NaN under the switch and finite without it, and
    inputs past the bound (q, k scaled by 2e3: ``64 * 2e3**2 * ...`` well over 2**24) come
    out finite under the switch: the exact step ran."""
    def poisoned(m_old, s, scale_log2, threshold, broadcast=None):
        m_new, moved, alpha, p = softmax_block_fma(m_old, s, scale_log2, threshold,
                                                   broadcast)
        return m_new, moved, alpha, p * jnp.float32(jnp.nan)

    monkeypatch.setattr(pallas_mosaic_gpu, "softmax_block_fma", poisoned)
    q, k, v = _inputs()
    assert bool(fma_exponent_is_safe(q, k, 0.125))
    assert np.isnan(np.asarray(_call(q, k, v, ON), np.float32)).all()
    assert np.isfinite(np.asarray(_call(q, k, v, MosaicVariant()), np.float32)).all()
    big = _inputs(scale=2e3)
    assert not bool(fma_exponent_is_safe(big[0], big[1], 0.125))
    assert np.isfinite(np.asarray(_call(*big, ON), np.float32)).all()


@pytest.mark.parametrize("variant", [ON, MosaicVariant(bounded_fma_exponent=True,
                                                       intra_wg_pipeline=True),
                                     MosaicVariant(bounded_fma_exponent=True,
                                                   lazy_rescale_log2=8.0)],
                         ids=lambda v: v.label())
def test_the_switch_in_interpret_mode_against_float64(variant):
    """The kernel with the switch on fresh random inputs, causal with a length that is no
    tile multiple: within the bf16 kernels' error of float64 (the FMA form ran: the
    inputs are bounded)."""
    q, k, v = _inputs()
    kl = jnp.array([301], jnp.int32)
    out = np.asarray(jnp.asarray(_call(q, k, v, variant, kv_lengths=kl), jnp.float32),
                     np.float64)
    ref = attention_reference(q, k, v, causal=True, scale=0.125, kv_lengths=kl)
    assert relative_error(out, ref) < 4e-3


@pytest.mark.parametrize("variant", [ON, MosaicVariant(bounded_fma_exponent=True,
                                                       intra_wg_pipeline=True)],
                         ids=lambda v: v.label())
def test_the_switch_lowers_with_both_exponent_forms(variant, monkeypatch):
    """Lowered for CUDA: the module holds exp2 arguments of the fused form
    (``arith.subf`` of an ``arith.mulf``: one FMA under ``contract``) and of the exact
    form; without the switch it holds none of the first (the extreme-value test's rule)."""
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)

    def module(var):
        def fn(q, k, v):
            return pallas_mosaic_gpu_attention(q, k, v, causal=False, scale=0.1,
                                               q_lengths=None, kv_lengths=None, variant=var)
        return exp2_arguments(_mosaic_module(monkeypatch, fn, q, q, q))

    def fused(args):
        return [a for a in args if a[0] in ("arith.addf", "arith.subf") and "arith.mulf" in a[1]]

    on = module(variant)
    assert fused(on) and len(fused(on)) < len(on)
    off = module(variant.model_copy(update={"bounded_fma_exponent": False}))
    assert not fused(off)


@pytest.mark.parametrize("causal", [False, True])
def test_the_switch_is_registered_from_16384_keys_at_head_dim_64(causal):
    """Where it was measured to pay (H100, S = 16384 full and causal): on top of the
    switches registered at shorter lengths, nothing else changed; shorter calls, calls of
    unknown length and head_dim 256 (where it lost) run without it."""
    from kernels.mosaic_variants import registered_default

    short = registered_default(64, causal=causal, kv_len=4096)
    for kv_len in (16384, 131072):
        long_ = registered_default(64, causal=causal, kv_len=kv_len)
        assert long_ == short.model_copy(update={"bounded_fma_exponent": True}), kv_len
    for kv_len in (1, 4096, 16383, None):
        assert not registered_default(64, causal=causal,
                                      kv_len=kv_len).bounded_fma_exponent, kv_len
    assert not registered_default(256, causal=causal, kv_len=16384).bounded_fma_exponent


def test_at_head_dim_128_the_checked_fma_comes_first_and_the_bounded_one_after_it():
    """head_dim 128: the checked FMA without a causal mask at every length and with one
    from 16384 keys (where it was measured to pay), the bounded one next from 16384 keys
    (for tilings that cannot hold the checked one's row flags), the exact form under
    16384 causal keys and where the mask is unknown below 16384."""
    from kernels.mosaic_variants import registered_candidates, registered_default

    def first(causal, kv_len):
        variant = registered_default(128, causal=causal, kv_len=kv_len)
        return variant.checked_fma_exponent, variant.bounded_fma_exponent

    for kv_len in (1, 4096, 16384, None):
        assert first(False, kv_len) == (True, False), kv_len
    for kv_len in (16384, 131072):
        assert first(True, kv_len) == (True, False), kv_len
        fallback = list(registered_candidates(128, causal=True, kv_len=kv_len))[1]
        assert fallback.bounded_fma_exponent and not fallback.checked_fma_exponent
        assert first(None, kv_len) == (False, True), kv_len
    for kv_len in (1, 4096, 16383):
        assert first(True, kv_len) == (False, False), kv_len
    assert first(None, None) == (False, False)


def test_a_rule_with_a_least_length_applies_only_from_that_length():
    from kernels.mosaic_variants import SwitchRule

    rule = SwitchRule(padded_head_dim=128, min_kv_len=100, switches={})
    assert [rule.applies(128, None, n) for n in (99, 100, 5000, None)] == [
        False, True, True, False]
    assert not rule.applies(64, None, 100)
    both = SwitchRule(padded_head_dim=128, min_kv_len=100, max_kv_len=200, switches={})
    assert [both.applies(128, True, n) for n in (99, 100, 200, 201)] == [
        False, True, True, False]
    with pytest.raises(ValueError, match="min_kv_len 300 > max_kv_len 200"):
        SwitchRule(padded_head_dim=128, min_kv_len=300, max_kv_len=200, switches={})
