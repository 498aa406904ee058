"""Each invalid input gets its own clear error; the registry resolves as documented."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import kernels


def _qkv(batch=2, q_len=8, kv_len=6, heads=4, kv_heads=2, head_dim=16, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, q_len, heads, head_dim)), dtype)
    k = jnp.asarray(rng.standard_normal((batch, kv_len, kv_heads, head_dim)), dtype)
    v = jnp.asarray(rng.standard_normal((batch, kv_len, kv_heads, head_dim)), dtype)
    return q, k, v


def _call(q, k, v, **kw):
    return kernels.attention(q, k, v, implementation="naive", **kw)


def test_valid_call_passes():
    q, k, v = _qkv()
    out = _call(q, k, v, q_lengths=np.array([8, 3], np.int32), kv_lengths=np.array([6, 0]))
    assert out.shape == q.shape


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank(which):
    q, k, v = _qkv()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][0]
    with pytest.raises(ValueError, match=f"{which} must have rank 4"):
        _call(args["q"], args["k"], args["v"])


def test_dtype_mismatch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="share one dtype"):
        _call(q, k.astype(jnp.bfloat16), v)


@pytest.mark.parametrize("dtype", [jnp.int32, np.float64])
def test_unsupported_dtype(dtype):
    q, k, v = (np.asarray(x).astype(dtype) for x in _qkv())
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
        _call(q, k, v)


def test_head_dim_mismatch():
    q, _, _ = _qkv(head_dim=16)
    _, k, v = _qkv(head_dim=32)
    with pytest.raises(ValueError, match="same head_dim"):
        _call(q, k, v)


def test_batch_mismatch():
    q, _, _ = _qkv(batch=2)
    _, k, v = _qkv(batch=3)
    with pytest.raises(ValueError, match="same batch size"):
        _call(q, k, v)


def test_head_divisibility():
    q, k, v = _qkv(heads=3, kv_heads=2)
    with pytest.raises(ValueError, match=r"num_heads \(3\) must be a multiple of num_kv_heads \(2\)"):
        _call(q, k, v)


def test_k_v_shape_mismatch():
    q, k, _ = _qkv(kv_len=6)
    _, _, v = _qkv(kv_len=7)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        _call(q, k, v)


def test_zero_sized_dimension():
    q, k, v = _qkv(q_len=0)
    with pytest.raises(ValueError, match="must be non-zero"):
        _call(q, k, v)


@pytest.mark.parametrize(("name", "value", "match"), [
    ("q_lengths", np.array([8, 3, 1], np.int32), r"q_lengths must have shape \[batch\]"),
    ("kv_lengths", np.array([[6, 6]], np.int32), r"kv_lengths must have shape \[batch\]"),
    ("q_lengths", np.array([8.0, 3.0]), "q_lengths must be an integer array"),
    ("q_lengths", np.array([9, 3], np.int32), r"q_lengths must lie in \[0, 8\]"),
    ("kv_lengths", np.array([-1, 3], np.int32), r"kv_lengths must lie in \[0, 6\]"),
])
def test_lengths(name, value, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        _call(q, k, v, **{name: value})


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_bad_scale(scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="scale must be a finite positive number"):
        _call(q, k, v, scale=scale)


def test_explicit_scale_is_used():
    q, k, v = _qkv()
    ref = kernels.attention_reference(q, k, v, scale=0.05)
    out = _call(q, k, v, scale=0.05)
    assert kernels.relative_error(out, ref) < 2e-6
    assert kernels.relative_error(_call(q, k, v), ref) > 1e-3  # the scale matters


def test_unknown_implementation():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="unknown implementation 'flash9000'"):
        kernels.attention(q, k, v, implementation="flash9000")


def test_cudnn_on_cpu_is_not_implemented():
    q, k, v = _qkv(dtype=jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="cudnn needs an NVIDIA GPU"):
        kernels.attention(q, k, v, implementation="cudnn")


def test_pallas_tpu_on_gpu_backend_is_not_implemented():
    spec, _, _ = kernels.validate(*_qkv())
    with pytest.raises(NotImplementedError, match="pallas_tpu is a Mosaic TPU kernel"):
        kernels.resolve("pallas_tpu", spec, "gpu")


@pytest.mark.parametrize(("config", "match"), [
    ({"block_q": 12, "block_kv": 128}, "block_q must be a multiple of 8"),
    ({"block_q": 16, "block_kv": 64}, "block_kv must be a multiple of 128"),
    ({"block_q": 4096, "block_kv": 4096}, "VMEM"),
])
def test_illegal_tpu_block_sizes(config, match):
    q, k, v = _qkv(q_len=4096, kv_len=4096, batch=1, heads=1, kv_heads=1, head_dim=128)
    with pytest.raises(ValueError, match=match):
        kernels.attention(q, k, v, implementation="pallas_tpu", config=config)


def test_auto_resolution_per_backend():
    spec, _, _ = kernels.validate(*_qkv())
    cpu = kernels.resolve("auto", spec, "cpu")
    tpu = kernels.resolve("auto", spec, "tpu")
    assert (cpu.name, cpu.native) == ("xla", True)
    assert (tpu.name, tpu.native) == ("pallas_tpu", True)
    assert "tpu" in tpu.reason and tpu.skipped == {}
