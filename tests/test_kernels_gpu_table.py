"""Stored records stay readable after each kernel got its own config type.

* The committed GPU table was converted from schema 2 (the commit before, kept gzipped in
  ``tests/data/gpu_table-schema2-1be416f.json.gz``) to schema 3 by ``python -m
  kernels.tools.autotune --convert``: nothing re-measured, the same figures, the same
  picks; the schema-2 original still reads and picks the same.
* Build records made by the commit before (``tests/data/kernel_build-1be416f-*.json``, the
  shared block-size shape: Mosaic's ring depth named ``num_stages``, its 12 warps stored)
  read back as each kernel's own config type, and so do the version's ``kernel.json``
  config and its ``kernelgate.config`` tag value.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pytest

import kernels
from kernels import selection
from kernels.build import KernelBuild
from kernels.pallas_gpu import TritonConfig
from kernels.pallas_mosaic_gpu import MosaicConfig
from kernels.pallas_tpu import TpuConfig
from kernels.shapes import AttentionShape
from kernels.tools import autotune

DATA = Path(__file__).parent / "data"
SCHEMA_2 = DATA / "gpu_table-schema2-1be416f.json.gz"


@pytest.fixture(scope="module")
def schema_2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("table") / "gpu_table.json"
    path.write_bytes(gzip.decompress(SCHEMA_2.read_bytes()))
    return path


def test_the_committed_table_is_the_schema_2_one_converted(schema_2, tmp_path):
    old, new = selection.load_table(schema_2), selection.load_table()
    assert (old.schema_version, new.schema_version) == (2, selection.TABLE_SCHEMA_VERSION)
    raw_old = json.loads(schema_2.read_text())
    for field in ("jax_version", "device_kind", "created_at", "tuning_data"):
        assert getattr(new, field) == raw_old[field]
    assert new.command == raw_old["command"] + " ; " + autotune.CONVERT_COMMAND
    assert len(new.notes) == 1 and "nothing was re-measured" in new.notes[0]
    assert len(new.entries) == len(raw_old["entries"])
    for o, n in zip(raw_old["entries"], new.entries, strict=True):
        assert (o["dtype"], o["batch"], o["seq"], o["num_heads"], o["head_dim"], o["causal"],
                o["device_kind"], o["best"], o["tflops"]) == (
            n.dtype, n.batch, n.seq, n.num_heads, n.head_dim, n.causal, n.device_kind, n.best,
            n.tflops)  # the measured figures, exactly
        assert n.configs["pallas_gpu"] == o["pallas_config"]
        assert [(c["tflops"], c["rel_diff_to_baseline"], c["error"]) for c in o["candidates"]] \
            == [(c.tflops, c.rel_diff_to_baseline, c.error) for c in n.candidates["pallas_gpu"]]
        if o["mosaic_config"] is None:
            assert "pallas_mosaic_gpu" not in n.configs
        else:  # Mosaic's ring depth under its own name, its fixed 12 warps dropped
            m = o["mosaic_config"]
            assert n.configs["pallas_mosaic_gpu"] == {
                "block_q": m["block_q"], "block_kv": m["block_kv"], "kv_ring_depth": m["num_stages"]}
    # the conversion is deterministic, and a converted table is left alone
    out = tmp_path / "again.json"
    out.write_bytes(schema_2.read_bytes())
    assert autotune.main(["--convert", "--out", str(out)]) == 0
    assert out.read_bytes() == selection.DEFAULT_TABLE_PATH.read_bytes()
    assert autotune.main(["--convert", "--out", str(out)]) == 0
    assert out.read_bytes() == selection.DEFAULT_TABLE_PATH.read_bytes()


SHAPES = [AttentionShape(batch=b, q_len=s, kv_len=s, num_heads=h, num_kv_heads=h, head_dim=d,
                         dtype=dtype, causal=causal)
          for (b, s), h, d, dtype, causal in itertools.product(
              ((16, 1024), (4, 4096), (1, 16384), (8, 128), (16, 512)), (12, 16),
              (32, 64, 128, 256), ("bfloat16", "float16", "float32"), (False, True))]


def test_the_schema_2_and_schema_3_tables_pick_the_same(schema_2):
    """Every pick and config ``auto`` would take on an H200, over a grid of shapes, from
    the table before and after the conversion (the configs compared as the kernels' own
    types: the schema-2 ones are read through the older shape)."""
    old, new = selection.load_table(schema_2), selection.load_table()
    for shape in SHAPES:
        before = selection.select_gpu_implementation(shape, table=old, device_kind="NVIDIA H200")
        after = selection.select_gpu_implementation(shape, table=new, device_kind="NVIDIA H200")
        assert before == after, shape.label
        assert (selection.measured_configs(shape, table=old)
                == selection.measured_configs(shape, table=new)), shape.label


def test_older_build_records_read_as_each_kernels_own_type():
    mosaic = KernelBuild.model_validate_json(
        (DATA / "kernel_build-1be416f-pallas_mosaic_gpu.json").read_text())
    assert mosaic.requested_config == MosaicConfig(kv_ring_depth=3)
    assert mosaic.config == MosaicConfig(block_q=64, block_kv=128, kv_ring_depth=3)
    tpu = KernelBuild.model_validate_json(
        (DATA / "kernel_build-1be416f-pallas_tpu.json").read_text())
    assert tpu.requested_config == TpuConfig(block_q=64)
    assert tpu.config == tpu.resolution.config == TpuConfig(block_q=64, block_kv=128)
    # and written again in the kernels' own fields
    assert json.loads(mosaic.model_dump_json())["config"] == {
        "block_q": 64, "block_kv": 128, "kv_ring_depth": 3}


@pytest.mark.parametrize(("implementation", "stored", "expected"), [
    # a version's kernel.json / signed build "config" and its kernelgate.config tag value
    ("pallas_gpu", {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2},
     TritonConfig(block_q=64, block_kv=64, num_warps=4, num_stages=2)),
    ("pallas_mosaic_gpu", {"block_q": 64, "block_kv": 192, "num_warps": 12, "num_stages": 2},
     MosaicConfig(block_q=64, block_kv=192, kv_ring_depth=2)),
    ("pallas_tpu", {"block_q": 32, "block_kv": 256, "num_warps": None, "num_stages": None},
     TpuConfig(block_q=32, block_kv=256)),
    ("pallas_tpu", {"block_q": 32}, TpuConfig(block_q=32)),
    ("xla", None, None),
    ("xla", {}, None),
])
def test_stored_configs_of_either_shape_read_as_the_kernels_type(implementation, stored,
                                                                 expected):
    assert kernels.stored_config(implementation, stored) == expected
    if expected is not None:  # the new shape reads the same
        assert kernels.stored_config(implementation, expected.fields_set()) == expected
        assert json.loads(json.dumps(expected.fields_set())) == expected.fields_set()


def test_an_older_mosaic_record_with_other_warps_is_refused():
    with pytest.raises(ValueError, match="num_warps is fixed at 12"):
        kernels.stored_config("pallas_mosaic_gpu", {"block_q": 64, "num_warps": 8})
