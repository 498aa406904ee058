"""The GPU selection table is keyed by device kind: a GPU picks only from entries measured
on its own kind; a version-1 table reads as measured on its one device kind."""

from __future__ import annotations

import json

import pytest

from kernels import selection
from kernels.shapes import AttentionShape

SHAPE = AttentionShape(batch=4, q_len=4096, kv_len=4096, num_heads=16, num_kv_heads=16,
                       head_dim=128, dtype="bfloat16", causal=True)


def _entry(best: str, **extra) -> dict:
    return {"dtype": "bfloat16", "batch": 4, "seq": 4096, "num_heads": 16, "head_dim": 128,
            "causal": True, "best": best, "tflops": {"cudnn": 500.0, best: 600.0},
            "pallas_config": {"block_q": 128, "block_kv": 64, "num_warps": 8, "num_stages": 3},
            "mosaic_config": {"block_q": 128, "block_kv": 128, "num_stages": 2}, **extra}


def _table(tmp_path, version: int, entries: list[dict], kind: str = "NVIDIA H200"):
    path = tmp_path / f"table-v{version}.json"
    path.write_text(json.dumps({"schema_version": version, "jax_version": "0.11.2",
                                "device_kind": kind, "created_at": "2026-12-01",
                                "command": "test", "tuning_data": "test",
                                "entries": entries}))
    return path


def test_a_version_1_table_counts_as_measured_on_its_device_kind(tmp_path):
    path = _table(tmp_path, 1, [_entry("pallas_mosaic_gpu")])
    name, config, why = selection.select_gpu_implementation(SHAPE, table_path=path,
                                                            device_kind="NVIDIA H200")
    assert name == "pallas_mosaic_gpu" and config is not None
    assert "on NVIDIA H200" in why and "pallas_mosaic_gpu 600 TFLOP/s" in why
    name, config, why = selection.select_gpu_implementation(SHAPE, table_path=path,
                                                            device_kind="NVIDIA A100-SXM4-80GB")
    assert (name, config) == ("cudnn", None)
    assert "no entry for NVIDIA A100-SXM4-80GB" in why and "['NVIDIA H200']" in why


def test_entries_of_another_device_kind_are_never_picked(tmp_path):
    path = _table(tmp_path, 2, [_entry("pallas_mosaic_gpu", device_kind="NVIDIA H200"),
                                _entry("pallas_gpu", device_kind="NVIDIA L4")])
    assert selection.select_gpu_implementation(
        SHAPE, table_path=path, device_kind="NVIDIA L4")[0] == "pallas_gpu"
    assert selection.select_gpu_implementation(
        SHAPE, table_path=path, device_kind="NVIDIA H200")[0] == "pallas_mosaic_gpu"


def test_merging_tables_of_two_device_kinds_keeps_both(tmp_path):
    h200 = selection.load_table(_table(tmp_path, 1, [_entry("pallas_mosaic_gpu")]))
    l4 = selection.SelectionTable.model_validate(json.loads(
        _table(tmp_path, 2, [_entry("pallas_gpu")], kind="NVIDIA L4").read_text()))
    merged = selection.merge_tables(h200, l4)
    assert merged.schema_version == selection.TABLE_SCHEMA_VERSION
    assert sorted(selection.measured_on(e, merged) for e in merged.entries) == [
        "NVIDIA H200", "NVIDIA L4"]
    other = l4.model_copy(update={"jax_version": "0.0.1"})
    with pytest.raises(ValueError, match="jax 0.0.1"):
        selection.merge_tables(h200, other)


def test_an_unknown_schema_version_is_refused(tmp_path):
    with pytest.raises(ValueError, match="schema_version 4"):
        selection.load_table(_table(tmp_path, 4, []))


def _measured(dtype: str, head_dim: int, seq: int, tflops: dict, kind="NVIDIA H200") -> dict:
    best = max(tflops, key=tflops.get)
    return {"dtype": dtype, "batch": 1, "seq": seq, "num_heads": 8, "head_dim": head_dim,
            "causal": False, "best": best, "tflops": tflops, "device_kind": kind,
            "pallas_config": {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2},
            "mosaic_config": {"block_q": 64, "block_kv": 128, "num_stages": 2}}


