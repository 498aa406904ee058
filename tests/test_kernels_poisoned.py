"""Padding is not data, and extreme magnitudes stay finite.

Two kinds of input that peers' test suites and public bug reports found to break flash
kernels:

* **Poisoned padding**: the padded positions (query rows at or past ``q_lengths``, key
  and value rows at or past ``kv_lengths``) hold NaN, +inf or the dtype's maximum. The
  contract masks them, so nothing in them may reach the output: the result must equal
  the float64 reference computed on the same inputs with the padding *zeroed*, and
  padded query rows must be exactly zero.
* **Low-precision extremes**: large, nearly equal logits near the dtype's range with
  very few visible keys (a softmax whose maximum sits on one or two keys and whose
  exponent arithmetic is near overflow).

Every registered kernel that runs on this host is checked (the Pallas kernels in
interpret mode on a CPU); the ``gpu``-marked tests run the same checks in bf16 and f16
on a GPU, where cuDNN and pallas_mosaic_gpu run too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.reference import attention_reference, relative_error

POISONS = ("nan", "inf", "max")
ALL_KERNELS = tuple(sorted(kernels.registry.BUILTIN))
"""Every built-in kernel: one added later is checked here without editing this file
(those that cannot run on this host skip with their own reason)."""
TOLERANCE = {"float32": 2e-6, "bfloat16": 2e-2, "float16": 3e-3, "float8_e4m3fn": 0.1}
"""Rel. error bound vs float64 (the accuracy suite's float32 bound; for bf16/f16 the
bound the accuracy suite holds naive's own error to; for a kernel on e4m3 operands the
e4m3 suite's bound against exact attention: 3 significand bits put each of q, k, v and the
softmax's weights off by up to 2⁻⁴ of itself, about 0.05 of the output's RMS on unit-normal
inputs, where a leaked NaN or a padded maximum in a quantisation scale gives O(1))."""


def bound(implementation: str, dtype: str) -> float:
    """The error bound for ``implementation`` called in ``dtype``: its operands' dtype's
    where they are narrower than the call's (``Kernel.operand_dtype``), else the call's."""
    return TOLERANCE[kernels.IMPLEMENTATIONS[implementation].operand_dtype or dtype]


def _poison_value(kind: str, dtype) -> float:
    if kind == "nan":
        return float("nan")
    if kind == "inf":
        return float("inf")
    return float(jnp.finfo(dtype).max)


def _padded_inputs(dtype: str, poison: str, seed: int, *, head_dim: int = 64,
                   causal: bool = False):
    """q, k, v with real data inside the lengths and ``poison`` outside; also the same
    arrays with zeros outside (what the reference sees) and the lengths."""
    rng = np.random.default_rng(seed)
    batch, q_len, kv_len, heads, kv_heads = 2, 100, 150, 4, 2
    q_lengths = np.array([61, 100], np.int32)
    kv_lengths = np.array([150, 37], np.int32)
    q = rng.standard_normal((batch, q_len, heads, head_dim))
    k = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    v = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    q_pad = np.arange(q_len)[None, :] >= q_lengths[:, None]
    kv_pad = np.arange(kv_len)[None, :] >= kv_lengths[:, None]
    clean = [x.copy() for x in (q, k, v)]
    for x, pad in ((clean[0], q_pad), (clean[1], kv_pad), (clean[2], kv_pad)):
        x[pad] = 0.0
    value = _poison_value(poison, jnp.dtype(dtype))
    poisoned = [x.copy() for x in (q, k, v)]
    for x, pad in ((poisoned[0], q_pad), (poisoned[1], kv_pad), (poisoned[2], kv_pad)):
        x[pad] = value
    cast = lambda arrays: [jnp.asarray(x, dtype) for x in arrays]  # noqa: E731
    return cast(poisoned), cast(clean), q_lengths, kv_lengths, q_pad


def _check_poisoned(implementation: str, dtype: str, poison: str, causal: bool, seed: int):
    (q, k, v), (qc, kc, vc), ql, kl, q_pad = _padded_inputs(dtype, poison, seed,
                                                           causal=causal)
    try:
        out = kernels.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl,
                                implementation=implementation)
    except NotImplementedError as err:
        pytest.skip(f"{implementation} does not run this call here: {err}")
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = attention_reference(qc, kc, vc, causal=causal, q_lengths=ql, kv_lengths=kl)
    assert np.all(np.isfinite(out)), (
        f"{implementation}: {int(np.sum(~np.isfinite(out)))} non-finite outputs with "
        f"{poison} in the padding")
    assert np.all(out[q_pad] == 0.0), f"{implementation}: padded query rows are not zero"
    err = relative_error(out, ref)
    assert err < bound(implementation, dtype), (
        f"{implementation}: rel. error {err:.3e} vs float64")


def _extreme_inputs(dtype: str, seed: int, visible: int, head_dim: int = 64):
    """Logits near the range of ``dtype``: every query row and key equal up to a small
    perturbation, values large, and only ``visible`` keys per example (kv_lengths)."""
    rng = np.random.default_rng(seed)
    batch, q_len, kv_len, heads = 2, 64, 96, 2
    big = {"bfloat16": 2.0**6, "float16": 2.0**3, "float32": 2.0**6}[dtype]
    base = np.full((batch, 1, heads, head_dim), big)
    q = base + 0.01 * rng.standard_normal((batch, q_len, heads, head_dim))
    k = base + 0.01 * rng.standard_normal((batch, kv_len, heads, head_dim))
    v_scale = float(jnp.finfo(jnp.dtype(dtype)).max) / 8 if dtype != "float32" else 1e30
    v = v_scale * rng.uniform(0.5, 1.0, (batch, kv_len, heads, head_dim))
    kv_lengths = np.array([visible, max(1, visible - 1)], np.int32)
    return [jnp.asarray(x, dtype) for x in (q, k, v)], kv_lengths


def _check_extreme(implementation: str, dtype: str, visible: int, seed: int):
    (q, k, v), kl = _extreme_inputs(dtype, seed, visible)
    try:
        out = kernels.attention(q, k, v, kv_lengths=kl, implementation=implementation)
    except NotImplementedError as err:
        pytest.skip(f"{implementation} does not run this call here: {err}")
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = attention_reference(q, k, v, kv_lengths=kl)
    assert np.all(np.isfinite(ref)), "the reference itself overflowed: a bad case"
    assert np.all(np.isfinite(out)), (
        f"{implementation}: {int(np.sum(~np.isfinite(out)))} non-finite outputs "
        f"(large equal logits, {visible} visible keys)")
    err = relative_error(out, ref)
    assert err < bound(implementation, dtype), (
        f"{implementation}: rel. error {err:.3e} vs float64")


@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("implementation", ALL_KERNELS)
def test_poisoned_padding_never_reaches_the_output(implementation, poison):
    seed = int(np.random.default_rng().integers(1 << 31))
    _check_poisoned(implementation, "float32", poison, causal=False, seed=seed)


@pytest.mark.parametrize("implementation", ALL_KERNELS)
def test_poisoned_padding_causal_bf16(implementation):
    seed = int(np.random.default_rng().integers(1 << 31))
    _check_poisoned(implementation, "bfloat16", "max", causal=True, seed=seed)


@pytest.mark.parametrize("visible", (1, 2))
@pytest.mark.parametrize("implementation", ALL_KERNELS)
def test_extreme_magnitudes_with_few_visible_keys_stay_finite(implementation, visible):
    seed = int(np.random.default_rng().integers(1 << 31))
    _check_extreme(implementation, "bfloat16", visible, seed)


def test_the_poisoned_check_fires_on_a_kernel_that_reads_padding():
    """The detector on a planted fault: attention that ignores the lengths lets the
    poison through (and so must be refused by the check above)."""
    (q, k, v), _, ql, kl, _ = _padded_inputs("float32", "nan", seed=7)
    leaky = kernels.attention(q, k, v, implementation="naive")  # lengths dropped
    assert not np.all(np.isfinite(np.asarray(leaky)))


def test_only_a_kernel_on_narrower_operands_gets_their_looser_bound():
    """The e4m3 kernel is held to e4m3's bound (its bf16 error of about 0.05 failed the bf16
    one on an H100); every other kernel to its call's dtype's, the bound not loosened."""
    assert bound("pallas_mosaic_gpu_fp8", "bfloat16") == 0.1
    assert bound("pallas_mosaic_gpu_fp8", "float16") == 0.1
    for name in ALL_KERNELS:
        if name != "pallas_mosaic_gpu_fp8":
            for dtype in ("float32", "bfloat16", "float16"):
                assert bound(name, dtype) == TOLERANCE[dtype], name


_GPU = pytest.mark.skipif(jax.default_backend() not in ("gpu", "cuda"), reason="needs a GPU")


@pytest.mark.gpu
@_GPU
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("implementation", ALL_KERNELS)
def test_gpu_poisoned_padding(implementation, poison, dtype):
    for causal in (False, True):
        _check_poisoned(implementation, dtype, poison, causal=causal, seed=11)


@pytest.mark.gpu
@_GPU
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("visible", (1, 2, 3))
@pytest.mark.parametrize("implementation", ALL_KERNELS)
def test_gpu_extreme_magnitudes(implementation, visible, dtype):
    _check_extreme(implementation, dtype, visible, seed=13)
