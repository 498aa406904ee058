"""Shared memory of pallas_gpu tilings (kernels.gpu_limits), the fitted defaults, the
selection table's fit check and the autotuner's candidates.

The measured figures below are Triton's own ("Shared memory size limit exceeded:
requested N, available: 232448") from the H200 runs and the ncu profile recorded in
kernels/tools/NOTES-gpu.md; they are facts about the device, not outputs of the model. A GPU
sweep of dtype x head_dim x causal runs under ``-m gpu``.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import gpu_limits, pallas_gpu, selection
from kernels.contract import validate
from kernels.pallas_gpu import TritonConfig
from kernels.shapes import AttentionShape
from tests.kernels_helpers import Case, assert_accurate, random_inputs, reference_for

H200_OPT_IN = 232448  # "available: 232448" in the H200's error message
ON_GPU = jax.default_backend() in ("gpu", "cuda")

# (block_q, block_kv, num_warps, num_stages, dtype, head_dim, causal, bytes Triton requested)
MEASURED_OVERFLOWS = [
    (128, 128, 8, 3, "float32", 128, False, 393216),
    (128, 128, 8, 3, "float32", 128, True, 458752),
    (64, 64, 4, 3, "float32", 256, False, 344320),
    (64, 64, 4, 3, "float32", 256, True, 409856),
]
# bf16 d128 128x128 w8 s3 ran at S=16384 (ncu: 229.4 KB dynamic shared memory per block)
MEASURED_RUNS = [(128, 128, 8, 3, "bfloat16", 128, 229376)]


PG = pallas_gpu.PallasGpuKernel()


def _cfg(bq, bkv, warps, stages) -> TritonConfig:
    return TritonConfig(block_q=bq, block_kv=bkv, num_warps=warps, num_stages=stages)


def _spec(dtype, head_dim, q_len=384, kv_len=384, causal=False):
    q = jax.ShapeDtypeStruct((1, q_len, 2, head_dim), jnp.dtype(dtype))
    kv = jax.ShapeDtypeStruct((1, kv_len, 2, head_dim), jnp.dtype(dtype))
    return validate(q, kv, kv, causal=causal)[0]


@pytest.mark.parametrize("bq, bkv, warps, stages, dtype, head_dim, causal, requested",
                         MEASURED_OVERFLOWS)
def test_model_covers_every_measured_overflow(bq, bkv, warps, stages, dtype, head_dim,
                                              causal, requested):
    need = gpu_limits.shared_memory_bytes(_cfg(bq, bkv, warps, stages), dtype=dtype,
                                          head_dim=head_dim)
    assert need >= requested > H200_OPT_IN
    assert need <= 1.25 * requested  # an estimate, not a blanket refusal


@pytest.mark.parametrize("bq, bkv, warps, stages, dtype, head_dim, used", MEASURED_RUNS)
def test_model_admits_the_measured_fastest_bf16_tiling(bq, bkv, warps, stages, dtype,
                                                       head_dim, used):
    need = gpu_limits.shared_memory_bytes(_cfg(bq, bkv, warps, stages), dtype=dtype,
                                          head_dim=head_dim)
    assert used <= need <= H200_OPT_IN


def test_every_tiling_that_ran_on_the_h200_fits_the_model():
    table = selection.load_table()
    ran = [(e, c) for e in table.entries for c in e.candidates["pallas_gpu"] if c.tflops]
    assert len(ran) > 50
    for entry, cand in ran:
        cfg = TritonConfig(**cand.config)
        need = gpu_limits.shared_memory_bytes(
            gpu_limits.effective_config(cfg, entry.seq, entry.seq), dtype=entry.dtype,
            head_dim=entry.head_dim)
        assert need <= H200_OPT_IN, (entry.dtype, entry.head_dim, cand.config, need)


def test_model_grows_with_every_dimension_of_the_tiling():
    base = _cfg(64, 64, 4, 2)
    for dtype in ("float32", "bfloat16"):
        ref = gpu_limits.shared_memory_bytes(base, dtype=dtype, head_dim=64)
        for update in ({"block_q": 128}, {"block_kv": 128}, {"num_stages": 3}):
            bigger = base.model_copy(update=update)
            assert gpu_limits.shared_memory_bytes(bigger, dtype=dtype, head_dim=64) > ref
        assert gpu_limits.shared_memory_bytes(base, dtype=dtype, head_dim=128) > ref
    # float32 tiles are twice as wide as bf16 ones (one stage fewer: no async wgmma)
    assert (gpu_limits.shared_memory_bytes(base, dtype="float32", head_dim=64)
            > gpu_limits.shared_memory_bytes(base, dtype="bfloat16", head_dim=64))


@pytest.mark.parametrize("cc, expected", [("9.0", 232448), ("8.0", 166912), ("8.6", 101376),
                                          ("7.5", 65536), ((10, 0), 232448),
                                          ("11.7", 49152), (None, 49152)])
def test_budget_by_compute_capability(cc, expected):
    device = SimpleNamespace(device_kind="Some GPU", compute_capability=cc)
    budget = gpu_limits.shared_memory_budget(device)
    assert budget.bytes == expected
    assert "Some GPU" in budget.describe() and str(expected) in budget.describe()


def test_host_without_gpu_plans_for_the_target_h200():
    if ON_GPU:
        pytest.skip("a GPU host uses its own device")
    budget = gpu_limits.shared_memory_budget()
    assert budget.bytes == H200_OPT_IN and budget.device_kind == "NVIDIA H200"


DTYPES = ("float32", "bfloat16", "float16")
HEAD_DIMS = (32, 40, 64, 80, 96, 128, 160, 256)


@pytest.mark.parametrize("dtype, head_dim", list(itertools.product(DTYPES, HEAD_DIMS)))
def test_default_tiling_fits_for_every_dtype_and_head_dim(dtype, head_dim):
    for seq in (1, 127, 384, 4096):
        for causal in (False, True):
            spec = _spec(dtype, head_dim, seq, seq, causal)
            PG.check_supported(spec, "gpu", None)  # no refusal
            cfg = PG.resolve_config(spec, None)
            TritonConfig(**cfg.model_dump())  # a legal Triton tiling
            need = gpu_limits.shared_memory_bytes(
                gpu_limits.effective_config(cfg, seq, seq), dtype=dtype, head_dim=head_dim)
            assert need <= H200_OPT_IN, (cfg, need)
            assert cfg.num_warps * 16 <= cfg.block_q  # at least 16 query rows per warp


def test_float32_d128_default_is_shrunk_stages_first_then_tiles():
    spec = _spec("float32", 128)
    cfg = PG.resolve_config(spec, None)
    assert cfg != PG.default_config(128)  # 128x128 s3: the overflow
    assert cfg.num_stages >= 2  # tiles shrank before pipelining was given up
    assert cfg.block_q * cfg.block_kv < 128 * 128
    # bf16 keeps the measured 128x128 w8 s3 winner
    assert PG.resolve_config(_spec("bfloat16", 128), None) == PG.default_config(128)


def test_explicit_tiling_that_cannot_fit_is_refused_naming_the_limit():
    spec = _spec("float32", 128)
    with pytest.raises(ValueError, match=r"shared memory.*232448"):
        PG.check_supported(spec, "gpu", _cfg(128, 128, 8, 3))
    with pytest.raises(ValueError, match="232448"):
        kernels.resolve("pallas_gpu", spec, backend="gpu", config=_cfg(128, 128, 8, 3))
    # the same tiling over a 16-token sequence is a 16x16 tiling: it fits
    PG.check_supported(_spec("float32", 128, 16, 16), "gpu", _cfg(128, 128, 8, 3))
    # interpret mode (CPU) has no shared-memory limit
    PG.check_supported(spec, "cpu", _cfg(128, 128, 8, 3))


def test_fields_a_caller_fixes_are_kept_and_the_rest_fitted():
    spec = _spec("float32", 128)
    cfg = PG.resolve_config(spec, TritonConfig(block_q=128))
    assert cfg.block_q == 128
    need = gpu_limits.shared_memory_bytes(cfg, dtype="float32", head_dim=128)
    assert need <= H200_OPT_IN
    with pytest.raises(ValueError, match="shared memory"):
        PG.check_supported(spec, "gpu", TritonConfig(block_q=256, block_kv=256,
                                                     num_stages=4))


def test_nothing_fits_a_small_budget_so_auto_moves_on(monkeypatch):
    tiny = gpu_limits.budget_for("Tiny GPU", None)
    monkeypatch.setattr(pallas_gpu, "shared_memory_budget", lambda device=None: tiny)
    spec = _spec("float32", 256)
    with pytest.raises(NotImplementedError, match="no tiling fits"):
        PG.check_supported(spec, "gpu", None)
    res = kernels.resolve("auto", spec, backend="gpu")
    assert res.name != "pallas_gpu" and "no tiling fits" in res.skipped["pallas_gpu"]


@pytest.fixture
def bf16_d128_table(tmp_path, monkeypatch):
    """The table of the issue's case: one bf16 head_dim-128 causal entry, pallas_gpu best
    with a 64x64 s3 tiling (which does not fit float32 at head_dim 256). Synthetic, so the
    check does not depend on what the committed table's autotune happened to measure."""
    entry = selection.TableEntry(
        dtype="bfloat16", batch=1, seq=1024, num_heads=16, head_dim=128, causal=True,
        best="pallas_gpu", tflops={"pallas_gpu": 400.0, "cudnn": 380.0},
        configs={"pallas_gpu": {"block_q": 64, "block_kv": 64, "num_warps": 4,
                                "num_stages": 3}})
    table = selection.SelectionTable(
        jax_version="0.11.2", device_kind="NVIDIA H200", created_at="2026-12-01T00:00:00+00:00",
        command="test", tuning_data="synthetic", entries=[entry])
    path = tmp_path / "gpu_table.json"
    path.write_text(table.model_dump_json())
    monkeypatch.setattr(selection, "DEFAULT_TABLE_PATH", path)
    return path