def test_auto_over_a_contract_picks_the_fastest_inside_it(tmp_path):
    path = _table(tmp_path, 2, [
        # inside a bf16, S >= 1024 contract: mosaic fastest by geometric mean
        _measured("bfloat16", 128, 4096, {"pallas_mosaic_gpu": 600, "cudnn": 560, "pallas_gpu": 450}),
        _measured("bfloat16", 64, 16384, {"pallas_mosaic_gpu": 420, "cudnn": 440, "pallas_gpu": 350}),
        # outside it (short sequences): pallas_gpu far ahead, must not sway the pick
        _measured("bfloat16", 32, 512, {"pallas_mosaic_gpu": 10, "cudnn": 20, "pallas_gpu": 90}),
        # another device kind: never read
        _measured("bfloat16", 128, 4096, {"pallas_mosaic_gpu": 1, "cudnn": 1, "pallas_gpu": 900},
                  kind="NVIDIA L4"),
    ])

    def long_bf16(dtype, head_dim, seq):
        return dtype == "bfloat16" and 64 <= head_dim <= 256 and seq >= 1024

    name, why = selection.fastest_over(long_bf16, table_path=path, device_kind="NVIDIA H200")
    assert name == "pallas_mosaic_gpu" and "2 shapes" in why
    # geometric means: mosaic sqrt(600*420)=502, cudnn sqrt(560*440)=496
    assert "pallas_mosaic_gpu 502" in why and "cudnn 496" in why
    short = selection.fastest_over(lambda d, h, s: s < 1024, table_path=path,
                                   device_kind="NVIDIA H200")
    assert short[0] == "pallas_gpu"
    assert selection.fastest_over(lambda d, h, s: d == "float16", table_path=path,
                                  device_kind="NVIDIA H200") is None


def test_auto_never_picks_a_kernel_that_refuses_part_of_the_contract(tmp_path, monkeypatch):
    """The H200 rollout of 2026-12-01 (local-dry-run: float32 served) picked cuDNN, the
    fastest by TFLOP/s, and was rejected for refusing 16 float32 cases: a kernel that
    cannot run a served dtype is never eligible."""
    from flows import kernel_choice

    path = _table(tmp_path, 2, [
        _measured("bfloat16", 64, 4096, {"cudnn": 600, "pallas_gpu": 400, "pallas_mosaic_gpu": 550}),
        _measured("float32", 64, 4096, {"cudnn": 600, "pallas_gpu": 100, "pallas_mosaic_gpu": 500}),
    ])
    monkeypatch.setattr(selection, "DEFAULT_TABLE_PATH", path)
    monkeypatch.setattr(selection, "current_device_kind", lambda: "NVIDIA H200")
    from gates.thresholds import load_thresholds

    root = __import__("pathlib").Path(__file__).resolve().parents[1]

    def contract(name):
        return load_thresholds(root / "thresholds" / name).serving

    name, why = kernel_choice.rollout_kernel("auto", "gpu", contract("local-dry-run.yaml"))
    assert name == "pallas_gpu", why  # the only one of the three that runs float32
    name, why = kernel_choice.rollout_kernel("auto", "gpu", contract("bf16-long.yaml"))
    assert name == "pallas_mosaic_gpu", why  # cuDNN needs head_dim multiples of 8


@pytest.mark.parametrize(("implementation", "backend", "profile", "kernel"), [
    ("auto", "cpu", "local-interpreted", "pallas_tpu"),   # make run on a CPU host
    ("pallas_tpu", "cpu", "local-interpreted", "pallas_tpu"),
    ("native", "cpu", "local-dry-run", "xla"),
    ("xla", "cpu", "local-dry-run", "xla"),
    ("pallas_tpu", "tpu", "local-dry-run", "pallas_tpu"),
])
def test_a_rollout_without_thresholds_registers_the_profile_of_how_its_kernel_runs(
        implementation, backend, profile, kernel):
    """No --thresholds: an interpreted candidate gets local-interpreted (smaller sizes,
    declared), a native one local-dry-run; the sentence names the file and says why."""
    from flows import kernel_choice
    from gates.thresholds import load_thresholds

    path, why = kernel_choice.default_thresholds(implementation, backend)
    assert load_thresholds(path).profile == profile
    assert kernel in why and profile in why
    assert f"(thresholds/{path.name}" in why  # the file the rollout registers, by name
    assert ("interpreted" in why) == (profile == "local-interpreted")
