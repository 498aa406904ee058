"""kernels.tools.bench (tiny interpret-mode run, timing, correctness checks) and
kernels.tools.autotune (the measured GPU selection table behind ``auto``)."""

from __future__ import annotations

import functools
import json
import math
import time

import jax
import numpy as np
import pytest

from kernels import registry, selection
from kernels.reference import attention_reference
from kernels.shapes import AttentionShape
from kernels.timing import time_call
from kernels.tools import autotune, bench


def mha(dtype: str, batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> AttentionShape:
    return AttentionShape(dtype=dtype, batch=batch, q_len=seq, kv_len=seq, num_heads=heads,
                          num_kv_heads=heads, head_dim=head_dim, causal=causal)


def test_quick_bench_cli_writes_a_correct_report(tmp_path):
    out = tmp_path / "bench.json"
    code = bench.main(["--quick", "--out", str(out), "--dtypes", "float32", "--head-dims", "32",
                       "--seqs", "64", "--implementations", "naive", "xla", "pallas_gpu",
                       "--long-seqs", "64", "128", "--no-serving"])  # serving: its own test
    assert code == 0
    report = bench.BenchReport.model_validate_json(out.read_text())
    assert report.interpret_mode and report.backend == "cpu"
    assert {r.implementation for r in report.rows} == {"naive", "xla", "pallas_gpu"}
    assert len(report.rows) == 2 * 3  # causal and not, three implementations
    for row in report.rows:
        assert row.ok, row.error
        assert row.correct and row.rel_error_vs_reference < 1e-5
        assert row.timing.median_s > 0 and row.tflops_pass2 > 0
        if row.implementation != "naive":
            assert row.rel_error_vs_naive < 1e-5
    assert report.longest_causal_context == {"pallas_gpu": 128, "naive": 128}
    assert report.geomean_ratio_pallas_to_cudnn is None  # no cuDNN on the CPU


def test_help_mentions_the_options(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = capsys.readouterr().out
    for option in ("--out", "--quick", "--seqs", "--long-seqs"):
        assert option in text


def test_gpu_grid_follows_the_issue():
    shapes = bench.grid(quick=False)
    assert len(shapes) == 2 * 2 * 2 * 5
    for s in shapes:
        assert s.batch * s.q_len == 16384 and s.num_heads * s.head_dim == 2048
        assert s.q_len == s.kv_len and s.num_kv_heads == s.num_heads
    assert {s.q_len for s in shapes} == {1024, 2048, 4096, 8192, 16384}


def test_flops_formula():
    shape = mha("bfloat16", 2, 1024, 16, 128, False)
    assert shape.flops() == 17_179_869_184  # 4*2*16*1024^2*128, by hand
    assert shape.model_copy(update={"causal": True}).flops() == 8_589_934_592


@pytest.mark.parametrize("causal", [False, True])
def test_sampled_row_reference_equals_full_reference(causal):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 40, 3, 16)) for _ in range(3))
    rows = np.array([0, 7, 39])
    pairs = [(0, 2), (1, 0)]
    got = bench.sampled_reference(q, k, v, causal=causal, scale=0.25, pairs=pairs, rows=rows)
    full = attention_reference(q, k, v, causal=causal, scale=0.25)
    want = np.stack([full[b, rows, h] for b, h in pairs])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_time_call_measures_seconds_per_call():
    def sleepy(x):
        time.sleep(0.004)
        return x

    timing = time_call(sleepy, (np.ones(3),), repeats=3, target_repeat_s=0.02,
                             warmup_s=0.0)
    assert timing.calls_per_repeat >= 4
    assert 0.004 <= timing.median_s < 0.012


def test_bench_flags_a_wrong_kernel(monkeypatch):
    real = bench.attention_fn

    def fake(name, shape, config):
        fn = real("naive" if name == "pallas_gpu" else name, shape, None)
        if name != "pallas_gpu":
            return fn
        # Drops the last key: exact elsewhere, so only the checks can catch it.
        return lambda q, k, v: fn(q, k[:, :-1], v[:, :-1])

    monkeypatch.setattr(bench, "attention_fn", fake)
    shape = mha("float32", 1, 64, 2, 32, False)
    rows = bench.bench_shape(shape, ["naive", "pallas_gpu"], seed=3, ceiling=1.0, repeats=1,
                             target_repeat_s=0.0, warmup_s=0.0)
    wrong = next(r for r in rows if r.implementation == "pallas_gpu")
    assert wrong.ok and wrong.correct is False
    assert wrong.rel_error_vs_naive > 1e-3


