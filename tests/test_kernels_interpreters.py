"""Pallas' two interpreters for ``pallas_tpu`` off-TPU (``kernels.interpreters``): the
same outputs bit for bit on fresh random inputs, both against float64; which one a
trace uses; the per-purpose plan a registration gives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import interpreters
from kernels.interpreters import InterpreterPlan
from kernels.pallas_tpu import TpuConfig
from tests.kernels_helpers import Case, assert_accurate, random_inputs, reference_for

# Fresh seeds per case (never the test set's): several shapes, causal and not, padding
# lengths (query and key), GQA, several tiles, a head_dim padded to the lanes, low precision.
CASES = [
    Case("serving-causal", batch=1, q_len=256, kv_len=256, num_heads=12, num_kv_heads=12,
         head_dim=32, causal=True),
    Case("padded-lengths", batch=3, q_len=200, kv_len=300, num_heads=4, num_kv_heads=4,
         head_dim=64, q_lengths=(200, 77, 1), kv_lengths=(300, 129, 0)),
    Case("gqa-causal-padded", batch=2, q_len=384, kv_len=384, num_heads=8, num_kv_heads=2,
         head_dim=128, causal=True, kv_lengths=(384, 250), q_lengths=(384, 250)),
    Case("cross-gqa-small-blocks", batch=1, q_len=100, kv_len=520, num_heads=6,
         num_kv_heads=3, head_dim=80, config=TpuConfig(block_q=32, block_kv=128)),
    Case("bf16-causal", batch=2, q_len=130, kv_len=130, num_heads=2, num_kv_heads=1,
         head_dim=64, dtype="bfloat16", causal=True, kv_lengths=(130, 60)),
]


def _run(case: Case, name: str, q, k, v, ql, kl) -> np.ndarray:
    fn = kernels.get_attention_fn("pallas_tpu", case.config)
    with interpreters.interpreter(name):
        out = fn(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl)
    return np.asarray(jax.block_until_ready(out))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_both_interpreters_give_identical_outputs(case):
    """The generic lowering computes what TPU interpret mode computes, bit for bit, and
    both are within the accuracy rule against float64 (bf16: against naive's error)."""
    seed = 1000 + CASES.index(case)
    q, k, v, ql, kl = random_inputs(case, seed)
    tpu = _run(case, "tpu_interpret", q, k, v, ql, kl)
    generic = _run(case, "generic_interpret", q, k, v, ql, kl)
    assert tpu.dtype == generic.dtype and tpu.shape == generic.shape
    np.testing.assert_array_equal(generic, tpu)
    ref = reference_for(q, k, v, case, ql, kl)
    naive_error = None
    if case.dtype != "float32":
        naive = kernels.get_attention_fn("naive")(q, k, v, causal=case.causal, q_lengths=ql,
                                                   kv_lengths=kl)
        naive_error = assert_accurate(naive, ref, case.dtype)
    for out in (tpu, generic):
        assert_accurate(out, ref, case.dtype, naive_error)


def _host_callbacks(name: str) -> int:
    arg = jax.ShapeDtypeStruct((1, 16, 2, 32), jnp.float32)
    with interpreters.interpreter(name):
        # one jit for both names: the choice must be part of jit's cache key
        text = _JITTED.lower(arg, arg, arg).as_text()
    return text.count("xla_python_cpu_callback") + text.count("xla_ffi_python_cpu_callback")


_JITTED = jax.jit(lambda q, k, v: kernels.get_attention_fn("pallas_tpu", jit=False)(
    q, k, v, causal=True))


def test_the_choice_is_made_at_trace_time_and_keys_the_jit_cache():
    """TPU interpret mode reaches its simulated memory through host callbacks (which
    also keep a program out of the persistent cache); the generic lowering has none.
    One jitted function traced under both gives both programs, not a reused one."""
    assert _host_callbacks("tpu_interpret") > 0
    assert _host_callbacks("generic_interpret") == 0
    assert _host_callbacks("tpu_interpret") > 0
    assert interpreters.current() == "tpu_interpret"  # the default, restored


def test_tpu_interpret_mode_checks_what_the_generic_lowering_does_not():
    """An out-of-bounds block index raises in TPU interpret mode; the generic lowering
    clamps it silently. This is why the accuracy cases stay in TPU interpret mode."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)

    def call(interpret):
        return pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 2, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              interpret=interpret)(x)

    clamped = np.asarray(call(True))
    np.testing.assert_array_equal(clamped, np.asarray(x[8:]))  # block 2 clamped to block 1
    with pytest.raises(Exception, match="[Oo]ut-of-bounds"):
        jax.block_until_ready(call(pltpu.InterpretParams()))
    pltpu.reset_tpu_interpret_mode_state()


def test_plan_keeps_accuracy_in_tpu_interpret_mode():
    strict = InterpreterPlan.for_profile(True)
    loose = InterpreterPlan.for_profile(False)
    assert {p: strict.for_purpose(p) for p in interpreters.PURPOSES} == dict.fromkeys(
        interpreters.PURPOSES, "tpu_interpret")
    assert loose.accuracy == "tpu_interpret"
    assert {loose.model_check, loose.shadow, loose.canary} == {"generic_interpret"}
    with loose.scope("shadow"):
        assert interpreters.current() == "generic_interpret"
        with loose.scope("accuracy"):
            assert interpreters.current() == "tpu_interpret"
    assert interpreters.current() == "tpu_interpret"
    with pytest.raises(ValueError, match="choose one of"):
        loose.for_purpose("speed")
    with pytest.raises(ValueError, match="choose one of"):
        interpreters.interpreter("mosaic").__enter__()
    with pytest.raises(ValueError):
        InterpreterPlan(accuracy="generic_interpret")


def test_a_version_s_own_process_runs_under_the_interpreter_the_request_names():
    """``lineage/serving/model_worker.py`` (a version in its own process) enters the interpreter
    the parent's request carries and says which ran; the parent sends its current one."""
    from types import SimpleNamespace

    from lineage.serving import model_worker

    ran: list[str] = []

    def embed(texts):
        ran.append(interpreters.current())
        return np.zeros((len(texts), 384), np.float32)

    def attention(q, k, v, **kw):
        ran.append(interpreters.current())
        return q

    handlers = model_worker._handlers(SimpleNamespace(embed=embed, attention=attention))
    x = np.ones((1, 8, 1, 32), np.float32)
    reply = handlers["embed"]({"texts": ["a"], "interpreter": "generic_interpret"})
    assert reply["interpreter"] == "generic_interpret"
    assert handlers["embed"]({"texts": ["a"]})["interpreter"] == "tpu_interpret"
    reply = handlers["attention"]({"q": x, "k": x, "v": x, "causal": False, "scale": None,
                                   "interpreter": "generic_interpret"})
    assert reply["interpreter"] == "generic_interpret"
    assert ran == ["generic_interpret", "tpu_interpret", "generic_interpret"]
