"""evaluation.profiling: a jax.profiler trace of named attention kernels.

On the CPU the trace holds the host timeline and the executed HLO modules, where the
kernels' names (Pallas ``name=``, ``jax.named_call``) appear; on a GPU the same names
label the device kernels too."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import kernels
from evaluation.profiling import names_in_trace, record_trace, trace_event_names
from kernels.shapes import AttentionShape

SHAPE = AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2,
                       head_dim=32, causal=True)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    # pallas_tpu compiles and runs in this process, but before the trace: it must not
    # show up in the trace's events (its HLO is in the file's metadata all the same).
    q, k, v = kernels.random_inputs(SHAPE, 0)
    kernels.get_attention_fn("pallas_tpu")(q, k, v, causal=True).block_until_ready()
    out = tmp_path_factory.mktemp("profile")
    return record_trace({"candidate": "pallas_gpu", "baseline": "naive", "xla": "xla"},
                        SHAPE, out, calls=2)


def test_trace_file_exists_under_the_folder(trace):
    path = Path(trace.path)
    assert path.is_file() and path.name.endswith(".xplane.pb") and path.stat().st_size > 0
    assert path.is_relative_to(trace.trace_dir)
    assert Path(trace.perfetto_path).is_file()


def test_each_kernel_is_visible_by_name(trace):
    expected = {"candidate": "kernelgate_flash_attention_fwd_gpu",
                "baseline": "kernelgate_naive_attention", "xla": "kernelgate_xla_attention"}
    assert trace.trace_names == expected
    assert trace.names_found == dict.fromkeys(expected, True)
    events = trace_event_names(trace.path)
    for name in expected.values():
        assert f"PjitFunction({name})" in events  # the dispatch of that kernel's module
    assert expected["candidate"] == kernels.pallas_gpu.KERNEL_NAME


def test_a_kernel_that_did_not_run_is_not_in_the_trace(trace):
    assert names_in_trace(trace.path, ["kernelgate_flash_attention_tpu"]) == {
        "kernelgate_flash_attention_tpu": False}


def test_perfetto_trace_carries_the_role_annotations(trace):
    text = gzip.decompress(Path(trace.perfetto_path).read_bytes()).decode()
    for role, name in trace.implementations.items():
        assert f"kernelgate/{role}:{name}" in text


def test_registry_trace_names_match_the_kernels():
    from kernels import pallas_gpu, pallas_tpu

    assert kernels.IMPLEMENTATIONS["pallas_gpu"].trace_name == pallas_gpu.KERNEL_NAME
    assert kernels.IMPLEMENTATIONS["pallas_tpu"].trace_name == pallas_tpu.KERNEL_NAME


def test_plain_callable_and_bad_arguments(tmp_path):
    def mine(q, k, v, *, causal=False, scale=None, q_lengths=None, kv_lengths=None):
        return kernels.get_attention_fn("naive")(q, k, v, causal=causal)

    trace = record_trace({"candidate": mine}, SHAPE, tmp_path, calls=1, perfetto=False)
    assert trace.implementations == {"candidate": "mine"}
    assert trace.trace_names == {"candidate": None} and trace.names_found == {"candidate": False}
    assert trace.perfetto_path is None
    with pytest.raises(ValueError, match="at least one"):
        record_trace({}, SHAPE, tmp_path)
    with pytest.raises(ValueError, match="calls"):
        record_trace({"baseline": "naive"}, SHAPE, tmp_path, calls=0)
