"""pallas_gpu: the Pallas (Triton lowering) flash-attention kernel for NVIDIA GPUs.

On the CPU the kernel runs in Pallas interpret mode (small shapes only) and its Triton
lowering for CUDA is checked without a GPU; ``@pytest.mark.gpu`` tests run it natively.
"""

from __future__ import annotations

import functools
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.contract import validate
from kernels.pallas_gpu import KERNEL_NAME, PallasGpuKernel, TritonConfig, pallas_gpu_attention
from kernels.reference import attention_reference, relative_error
from kernels.shapes import AttentionShape

KERNEL = PallasGpuKernel()
ON_GPU = jax.default_backend() in ("gpu", "cuda")
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a GPU")


def _inputs(seed, batch, q_len, kv_len, heads, kv_heads, head_dim, dtype):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_len, heads, head_dim))
    k = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    v = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _run(q, k, v, *, causal=False, q_lengths=None, kv_lengths=None, config=None):
    scale = 1.0 / math.sqrt(q.shape[-1])
    ql = None if q_lengths is None else jnp.asarray(q_lengths, jnp.int32)
    kl = None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32)
    if isinstance(config, dict):
        config = TritonConfig(**config)
    out = pallas_gpu_attention(q, k, v, causal=causal, scale=scale, q_lengths=ql,
                               kv_lengths=kl, config=config)
    assert out.shape == q.shape and out.dtype == q.dtype
    return out


def _ref(q, k, v, **kw):
    f32 = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    return attention_reference(*f32, **kw)


