"""Adding a tuned GPU kernel is its class and its tests: selection, the autotuner and the
build read what the class declares.

The kernel is defined here, with a config type of its own (a key block and an unroll
factor, which checks itself), its defaults, its autotuning candidates and its rank in
``auto``'s GPU order. It is registered for the test only (``kernels.registered``), and
its GPU table entry lives in a table object handed to selection (``table=``): no module
attribute is patched, no file of ``kernels/`` is touched. It computes real attention
(XLA underneath; its config changes no number), so its outputs can be checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from pydantic import field_validator

import kernels
from kernels import registry, selection
from kernels.build import KernelBuild
from kernels.build import build as build_kernel
from kernels.config import KernelConfig, StoredConfig
from kernels.kernel import Capability, Kernel
from kernels.shapes import AttentionShape
from kernels.tools import autotune
from kernels.xla import xla_attention

NAME = "test_tuned"
H200 = "NVIDIA H200"


class KeyBlockConfig(KernelConfig):
    """The stand-in's config: keys per step (a multiple of 16 in [16, 512]) and an unroll
    factor (1..4)."""

    block_kv: int | None = None
    unroll: int | None = None

    @field_validator("block_kv")
    @classmethod
    def _keys(cls, value):
        if value is not None and (value % 16 or not 16 <= value <= 512):
            raise ValueError(f"{NAME}: block_kv must be a multiple of 16 in [16, 512], "
                             f"got {value}")
        return value

    @field_validator("unroll")
    @classmethod
    def _unroll(cls, value):
        if value is not None and not 1 <= value <= 4:
            raise ValueError(f"{NAME}: unroll must lie in [1, 4], got {value}")
        return value


def key_block_attention(q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
    """XLA's attention; ``config`` must be resolved (both fields set)."""
    assert isinstance(config, KeyBlockConfig) and config.is_complete(), config
    return xla_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                         kv_lengths=kv_lengths)


class TunedKernel(Kernel[KeyBlockConfig]):
    """A tuned GPU kernel (interpreted, i.e. XLA, on a CPU for the tests)."""

    name = NAME
    description = "a tuned GPU kernel defined in a test (XLA underneath)"
    native_platforms = ("gpu",)
    capability = Capability(dtypes=("float32", "bfloat16", "float16"), max_head_dim=256)
    forward = staticmethod(jax.named_call(key_block_attention, name="kernelgate_test_tuned"))
    auto_priority = {"gpu": 5}  # after pallas_gpu, before cuDNN
    float32_matmul_precision = "highest"
    trace_name = "kernelgate_test_tuned"
    tuned = True

    def check_supported(self, spec, backend, config=None):
        if backend not in ("gpu", "cpu"):
            raise NotImplementedError(f"{NAME} runs on a GPU (and on a CPU for tests)")
        super().check_supported(spec, backend, config)

    def default_config(self, head_dim):
        return KeyBlockConfig(block_kv=128 if head_dim <= 128 else 64, unroll=1)

    def candidate_configs(self, shape, quick=False):
        grid = ((64, 1), (256, 2)) if quick else ((64, 1), (128, 2), (256, 2), (256, 4))
        out = [self.default_config(shape.head_dim)]
        out += [c for c in (KeyBlockConfig(block_kv=b, unroll=u) for b, u in grid)
                if c not in out]
        return out


SHAPE = AttentionShape(batch=2, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2,
                       head_dim=32, dtype="bfloat16", causal=False)
TUNED = {"block_kv": 256, "unroll": 2}


def _spec(shape=SHAPE):
    return kernels.validate(*shape.structs(), causal=shape.causal)[0]


def _table(entries) -> selection.SelectionTable:
    return selection.SelectionTable(jax_version=jax.__version__, device_kind=H200,
                                    created_at="2026-12-04T00:00:00+00:00", command="test",
                                    tuning_data="synthetic", entries=list(entries))


def _entry(best=NAME, dtype="bfloat16") -> selection.TableEntry:
    return selection.TableEntry(
        dtype=dtype, batch=2, seq=64, num_heads=2, head_dim=32, causal=False, device_kind=H200,
        best=best, tflops={"cudnn": 500.0, "pallas_gpu": 400.0, NAME: 650.0},
        configs={NAME: TUNED,
                 "pallas_gpu": {"block_q": 64, "block_kv": 64, "num_warps": 4, "num_stages": 2}},
        candidates={NAME: [selection.CandidateResult(config=TUNED, tflops=650.0),
                           selection.CandidateResult(config={"block_kv": 128, "unroll": 1},
                                                     tflops=600.0)]})


@pytest.fixture
def tuned():
    with kernels.registered(TunedKernel) as kernel:
        yield kernel
    assert NAME not in kernels.IMPLEMENTATIONS  # nothing of it is left behind
    assert NAME not in registry.tuned() and NAME not in kernels.auto_order("gpu")


