"""``auto`` and ``native``: what each means on each backend, and the CLI says it.

On a CPU or TPU host ``native`` is what ``kernels.attention(implementation="auto")``
runs; on a GPU ``auto`` runs what the measured selection table picks per shape (cuDNN
for bf16/f16 in today's table), which ``native`` (the head of the fallback order) is not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import selection


def test_the_orders_the_classes_declare_are_the_documented_ones():
    """``auto``'s fallback order and the rollout's flash kernel per backend, derived from
    the kernel classes' ``auto_priority`` and ``rollout_default_on`` declarations."""
    assert {b: kernels.auto_order(b) for b in ("cpu", "gpu", "tpu")} == {
        "tpu": ("pallas_tpu", "xla", "naive"),
        "gpu": ("pallas_gpu", "cudnn", "pallas_mosaic_gpu", "xla", "naive"),
        "cpu": ("xla", "naive")}
    assert {b: kernels.native_flash(b) for b in ("cpu", "gpu", "tpu")} == {
        "tpu": "pallas_tpu", "gpu": "pallas_gpu", "cpu": "pallas_tpu"}
    assert kernels.auto_order("metal") == kernels.auto_order("cpu")


def _spec(dtype="float32", shape=(2, 128, 4, 64)):
    q = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    return kernels.validate(q, q, q)[0]


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_native_is_what_attention_auto_runs_on_a_cpu_or_tpu(backend):
    for dtype in ("float32", "bfloat16"):
        assert (kernels.native_flash_kernel("native", backend)
                == kernels.resolve("auto", _spec(dtype), backend).name)
    assert "runs first" in kernels.why_picked("native", backend)
    assert kernels.native_flash_kernel("auto", backend) == kernels.native_flash(backend)


def _table(best: str) -> selection.SelectionTable:
    entry = selection.TableEntry(
        dtype="bfloat16", batch=2, seq=128, num_heads=4, head_dim=64, causal=False, best=best,
        tflops={"cudnn": 2.0 if best == "cudnn" else 1.0, "pallas_gpu": 1.5},
        pallas_config={"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2})
    return selection.SelectionTable(jax_version="test", device_kind="test", created_at="now",
                                    command="test", tuning_data="test", entries=[entry])


@pytest.mark.parametrize("best", ["cudnn", "pallas_gpu"])
def test_on_a_gpu_auto_runs_what_the_table_picks_not_native(best, tmp_path, monkeypatch):
    path = tmp_path / "gpu_table.json"
    path.write_text(_table(best).model_dump_json())
    monkeypatch.setattr(selection, "DEFAULT_TABLE_PATH", path)
    native = kernels.native_flash_kernel("native", "gpu")
    assert native == kernels.auto_order("gpu")[0]
    picked = kernels.resolve("auto", _spec("bfloat16"), "gpu").name
    assert picked == best  # the table decides, per shape
    if best != native:
        why = kernels.why_picked("native", "gpu")
        assert "selection table" in why and "runs first" not in why


def test_with_the_checked_in_table_auto_follows_the_table_on_a_gpu():
    spec = _spec("bfloat16", (16, 1024, 16, 128))
    picked = kernels.resolve("auto", spec, "gpu").name
    assert picked == selection.select_gpu_implementation(spec.shape)[0]


def test_auto_on_a_cpu_says_it_interprets_and_names_the_native_kernel():
    why = kernels.why_picked("auto", "cpu")
    assert kernels.native_flash("cpu") in why and "interpreted" in why
    assert f"native kernel ({kernels.auto_order('cpu')[0]})" in why
    assert "as asked" in kernels.why_picked("xla", "cpu")
    assert "interpreted" not in kernels.why_picked("auto", "gpu")
    with pytest.raises(ValueError, match="unknown implementation"):
        kernels.why_picked("fast", "cpu")