# (batch, q_len, kv_len, heads, kv_heads, head_dim, causal, q_lengths, kv_lengths, config)
CASES = {
    "mha": (2, 64, 64, 2, 2, 32, False, None, None, None),
    "causal_multi_block": (1, 64, 64, 2, 2, 32, True, None, None, {"block_q": 16, "block_kv": 16}),
    "gqa_causal": (1, 48, 48, 4, 2, 32, True, None, None, {"block_q": 16, "block_kv": 16}),
    "mqa": (1, 32, 48, 4, 1, 32, False, None, None, {"block_q": 16, "block_kv": 16}),
    "ragged_not_block_multiple": (1, 50, 70, 2, 1, 40, True, None, None,
                                  {"block_q": 16, "block_kv": 32}),
    "q_shorter_than_kv_causal": (1, 24, 80, 2, 2, 32, True, None, None,
                                 {"block_q": 16, "block_kv": 16}),
    "lengths_with_empty_example": (2, 48, 80, 2, 2, 32, False, [30, 48], [0, 33],
                                   {"block_q": 16, "block_kv": 32}),
    "lengths_causal": (2, 48, 48, 2, 2, 32, True, [30, 48], [5, 40],
                       {"block_q": 16, "block_kv": 16}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_float32_matches_float64_reference(case):
    batch, q_len, kv_len, heads, kv_heads, head_dim, causal, ql, kl, cfg = case
    q, k, v = _inputs(zlib.crc32(repr(case).encode()), batch, q_len, kv_len, heads, kv_heads, head_dim,
                      jnp.float32)
    out = _run(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl, config=cfg)
    ref = _ref(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_error_within_small_factor_of_naive(dtype):
    from kernels.naive import naive_attention

    q, k, v = _inputs(3, 1, 64, 64, 2, 2, 64, dtype)
    ref = _ref(q, k, v, causal=True)
    out = _run(q, k, v, causal=True, config={"block_q": 32, "block_kv": 16})
    naive = naive_attention(q, k, v, causal=True, scale=1 / 8, q_lengths=None,
                            kv_lengths=None)
    err, naive_err = relative_error(out, ref), relative_error(naive, ref)
    assert err < 1e-2
    assert err <= 2.0 * max(naive_err, 1e-3)


def test_rows_without_keys_and_query_padding_are_zero():
    q, k, v = _inputs(5, 2, 32, 32, 2, 2, 32, jnp.float32)
    out = np.asarray(_run(q, k, v, q_lengths=[32, 20], kv_lengths=[0, 32],
                          config=TritonConfig(block_q=16, block_kv=16)))
    assert np.all(out[0] == 0.0)  # example 0 sees no key
    assert np.all(out[1, 20:] == 0.0)  # query padding
    assert np.all(np.abs(out[1, :20]).sum(axis=-1) > 0)


def test_padding_and_future_keys_are_never_read():
    # NaN in key/value padding and in keys no query may see (kv_len > q_len, causal):
    # blocks past the diagonal/kv_length are skipped and the straddling ones masked.
    q, k, v = _inputs(7, 2, 32, 96, 2, 1, 32, jnp.float32)
    kv_lengths = [40, 96]
    ref = _ref(q, k, v, causal=True, kv_lengths=kv_lengths)
    pad = np.zeros(k.shape, bool)
    pad[0, 40:] = True  # padding of example 0
    pad[1, 32:] = True  # keys beyond every causal query of example 1
    k_bad, v_bad = (jnp.where(pad, jnp.nan, x) for x in (k, v))
    out = _run(q, k_bad, v_bad, causal=True, kv_lengths=kv_lengths,
               config=TritonConfig(block_q=16, block_kv=16))
    assert np.all(np.isfinite(np.asarray(out)))
    assert relative_error(out, ref) < 1e-5


def test_huge_logits_do_not_overflow():
    q, k, v = _inputs(11, 1, 32, 32, 1, 1, 32, jnp.float32)
    q = q * 300.0  # logits ~ 1e3-1e4: exp overflows without the running max
    out = _run(q, k, v, causal=True, config=TritonConfig(block_q=16, block_kv=16))
    assert relative_error(out, _ref(q, k, v, causal=True)) < 1e-5


def test_gqa_reads_kv_heads_without_repeating_them():
    q, k, v = _inputs(13, 1, 32, 32, 8, 2, 32, jnp.float32)
    fn = functools.partial(pallas_gpu_attention, causal=False, scale=0.1, q_lengths=None,
                           kv_lengths=None, config=TritonConfig(block_q=16, block_kv=16))
    jaxpr = jax.make_jaxpr(fn)(q, k, v)
    calls = [e for e in jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(calls) == 1
    shapes = [tuple(x.aval.shape) for x in calls[0].invars]
    assert shapes == [q.shape, k.shape, v.shape]  # kv heads stay 2, not 8


@pytest.mark.parametrize("causal,lengths", [(True, True), (False, False)])
def test_lowers_for_cuda_with_triton_and_a_stable_name(causal, lengths):
    q = jax.ShapeDtypeStruct((2, 1000, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 1000, 2, 128), jnp.bfloat16)
    lens = jax.ShapeDtypeStruct((2,), jnp.int32) if lengths else None

    def fn(q, k, v, ql, kl):
        return pallas_gpu_attention(q, k, v, causal=causal, scale=0.1, q_lengths=ql,
                                    kv_lengths=kl, config=None, interpret=False)

    text = jax.jit(fn).trace(q, kv, kv, lens, lens).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert KERNEL_NAME in text


def test_export_for_cuda_from_a_cpu_host_carries_the_triton_kernel():
    from jax import export as jax_export


    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    fn = jax.jit(functools.partial(pallas_gpu_attention, causal=True, scale=0.125,
                                   q_lengths=None, kv_lengths=None, config=None))
    interpreted = fn.trace(q, q, q).lower().as_text()  # traced first: must not be reused
    assert "__gpu$xla.gpu.triton" not in interpreted
    with KERNEL.export_context("cuda"):
        exported = jax_export.export(fn, platforms=["cuda"],
                                     disabled_checks=KERNEL.export_disabled_checks("cuda"))(q, q, q)
    text = exported.mlir_module()
    assert "__gpu$xla.gpu.triton" in text and KERNEL_NAME in text
    assert exported.platforms == ("cuda",) and len(exported.serialize()) > 0


def _spec(q_shape, kv_shape, dtype):
    return validate(jax.ShapeDtypeStruct(q_shape, dtype), jax.ShapeDtypeStruct(kv_shape, dtype),
                    jax.ShapeDtypeStruct(kv_shape, dtype))[0]


def test_check_supported_reasons():
    spec = _spec((1, 128, 4, 128), (1, 128, 2, 128), jnp.bfloat16)
    KERNEL.check_supported(spec, "gpu")
    KERNEL.check_supported(_spec((1, 128, 4, 128), (1, 128, 2, 128), jnp.float32), "cpu")  # interpreted
    with pytest.raises(NotImplementedError, match="tpu"):
        KERNEL.check_supported(spec, "tpu")
    with pytest.raises(NotImplementedError, match="head_dim"):
        KERNEL.check_supported(_spec((1, 128, 4, 512), (1, 128, 2, 512), jnp.bfloat16), "gpu")
    with pytest.raises(ValueError, match="power of two"):
        KERNEL.check_supported(spec, "gpu", {"block_q": 48})
    with pytest.raises(ValueError, match="num_stages"):
        KERNEL.check_supported(spec, "gpu", {"num_stages": 9})
    with pytest.raises(ValueError, match="power of two"):
        TritonConfig(block_kv=300)  # the config type checks itself


def test_config_defaults_are_filled_in():
    spec = _spec((1, 128, 4, 128), (1, 128, 2, 128), jnp.bfloat16)
    cfg = KERNEL.resolve_config(spec, TritonConfig(block_q=64, block_kv=32, num_warps=4))
    assert (cfg.block_q, cfg.block_kv, cfg.num_warps) == (64, 32, 4)
    assert cfg.num_stages is not None  # filled from the head_dim default
    assert KERNEL.resolve_config(spec, None) == KERNEL.resolve_config(spec, TritonConfig())


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_interpret_larger_shapes(head_dim):
    q, k, v = _inputs(17, 1, 256, 256, 2, 1, head_dim, jnp.float32)
    out = _run(q, k, v, causal=True)
    assert relative_error(out, _ref(q, k, v, causal=True)) < 1e-5


# ----------------------------------------------------------------------------- GPU only


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_benchmark_shapes_match_reference_and_naive(dtype, head_dim, causal):
    from kernels.tools import bench

    shape = AttentionShape(dtype=dtype, batch=4, q_len=4096, kv_len=4096,
                           num_heads=2048 // head_dim, num_kv_heads=2048 // head_dim,
                           head_dim=head_dim, causal=causal)
    rows = bench.bench_shape(shape, ["naive", "pallas_gpu"], seed=head_dim, ceiling=1.0,
                             repeats=1, target_repeat_s=0.0, warmup_s=0.0)
    pallas = next(r for r in rows if r.implementation == "pallas_gpu")
    assert pallas.ok, pallas.error
    assert pallas.correct, pallas
    assert pallas.rel_error_vs_naive < 1e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_edge_cases_match_reference(dtype):
    for name, case in CASES.items():
        batch, q_len, kv_len, heads, kv_heads, head_dim, causal, ql, kl, cfg = case
        q, k, v = _inputs(19, batch, q_len, kv_len, heads, kv_heads, head_dim, dtype)
        out = _run(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl, config=None)
        err = relative_error(out, _ref(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl))
        assert err < (1e-5 if dtype == jnp.float32 else 1e-2), name


@gpu
@pytest.mark.gpu
def test_gpu_long_causal_context_131072():
    q, k, v = _inputs(23, 1, 131072, 131072, 16, 16, 128, jnp.bfloat16)
    out = jax.jit(functools.partial(pallas_gpu_attention, causal=True, scale=128**-0.5,
                                    q_lengths=None, kv_lengths=None, config=None))(q, k, v)
    rows = np.array([0, 4097, 131071])
    q64, k64, v64 = (np.asarray(x[0, :, 3].astype(jnp.float32), np.float64) for x in (q, k, v))
    for r in rows:
        logits = k64[: r + 1] @ q64[r] * 128**-0.5
        p = np.exp(logits - logits.max())
        ref = p @ v64[: r + 1] / p.sum()
        got = np.asarray(out[0, r, 3].astype(jnp.float32))
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-2
