"""The kernel registry: a kernel is one ``kernels.Kernel`` class; adding one
is its module, one registry line and its tests.

The acceptance test defines a stand-in kernel here, registers it from this module and
nowhere else, and has it built (``kernels.build``), evaluated (evaluation's accuracy on
real test cases against the float64 reference) and benched (the benchmark tool). The
stand-in computes real attention (XLA underneath, under its own trace name) and declares
a narrower capability than XLA's, so what it declares is seen in each output.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import kernels
from evaluation.accuracy import evaluate_accuracy
from evaluation.profiling import record_trace
from evaluation.runners import LocalRunner
from kernels import dispatch, registry, selection
from kernels.build import build as build_kernel
from kernels.config import LEGACY_FIELDS
from kernels.kernel import Capability, Kernel
from kernels.tools import bench
from kernels.xla import xla_attention
from tests.test_evaluation_accuracy import make_case

STAND_IN = "test_stand_in"
TRACE_NAME = "kernelgate_stand_in_attention"


class StandInKernel(Kernel):
    """XLA attention under another name: float32 only, head_dim <= 64."""

    name = STAND_IN
    description = "a stand-in registered from a test module (XLA underneath)"
    native_platforms = ("cpu", "gpu", "tpu")
    capability = Capability(dtypes=("float32",), max_head_dim=64)
    float32_matmul_precision = "highest"
    trace_name = TRACE_NAME
    calls = 0

    def __call__(self, q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
        type(self).calls += 1  # counted at trace time: the stand-in, not XLA, was bound
        return jax.named_call(xla_attention, name=TRACE_NAME)(
            q, k, v, causal=causal, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths)


@pytest.fixture
def stand_in():
    dispatch.get_attention_fn.cache_clear()
    StandInKernel.calls = 0
    with kernels.registered(StandInKernel) as kernel:
        yield kernel
    dispatch.get_attention_fn.cache_clear()
    assert STAND_IN not in kernels.IMPLEMENTATIONS


F32 = dict(batch=2, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2, head_dim=32,
           dtype="float32", causal=True)


def test_a_registered_kernel_is_built(stand_in, tmp_path):
    build = build_kernel(STAND_IN, None, F32, platforms=("cpu",), output_dir=tmp_path)
    assert build.implementation == STAND_IN and build.config is None
    assert build.resolution.name == STAND_IN and build.resolution.native
    assert build.local is not None and build.local.compile_time_s > 0
    assert build.artifact("cpu").status == "exported"
    assert (tmp_path / f"{STAND_IN}.cpu.jax_exported").is_file()
    assert StandInKernel.calls > 0
    # its declared capability refuses a bf16 build, naming the reason
    with pytest.raises(NotImplementedError, match="supports dtypes"):
        build_kernel(STAND_IN, None, {**F32, "dtype": "bfloat16"}, platforms=())
    # untiled (no config type): block sizes are refused, not ignored
    with pytest.raises(ValueError, match="does not tile"):
        build_kernel(STAND_IN, {"block_q": 64}, F32, platforms=())


def test_a_registered_kernel_is_evaluated(stand_in):
    cases = [make_case("ord-0", "ordinary", q_len=128, kv_len=128, seed=1),
             make_case("hard-0", "hard", q_len=64, kv_len=300, causal=True, seed=2),
             make_case("hard-1", "hard", q_len=100, kv_len=200, heads=4, kv_heads=2,
                       lengths=True, seed=3),
             make_case("wide", "hard", q_len=64, kv_len=64, head_dim=128, seed=4)]
    runner = LocalRunner.for_implementation(STAND_IN)
    info = runner.describe()
    assert info["implementation"] == STAND_IN and info["float32_matmul_precision"] == "highest"
    results = evaluate_accuracy(cases, {"baseline": kernels.get_attention_fn("naive"),
                                        "candidate": kernels.get_attention_fn(STAND_IN)})
    rows = {r.case_id: r for r in results["candidate"].cases}
    for case_id in ("ord-0", "hard-0", "hard-1"):
        row = rows[case_id]
        assert row.error is None, row.error
        assert row.rel_error < 1e-5 and row.error_ratio_to_baseline <= 2.0
        assert row.nan_count == 0
    # head_dim 128 is outside its capability: the case is recorded as a refusal
    assert "supports head_dim <= 64" in rows["wide"].error
    assert results["candidate"].categories["hard"].failed_cases == 1
    assert StandInKernel.calls > 0


def test_a_registered_kernel_is_benched(stand_in, tmp_path):
    assert STAND_IN in bench.implementations()
    out = tmp_path / "bench.json"
    code = bench.main(["--quick", "--out", str(out), "--dtypes", "float32", "bfloat16",
                       "--head-dims", "32", "--seqs", "64", "--implementations", "naive",
                       STAND_IN, "--long-seqs", "64", "--no-serving"])
    assert code == 0
    report = bench.BenchReport.model_validate_json(out.read_text())
    rows = [r for r in report.rows if r.implementation == STAND_IN]
    assert len(rows) == 4  # two dtypes, causal and not
    for row in rows:
        if row.shape.dtype == "float32":
            assert row.ok and row.correct and row.rel_error_vs_reference < 1e-5
            assert row.rel_error_vs_naive < 1e-5 and row.tflops > 0
        else:  # its capability, recorded as the reason it did not run
            assert not row.ok and row.error.startswith("unsupported")
            assert "supports dtypes ('float32',)" in row.error
    assert f"not run: {STAND_IN}" in bench.format_table(report)


def test_its_trace_name_shows_in_a_profile(stand_in, tmp_path):
    shape = kernels.AttentionShape(**F32)
    trace = record_trace({"candidate": STAND_IN}, shape, tmp_path, calls=1, perfetto=False)
    assert trace.trace_names == {"candidate": TRACE_NAME}
    assert trace.names_found == {"candidate": True}


# --------------------------------------------------------------------------- the registry


def test_register_refuses_what_is_not_a_new_kernel(stand_in):
    with pytest.raises(ValueError, match="registered already"):
        kernels.register(StandInKernel)
    with pytest.raises(TypeError, match="Kernel"):
        kernels.register(xla_attention)
    with pytest.raises(TypeError):
        kernels.IMPLEMENTATIONS["x"] = xla_attention
    auto = type("Auto", (StandInKernel,), {"name": "auto"})
    with pytest.raises(ValueError, match="selection mode"):
        kernels.register(auto)
    with pytest.raises(ValueError, match="unknown implementation"):
        kernels.attention(*(jnp.ones((1, 8, 1, 8)),) * 3, implementation="test_nothing")


def test_register_and_unregister():
    other = type("Other", (StandInKernel,), {"name": "test_other"})
    kernel = kernels.register(other)
    try:
        assert kernels.IMPLEMENTATIONS["test_other"] is kernel
        q = jnp.ones((1, 8, 1, 8))
        assert kernels.attention(q, q, q, implementation="test_other").shape == q.shape
    finally:
        kernels.unregister("test_other")
    assert "test_other" not in kernels.IMPLEMENTATIONS
    with pytest.raises(KeyError):
        kernels.unregister("test_other")


def test_registered_restores_a_replaced_kernel():
    before = kernels.IMPLEMENTATIONS["xla"]
    replaced = type("TpuOnlyXla", (type(before),), {"native_platforms": ("tpu",)})
    with kernels.registered(replaced, replace=True):
        assert kernels.IMPLEMENTATIONS["xla"].native_platforms == ("tpu",)
    assert kernels.IMPLEMENTATIONS["xla"] is before


def test_importing_kernels_loads_no_kernel_module_until_asked():
    code = ("import sys, kernels\n"
            "heavy = ['kernels.pallas_tpu', 'kernels.pallas_mosaic_gpu']\n"
            "before = [m in sys.modules for m in heavy]\n"
            "kernels.IMPLEMENTATIONS['pallas_mosaic_gpu']\n"
            "print(before, 'kernels.pallas_mosaic_gpu' in sys.modules,"
            " 'jax.experimental.pallas.mosaic_gpu' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split() == ["[False,", "False]", "True", "False"]


def _spec(dtype: str, head_dim: int):
    q = jax.ShapeDtypeStruct((1, 64, 2, head_dim), jnp.dtype(dtype))
    return kernels.validate(q, q, q)[0]


@pytest.mark.parametrize("name", list(registry.BUILTIN))
def test_each_kernel_refuses_what_its_capability_leaves_out(name):
    kernel = kernels.IMPLEMENTATIONS[name]
    backend = kernel.native_platforms[0]
    cap = kernel.capability
    for dtype in ("float32", "bfloat16", "float16"):
        if dtype not in cap.dtypes:
            with pytest.raises(NotImplementedError):
                kernel.check_supported(_spec(dtype, 64), backend)
    if cap.max_head_dim is not None:
        with pytest.raises(NotImplementedError):
            kernel.check_supported(_spec(cap.dtypes[0], cap.max_head_dim + 64), backend)
    if cap.head_dim_multiple > 1:
        with pytest.raises(NotImplementedError):
            kernel.check_supported(_spec(cap.dtypes[0], cap.head_dim_multiple + 1), backend)


@pytest.mark.parametrize("name", list(registry.BUILTIN))
def test_each_kernel_refuses_block_sizes_outside_its_config_type(name):
    kernel = kernels.IMPLEMENTATIONS[name]
    config_type = kernel.config_type
    for field in LEGACY_FIELDS:
        readable = config_type is not None and (
            field in config_type.model_fields or field in config_type.legacy_names)
        if not readable:
            with pytest.raises(ValueError):
                kernel.config_from({field: 64 if "block" in field else 3})
    assert kernel.tiled == bool(kernel.config_fields) == (config_type is not None)
    if kernel.tiled:
        resolved = kernel.resolve_config(_spec(kernel.capability.dtypes[0], 64), None)
        assert all(getattr(resolved, f) is not None for f in kernel.config_fields)
    else:
        assert kernel.resolve_config(_spec("float32", 64), None) is None


def test_the_tuned_and_our_kernels_are_what_the_classes_declare():
    declared = {n: (k.tuned, k.ours) for n, k in kernels.IMPLEMENTATIONS.items()}
    assert registry.tuned() == tuple(n for n, (t, _) in declared.items() if t)
    assert registry.ours() == tuple(n for n, (_, o) in declared.items() if o)
    assert "pallas_gpu" in registry.tuned()
    table = selection.load_table()
    # what the checked-in table picks is registered, and its tilings are of tuned kernels
    for entry in table.entries:
        assert entry.best in kernels.IMPLEMENTATIONS
        assert set(entry.tflops) <= {"cudnn", *registry.tuned()}
        assert set(entry.configs) <= set(registry.tuned())
        assert isinstance(entry.config_of("pallas_gpu"), kernels.KernelConfig)
