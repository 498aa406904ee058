"""pallas_mosaic_gpu's ``checked_fma_exponent`` switch: the per-row check (both ways, on
rows built to each side of it), the kernel keeping the FMA launch's output where no row
is flagged and rewriting it with the exact form where one is (JAX's GPU interpreter,
against float64 and against the exact kernel), the check's planted failure (a check that
never flags leaves the bug report's row non-finite), and the CUDA lowering (two
launches, the second aliased in place, one exponent form each)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import pallas_mosaic_gpu
from kernels.mosaic_variants import (
    FMA_EXPONENT_BOUND,
    MosaicVariant,
    fma_rows_unsafe,
    softmax_block_fma,
)
from kernels.pallas_mosaic_gpu import pallas_mosaic_gpu_attention
from kernels.reference import attention_reference, relative_error
from tests.kernels_helpers import mosaic_module_texts
from tests.test_kernels_pallas_mosaic_gpu import exp2_arguments

CHECKED = MosaicVariant(checked_fma_exponent=True)
REPORT = 130048.0  # the public bug report's q = k = v (bf16), one key, head_dim 64


def _flags(m, row_sum, acc):
    return np.asarray(fma_rows_unsafe(jnp.asarray(m, jnp.float32), jnp.asarray(row_sum, jnp.float32),
                                      jnp.asarray(acc, jnp.float32))).tolist()


def test_the_row_check_flags_a_final_max_past_the_bound_and_non_finite_rows_only():
    """Rows built on each side: a max just under 2**24 (either sign) and a row that saw no
    key (max -inf, l 0) pass; just at the bound, +inf, NaN, an accumulator holding inf or
    NaN, and an infinite or NaN ``l`` are flagged."""
    under = np.nextafter(np.float32(FMA_EXPONENT_BOUND), np.float32(0))
    rows = [  # (m_last, l, one accumulator value, flagged)
        (0.0, 1.0, 0.5, False), (under, 3.0, -2.0, False), (-under, 1.0, 1.0, False),
        (-np.inf, 0.0, 0.0, False),
        (FMA_EXPONENT_BOUND, 1.0, 1.0, True), (-FMA_EXPONENT_BOUND, 1.0, 1.0, True),
        (np.inf, 1.0, 1.0, True), (np.nan, 1.0, 1.0, True),
        (1.0, 1.0, np.inf, True), (1.0, 1.0, -np.inf, True), (1.0, 1.0, np.nan, True),
        (1.0, np.inf, 1.0, True), (1.0, np.nan, 1.0, True),
    ]
    m, row_sum, a, flagged = (np.array(col) for col in zip(*rows, strict=True))
    acc = np.ones((len(rows), 64), np.float32) * 0.25
    acc[:, 17] = a
    assert _flags(m, row_sum, acc) == [1.0 if f else 0.0 for f in flagged]


def _call(q, k, v, variant, *, causal=False, kv_lengths=None):
    return np.asarray(jnp.asarray(
        pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=q.shape[-1] ** -0.5,
                                    q_lengths=None, kv_lengths=kv_lengths, interpret=True,
                                    variant=variant), jnp.float32), np.float64)


def _inputs(seed=None):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((1, 256, 2, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((1, 320, 1, 64)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((1, 320, 1, 64)), jnp.bfloat16)
    return q, k, v


@pytest.mark.parametrize("variant", [CHECKED,
                                     MosaicVariant(checked_fma_exponent=True,
                                                   intra_wg_pipeline=True),
                                     MosaicVariant(checked_fma_exponent=True,
                                                   lazy_rescale_log2=8.0)],
                         ids=lambda v: v.label())
def test_the_switch_in_interpret_mode_against_float64(variant):
    """Fresh random inputs, causal, a key length that is no tile multiple: within the
    bf16 kernels' error of float64."""
    q, k, v = _inputs()
    kl = jnp.array([301], jnp.int32)
    out = _call(q, k, v, variant, causal=True, kv_lengths=kl)
    ref = attention_reference(q, k, v, causal=True, scale=0.125, kv_lengths=kl)
    assert relative_error(out, ref) < 4e-3


