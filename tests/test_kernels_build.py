"""kernels.build: local compile facts, fingerprints, per-platform jax.export artifacts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

import kernels
from kernels.build import ExampleShapes, KernelBuild
from kernels.config import BlockSizes
from tests.kernels_helpers import Case, random_inputs, reference_for

SHAPES = ExampleShapes(batch=1, q_len=136, kv_len=200, num_heads=4, num_kv_heads=2, head_dim=64)
KERNELS_DIR = Path(kernels.__file__).parent


@pytest.fixture(scope="module")
def tpu_builds(tmp_path_factory):
    """Two independent builds of pallas_tpu (the second with an output folder)."""
    out = tmp_path_factory.mktemp("build")
    config = BlockSizes(block_q=64, block_kv=128)
    first = kernels.build("pallas_tpu", config, SHAPES, causal=True, dtype="bfloat16")
    second = kernels.build("pallas_tpu", config, SHAPES.model_dump(), causal=True,
                           dtype="bfloat16", output_dir=out)
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
    assert first.source_files["pallas_tpu.py"] == hashlib.sha256(
        (KERNELS_DIR / "pallas_tpu.py").read_bytes()).hexdigest()
    assert {"contract.py", "config.py"} <= set(first.source_files)
    assert first.source_sha256 == second.source_sha256
    assert first.local.lowered_sha256 == second.local.lowered_sha256
    other = kernels.build("pallas_tpu", BlockSizes(block_q=32, block_kv=128), SHAPES,
                          causal=True, dtype="bfloat16", platforms=("tpu",))
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
    build = kernels.build("naive", None, SHAPES, dtype="float32", platforms=("cpu",))
    spec, _, _ = kernels.validate(*(np.zeros(s.shape, np.float32)
                                    for s in SHAPES.structs(jnp.float32)))
    assert build.local.cost.flops >= spec.flops()
    # The materialised logits and probabilities: at least one f32 [B, H, Sq, Skv].
    assert build.local.memory.temp_bytes >= 4 * 4 * 136 * 200


def test_exported_cpu_artifact_runs_and_is_exact(tmp_path):
    """An exported artifact is the kernel: deserialised and called, it matches
    the float64 reference (lengths included)."""
    build = kernels.build("xla", None, SHAPES, dtype="float32", platforms=("cpu", "tpu"),
                          with_lengths=True, output_dir=tmp_path)
    assert [a.status for a in build.artifacts] == ["exported", "exported"]
    exported = jax_export.deserialize(bytearray(Path(build.artifact("cpu").path).read_bytes()))
    case = Case("exported", batch=1, q_len=136, kv_len=200, num_heads=4, num_kv_heads=2,
                q_lengths=(100,), kv_lengths=(150,))
    q, k, v, ql, kl = random_inputs(case, seed=12)
    out = exported.call(q, k, v, ql, kl)
    assert kernels.relative_error(out, reference_for(q, k, v, case, ql, kl)) < 2e-6


def test_unsupported_targets_are_skipped_with_reason():
    build = kernels.build("cudnn", None, SHAPES, dtype="bfloat16",
                          platforms=("cpu", "cuda", "tpu", "metal"))
    assert build.local is None and "NVIDIA GPU" in build.local_skipped_reason
    reasons = {a.platform: (a.status, a.reason) for a in build.artifacts}
    assert all(status == "skipped" for status, _ in reasons.values())
    assert "needs a local cuda device" in reasons["cuda"][1]
    assert "not native on tpu" in reasons["tpu"][1]
    assert "unknown jax.export platform" in reasons["metal"][1]


def test_auto_records_its_resolution():
    build = kernels.build("auto", None, SHAPES, dtype="float32", platforms=())
    assert build.implementation == "xla"
    assert build.resolution.requested == "auto" and build.resolution.reason


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"implementation": "flash9000"}, "unknown implementation"),
    ({"config": BlockSizes(block_q=10, block_kv=128)}, "block_q must be a multiple of 8"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"example_shapes": {**SHAPES.model_dump(), "num_kv_heads": 3}}, "multiple of num_kv_heads"),
])
def test_invalid_build_requests(kwargs, match):
    args = {"implementation": "pallas_tpu", "config": None, "example_shapes": SHAPES,
            "platforms": ("tpu",), **kwargs}
    with pytest.raises(ValueError, match=match):
        kernels.build(**args)


def test_pallas_gpu_exports_for_cuda_from_a_cpu_host_and_records_the_waiver():
    """The Triton custom call is version-bound: the export waives that check and says so."""
    import jax

    import kernels
    from kernels.build import ExampleShapes

    shapes = ExampleShapes(batch=1, q_len=128, kv_len=128, num_heads=2, num_kv_heads=2,
                           head_dim=64)
    build = kernels.build("pallas_gpu", None, shapes, platforms=("cuda",))
    (artifact,) = build.artifacts
    assert artifact.status == "exported", artifact.reason
    assert "triton" in artifact.reason and jax.__version__ in artifact.reason
    assert len(artifact.sha256) == 64 and artifact.size_bytes > 0
