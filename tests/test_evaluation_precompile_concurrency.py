"""Warming many shapes at once: a kernel whose first calls must not overlap other threads'
compiles and loads (cuDNN: on an H100 its cached programs, loaded from several threads,
crashed rollouts) is warmed one case at a time, and everything beside it too; other
kernels keep the thread pool. Checked with stand-in kernels that count how many of their
traces (a first call's compile) run at once."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

import kernels
from evaluation.accuracy import precompile
from evaluation.cases import make_case
from kernels.dispatch import GuardedAttention
from kernels.kernel import Kernel
from kernels.xla import xla_attention

TRACE_S = 0.2  # long enough that four pooled threads overlap on a loaded 2-core host


class _Overlap:
    lock = threading.Lock()
    active = 0
    most = 0


class OverlapProbe(Kernel):
    """XLA attention whose trace (run once per first call) records how many traces of
    any probe are in progress at once."""

    native_platforms = ("cpu", "gpu", "tpu")

    def __call__(self, q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
        with _Overlap.lock:
            _Overlap.active += 1
            _Overlap.most = max(_Overlap.most, _Overlap.active)
        time.sleep(TRACE_S)
        with _Overlap.lock:
            _Overlap.active -= 1
        return xla_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                             kv_lengths=kv_lengths)


class PoolSafe(OverlapProbe):
    name = "test_pool_safe"
    description = "stand-in: first calls may overlap"


class PoolUnsafe(OverlapProbe):
    name = "test_pool_unsafe"
    description = "stand-in: first calls must not overlap (as cuDNN's)"
    concurrent_first_call = False


@pytest.fixture
def probes(monkeypatch):
    for cls in (PoolSafe, PoolUnsafe):
        monkeypatch.setitem(kernels.IMPLEMENTATIONS, cls.name, cls())
    _Overlap.active = _Overlap.most = 0
    yield


def _cases(n: int):
    rng = np.random.default_rng()
    out = []
    for i in range(n):  # distinct shapes: each is a first call
        q, k, v = (rng.standard_normal((1, 8 + 8 * i, 2, 16)).astype(np.float32)
                   for _ in range(3))
        out.append(make_case(case_id=f"c{i}", category="ordinary", tags=(), q=q, k=k, v=v,
                             source="test"))
    return out


def test_first_calls_of_safe_kernels_overlap_in_the_pool(probes):
    # the control: the probe sees overlap when nothing asks for one case at a time
    precompile(_cases(6), {"a": GuardedAttention(PoolSafe.name, None)}, workers=4)
    assert _Overlap.most >= 2


def test_a_kernel_that_must_not_overlap_is_warmed_one_case_at_a_time(probes):
    implementations = {"candidate": GuardedAttention(PoolSafe.name, None),
                       "production": GuardedAttention(PoolUnsafe.name, None)}
    precompile(_cases(6), implementations, workers=4)
    assert _Overlap.most == 1  # not even the safe kernel's traces ran beside it


def test_the_warmed_programs_are_the_ones_scoring_runs(probes):
    # warming one at a time still compiles every shape: the scoring calls take the fast path
    fn = GuardedAttention(PoolUnsafe.name, None)
    cases = _cases(3)
    precompile(cases, {"production": fn}, workers=4)
    assert len(fn.resolutions) == 3


def test_which_attentions_must_not_overlap(monkeypatch):
    assert GuardedAttention("cudnn", None).concurrent_first_calls is False
    assert GuardedAttention("xla", None).concurrent_first_calls is True
    # auto may pick cuDNN on a GPU, never on a CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert GuardedAttention("auto", None).concurrent_first_calls is False
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert GuardedAttention("auto", None).concurrent_first_calls is True