def test_geomean_of_ratios():
    def row(ratio, causal):
        shape = mha("bfloat16", 1, 1024, 1, 64, causal)
        return bench.BenchRow(shape=shape, implementation="pallas_gpu", ok=True,
                              ratio_to_cudnn=ratio)

    overall, groups = bench.summarize_ratios([row(0.5, False), row(2.0, False), row(0.8, True)])
    assert overall == pytest.approx(0.8 ** (1 / 3))
    assert groups["bfloat16 d64 full"] == pytest.approx(1.0)
    assert groups["bfloat16 d64 causal"] == pytest.approx(0.8)


# ----------------------------------------------------------------------------- autotune


def _entry(seq, causal, best, dtype="bfloat16", head_dim=128, block_q=64):
    return selection.TableEntry(
        dtype=dtype, batch=16384 // seq, seq=seq, num_heads=2048 // head_dim,
        head_dim=head_dim, causal=causal, best=best,
        tflops={"cudnn": 500.0, "pallas_gpu": 520.0 if best == "pallas_gpu" else 400.0},
        pallas_config={"block_q": block_q, "block_kv": 64, "num_warps": 4, "num_stages": 3})


@pytest.fixture
def table_path(tmp_path):
    table = selection.SelectionTable(
        jax_version="0.11.2", device_kind="NVIDIA H200", created_at="2026-11-29T00:00:00+00:00",
        command="test", tuning_data="synthetic",
        entries=[_entry(1024, True, "cudnn", block_q=32), _entry(16384, True, "pallas_gpu"),
                 _entry(16384, False, "cudnn", block_q=128)])
    path = tmp_path / "table.json"
    path.write_text(table.model_dump_json())
    return path


def test_select_uses_the_nearest_measured_shape(table_path):
    select = functools.partial(selection.select_gpu_implementation, table_path=table_path)
    name, config, reason = select(mha("bfloat16", 1, 12000, 16, 128, True))
    assert name == "pallas_gpu" and config.block_q == 64
    assert "S16384" in reason and "NVIDIA H200" in reason
    name, config, _ = select(mha("float16", 8, 1500, 16, 128, True))
    assert (name, config) == ("cudnn", None)
    name, _, _ = select(mha("bfloat16", 1, 12000, 16, 128, False))
    assert name == "cudnn"  # causal and full never mix
    name, config, reason = select(mha("float32", 8, 1500, 16, 128, True))
    assert name == "pallas_gpu" and config.block_q == 32 and "float32" in reason


def test_select_without_a_table_uses_the_documented_default(tmp_path):
    missing = tmp_path / "none.json"
    name, config, reason = selection.select_gpu_implementation(
        mha("bfloat16", 1, 64, 2, 64, False), table_path=missing)
    assert (name, config) == ("cudnn", None) and "default" in reason
    name, config, _ = selection.select_gpu_implementation(
        mha("float32", 1, 64, 2, 64, False), table_path=missing)
    assert name == "pallas_gpu" and config.block_q in (16, 32, 64, 128)


def test_unknown_schema_version_is_refused(table_path):
    data = json.loads(table_path.read_text())
    data["schema_version"] = 99
    table_path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema_version"):
        selection.load_table(table_path)


def test_quick_autotune_writes_a_table_select_can_read(tmp_path):
    out = tmp_path / "gpu_table.json"
    assert autotune.main(["--quick", "--out", str(out), "--dtypes", "float32",
                          "--head-dims", "32", "--seqs", "64"]) == 0
    table = selection.load_table(out)
    assert table.device_kind == jax.devices()[0].device_kind
    assert len(table.entries) == 2  # causal and not
    for entry in table.entries:
        assert entry.best == "pallas_gpu"  # no cuDNN on the CPU
        assert all(c.rel_diff_to_baseline < 1e-5 for c in entry.candidates["pallas_gpu"]
                   if c.tflops)
    name, config, _ = selection.select_gpu_implementation(
        mha("float32", 2, 64, 2, 32, True), table_path=out)
    assert name == "pallas_gpu"
    assert config.fields_set() in [e.configs["pallas_gpu"] for e in table.entries]