def test_its_class_declares_it_and_its_config_checks_itself(tuned):
    assert tuned.config_type is KeyBlockConfig and tuned.config_fields == ("block_kv", "unroll")
    assert NAME in registry.tuned()
    assert kernels.auto_order("gpu") == ("pallas_gpu", NAME, "cudnn", "pallas_mosaic_gpu",
                                         "xla", "naive")
    assert NAME not in kernels.auto_order("cpu")  # it declares no place there
    with pytest.raises(ValueError, match="multiple of 16"):
        KeyBlockConfig(block_kv=40)
    with pytest.raises(ValueError, match=r"test_tuned: unroll must lie in \[1, 4\]"):
        tuned.config_from({"unroll": 9})
    with pytest.raises(ValueError, match=r"takes block sizes \['block_kv', 'unroll'\]"):
        tuned.config_from({"block_q": 64})
    assert tuned.resolve_config(_spec(), {"unroll": 3}) == KeyBlockConfig(block_kv=128, unroll=3)


def test_selection_reads_its_table_entry(tuned):
    table = _table([_entry()])
    name, config, why = selection.select_gpu_implementation(SHAPE, table=table, device_kind=H200)
    assert (name, config) == (NAME, KeyBlockConfig(**TUNED)) and NAME in why
    assert selection.measured_configs(SHAPE, table=table)[NAME] == KeyBlockConfig(**TUNED)
    # auto on a GPU runs it with its measured config; named, it takes the same one
    picked = kernels.resolve("auto", _spec(), "gpu", table=table)
    assert (picked.name, picked.config) == (NAME, KeyBlockConfig(**TUNED))
    named = kernels.resolve(NAME, _spec(), "gpu", table=table)
    assert named.config == KeyBlockConfig(**TUNED) and "measured" in named.reason
    asked = kernels.resolve(NAME, _spec(), "gpu", config={"unroll": 4}, table=table)
    assert asked.config == KeyBlockConfig(block_kv=128, unroll=4)  # asked for: no table
    # the table as a file reads back the same (schema 3: {implementation: config})
    again = selection.SelectionTable.model_validate_json(table.model_dump_json())
    assert again.entries[0].config_of(NAME) == KeyBlockConfig(**TUNED)
    assert selection.select_gpu_implementation(SHAPE, table=again, device_kind=H200)[0] == NAME


def test_without_it_registered_its_entry_falls_back_by_name():
    name, config, why = selection.select_gpu_implementation(
        SHAPE, table=_table([_entry()]), device_kind=H200)
    assert name == "pallas_gpu" and config.block_q == 64
    assert f"{NAME} does not run" in why
    stored = _entry().config_of(NAME)  # an older record of a kernel not registered here
    assert isinstance(stored, StoredConfig) and stored.fields_set() == TUNED


def test_the_autotuner_tries_its_candidates_and_writes_its_config(tuned):
    assert autotune.search_space(NAME, SHAPE, quick=True) == tuned.candidate_configs(SHAPE, True)
    assert len(autotune.search_space(NAME, SHAPE, quick=False, max_tilings=3)) == 3
    entry = autotune.tune_shape(SHAPE, quick=True, seed=0, repeats=1, target_repeat_s=0.0,
                                kernels=(NAME,))
    assert entry.best == NAME  # no cuDNN on this host: the XLA output is the reference
    assert [c.config for c in entry.candidates[NAME]] == [
        c.fields_set() for c in tuned.candidate_configs(SHAPE, True)]
    assert all(c.tflops and c.rel_diff_to_baseline < 1e-2 for c in entry.candidates[NAME])
    assert isinstance(entry.config_of(NAME), KeyBlockConfig)
    table = _table([entry.model_copy(update={"device_kind": H200})])
    name, config, _ = selection.select_gpu_implementation(SHAPE, table=table, device_kind=H200)
    assert name == NAME and config == entry.config_of(NAME)


def test_the_build_records_its_config_as_its_own_type(tuned, tmp_path):
    shape = SHAPE.model_copy(update={"dtype": "float32"})
    built = build_kernel(NAME, {"unroll": 2}, shape, platforms=(), output_dir=tmp_path)
    assert built.requested_config == KeyBlockConfig(unroll=2)
    assert built.config == KeyBlockConfig(block_kv=128, unroll=2)
    record = (tmp_path / "kernel_build.json").read_text()
    again = KernelBuild.model_validate_json(record)
    assert type(again.config) is KeyBlockConfig and again.config == built.config
    q = jnp.ones((1, 16, 2, 32), jnp.float32)
    out = kernels.attention(q, q, q, implementation=NAME, config={"block_kv": 64})
    assert out.shape == q.shape
    # a record of a kernel this process no longer registers still reads, field by field
    kernels.unregister(NAME)
    try:
        old = KernelBuild.model_validate_json(record)
        assert isinstance(old.config, StoredConfig)
        assert old.config.fields_set() == {"block_kv": 128, "unroll": 2}
    finally:
        kernels.register(tuned)
