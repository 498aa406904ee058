"""The serving-shape table (kernels.tools.bench_serving) and the serving autotune:
MiniLM's shapes, every registry column plus the float32 experiments, a wrong
kernel flagged, the tuned entries merged into the selection table."""

from __future__ import annotations

import json

import jax
import pytest

from kernels import selection
from kernels.pallas_gpu import PallasGpuKernel, TritonConfig
from kernels.shapes import AttentionShape
from kernels.tools import autotune, bench, bench_serving


def test_serving_shapes_are_minilms():
    shapes = bench_serving.serving_shapes(quick=False)
    assert {(s.batch, s.q_len) for s in shapes} == {(8, 128), (16, 512), (4, 1024)}
    assert {s.dtype for s in shapes} == {"float32", "bfloat16"}
    for s in shapes:
        assert (s.num_heads, s.num_kv_heads, s.head_dim) == (12, 12, 32)
        assert s.q_len == s.kv_len and not s.causal


def test_serving_sizes_on_the_command_line_are_the_tables_shapes():
    """Batch-1 request shapes (one canary request) can be asked for by ``--serving-sizes``;
    a malformed size names the form it needs."""
    args = bench.build_parser().parse_args(["--serving-sizes", "1x64", "1X256"])
    assert args.serving_sizes == [(1, 64), (1, 256)]
    shapes = bench_serving.serving_shapes(False, ("bfloat16",), args.serving_sizes)
    assert [(s.batch, s.q_len, s.kv_len, s.num_heads) for s in shapes] == [
        (1, 64, 64, 12), (1, 256, 256, 12)]
    for bad in ("1x", "0x64", "64", "1x-2", "ax64"):
        with pytest.raises(SystemExit):
            bench.build_parser().parse_args(["--serving-sizes", bad])
    with pytest.raises(Exception, match="BATCHxSEQ with two positive integers"):
        bench_serving.parse_size("0x64")


def test_columns_cover_the_registry_and_the_experiments():
    cols = bench_serving.columns()
    assert cols[:4] == ["naive", "xla", "cudnn", "pallas_gpu"]
    assert {"xla_default", "pallas_gpu[tf32x3]", "pallas_gpu[bf16x6]"} <= set(cols)


def test_quick_serving_table_cli(tmp_path, capsys):
    out = tmp_path / "serving.json"
    code = bench.main(["--quick", "--serving-only", "--serving-dtypes", "float32",
                       "--out", str(out)])
    assert code == 0
    report = bench.BenchReport.model_validate_json(out.read_text())
    assert report.rows == [] and report.long_context == []
    rows = {(r.shape.q_len, r.implementation): r for r in report.serving}
    for seq in (32, 64):
        for name in ("naive", "xla", "pallas_gpu", "xla_default", "pallas_gpu[bf16x6]"):
            row = rows[(seq, name)]
            assert row.ok, row.error
            assert row.rel_error_vs_reference < 1e-5 and row.correct
            assert row.us_per_call > 0 and row.us_per_call_pass2 > 0
        assert rows[(seq, "xla")].float32_precision == "highest"
        assert rows[(seq, "pallas_gpu")].config is not None
        assert rows[(seq, "cudnn")].error.startswith("unsupported")  # no GPU here
    text = capsys.readouterr().out
    assert "serving shape (us per call)" in text and "pallas/xla" in text


def test_serving_table_flags_a_wrong_kernel(monkeypatch):
    real = bench_serving.column_fn

    def fake(column, shape):
        fn, config, precision = real(column, shape)
        if column != "pallas_gpu":
            return fn, config, precision
        return (lambda q, k, v, kl: fn(q, k, v, kl - 1)), config, precision  # drops a key

    monkeypatch.setattr(bench_serving, "column_fn", fake)
    shape = bench_serving.serving_shapes(True, ("float32",))[0]
    rows = bench_serving.bench_serving_shape(shape, ["naive", "pallas_gpu"], seed=1, repeats=1,
                                             target_repeat_s=0.0, warmup_s=0.0)
    naive, wrong = rows
    assert naive.correct and wrong.ok and wrong.correct is False
    assert wrong.error_ratio_to_naive > 100


