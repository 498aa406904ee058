"""kernels.build: local compile facts, fingerprints, per-platform jax.export artifacts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax.numpy as jnp
import pytest
from jax import export as jax_export

import kernels
from kernels.build import KernelBuild, source_digests
from kernels.build import build as build_kernel
from kernels.pallas_gpu import TritonConfig
from kernels.pallas_tpu import TpuConfig
from kernels.shapes import AttentionShape
from tests.kernels_helpers import Case, random_inputs, reference_for

SHAPES = AttentionShape(batch=1, q_len=136, kv_len=200, num_heads=4, num_kv_heads=2, head_dim=64,
                        dtype="bfloat16", causal=True)
F32 = SHAPES.model_copy(update={"dtype": "float32", "causal": False})
KERNELS_DIR = Path(kernels.__file__).parent


@pytest.fixture(scope="module")
def tpu_builds(tmp_path_factory):
    """Two independent builds of pallas_tpu (the second with an output folder)."""
    out = tmp_path_factory.mktemp("build")
    config = TpuConfig(block_q=64, block_kv=128)
    first = build_kernel("pallas_tpu", config, SHAPES)
    second = build_kernel("pallas_tpu", config, SHAPES.model_dump(), output_dir=out)
    return first, second, out


def test_pallas_tpu_exports_for_tpu_from_a_cpu_host(tpu_builds):
    first, _, _ = tpu_builds
    tpu = first.artifact("tpu")
    assert tpu.status == "exported" and first.ok
    for platform in ("cpu", "cuda"):
        skipped = first.artifact(platform)
        assert skipped.status == "skipped" and "not native" in skipped.reason


def test_exported_artifact_is_deterministic_and_deserialises(tpu_builds):
    first, second, out = tpu_builds
    assert first.artifact("tpu").sha256 == second.artifact("tpu").sha256
    data = Path(second.artifact("tpu").path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == second.artifact("tpu").sha256
    assert len(data) == second.artifact("tpu").size_bytes
    exported = jax_export.deserialize(bytearray(data))
    assert exported.platforms == ("tpu",)
    assert [a.shape for a in exported.in_avals] == [(1, 136, 4, 64), (1, 200, 2, 64),
                                                   (1, 200, 2, 64)]
    assert exported.out_avals[0].shape == (1, 136, 4, 64)
    assert exported.out_avals[0].dtype == jnp.bfloat16
    assert "tpu_custom_call" in exported.mlir_module()
    # The build record written beside the artifact reads back as the same model.
    assert KernelBuild.model_validate_json((out / "kernel_build.json").read_text()) == second


def test_fingerprints(tpu_builds):
    first, second, _ = tpu_builds
    # every file of the kernels package bar its tools, the dispatch in api.py and the
    # table included
    on_disk = {p.relative_to(KERNELS_DIR).as_posix() for pattern in ("*.py", "*.json")
               for p in KERNELS_DIR.rglob(pattern)
               if "__pycache__" not in p.parts and "tools" not in p.relative_to(KERNELS_DIR).parts}
    assert set(first.source_files) == on_disk
    assert {"api.py", "pallas_tpu.py", "contract.py", "gpu_table.json"} <= on_disk
    assert first.source_files["api.py"] == hashlib.sha256(
        (KERNELS_DIR / "api.py").read_bytes()).hexdigest()
    assert first.source_sha256 == second.source_sha256
    assert first.local.lowered_sha256 == second.local.lowered_sha256
    other = build_kernel("pallas_tpu", TpuConfig(block_q=32, block_kv=128), SHAPES,
                          platforms=("tpu",))
    assert other.local.lowered_sha256 != first.local.lowered_sha256
    assert other.artifact("tpu").sha256 != first.artifact("tpu").sha256


def test_local_compile_facts(tpu_builds):
    first, _, _ = tpu_builds
    assert first.resolution.name == "pallas_tpu" and not first.resolution.native
    assert first.local.backend == "cpu" and not first.local.native
    assert first.local.compile_time_s > 0 and first.local.lower_time_s > 0
    assert first.local.memory.argument_bytes == 2 * (136 * 4 * 64 + 2 * 200 * 2 * 64)
    # The interpreter's program also returns an effect token (a few bytes).
    assert 0 <= first.local.memory.output_bytes - 2 * 136 * 4 * 64 < 1024


def test_naive_build_cost_counts_the_matmuls():
    build = build_kernel("naive", None, F32, platforms=("cpu",))
    assert build.local.cost.flops >= 4 * 1 * 4 * 136 * 200 * 64  # two matmuls, 2 FLOPs/MAC
    # The materialised logits and probabilities: at least one f32 [B, H, Sq, Skv].
    assert build.local.memory.temp_bytes >= 4 * 4 * 136 * 200


def test_exported_cpu_artifact_runs_and_is_exact(tmp_path):
    """An exported artifact is the kernel: deserialised and called, it matches
    the float64 reference (lengths included)."""
    build = build_kernel("xla", None, F32, platforms=("cpu", "tpu"),
                          with_lengths=True, output_dir=tmp_path)
    assert [a.status for a in build.artifacts] == ["exported", "exported"]
    exported = jax_export.deserialize(bytearray(Path(build.artifact("cpu").path).read_bytes()))
    case = Case("exported", batch=1, q_len=136, kv_len=200, num_heads=4, num_kv_heads=2,
                q_lengths=(100,), kv_lengths=(150,))
    q, k, v, ql, kl = random_inputs(case, seed=12)
    out = exported.call(q, k, v, ql, kl)
    assert kernels.relative_error(out, reference_for(q, k, v, case, ql, kl)) < 2e-6


def test_unsupported_targets_are_skipped_with_reason():
    build = build_kernel("cudnn", None, SHAPES, platforms=("cpu", "cuda", "tpu", "metal"))
    assert build.local is None and "NVIDIA GPU" in build.local_skipped_reason
    reasons = {a.platform: (a.status, a.reason) for a in build.artifacts}
    assert all(status == "skipped" for status, _ in reasons.values())
    assert "needs a local cuda device" in reasons["cuda"][1]
    assert "not native on tpu" in reasons["tpu"][1]
    assert "unknown jax.export platform" in reasons["metal"][1]


def test_auto_records_its_resolution():
    build = build_kernel("auto", None, F32, platforms=())
    assert build.implementation == "xla"
    assert build.resolution.requested == "auto" and build.resolution.reason


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"implementation": "flash9000"}, "unknown implementation"),
    ({"config": {"block_q": 10, "block_kv": 128}}, "block_q must be a multiple of 8"),
    ({"config": {"block_q": 64, "num_warps": 4}}, r"takes block sizes .*not \['num_warps'\]"),
    ({"implementation": "xla", "config": {"block_q": 64}}, "xla has no block sizes"),
    ({"implementation": "xla", "config": TpuConfig(block_q=64)}, "xla has no block sizes"),
    ({"implementation": "pallas_gpu", "config": {"block_q": 48}}, "power of two"),
    ({"shape": {**SHAPES.model_dump(), "dtype": "int8"}}, "dtype"),
    ({"shape": {**SHAPES.model_dump(), "num_kv_heads": 3}}, "multiple of num_kv_heads"),
])
def test_invalid_build_requests(kwargs, match):
    args = {"implementation": "pallas_tpu", "config": None, "shape": SHAPES,
            "platforms": ("tpu",), **kwargs}
    with pytest.raises(ValueError, match=match):
        build_kernel(**args)


def test_pallas_gpu_exports_for_cuda_from_a_cpu_host_and_records_the_waiver():
    """The Triton custom call is version-bound: the export waives that check and says so."""
    import jax

    shape = AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=2, num_kv_heads=2,
                           head_dim=64, dtype="bfloat16")
    build = build_kernel("pallas_gpu", None, shape, platforms=("cuda",))
    (artifact,) = build.artifacts
    assert artifact.status == "exported", artifact.reason
    assert "triton" in artifact.reason and jax.__version__ in artifact.reason
    assert len(artifact.sha256) == 64 and artifact.size_bytes > 0


def test_resolved_config_is_recorded_never_null():
    built = build_kernel("pallas_gpu", {"block_q": 32}, SHAPES, platforms=())
    assert built.requested_config == TritonConfig(block_q=32)  # read as the kernel's own
    assert built.config.block_q == 32 and built.config.is_complete()
    untiled = build_kernel("xla", None, F32, platforms=())
    assert untiled.config is None


def test_a_build_record_reads_back_as_the_kernels_own_config_type():
    built = build_kernel("pallas_gpu", TritonConfig(block_q=32), SHAPES, platforms=())
    again = KernelBuild.model_validate_json(built.model_dump_json())
    assert again.config == built.config and type(again.config) is TritonConfig
    assert again.requested_config == TritonConfig(block_q=32)
    assert again.resolution.config == built.config
    assert '"num_warps"' in built.model_dump_json()  # dumped with its own type's fields


def test_source_digest_changes_with_any_file_of_the_package(tmp_path):
    import shutil

    copy = tmp_path / "kernels"
    shutil.copytree(KERNELS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_digests(copy)
    (copy / "api.py").write_text((copy / "api.py").read_text() + "\n# edited\n")
    after = source_digests(copy)
    assert [f for f in before if before[f] != after[f]] == ["api.py"]