def test_autotune_reads_shapes_from_the_tuning_split_only(tmp_path):
    manifest = {"splits": {
        "tuning": {"cases": [
            {"q_shape": [2, 64, 4, 32], "kv_shape": [2, 96, 2, 32], "dtype": "float16", "causal": True},
            {"q_shape": [2, 64, 4, 32], "kv_shape": [2, 96, 2, 32], "dtype": "float16", "causal": True},
        ]},
        "heldout": {"cases": [
            {"q_shape": [1, 8, 1, 16], "kv_shape": [1, 8, 1, 16], "dtype": "float32", "causal": False}]},
    }}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert autotune.tuning_shapes(tmp_path) == [AttentionShape(
        batch=2, q_len=64, kv_len=96, num_heads=4, num_kv_heads=2, head_dim=32,
        dtype="float16", causal=True)]


def test_committed_table_is_consistent_and_covers_the_grid():
    """The table is data a GPU run wrote: each entry's winner is its fastest
    implementation, the pallas tiling it records is the fastest correct candidate it
    measured, and every tiling is legal for the kernel."""
    table = selection.load_table()
    assert table is not None
    covered = {(e.dtype, e.head_dim, e.causal) for e in table.entries}
    assert covered >= {(d, h, c) for d in ("bfloat16", "float16") for h in (64, 128)
                       for c in (False, True)}
    for e in table.entries:
        # cuDNN and pallas_mosaic_gpu run bf16/f16 only: float32 entries (serving shapes)
        # time pallas_gpu alone
        if e.dtype == "float32":
            assert set(e.tflops) == {"pallas_gpu"}
        else:
            assert {"cudnn", "pallas_gpu"} <= set(e.tflops) <= {"cudnn", *registry.tuned()}
        assert e.best == max(e.tflops, key=e.tflops.get)
        assert "pallas_gpu" in e.configs
        if "pallas_mosaic_gpu" not in e.configs:
            assert "pallas_mosaic_gpu" not in e.tflops
        for name, config in e.configs.items():
            fastest = max((c for c in e.candidates[name] if c.tflops), key=lambda c: c.tflops)
            assert fastest.config == config
            assert math.isclose(fastest.tflops, e.tflops[name])
            # legal for the kernel, stored in its own config type's fields
            assert registry.IMPLEMENTATIONS[name].config_from(config).fields_set() == config


def test_without_naive_the_error_bound_is_cudnns_own_error(monkeypatch):
    """A run with naive off (the long-sequence GPU runs) judges each kernel by cuDNN's
    error on the same inputs; the bf16 floor alone (2 x 1e-3) would fail correct kernels,
    whose error is about 2e-3 from rounding P to bf16."""
    real = bench.attention_fn
    monkeypatch.setattr(bench, "attention_fn", lambda name, shape, config: real(
        "xla" if name == "cudnn" else name, shape, None if name == "cudnn" else config))
    shape = mha("bfloat16", 1, 128, 2, 64, True)
    rows = bench.bench_shape(shape, ["cudnn", "pallas_gpu"], seed=5, ceiling=1.0, repeats=1,
                             target_repeat_s=0.0, warmup_s=0.0)
    stand_in, pallas = rows
    assert stand_in.rel_error_vs_reference > bench.ERROR_FLOOR["bfloat16"]
    assert pallas.error_baseline == "cudnn" and pallas.correct
    assert pallas.error_ratio_to_naive == pytest.approx(
        pallas.rel_error_vs_reference / stand_in.rel_error_vs_reference)


def test_autotune_merge_adds_shapes_and_replaces_remeasured_ones(tmp_path):
    out = tmp_path / "gpu_table.json"
    common = ["--quick", "--out", str(out), "--dtypes", "float32", "--head-dims", "32",
              "--skip", "pallas_mosaic_gpu"]
    assert autotune.main([*common, "--seqs", "64"]) == 0
    first = selection.load_table(out)
    assert autotune.main([*common, "--seqs", "64", "96", "--merge"]) == 0
    merged = selection.load_table(out)
    assert sorted((e.seq, e.causal) for e in merged.entries) == [
        (64, False), (64, True), (96, False), (96, True)]  # S=64 re-measured, not duplicated
    assert merged.command.count(" ; ") == 1
    assert {e.device_kind for e in merged.entries} == {first.device_kind}  # written per entry
    # another device kind's entries are kept side by side (the table is keyed by kind) ...
    other = first.model_copy(update={"device_kind": "NVIDIA H200", "entries": [
        e.model_copy(update={"device_kind": "NVIDIA H200"}) for e in first.entries]})
    both = selection.merge_tables(merged, other)
    assert len(both.entries) == len(merged.entries) + len(other.entries)
    # ... but one table is one JAX version
    with pytest.raises(ValueError, match="cannot merge"):
        selection.merge_tables(other.model_copy(update={"jax_version": "0.0.1"}), first)
