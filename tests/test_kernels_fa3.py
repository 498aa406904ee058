"""fa3: FlashAttention-3 through the flash-attn3-jax wheel, a registered kernel.

Without a GPU: the kernel is registered, documented, out of ``auto``'s order, refuses a
CPU host naming the optional extra, refuses what the wheel does not serve (head_dim
other than 128, float32, causal with ``q_len != kv_len`` or with lengths) with the
reason, and the third-party record a build keeps and a runner checks (name, version,
sha256 of the installed files). ``@pytest.mark.gpu`` tests run the wheel on an H200
against the float64 reference on fresh random inputs, and with poisoned padding.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import api, fa3, registry
from kernels.contract import validate
from kernels.kernel import distribution_record
from kernels.reference import attention_reference, relative_error
from tests.kernels_helpers import Case, assert_accurate, random_inputs
from tests.test_kernels_poisoned import TOLERANCE, _extreme_inputs, _padded_inputs

KERNEL = fa3.Fa3Kernel()
ON_GPU = jax.default_backend() in ("gpu", "cuda")
HAS_WHEEL = importlib.util.find_spec(fa3.MODULE) is not None
gpu = pytest.mark.skipif(not (ON_GPU and HAS_WHEEL), reason="needs a GPU and the fa3 extra")


def _spec(q_len=256, kv_len=256, *, head_dim=128, dtype=jnp.bfloat16, heads=4, kv_heads=4,
          causal=False, lengths=False):
    q = jax.ShapeDtypeStruct((2, q_len, heads, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((2, kv_len, kv_heads, head_dim), dtype)
    ql = np.array([q_len, 1], np.int32) if lengths else None
    return validate(q, kv, kv, causal=causal, q_lengths=ql)[0]


# ----------------------------------------------------------------------------- no GPU


def test_it_is_registered_documented_and_not_in_auto():
    assert registry.BUILTIN["fa3"] == "kernels.fa3:Fa3Kernel"
    kernel = kernels.IMPLEMENTATIONS["fa3"]
    assert isinstance(kernel, fa3.Fa3Kernel) and kernel.native_platforms == ("gpu",)
    assert not kernel.tiled and not kernel.ours and not kernel.tuned
    assert "fa3" not in api.auto_order("gpu") and "fa3" not in api.auto_order("cpu")
    assert kernel.third_party == ("flash-attn3-jax",)
    doc = fa3.__doc__
    for needed in ("arXiv:2407.08608", "flash-attn3-jax", "bottom right", "top left",
                   "kernelgate[fa3]", "head_dim 128"):
        assert needed in doc, needed


@pytest.mark.skipif(HAS_WHEEL, reason="the fa3 extra is installed here")
def test_a_host_without_the_wheel_is_refused_naming_the_extra():
    for backend in ("cpu", "gpu"):
        with pytest.raises(NotImplementedError, match=r"pip install kernelgate\[fa3\]"):
            KERNEL.check_supported(_spec(), backend)
    q = jnp.ones((1, 64, 2, 128), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match=r"optional extra: pip install kernelgate"):
        kernels.attention(q, q, q, implementation="fa3")


@pytest.mark.parametrize(("spec", "message"), [
    (dict(head_dim=64), "head_dim a multiple of 128, got 64"),
    (dict(head_dim=256), "head_dim <= 128, got 256"),
    (dict(dtype=jnp.float32), r"supports dtypes \('bfloat16', 'float16'\), got float32"),
    (dict(q_len=128, kv_len=256, causal=True), "causal with q_len != kv_len .* bottom-right"),
    (dict(causal=True, lengths=True), "causal with q_lengths/kv_lengths"),
])
def test_what_the_wheel_does_not_serve_is_refused_with_the_reason(spec, message):
    for backend in ("cpu", "gpu"):  # the call's own limits come before the host's
        with pytest.raises(NotImplementedError, match=message):
            KERNEL.check_supported(_spec(**spec), backend)


def test_block_sizes_are_refused():
    with pytest.raises(ValueError, match="does not tile"):
        KERNEL.check_supported(_spec(), "gpu", {"block_q": 64})


def test_the_third_party_record_is_name_version_and_digest_of_the_installed_files():
    record = distribution_record("pydantic")
    assert record["distribution"].lower() == "pydantic" and record["version"]
    assert len(record["sha256"]) == 64 and record == distribution_record("pydantic")
    assert distribution_record("kernelgate-no-such-distribution") is None
    assert KERNEL.third_party_code() == {"flash-attn3-jax": distribution_record(
        "flash-attn3-jax")}


def test_a_runner_refuses_other_third_party_bytes(monkeypatch):
    built = {"distribution": "flash-attn3-jax", "version": "0.2.3", "sha256": "a" * 64}
    monkeypatch.setattr(fa3.Fa3Kernel, "third_party_code",
                        lambda self: {"flash-attn3-jax": dict(built)})
    KERNEL.check_third_party({"flash-attn3-jax": dict(built)})  # the same bytes: runs
    for recorded in ({"flash-attn3-jax": {**built, "sha256": "b" * 64}},
                     {"flash-attn3-jax": {**built, "version": "0.2.4"}}, {}, None):
        with pytest.raises(RuntimeError, match="fa3 runs flash-attn3-jax: the version was "
                                               "built with"):
            KERNEL.check_third_party(recorded)
    kernels.IMPLEMENTATIONS["xla"].check_third_party(None)  # our own code: nothing to check


# ----------------------------------------------------------------------------- on a GPU

GPU_CASES = [
    Case("bf16-1024", batch=2, q_len=1024, kv_len=1024, num_heads=8, num_kv_heads=8,
         head_dim=128, dtype="bfloat16"),
    Case("f16-777x1500", batch=2, q_len=777, kv_len=1500, num_heads=4, num_kv_heads=4,
         head_dim=128, dtype="float16"),
    Case("bf16-1000-causal", batch=2, q_len=1000, kv_len=1000, num_heads=4, num_kv_heads=4,
         head_dim=128, dtype="bfloat16", causal=True),
    Case("f16-513-causal-gqa", batch=1, q_len=513, kv_len=513, num_heads=8, num_kv_heads=2,
         head_dim=128, dtype="float16", causal=True),
    Case("bf16-300x700-mqa", batch=3, q_len=300, kv_len=700, num_heads=6, num_kv_heads=1,
         head_dim=128, dtype="bfloat16"),
    Case("bf16-lengths-gqa", batch=3, q_len=400, kv_len=650, num_heads=4, num_kv_heads=2,
         head_dim=128, dtype="bfloat16", q_lengths=(400, 17, 250), kv_lengths=(650, 1, 0)),
    Case("f16-kv-lengths", batch=2, q_len=128, kv_len=300, num_heads=2, num_kv_heads=2,
         head_dim=128, dtype="float16", kv_lengths=(129, 300)),
]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_matches_float64_reference_within_naive_rounding(case):
    seed = int(np.random.default_rng().integers(1 << 31))  # fresh inputs each run
    q, k, v, ql, kl = random_inputs(case, seed)
    ref = attention_reference(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl)
    out = kernels.attention(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl,
                            implementation="fa3")
    assert out.shape == q.shape and out.dtype == q.dtype
    naive = relative_error(kernels.attention(q, k, v, causal=case.causal, q_lengths=ql,
                                             kv_lengths=kl, implementation="naive"), ref)
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert_accurate(out, ref, case.dtype, naive)
    empty = ~np.any(np.abs(ref) > 0, axis=(2, 3))
    assert np.all(out[empty] == 0.0), f"seed {seed}: rows that see no key are not zero"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("poison", ("nan", "inf", "max"))
def test_gpu_poisoned_padding_never_reaches_the_output(poison, dtype):
    (q, k, v), (qc, kc, vc), ql, kl, q_pad = _padded_inputs(dtype, poison, seed=11,
                                                           head_dim=128)
    out = kernels.attention(q, k, v, q_lengths=ql, kv_lengths=kl, implementation="fa3")
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = attention_reference(qc, kc, vc, q_lengths=ql, kv_lengths=kl)
    assert np.all(np.isfinite(out)), f"{int(np.sum(~np.isfinite(out)))} non-finite outputs"
    assert np.all(out[q_pad] == 0.0), "padded query rows are not zero"
    assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("visible", (1, 2, 3))
def test_gpu_extreme_magnitudes_with_few_visible_keys_stay_finite(visible, dtype):
    (q, k, v), kl = _extreme_inputs(dtype, seed=13, visible=visible, head_dim=128)
    out = kernels.attention(q, k, v, kv_lengths=kl, implementation="fa3")
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = attention_reference(q, k, v, kv_lengths=kl)
    assert np.all(np.isfinite(ref)) and np.all(np.isfinite(out))
    assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.gpu
@gpu
def test_gpu_build_records_the_wheel_and_the_device_is_hopper():
    from kernels.build import build as build_kernel

    assert jax.devices()[0].compute_capability == fa3.COMPUTE_CAPABILITY
    shape = dict(batch=1, q_len=256, kv_len=256, num_heads=2, num_kv_heads=2, head_dim=128,
                 dtype="bfloat16", causal=True)
    result = build_kernel("fa3", None, shape, platforms=())
    assert result.resolution.name == "fa3" and result.local.compile_time_s > 0
    record = result.third_party["flash-attn3-jax"]
    assert record["version"] == "0.2.3" and len(record["sha256"]) == 64
    print("fa3 wheel record:", record)