def test_the_second_serving_pass_refines_the_fastest_tilings():
    shape = bench_serving.serving_shapes(False, ("bfloat16",))[0]

    def tried(bq, bkv, tflops):
        return TritonConfig(block_q=bq, block_kv=bkv, num_warps=1, num_stages=2), tflops

    results = [tried(16, 32, 1.0), tried(32, 32, 3.0), tried(64, 32, 2.0),
               tried(128, 32, None), tried(16, 64, 0.5)]
    kernel = PallasGpuKernel()
    variants = kernel.refined_candidates(results, shape)
    assert {(c.block_q, c.num_stages) for c in variants} == {
        (bq, s) for bq in (32, 64, 16) for s in (1, 3)}
    assert all(c.block_kv == 32 for c in variants)
    assert kernel.refined_candidates(results, shape, quick=True) == []
    wide = shape.model_copy(update={"head_dim": 64})  # the serving grid's second pass only
    assert kernel.refined_candidates(results, wide) == []


def _table(device_kind, entries=()):
    return selection.SelectionTable(jax_version=jax.__version__, device_kind=device_kind,
                                    created_at="2026-01-01T00:00:00+00:00", command="old",
                                    tuning_data="old data", entries=list(entries))


def test_serving_autotune_merges_into_the_existing_table(tmp_path):
    old_entry = selection.TableEntry(
        dtype="bfloat16", batch=16, seq=1024, num_heads=16, head_dim=128, causal=False,
        best="cudnn", tflops={"cudnn": 500.0, "pallas_gpu": 400.0},
        pallas_config={"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 3})
    out = tmp_path / "gpu_table.json"
    out.write_text(_table(jax.devices()[0].device_kind, [old_entry]).model_dump_json())
    assert autotune.main(["--serving", "--quick", "--dtypes", "float32", "--out", str(out)]) == 0
    table = selection.load_table(out)
    kept = table.entries[0]
    assert kept.device_kind == jax.devices()[0].device_kind  # the old table's kind, named
    assert kept.model_copy(update={"device_kind": None}) == old_entry
    new = table.entries[1:]
    assert {(e.dtype, e.head_dim, e.seq) for e in new} == {("float32", 32, 32),
                                                         ("float32", 32, 64)}
    assert table.command.count(" ; ") == 1  # the old command, then the serving one
    # select reads the merged table: a serving-like call takes the serving entry
    shape = AttentionShape(batch=2, q_len=32, kv_len=32, num_heads=2, num_kv_heads=2,
                           head_dim=32, dtype="float32")
    assert selection.nearest_entry(shape, table) in new
    json.loads(out.read_text())  # valid JSON, written atomically


def test_merge_keeps_each_device_kind_apart():
    """Tables of two device kinds merge side by side, each entry naming its kind (a GPU
    then reads only its own: tests/test_kernels_selection_device.py)."""
    entry = selection.TableEntry(
        dtype="bfloat16", batch=1, seq=1024, num_heads=8, head_dim=64, causal=False,
        best="cudnn", tflops={"cudnn": 300.0},
        pallas_config={"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 3})
    merged = selection.merge_tables(_table("NVIDIA H200", [entry]),
                                    _table("NVIDIA A100", [entry]))
    assert sorted(e.device_kind for e in merged.entries) == ["NVIDIA A100", "NVIDIA H200"]


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() not in ("gpu", "cuda"), reason="needs a GPU")
def test_gpu_serving_table_every_column_runs_correctly():
    """Correctness at MiniLM's real shapes on the GPU (speed is read from
    ``python -m kernels.tools.bench --serving-only``, not asserted here)."""
    rows = bench_serving.bench_serving(bench_serving.serving_shapes(False), repeats=3,
                                       target_repeat_s=0.005, warmup_s=0.05)
    print(bench_serving.format_serving(rows))
    for row in rows:
        if row.error and row.error.startswith("unsupported"):
            assert row.implementation in ("cudnn", "pallas_mosaic_gpu") or row.experiment
            continue
        assert row.ok, (row.shape.label, row.implementation, row.error)
        if not row.experiment:
            assert row.correct, (row.shape.label, row.implementation,
                                 row.rel_error_vs_reference, row.error_ratio_to_naive)
    assert any(r.implementation == "cudnn" and r.ok for r in rows)  # bf16
