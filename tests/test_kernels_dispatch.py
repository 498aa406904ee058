"""kernels.dispatch: a compile that runs out of a device resource makes ``auto`` move on
(saying why) and makes an explicitly requested implementation fail naming the limit,
under ``jax.jit`` as well as eagerly.

A CPU has no shared-memory limit, so a stand-in tiled kernel registered as native on the
CPU raises XLA's error the first time it is lowered; the real error comes from the
compile of the same jitted call, inside the same ``try``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import api, dispatch
from kernels.pallas_gpu import TritonConfig
from kernels.xla import xla_attention

XLA_MESSAGE = ("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 458752, "
               "available: 232448")
LOWERINGS = {"count": 0}


def exhausting_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Fails as XLA does when a Triton kernel needs more shared memory than there is."""
    LOWERINGS["count"] += 1
    raise jax.errors.JaxRuntimeError(XLA_MESSAGE)


class ExhaustingKernel(kernels.Kernel[TritonConfig]):
    """The stand-in as a registered kernel: tiled (Triton's config type), native on the
    CPU and first in ``auto``'s order there."""

    name = "exhausting"
    description = "stand-in that runs out of shared memory"
    native_platforms = ("cpu",)
    forward = staticmethod(exhausting_attention)
    auto_priority = {"cpu": 0}

    def default_config(self, head_dim):
        del head_dim
        return TritonConfig(block_q=128, block_kv=128, num_warps=8, num_stages=3)


@pytest.fixture
def exhausting(monkeypatch):
    """Register the stand-in as a tiled kernel native on the CPU, first in ``auto``."""
    monkeypatch.setattr(api, "default_backend", lambda: "cpu")
    LOWERINGS["count"] = 0
    dispatch.get_attention_fn.cache_clear()
    with kernels.registered(ExhaustingKernel):
        assert kernels.auto_order("cpu") == ("exhausting", "xla", "naive")
        yield
    dispatch.get_attention_fn.cache_clear()


def _inputs(seed=0, shape=(2, 40, 4, 32)):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3))


def _reference(q, k, v, **kw):
    return kernels.attention_reference(*(np.asarray(x) for x in (q, k, v)), **kw)


def test_auto_moves_to_the_next_implementation_and_says_why(exhausting):
    q, k, v = _inputs()
    fn = kernels.get_attention_fn("auto")
    out = fn(q, k, v, causal=True)
    assert kernels.relative_error(out, _reference(q, k, v, causal=True)) < 1e-5
    (label, resolution), = fn.resolutions.items()
    assert resolution.name == "xla"
    assert "requested 458752, available: 232448" in resolution.skipped["exhausting"]
    assert fn.fallbacks == {label: {"exhausting": resolution.skipped["exhausting"]}}
    # later calls of the same signature go straight to the fallback
    tried = LOWERINGS["count"]
    fn(*_inputs(1), causal=True)
    assert LOWERINGS["count"] == tried
    # another signature is tried afresh (the limit depends on the call)
    fn(q[:, :16], k, v, causal=False)
    assert LOWERINGS["count"] == tried + 1


def test_auto_falls_back_inside_an_outer_jit(exhausting):
    """The MiniLM forward passes the attention function into its own ``jax.jit``:
    resolution runs at its trace, so the guard compiles the attention alone there."""
    q, k, v = _inputs(2)
    lengths = jnp.asarray([40, 23], jnp.int32)
    fn = kernels.get_attention_fn("auto")

    @jax.jit
    def layer(q, k, v, lengths):
        return 2.0 * fn(q, k, v, causal=False, kv_lengths=lengths)

    out = layer(q, k, v, lengths)
    ref = _reference(q, k, v, kv_lengths=np.asarray(lengths))
    assert kernels.relative_error(out, 2.0 * ref) < 1e-5
    (resolution,) = fn.resolutions.values()
    assert resolution.name == "xla" and "RESOURCE_EXHAUSTED" in resolution.skipped["exhausting"]


def test_an_explicit_implementation_fails_naming_the_limit(exhausting):
    q, k, v = _inputs(3)
    fn = kernels.get_attention_fn("exhausting")
    with pytest.raises(kernels.ResourceLimitError,
                       match=r"exhausting config .*block_q.*available: 232448"):
        fn(q, k, v)
    with pytest.raises(kernels.ResourceLimitError, match="requested 458752"):
        jax.jit(lambda q: fn(q, k, v))(q)


def test_other_errors_are_not_swallowed(exhausting):
    q, k, v = _inputs(4)
    fn = kernels.get_attention_fn("auto")
    with pytest.raises(ValueError, match="head_dim"):
        fn(q, k[..., :16], v[..., :16])


def test_guarded_function_is_cached_and_hashable():
    fn = kernels.get_attention_fn("xla")
    assert fn is kernels.get_attention_fn("xla")
    assert hash(fn) == hash(kernels.get_attention_fn("xla"))
    q, k, v = _inputs(5)
    np.testing.assert_array_equal(
        np.asarray(fn(q, k, v, causal=True)),
        np.asarray(jax.jit(xla_attention, static_argnames=("causal", "scale"))(
            q, k, v, causal=True, scale=32 ** -0.5, q_lengths=None, kv_lengths=None)))
    with pytest.raises(ValueError, match="unknown implementation"):
        kernels.get_attention_fn("no-such-kernel")


# ----------------------------------------------------------------------------- GPU only

ON_GPU = jax.default_backend() in ("gpu", "cuda")
OVERSIZED = TritonConfig(block_q=128, block_kv=128, num_warps=8, num_stages=3)  # the issue's


@pytest.fixture
def model_switched_off(monkeypatch):
    """Pretend the device had 10 MB of shared memory, so that the model lets the issue's
    float32 head_dim-128 tiling through and the real compile has to fail."""
    from kernels import gpu_limits, pallas_gpu

    huge = gpu_limits.SharedMemoryBudget(bytes=10 << 20, device_kind="pretend",
                                         compute_capability=None, source="test")
    monkeypatch.setattr(pallas_gpu, "shared_memory_budget", lambda device=None: huge)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gpu_real_overflow_explicit_raises_naming_the_limit(model_switched_off):
    q, k, v = _inputs(6, (1, 384, 2, 128))
    fn = dispatch.GuardedAttention("pallas_gpu", OVERSIZED)
    with pytest.raises(kernels.ResourceLimitError, match="RESOURCE_EXHAUSTED") as info:
        fn(q, k, v, causal=True)
    assert "available" in str(info.value) and "block_q" in str(info.value)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_gpu_real_overflow_auto_falls_back(model_switched_off, monkeypatch):
    from kernels import selection

    monkeypatch.setattr(selection, "select_gpu_implementation",
                        lambda shape, **kw: ("pallas_gpu", OVERSIZED, "forced by the test"))
    q, k, v = _inputs(7, (1, 384, 2, 128))
    ref = _reference(q, k, v, causal=True)
    for outer_jit in (False, True):  # eager first call, and inside a traced caller
        fn = dispatch.GuardedAttention("auto", None)
        call = lambda q, k, v, fn=fn: fn(q, k, v, causal=True)  # noqa: E731
        out = (jax.jit(call) if outer_jit else call)(q, k, v)
        assert kernels.relative_error(out, ref) < 1e-5
        (resolution,) = fn.resolutions.values()
        assert resolution.name != "pallas_gpu", outer_jit
        assert "RESOURCE_EXHAUSTED" in resolution.skipped["pallas_gpu"], outer_jit
