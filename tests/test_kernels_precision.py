"""Honest baselines: naive and xla compute float32 at full float32
precision on every backend, and every implementation declares its float32 precision.

On an H200, JAX's default precision let naive and xla multiply float32 in TF32:
relative error 2-5e-4 on ordinary inputs, so every error ratio to the baseline was 100x
looser than it read. The error test below runs on whatever backend pytest runs on (the
CPU here); its ``gpu`` twin runs the same body on the GPU under ``-m gpu``, where TF32
would fail it (TF32 rounding of q and k alone, emulated on the CPU, gives 3e-4 to 1.3e-3
on inputs like these).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.contract import validate

BASELINES = ("naive", "xla")
FLOAT32_LEVEL = 1e-5  # "float32 far below 1e-5" (design notes); TF32 is 30-100x above it
ON_GPU = jax.default_backend() in ("gpu", "cuda")


def _lowered_dots(name: str, dtype) -> list[str]:
    q = jax.ShapeDtypeStruct((1, 64, 4, 32), dtype)
    fn = kernels.get_attention_fn(name)
    text = jax.jit(lambda q, k, v: fn(q, k, v, causal=True)).lower(q, q, q).as_text()
    return [line for line in text.splitlines() if "dot_general" in line]


@pytest.mark.parametrize("name", BASELINES)
def test_float32_baselines_request_highest_precision(name):
    dots = _lowered_dots(name, jnp.float32)
    assert len(dots) >= 2  # q k^T and p v
    assert all("precision = [HIGHEST, HIGHEST]" in d for d in dots), dots
    # bf16 keeps the backend's native path (float32 accumulation), no HIGHEST passes
    assert not any("HIGHEST" in d for d in _lowered_dots(name, jnp.bfloat16))


def test_every_implementation_declares_its_float32_precision():
    spec = validate(*(jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.float32),) * 3)[0]
    for name, impl in kernels.IMPLEMENTATIONS.items():
        if impl.float32_matmul_precision is not None:
            assert impl.float32_matmul_precision == "highest", name
            continue
        # undeclared only when it runs no float32 call at all
        for platform in impl.native_platforms:
            with pytest.raises(NotImplementedError):
                impl.check_supported(spec, platform, None)


def _inputs(seed, shape, q_scale=1.0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape) for _ in range(3))
    return tuple(jnp.asarray(x, jnp.float32) for x in (q * q_scale, k, v))


# (batch, seq, heads, head_dim, causal, q_scale): ordinary inputs (MiniLM's shape among
# them) and logits 16x larger than ordinary, where TF32 loses most.
CASES = [(2, 128, 12, 32, False, 1.0), (1, 512, 4, 64, True, 1.0),
         (1, 384, 2, 128, False, 1.0), (1, 256, 4, 64, False, 16.0)]


def check_baselines_are_float32_level():
    for i, (batch, seq, heads, head_dim, causal, q_scale) in enumerate(CASES):
        q, k, v = _inputs(i, (batch, seq, heads, head_dim), q_scale)
        ref = kernels.attention_reference(*(np.asarray(x) for x in (q, k, v)), causal=causal)
        for name in BASELINES:
            out = kernels.get_attention_fn(name)(q, k, v, causal=causal)
            err = kernels.relative_error(out, ref)
            assert err <= FLOAT32_LEVEL, (name, jax.default_backend(), CASES[i], err)


def test_baseline_float32_error_is_float32_level_on_this_backend():
    check_baselines_are_float32_level()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gpu_baseline_float32_error_is_float32_level():
    check_baselines_are_float32_level()
