"""Every CPU-runnable implementation against the float64 reference.

pallas_tpu runs in TPU interpret mode here (slow), so the default cases are hand
picked to cover each listed value at least once rather than a cartesian product:
dtypes f32/bf16/f16; head_dim 32, 64, 80, 96, 128, 256; q_len == kv_len, q_len <
kv_len and q_len > kv_len; lengths 1, 127, 129, 300 (not block multiples);
causal and not; GQA groups 1, 2, 3 and all heads on one kv head; padding lengths
including zero (rows that see no key). A broader sweep runs under ``-m slow``.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.pallas_tpu import TpuConfig
from tests.kernels_helpers import (
    Case,
    assert_accurate,
    random_inputs,
    reference_for,
)

IMPLEMENTATIONS = ("naive", "xla", "auto", "pallas_tpu")

CASES = [
    Case("f32-d32-one-query", q_len=1, kv_len=129, head_dim=32),
    Case("f32-d64-127-causal-gqa2", q_len=127, kv_len=127, num_heads=4, num_kv_heads=2,
         causal=True),
    Case("f32-d80-129x300-gqa3", q_len=129, kv_len=300, num_heads=3, num_kv_heads=1,
         head_dim=80),
    Case("f32-d128-300x129-causal-bq64", q_len=300, kv_len=129, head_dim=128, causal=True,
         config=TpuConfig(block_q=64, block_kv=128)),
    Case("f32-d256-40x129-mqa", q_len=40, kv_len=129, num_heads=4, num_kv_heads=1,
         head_dim=256),
    Case("f32-padding-causal-bq16", batch=2, q_len=129, kv_len=129, num_heads=2,
         num_kv_heads=1, causal=True, q_lengths=(129, 64), kv_lengths=(100, 129),
         config=TpuConfig(block_q=16, block_kv=128)),
    Case("f32-zero-lengths", batch=3, q_len=24, kv_len=129, head_dim=32,
         q_lengths=(0, 17, 24), kv_lengths=(129, 0, 60)),
    Case("bf16-d64-129-causal-padding", batch=2, q_len=129, kv_len=129, causal=True,
         dtype="bfloat16", q_lengths=(100, 129), kv_lengths=(129, 0)),
    Case("bf16-d128-127x300-causal-gqa3-bq32", q_len=127, kv_len=300, num_heads=6,
         num_kv_heads=2, head_dim=128, causal=True, dtype="bfloat16",
         config=TpuConfig(block_q=32, block_kv=128)),
    # One key: every row copies v[0]; exact in any dtype.
    Case("bf16-d96-300x1", q_len=300, kv_len=1, head_dim=96, dtype="bfloat16"),
    Case("f16-d32-129x127-padding", batch=2, q_len=129, kv_len=127, num_heads=4,
         num_kv_heads=4, head_dim=32, dtype="float16", q_lengths=(129, 5),
         kv_lengths=(1, 127)),
    Case("f16-d256-64-causal-mqa", q_len=64, kv_len=64, num_heads=2, num_kv_heads=1,
         head_dim=256, causal=True, dtype="float16"),
    Case("f16-d80-1x300", q_len=1, kv_len=300, head_dim=80, dtype="float16"),
    Case("bf16-d64-256-bkv256", q_len=256, kv_len=384, causal=True, dtype="bfloat16",
         config=TpuConfig(block_q=128, block_kv=256)),
]


def _naive_error(q, k, v, case: Case, ql, kl, ref) -> float:
    out = kernels.attention(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl,
                            implementation="naive")
    return kernels.relative_error(out, ref)


def _check(implementation: str, case: Case, seed: int = 0):
    q, k, v, ql, kl = random_inputs(case, seed)
    ref = reference_for(q, k, v, case, ql, kl)
    # Block sizes go to tiled kernels only: the others refuse them (nothing to tile).
    tiled = kernels.IMPLEMENTATIONS[kernels.resolve(implementation).name].tiled
    config = case.config if tiled else None
    out = kernels.attention(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl,
                            implementation=implementation, config=config)
    assert out.shape == q.shape and out.dtype == q.dtype
    is_naive = kernels.resolve(implementation).name == "naive"
    naive = (None if case.dtype == "float32" or is_naive
             else _naive_error(q, k, v, case, ql, kl, ref))
    assert_accurate(out, ref, case.dtype, naive)
    out = np.asarray(out, np.float64)
    # Rows that see no key are exactly zero (the contract), not merely small.
    empty = ~np.any(np.abs(ref) > 0, axis=(2, 3))
    assert np.all(out[empty] == 0.0)
    return out, ref


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_matches_float64_reference(implementation, case):
    _check(implementation, case)


def test_cases_cover_the_acceptance_list():
    """The hand-picked list above must keep covering every listed value."""
    assert {c.dtype for c in CASES} == {"float32", "bfloat16", "float16"}
    assert {32, 64, 128, 256} <= {c.head_dim for c in CASES}
    assert any(c.head_dim & (c.head_dim - 1) for c in CASES)  # not a power of two
    assert {1, 127, 129, 300} <= {c.q_len for c in CASES} | {c.kv_len for c in CASES}
    assert {"equal", "shorter", "longer"} == {
        "equal" if c.q_len == c.kv_len else "shorter" if c.q_len < c.kv_len else "longer"
        for c in CASES}
    assert {True, False} == {c.causal for c in CASES}
    groups = {c.num_heads // c.num_kv_heads for c in CASES}
    assert {1, 2, 3} <= groups and any(c.num_kv_heads == 1 and c.num_heads > 1 for c in CASES)
    lengths = [x for c in CASES for x in (c.q_lengths or ()) + (c.kv_lengths or ())]
    assert 0 in lengths


def test_padding_rows_are_zero_and_the_rest_exact():
    """Padding rows of ``q`` and rows with all keys masked are zeros in every
    implementation; the visible rows still match the reference."""
    case = Case("padding", batch=3, q_len=20, kv_len=30, head_dim=32,
                q_lengths=(20, 7, 0), kv_lengths=(0, 30, 11))
    for implementation in IMPLEMENTATIONS:
        out, ref = _check(implementation, case)
        assert np.all(out[0] == 0.0)          # kv_length 0: every key masked
        assert np.all(out[1, 7:] == 0.0)      # query padding
        assert np.all(out[2] == 0.0)          # q_length 0
        assert np.abs(out[1, :7]).max() > 0.1  # real rows are not zeroed


STABILITY = [
    ("huge-logits-f32", "float32", 100.0),
    ("huge-logits-bf16", "bfloat16", 100.0),
]


@pytest.mark.parametrize("implementation", ("naive", "xla", "pallas_tpu"))
@pytest.mark.parametrize(("name", "dtype", "q_scale"), STABILITY, ids=[s[0] for s in STABILITY])
def test_softmax_is_stable_for_huge_logits(implementation, name, dtype, q_scale):
    """Logits of magnitude ~1e4 (softmax overflow without the max shift) agree
    with the float64 reference."""
    case = Case(name, q_len=20, kv_len=130, head_dim=64, dtype=dtype, causal=True)
    q, k, v, _, _ = random_inputs(case, seed=3, q_scale=q_scale)
    k = k * 100 if dtype == "float32" else (k.astype(jnp.float32) * 100).astype(k.dtype)
    logits = np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64),
                       np.asarray(k, np.float64)) / 8.0
    assert np.abs(logits).max() > 1e4
    ref = reference_for(q, k, v, case)
    out = kernels.attention(q, k, v, causal=True, implementation=implementation)
    naive = (None if dtype == "float32" or implementation == "naive"
             else _naive_error(q, k, v, case, None, None, ref))
    assert_accurate(out, ref, dtype, naive)


@pytest.mark.parametrize("implementation", ("naive", "xla", "pallas_tpu"))
def test_softmax_near_ties(implementation):
    """Keys that are nearly identical give nearly uniform weights: the output is
    close to the mean of v and still matches the float64 reference."""
    case = Case("near-ties", q_len=16, kv_len=200, head_dim=64)
    q, _, v, _, _ = random_inputs(case, seed=4)
    rng = np.random.default_rng(5)
    base = rng.standard_normal((1, 1, 2, 64))
    k = jnp.asarray(base + 1e-4 * rng.standard_normal((1, 200, 2, 64)), jnp.float32)
    ref = reference_for(q, k, v, case)
    out = kernels.attention(q, k, v, implementation=implementation)
    assert_accurate(out, ref, "float32")
    mean_v = np.asarray(v, np.float64).mean(axis=1, keepdims=True)
    assert np.abs(np.asarray(out) - mean_v).max() < 1e-2


def test_auto_resolves_to_xla_on_cpu_and_is_exact():
    resolution = kernels.resolve("auto", None, "cpu")
    assert resolution.name == "xla" and resolution.native
    _check("auto", CASES[1])


SWEEP = [
    Case(f"{dtype}-d{d}-{sq}x{skv}-{'causal' if causal else 'full'}-g{g}",
         batch=2, q_len=sq, kv_len=skv, num_heads=g * 2, num_kv_heads=2, head_dim=d,
         dtype=dtype, causal=causal, q_lengths=(sq, max(sq // 3, 1)),
         kv_lengths=(max(skv - 5, 0), skv))
    for dtype, d, (sq, skv), causal, g in itertools.product(
        ("float32", "bfloat16", "float16"), (32, 64, 80, 128, 256),
        ((127, 127), (129, 300), (300, 129)), (False, True), (1, 3))
]


@pytest.mark.slow
@pytest.mark.parametrize("case", SWEEP, ids=str)
def test_pallas_tpu_sweep(case):
    _check("pallas_tpu", case, seed=11)


def test_xla_float16_without_any_mask_matches_reference():
    """XLA:CPU lacks an f16 x f16 -> f32 dot; the unmasked path once raised on it."""
    import jax.numpy as jnp
    import numpy as np

    import kernels

    rng = np.random.default_rng()
    q, k, v = (jnp.asarray(rng.standard_normal((1, 48, 4, 32)), jnp.float16) for _ in range(3))
    out = kernels.attention(q, k, v, implementation="xla")
    naive = kernels.attention(q, k, v, implementation="naive")
    ref = kernels.attention_reference(q, k, v)
    assert out.dtype == jnp.float16
    assert kernels.relative_error(out, ref) <= 2 * kernels.relative_error(naive, ref)
