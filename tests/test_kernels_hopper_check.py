"""The Hopper check the sm_90 kernels share (``kernels.gpu_limits.hopper_refusal``): on a
GPU that is not Hopper each refuses before anything runs, naming the constraint and the
device's compute capability; on Hopper, and off a GPU (where each kernel's own backend
rule speaks), the check says nothing. No GPU needed: the default device is a stand-in."""
from __future__ import annotations

import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from kernels import fa3, gpu_limits
from kernels.contract import AttentionSpec
from kernels.pallas_mosaic_gpu import PallasMosaicGpuKernel
from kernels.pallas_mosaic_gpu_fp8 import PallasMosaicGpuFp8Kernel

SPEC = AttentionSpec(batch=1, q_len=256, kv_len=256, num_heads=2, num_kv_heads=2,
                     head_dim=128, dtype=jnp.dtype("bfloat16"), causal=False, scale=0.1,
                     has_lengths=False)


@pytest.fixture
def gpu(monkeypatch):
    """Make the default backend a GPU whose compute capability the test sets."""
    def with_capability(capability):
        device = SimpleNamespace(device_kind="stand-in GPU", compute_capability=capability)
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        monkeypatch.setattr(jax, "devices", lambda *a, **k: [device])
    return with_capability


@pytest.mark.parametrize(("capability", "any_9x", "only_9_0"), [
    ("9.0", True, True),         # H100, H200
    ("9.2", True, False),        # a later 9.x: wgmma and TMA, not the sm90-only wheel
    ("8.0", False, False),       # A100
    ("10.0", False, False),      # Blackwell: no wgmma
    ((8, 6), False, False),      # reported as a pair
    ("9.0a", True, True),        # the architecture-specific name: still 9.0
    ("gfx942", False, False),    # a ROCm GPU (also backend "gpu"): not readable as CUDA
    ("9", False, False),         # not a major.minor: refused, not taken for unreported
    (None, True, False),         # not reported: only the sm90-only wheel refuses
])
def test_the_rule_on_each_capability(gpu, capability, any_9x, only_9_0):
    gpu(capability)
    assert (gpu_limits.hopper_refusal("k", "wgmma") is None) is any_9x
    assert (gpu_limits.hopper_refusal("k", "its wheel", only_sm90=True) is None) is only_9_0


def test_off_a_gpu_the_check_says_nothing(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(jax, "devices", lambda *a, **k: pytest.fail("no device is read"))
    assert gpu_limits.hopper_refusal("k", "wgmma", only_sm90=True) is None


def test_the_refusal_names_the_kernel_the_need_and_the_device(gpu):
    gpu("8.0")
    why = gpu_limits.hopper_refusal("pallas_mosaic_gpu", "wgmma and TMA")
    assert why == ("pallas_mosaic_gpu needs an sm_90 (Hopper) GPU for wgmma and TMA "
                   "(compute capability 9.x); this device has compute capability 8.0")
    gpu("gfx942")  # shown as reported, not as a parse's "unknown"
    assert gpu_limits.hopper_refusal("k", "wgmma").endswith("compute capability gfx942")
    gpu(None)
    assert gpu_limits.hopper_refusal("k", "its wheel", only_sm90=True).endswith(
        "compute capability none reported")


@pytest.mark.parametrize("capability", ["8.0", "10.0"])
@pytest.mark.parametrize("kernel", [PallasMosaicGpuKernel(), PallasMosaicGpuFp8Kernel(),
                                    fa3.Fa3Kernel()], ids=lambda k: k.name)
def test_each_sm90_kernel_refuses_another_gpu_and_takes_a_hopper_one(gpu, kernel, capability,
                                                                      monkeypatch):
    # fa3 asks for its wheel before the device: stand one in, so the device is what decides
    monkeypatch.setattr(fa3.importlib.util, "find_spec", lambda name: object())
    gpu(capability)
    with pytest.raises(NotImplementedError,
                       match=rf"sm_90 \(Hopper\).*compute capability {re.escape(capability)}$"):
        kernel.check_supported(SPEC, "gpu")
    gpu("9.0")
    kernel.check_supported(SPEC, "gpu")  # no refusal on Hopper for this spec


def test_the_sm90_only_wheel_refuses_a_later_hopper(gpu, monkeypatch):
    monkeypatch.setattr(fa3.importlib.util, "find_spec", lambda name: object())
    gpu("9.2")
    PallasMosaicGpuKernel().check_supported(SPEC, "gpu")
    with pytest.raises(NotImplementedError,
                       match=r"compiled for sm90 only \(compute capability 9\.0\).*9\.2$"):
        fa3.Fa3Kernel().check_supported(SPEC, "gpu")