def test_table_tiling_for_another_dtype_is_never_applied_unfitted(bf16_d128_table):
    # The case: float32 d256 took the bf16 d128 entry's 64x64 s3 tiling.
    shape = AttentionShape(batch=1, q_len=384, kv_len=384, num_heads=2, num_kv_heads=2,
                           head_dim=256, dtype="float32", causal=True)
    name, cfg, reason = selection.select_gpu_implementation(shape)
    assert name == "pallas_gpu"
    assert gpu_limits.shared_memory_bytes(cfg, dtype="float32", head_dim=256) <= H200_OPT_IN
    assert "shared memory" in reason and "float32" in reason
    assert selection.measured_config(shape, "pallas_gpu") == cfg
    spec = _spec("float32", 256, causal=True)
    res = kernels.resolve("auto", spec, backend="gpu")
    assert res.name == "pallas_gpu" and res.config == cfg
    # pallas_gpu named without a tiling takes the same fitted table tiling
    res = kernels.resolve("pallas_gpu", spec, backend="gpu")
    assert res.config == cfg and "measured" in res.reason
    # a bf16 call of the entry's own kind gets the table's tiling untouched
    bf16 = shape.model_copy(update={"dtype": "bfloat16", "head_dim": 128, "q_len": 1024,
                                    "kv_len": 1024})
    assert selection.measured_config(bf16, "pallas_gpu") == selection.nearest_entry(
        bf16, selection.load_table()).config_of("pallas_gpu")


