"""``auto`` and a promoted dispatch policy: with none configured ``auto`` resolves exactly
as it always did; with one configured (the policy file and its signed fingerprint) it
serves each call by its bucket's kernel (checked against float64 attention), passing to
the next kernel of the ranking where one is excluded, and falls back to the auto order,
saying why, where the policy serves no kernel; a policy that is not the one pinned, or
not what its evidence derives, is refused rather than served.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import dispatch_serving
from kernels.api import Resolution, auto_order, resolve
from kernels.contract import validate
from kernels.dispatch_audit import PolicyError
from kernels.dispatch_serving import POLICY_ENV, SHA256_ENV, configured_policy
from kernels.naive import NaiveKernel
from kernels.reference import attention_reference
from kernels.shapes import AttentionShape
from kernels.xla import XlaKernel
from tests.test_kernels_dispatch_policy import _counting, _edited, _policy


def _spec(head_dim: int, seq: int, dtype: str = "float32"):
    shape = AttentionShape(batch=1, q_len=seq, kv_len=seq, num_heads=2, num_kv_heads=2,
                           head_dim=head_dim, dtype=dtype)
    return validate(*shape.structs(), causal=False)[0]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No policy configured and none cached, whatever the environment says."""
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    dispatch_serving._audited.cache_clear()
    yield
    dispatch_serving._audited.cache_clear()


@pytest.fixture
def served(monkeypatch, tmp_path):
    """The stand-in policy (xla at (32, 16) and (64, 16), naive at (32, 64), none at
    (64, 64)) configured for ``auto``, xla and naive counting the calls they serve."""
    counted = {"xla": _counting(XlaKernel), "naive": _counting(NaiveKernel)}
    for name, kernel in counted.items():
        monkeypatch.setitem(kernels.IMPLEMENTATIONS, name, kernel)
    path = tmp_path / "policy.json"
    path.write_text(_policy().model_dump_json(indent=1))
    monkeypatch.setenv(POLICY_ENV, str(path))
    monkeypatch.setenv(SHA256_ENV, _policy().fingerprint())
    return counted


@pytest.mark.parametrize("head_dim, seq, dtype", [
    (32, 16, "float32"), (32, 64, "float32"), (64, 64, "float32"), (64, 64, "bfloat16")])
def test_without_a_configured_policy_auto_resolves_as_it_always_did(head_dim, seq, dtype,
                                                                    monkeypatch):
    spec = _spec(head_dim, seq, dtype)
    expected = Resolution(requested="auto", name="xla", backend="cpu", native=True,
                          reason=f"first supported implementation for cpu in order "
                                 f"{list(auto_order('cpu'))}", config=None)
    assert configured_policy() is None
    assert resolve("auto", spec, "cpu") == expected
    monkeypatch.setenv(POLICY_ENV, " ")  # blank: none configured
    monkeypatch.setenv(SHA256_ENV, "")
    assert configured_policy() is None
    assert resolve("auto", spec, "cpu") == expected


def test_a_configured_policy_measured_on_another_backend_leaves_auto_its_order(served):
    spec = _spec(32, 64)
    gpu = resolve("auto", spec, "gpu")
    assert gpu.reason.startswith("the dispatch policy was measured on cpu, not gpu; "
                                 "first supported implementation for gpu")
    assert gpu.name != "naive"


@pytest.mark.parametrize("head_dim, seq, served_by", [(32, 16, "xla"), (32, 64, "naive"),
                                                      (64, 16, "xla")])
def test_auto_serves_each_bucket_by_the_configured_policys_kernel(served, head_dim, seq,
                                                                  served_by):
    resolution = resolve("auto", _spec(head_dim, seq), "cpu")
    fingerprint = _policy().fingerprint()
    assert (resolution.requested, resolution.name) == ("auto", served_by)
    assert resolution.reason.startswith(f"dispatch policy {fingerprint[:16]}: bucket ")
    assert resolution.reason.endswith(f"-> {served_by} (its choice)")
    rng = np.random.default_rng(seq)
    q, k, v = (jnp.asarray(rng.standard_normal((1, seq, 2, head_dim)), jnp.float32)
               for _ in range(3))
    before = {n: type(kn).calls for n, kn in served.items()}
    out = kernels.attention(q, k, v)  # implementation="auto"
    assert {n: type(kn).calls - before[n] for n, kn in served.items()} == {
        n: int(n == served_by) for n in served}
    np.testing.assert_allclose(np.asarray(out, np.float64), attention_reference(q, k, v),
                               rtol=2e-5, atol=2e-6)


def test_an_excluded_kernel_passes_the_call_to_the_next_of_its_buckets_ranking(served):
    resolution = resolve("auto", _spec(32, 64), "cpu", exclude={"naive": "out of memory"})
    assert resolution.name == "xla"
    assert resolution.skipped == {"naive": "out of memory"}
    assert resolution.reason.endswith("-> xla (next after ['naive'])")


def test_where_the_policy_serves_no_kernel_auto_falls_back_to_its_order_saying_why(served):
    empty = resolve("auto", _spec(64, 64), "cpu")
    assert empty.name == "xla"
    assert "has no kernel: no candidate serves it" in empty.reason
    assert empty.reason.endswith(f"first supported implementation for cpu in order "
                                 f"{list(auto_order('cpu'))}")
    outside = resolve("auto", _spec(32, 16, "bfloat16"), "cpu")
    assert "does not hold bfloat16" in outside.reason and outside.name == "xla"


def test_a_policy_not_pinned_or_not_the_one_signed_is_refused_not_served(served, monkeypatch,
                                                                         tmp_path):
    spec = _spec(32, 16)
    monkeypatch.setenv(SHA256_ENV, "0" * 64)
    with pytest.raises(PolicyError, match=f"not the {'0' * 64} signed"):
        resolve("auto", spec, "cpu")
    monkeypatch.delenv(SHA256_ENV)
    with pytest.raises(PolicyError, match="set together or not at all"):
        resolve("auto", spec, "cpu")
    edited = tmp_path / "edited.json"  # evidence edited after signing, fingerprint taken again
    forged = _edited(_policy(), (32, 16), "naive", 1e-6)
    edited.write_text(forged.model_dump_json())
    monkeypatch.setenv(POLICY_ENV, str(edited))
    monkeypatch.setenv(SHA256_ENV, forged.fingerprint())
    with pytest.raises(PolicyError, match="records xla, but its evidence derives naive"):
        resolve("auto", spec, "cpu")
    assert resolve("naive", spec, "cpu").name == "naive"  # a named kernel reads no policy


def test_a_dispatch_version_registers_only_the_configured_policy_its_config_names(
        served, monkeypatch):
    from kernels.dispatch_kernel import DispatchKernel, register_configured

    monkeypatch.delitem(kernels.IMPLEMENTATIONS, "dispatch", raising=False)
    with pytest.raises(PolicyError, match="this version's signed config names " + "1" * 64):
        register_configured("1" * 64)  # the environment's policy is another one
    assert "dispatch" not in kernels.IMPLEMENTATIONS
    kernel = register_configured(_policy().fingerprint())
    assert isinstance(kernel, DispatchKernel) and kernels.IMPLEMENTATIONS["dispatch"] is kernel
    assert kernel.fingerprint == _policy().fingerprint()
    monkeypatch.delenv(POLICY_ENV)
    monkeypatch.delenv(SHA256_ENV)
    with pytest.raises(PolicyError, match="served only with its signed policy"):
        register_configured(_policy().fingerprint())
