"""Candidate kernels with injected faults, for the rollout's fault-injection tests.

Each wraps the XLA implementation (correct) and breaks it in one way the pipeline
must catch at a specific stage. Each is a ``kernels.Kernel`` subclass registered as
native on every backend (see ``register``) so its speed is assessed like a real native
kernel's.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels.kernel import Kernel
from kernels.registry import IMPLEMENTATIONS
from kernels.xla import xla_attention


class Fault:
    """A switch the test flips when the fault should start (e.g. when canary traffic
    begins: a kernel that degrades under production traffic)."""

    active = False
    nan_fraction = 0.5
    slowdown = 20.0
    call_started_s = 0.0


def wrong_scale(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Numerically wrong everywhere: logits scaled by 1.3x the requested scale."""
    return xla_attention(q, k, v, causal=causal, scale=scale * 1.3, q_lengths=q_lengths,
                         kv_lengths=kv_lengths)


def _flag_nan(total) -> np.ndarray:
    # A deterministic share of calls (by their input) turns NaN while the fault is on;
    # an input already NaN (an earlier layer's) stays NaN.
    if not np.isfinite(total):
        return np.asarray(True)
    bucket = int(abs(float(total)) * 1e4) % 100
    return np.asarray(Fault.active and bucket < 100 * Fault.nan_fraction)


def nan_under_fault(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Correct until ``Fault.active``; then NaN on about ``Fault.nan_fraction`` of calls."""
    out = xla_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                        kv_lengths=kv_lengths)
    bad = jax.pure_callback(_flag_nan, jax.ShapeDtypeStruct((), jnp.bool_),
                            jnp.sum(q.astype(jnp.float32)))
    return jnp.where(bad, jnp.nan, out).astype(q.dtype)


def _start_clock(x) -> np.ndarray:
    Fault.call_started_s = time.perf_counter()
    return np.asarray(x)


def _stretch(x) -> np.ndarray:
    # The call's own wall time, stretched (slowdown - 1) times over: a fault of a stated
    # ratio, as the latency plan states its slowdowns, whatever the host's speed or load.
    time.sleep((Fault.slowdown - 1.0) * (time.perf_counter() - Fault.call_started_s))
    return np.asarray(x)


def slow(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Correct but slow: every call takes ``Fault.slowdown`` times its own wall time (the
    XLA attention, then a host wait of ``slowdown - 1`` times what it took)."""
    q = jax.pure_callback(_start_clock, jax.ShapeDtypeStruct(q.shape, q.dtype), q)
    out = xla_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                        kv_lengths=kv_lengths)
    return jax.pure_callback(_stretch, jax.ShapeDtypeStruct(out.shape, out.dtype), out)


def good(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """Correct (XLA): the control candidate."""
    return xla_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                         kv_lengths=kv_lengths)


NAMES = ("wrong_scale", "nan_under_fault", "slow", "good")


class FaultyKernel(Kernel):
    """A fault-injection kernel: one of the functions above, run wherever XLA runs."""

    native_platforms = ("cpu", "gpu", "tpu")
    fault: str

    def __call__(self, q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
        return globals()[self.fault](q, k, v, causal=causal, scale=scale,
                                     q_lengths=q_lengths, kv_lengths=kv_lengths)


def kernel_class(fault: str) -> type[FaultyKernel]:
    """The ``Kernel`` subclass named ``test_<fault>`` for one of ``NAMES``."""
    return type(f"Faulty_{fault}", (FaultyKernel,), {
        "name": f"test_{fault}", "description": f"fault injection: {fault}", "fault": fault})


def register(monkeypatch) -> None:
    """Add the kernels to the registry as ``test_<name>`` for one test (``monkeypatch``
    takes them out again)."""
    for fault in NAMES:
        kernel = kernel_class(fault)()
        assert kernel.name not in IMPLEMENTATIONS, kernel.name
        monkeypatch.setitem(IMPLEMENTATIONS, kernel.name, kernel)