@pytest.mark.parametrize("dtype, head_dim", list(itertools.product(DTYPES, (32, 64, 128, 256))))
def test_autotune_never_tries_a_tiling_that_cannot_fit(dtype, head_dim):
    shape = AttentionShape(batch=1, q_len=4096, kv_len=4096, num_heads=2, num_kv_heads=2,
                           head_dim=head_dim, dtype=dtype)
    configs = PG.candidate_configs(shape)
    assert configs
    for cfg in configs:
        assert gpu_limits.shared_memory_bytes(cfg, dtype=dtype, head_dim=head_dim) <= H200_OPT_IN
    if dtype == "float32" and head_dim == 128:
        assert _cfg(128, 128, 8, 3) not in configs


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("implementation", ["pallas_gpu", "pallas_gpu:kernel-default", "auto"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_every_dtype_and_head_dim_runs_and_matches_float64(dtype, head_dim, causal,
                                                               implementation):
    """The issue's sweep (1 x 384 x 2 heads), through the guarded jitted entry point:
    no compile may run out of shared memory (the model must have prevented it) and the
    output must match the float64 reference."""
    case = Case(f"{dtype}-d{head_dim}", q_len=384, kv_len=384, num_heads=2, num_kv_heads=2,
                head_dim=head_dim, dtype=dtype, causal=causal)
    q, k, v, _, _ = random_inputs(case, seed=head_dim + 7 * causal)
    ref = reference_for(q, k, v, case)
    if implementation == "pallas_gpu:kernel-default":  # the fitted default, not the table's
        fn = kernels.get_attention_fn("pallas_gpu", PG.fitted_config(
            dtype, head_dim, 384, 384))
    else:  # pallas_gpu without a tiling takes the (fitted) table's; auto picks
        fn = kernels.get_attention_fn(implementation)
    out = np.asarray(fn(q, k, v, causal=causal).astype(jnp.float32))
    label = AttentionShape(batch=1, q_len=384, kv_len=384, num_heads=2, num_kv_heads=2,
                           head_dim=head_dim, dtype=dtype, causal=causal).label
    assert label not in fn.fallbacks, fn.fallbacks[label]  # no compile ran out of a resource
    if implementation != "auto" or dtype == "float32":
        assert fn.resolutions[label].name == "pallas_gpu"
    naive = None
    if dtype != "float32":
        naive_out = kernels.attention(q, k, v, causal=causal, implementation="naive")
        naive = kernels.relative_error(naive_out, ref)
    assert_accurate(out, ref, dtype, naive)