def test_the_switch_with_both_lengths_in_float16_against_float64():
    """Both length operands beside the flag operands (the order the kernel pops them),
    float16, two examples: each within the kernels' error of its float64 reference."""
    rng = np.random.default_rng()
    q = jnp.asarray(rng.standard_normal((2, 200, 2, 64)), jnp.float16)
    k = jnp.asarray(rng.standard_normal((2, 301, 1, 64)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((2, 301, 1, 64)), jnp.float16)
    ql, kl = jnp.array([200, 77], jnp.int32), jnp.array([150, 0], jnp.int32)
    out = pallas_mosaic_gpu_attention(q, k, v, causal=True, scale=0.125, q_lengths=ql,
                                      kv_lengths=kl, interpret=True, variant=CHECKED)
    ref = attention_reference(q, k, v, causal=True, scale=0.125, q_lengths=ql, kv_lengths=kl)
    assert relative_error(np.asarray(jnp.asarray(out, jnp.float32), np.float64), ref) < 4e-3


def test_vmap_folds_the_mapped_axis_into_the_batch():
    """The checked switch's vmap rule (its in-place launch has none of its own): three
    examples mapped, lengths mapped or shared, run as one call over the folded batch
    (the stand-in sees ``[3 * 2, ...]``), and each example's result is its own call's."""
    from kernels.pallas_mosaic_gpu import _folding_vmap
    from kernels.xla import xla_attention

    seen = []

    def stand_in(q, k, v, q_lengths, kv_lengths):
        seen.append((q.shape, None if kv_lengths is None else kv_lengths.shape))
        return xla_attention(q, k, v, causal=True, scale=0.125, q_lengths=q_lengths,
                             kv_lengths=kv_lengths)

    rng = np.random.default_rng()
    q = jnp.asarray(rng.standard_normal((3, 2, 40, 2, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((3, 2, 50, 1, 16)), jnp.float32)
    kl = jnp.array([[50, 5], [20, 0], [1, 49]], jnp.int32)
    folded = _folding_vmap(stand_in)
    mapped = jax.vmap(lambda q, k, kl: folded(q, k, k, None, kl))(q, k, kl)
    shared = jax.vmap(lambda q, k: folded(q, k, k, None, kl[1]))(q, k)
    # (custom_vmap also traces the unmapped body once, at one example's shapes)
    assert [s for s in seen if s[0][0] != 2] == [((6, 40, 2, 16), (6,))] * 2
    for i in range(3):
        np.testing.assert_allclose(mapped[i], stand_in(q[i], k[i], k[i], None, kl[i]),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(shared[i], stand_in(q[i], k[i], k[i], None, kl[1]),
                                   rtol=1e-6, atol=1e-6)


def _planted_fma(factor):
    """``softmax_block_fma`` with every ``p`` multiplied by ``factor`` (NaN: a broken
    form the check must catch; a finite factor on one column: a wrong but finite form
    it cannot, which shows whose output the call returned)."""
    def step(m_old, s, scale_log2, threshold, broadcast=None):
        m_new, moved, alpha, p = softmax_block_fma(m_old, s, scale_log2, threshold, broadcast)
        col = jax.lax.broadcasted_iota(jnp.int32, p.shape, 1)
        return m_new, moved, alpha, jnp.where(col == 0, p * jnp.float32(factor), p)
    return step


def test_unflagged_calls_keep_the_fma_launch_s_output(monkeypatch):
    """With the FMA form planted to weigh each block's first key 8 times, ordinary
    inputs (no row flagged) come back with that planted error under the switch (the
    exact launch wrote nothing) and without it when the switch is off."""
    q, k, v = _inputs()
    exact = _call(q, k, v, MosaicVariant())
    monkeypatch.setattr(pallas_mosaic_gpu, "softmax_block_fma", _planted_fma(8.0))
    planted = _call(q, k, v, CHECKED)
    assert relative_error(planted, exact) > 0.02
    np.testing.assert_array_equal(_call(q, k, v, MosaicVariant()), exact)


def test_query_rows_past_their_length_flag_nothing(monkeypatch):
    """NaN and 3e38 in the query rows past ``q_lengths`` (padding, written as zeros
    either way) set no flag: with the FMA form planted to weigh each block's first key 8
    times, the planted error stays in the valid rows (no rerun) and the padding rows
    are zeros."""
    q, k, v = _inputs()
    ql = jnp.array([100], jnp.int32)
    q = q.at[:, 100:150].set(jnp.nan).at[:, 150:].set(3e38)
    kwargs = dict(causal=False, scale=0.125, q_lengths=ql, kv_lengths=None, interpret=True)
    exact = np.asarray(jnp.asarray(pallas_mosaic_gpu_attention(
        q, k, v, variant=MosaicVariant(), **kwargs), jnp.float32), np.float64)
    monkeypatch.setattr(pallas_mosaic_gpu, "softmax_block_fma", _planted_fma(8.0))
    got = np.asarray(jnp.asarray(pallas_mosaic_gpu_attention(
        q, k, v, variant=CHECKED, **kwargs), jnp.float32), np.float64)
    assert relative_error(got[:, :100], exact[:, :100]) > 0.02
    np.testing.assert_array_equal(got[:, 100:], 0.0)


def test_a_flagged_row_reruns_the_whole_call_with_the_exact_form(monkeypatch):
    """With the FMA form planted to return NaN, every row is flagged (non-finite) and the
    call's output is the exact kernel's, bit for bit."""
    q, k, v = _inputs()
    exact = _call(q, k, v, MosaicVariant(), causal=True)
    monkeypatch.setattr(pallas_mosaic_gpu, "softmax_block_fma", _planted_fma(math.nan))
    np.testing.assert_array_equal(_call(q, k, v, CHECKED, causal=True), exact)


def _report_inputs():
    """The bug report's case beside ordinary rows: one head of q = k = v = 130048 with
    one key (the FMA form's exponent is the rounding of ``max(s) * c``: p is 0 or inf),
    one head of random values."""
    rng = np.random.default_rng()
    q = np.asarray(rng.standard_normal((1, 128, 2, 64)), np.float32)
    q[:, :, 0, :] = REPORT
    k = np.asarray(rng.standard_normal((1, 1, 2, 64)), np.float32)
    k[:, :, 0, :] = REPORT
    v = k.copy()
    return (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


def _contracted_fma_step(m_old, s, scale_log2, threshold, broadcast=None):
    """``softmax_block_fma`` as the GPU computes it: ``p = exp2(s * c - M)`` with ``s * c``
    unrounded (one FMA), emulated exactly in float32 by Dekker's product ``s * c = hi +
    lo`` (Veltkamp's split by 4097), since JAX's interpreter does not contract."""
    m_new, moved, alpha, _ = softmax_block_fma(m_old, s, scale_log2, threshold, broadcast)
    c = jnp.float32(scale_log2)
    t = s * jnp.float32(4097.0)
    s_hi = t - (t - s)
    s_lo = s - s_hi
    t = c * jnp.float32(4097.0)
    c_hi = t - (t - c)
    c_lo = c - c_hi
    hi = s * c
    lo = ((s_hi * c_hi - hi) + s_hi * c_lo + s_lo * c_hi) + s_lo * c_lo
    lo = jnp.where(jnp.abs(hi) < jnp.inf, lo, 0.0)
    m_wide = m_new[:, None] if broadcast is None else broadcast(m_new, s.shape)
    return m_new, moved, alpha, jnp.exp2((hi - m_wide) + lo)


def test_the_bug_report_s_magnitudes_run_the_exact_form_and_a_silent_check_would_not(
        monkeypatch):
    """With the FMA step as the GPU rounds it, rows at the bug report's magnitude get the
    value itself (their keys weigh the same) and ordinary rows match float64; with the
    check planted to flag nothing, the same call's report rows lose their value (the
    exponent is the rounding of ``max(s) * c``: ``p`` is 0 or inf), the failure the
    check exists for."""
    monkeypatch.setattr(pallas_mosaic_gpu, "softmax_block_fma", _contracted_fma_step)
    q, k, v = _report_inputs()
    out = _call(q, k, v, CHECKED)
    np.testing.assert_array_equal(out[0, :, 0, :], REPORT)
    ref = attention_reference(q, k, v, causal=False, scale=0.125)
    assert relative_error(out[:, :, 1:], ref[:, :, 1:]) < 4e-3
    monkeypatch.setattr(pallas_mosaic_gpu, "fma_rows_unsafe",
                        lambda m, row_sum, acc: jnp.zeros_like(row_sum))
    silent = _call(q, k, v, CHECKED)
    assert not np.any(silent[0, :, 0, :] == REPORT)


def test_the_contracted_step_matches_the_cpu_s_own_fma_on_ordinary_logits():
    """The emulation above is the FMA: on random logits near 2**20 in log2 units, its
    ``p`` equals the jitted step's (this host's XLA contracts ``s * c - M``) exactly."""
    rng = np.random.default_rng()
    c = float(np.float32(math.log2(math.e) / 8.0))
    s = jnp.asarray(2.0 ** 20 / c + rng.normal(0.0, 8.0, (8, 64)), jnp.float32)
    m0 = jnp.full((8,), -jnp.inf, jnp.float32)
    jitted = jax.jit(lambda m, x: softmax_block_fma(m, x, c, None))(m0, s)[3]
    emulated = _contracted_fma_step(m0, s, c, None)[3]
    np.testing.assert_array_equal(np.asarray(emulated), np.asarray(jitted))


@pytest.mark.parametrize("causal", [False, True])
def test_the_switch_lowers_to_an_fma_launch_and_an_exact_launch_aliased_in_place(
        causal, monkeypatch):
    """Lowered for CUDA at head_dim 128: two Mosaic GPU launches; the second writes the
    first one's output buffer in place (an output-operand alias, so no copy); the first
    computes every exp2 argument of a logit with the fused form (``arith.subf`` of an
    ``arith.mulf``: one FMA), the second none."""
    q = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)

    def fn(q, k, v):
        return pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=0.1, q_lengths=None,
                                           kv_lengths=None, variant=CHECKED)

    lowered, (first, second) = mosaic_module_texts(monkeypatch, fn, q, q, q)
    assert lowered.count("mosaic_gpu_v2") == 2 and lowered.count("#stablehlo.output_operand_alias<") == 1

    def fused(module):
        return [a for a in exp2_arguments(module)
                if a[0] in ("arith.addf", "arith.subf") and "arith.mulf" in a[1]]

    assert len(fused(first)) >= 64 and not fused(second)


def test_under_vmap_the_switch_lowers_to_the_same_two_launches_over_the_folded_batch(
        monkeypatch):
    """``jit(vmap(...))`` over 3 examples of batch 2, lowered for CUDA: still two launches
    and one in-place alias (the folded call), the output shaped ``[3, 2, ...]``."""
    q = jax.ShapeDtypeStruct((3, 2, 256, 2, 128), jnp.bfloat16)

    def fn(q, k, v):
        return pallas_mosaic_gpu_attention(q, k, v, causal=True, scale=0.1, q_lengths=None,
                                           kv_lengths=None, variant=CHECKED)

    lowered, modules = mosaic_module_texts(monkeypatch, jax.vmap(fn), q, q, q)
    assert len(modules) == 2 and lowered.count("mosaic_gpu_v2") == 2
    assert lowered.count("#stablehlo.output_operand_alias<") == 1
    assert "tensor<6x256x2x128xbf16>" in lowered
    assert "-> tensor<3x2x256x2x128xbf16>" in lowered


def test_the_two_fma_switches_are_exclusive():
    with pytest.raises(ValueError, match="set at most one"):
        MosaicVariant(bounded_fma_exponent=True, checked_fma_exponent=True)
