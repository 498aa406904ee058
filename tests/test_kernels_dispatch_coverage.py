"""A bucket's kernel and the calls of the bucket it refuses: each candidate's declared
capability held against the whole bucket (the gap named and recorded), each bucket's
ranking, and the dispatch kernel serving a call its bucket's choice refuses by the next
kernel of the ranking that accepts it (checked against float64 attention).
"""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.contract import validate
from kernels.dispatch_audit import PolicyError, audit_policy
from kernels.dispatch_coverage import capability_gap
from kernels.dispatch_kernel import DispatchKernel
from kernels.dispatch_policy import (
    BucketEvidence,
    DispatchPolicy,
    Evidence,
    KernelEvidence,
    Rule,
    derive_policy,
)
from kernels.dispatch_space import DEFAULT_GRID, BucketGrid, IntRange, Region
from kernels.fa3 import Fa3Kernel
from kernels.kernel import Capability
from kernels.naive import NaiveKernel
from kernels.reference import attention_reference
from kernels.registry import registered
from kernels.shapes import AttentionShape
from kernels.xla import CudnnKernel, XlaKernel
from tests.test_kernels_dispatch_policy import (
    MEASURED,
    _choice,
    _counting,
    _timing,
    make_evidence,
)

NARROW = Capability(max_head_dim=32)
"""A stand-in capability that misses part of the head_dim-below-48 buckets."""


def _default_bucket(name_part: str):
    (bucket,) = [b for b in DEFAULT_GRID.buckets() if b.name == name_part]
    return bucket


@pytest.mark.parametrize("capability, bucket, gap", [
    (Fa3Kernel.capability, "bfloat16 full d[65, 129) q[1, 1024) kv[1, 1024) b[1, inf)",
     r"needs head_dim a multiple of 128; the bucket's head_dim \[65, 129\) holds 65"),
    (Fa3Kernel.capability, "float32 full d[65, 129) q[1, 1024) kv[1, 1024) b[1, inf)",
     r"runs dtypes \['bfloat16', 'float16'\]; the bucket holds \['float32'\]"),
    (CudnnKernel.capability, "bfloat16 full d[1, 65) q[1, 1024) kv[1, 1024) b[1, inf)",
     r"needs head_dim a multiple of 8; the bucket's head_dim \[1, 65\) holds 1"),
    (CudnnKernel.capability, "float16 causal d[129, inf) q[1, 1024) kv[1, 1024) b[1, inf)",
     r"runs head_dim <= 256; the bucket's head_dim \[129, inf\) reaches 257"),
    (Capability(causal_needs_square=True),
     "bfloat16 causal d[65, 129) q[1, 1024) kv[1, 1024) b[1, inf)",
     r"causal calls only with q_len == kv_len; .* q_len \[1, 1024\) and kv_len \[1, 1024\)"),
    (Capability(causal_with_lengths=False),
     "bfloat16 causal d[1, 65) q[1024, 8192) kv[1, 1024) b[1, inf)",
     "runs no causal call with lengths"),
])
def test_a_capability_that_misses_part_of_a_bucket_names_a_call_it_misses(
        capability, bucket, gap):
    found = capability_gap(capability, _default_bucket(bucket))
    assert found is not None and re.search(gap, found), found


def test_a_capability_that_reaches_every_call_of_a_bucket_has_no_gap():
    assert all(capability_gap(XlaKernel.capability, b) is None for b in DEFAULT_GRID.buckets())
    full = _default_bucket("bfloat16 full d[65, 129) q[1, 1024) kv[1, 1024) b[1, inf)")
    only_128 = full.model_copy(update={"head_dim": IntRange(lo=128, hi=129)})
    assert capability_gap(Fa3Kernel.capability, only_128) is None
    square = Region(dtypes=("bfloat16",), causal=(True,), head_dim=IntRange(lo=128, hi=129),
                    q_len=IntRange(lo=512, hi=513), kv_len=IntRange(lo=512, hi=513))
    assert capability_gap(Capability(causal_needs_square=True), square) is None
    assert capability_gap(Fa3Kernel.capability, square) == (
        "runs no causal call with lengths; the bucket's causal calls may carry them")


def test_fa3s_support_check_refuses_what_its_capability_declares():
    shape = AttentionShape(batch=1, q_len=128, kv_len=256, num_heads=2, num_kv_heads=2,
                           head_dim=128, dtype="bfloat16", causal=True)
    spec, _, _ = validate(*shape.structs(), causal=True)
    with pytest.raises(NotImplementedError, match="q_len != kv_len"):
        Fa3Kernel().check_supported(spec, "gpu")
    assert Fa3Kernel.capability.causal_needs_square
    assert not Fa3Kernel.capability.causal_with_lengths


# --------------------------------------------------------------------------- the policy's record

def test_a_winner_that_misses_part_of_its_bucket_is_kept_with_its_ranking_and_the_gap():
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule(),
                           {"xla": Capability(), "naive": NARROW})
    choice = _choice(policy, 32, 64)  # head_dim [1, 48), q_len 32 and more: naive fastest
    assert (choice.kernel, choice.ranking) == ("naive", ("naive", "xla"))
    gaps = {s.kernel: s.uncovered for s in choice.summaries}
    assert gaps == {"xla": None,
                    "naive": "runs head_dim <= 32; the bucket's head_dim [1, 48) reaches 33"}
    assert ("a call it refuses goes to the next of ['xla'] that accepts it (xla reaches "
            "every call)") in choice.why
    assert _choice(policy, 32, 16).ranking == ("xla", "naive")
    assert "refuses" not in _choice(policy, 32, 16).why  # xla reaches every call
    assert _choice(policy, 64, 64).ranking == ()  # no kernel serves it
    assert policy.capability_map() == {"xla": Capability(), "naive": NARROW}
    audit_policy(policy, policy.fingerprint())
    both = derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule(),
                         {"xla": NARROW, "naive": NARROW})
    assert "none reaches every call" in _choice(both, 32, 64).why


def test_a_recorded_capability_edited_after_deriving_fails_the_audit():
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule(),
                           {"xla": Capability(), "naive": NARROW})
    data = json.loads(policy.model_dump_json())
    data["capabilities"][1]["capability"]["max_head_dim"] = 64  # naive now reaches the bucket
    edited = DispatchPolicy.model_validate(data)
    with pytest.raises(PolicyError, match="not the .* signed"):
        audit_policy(edited, policy.fingerprint())
    with pytest.raises(PolicyError, match=r"naive's recorded summary .*uncovered"):
        audit_policy(edited)


def test_the_registrys_declared_capabilities_are_the_default_and_fa3s_bucket_falls_back():
    space = Region(dtypes=("bfloat16",), causal=(False,))
    grid = BucketGrid(space=space, head_dim_cuts=(65, 129), seq_cuts=(), split_kv_len=False)
    buckets = []
    for bucket in grid.buckets():
        d = {1: 64, 65: 128, 129: 256}[bucket.head_dim.lo]
        shape = AttentionShape(batch=1, q_len=512, kv_len=512, num_heads=2, num_kv_heads=2,
                               head_dim=d, dtype="bfloat16")
        medians = {"fa3": 1e-5, "cudnn": 1.2e-5, "xla": 3e-5} if d == 128 else {"xla": 3e-5}
        buckets.append(BucketEvidence(bucket=bucket, shapes=(shape,), kernels=tuple(
            KernelEvidence(kernel=k, timings=(_timing(shape, m),)) for k, m in medians.items())))
    evidence = Evidence(space=space, device="stand-in H200", backend="gpu", method="stand-in",
                        buckets=tuple(buckets))
    policy = derive_policy(evidence, ("xla", "cudnn", "fa3"), Rule())
    (mid,) = [b for b in policy.buckets if 128 in b.bucket.head_dim]
    assert (mid.kernel, mid.ranking) == ("fa3", ("fa3", "cudnn", "xla"))
    assert "(xla reaches every call)" in mid.why
    assert policy.capability_map()["fa3"] == Fa3Kernel.capability


# --------------------------------------------------------------------------- the dispatch kernel

@pytest.fixture
def narrow_naive(monkeypatch):
    """xla and naive as counting stand-ins, naive declaring and checking ``NARROW``; the
    dispatch kernel of the stand-in policy derived with the registry's capabilities."""
    counted = {"xla": _counting(XlaKernel), "naive": _counting(NaiveKernel)}
    type(counted["naive"]).capability = NARROW
    for name, kernel in counted.items():
        monkeypatch.setitem(kernels.IMPLEMENTATIONS, name, kernel)
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule())
    assert policy.capability_map()["naive"] == NARROW
    with registered(DispatchKernel(policy)) as dispatch:
        yield counted, dispatch


@pytest.mark.parametrize("head_dim, served_by", [(16, "naive"), (32, "naive"), (40, "xla")])
def test_a_call_the_buckets_kernel_refuses_is_served_by_the_next_that_accepts_it(
        narrow_naive, head_dim, served_by):
    counted, _ = narrow_naive
    rng = np.random.default_rng(head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 33, 2, head_dim)), jnp.float32)
               for _ in range(3))
    before = {name: type(kernel).calls for name, kernel in counted.items()}
    out = kernels.attention(q, k, v, implementation="dispatch")
    assert {n: type(kn).calls - before[n] for n, kn in counted.items()} == {
        n: int(n == served_by) for n in counted}
    np.testing.assert_allclose(np.asarray(out, np.float64), attention_reference(q, k, v),
                               rtol=2e-5, atol=2e-6)


def test_a_call_every_kernel_of_the_ranking_refuses_is_refused_with_each_reason(
        narrow_naive, monkeypatch):
    monkeypatch.setattr(type(kernels.IMPLEMENTATIONS["xla"]), "capability", NARROW)
    q = jnp.ones((1, 33, 2, 40), jnp.float32)
    with pytest.raises(NotImplementedError, match=r"every kernel of its ranking refuses the "
                                                  r"call: naive: .*head_dim <= 32.*; xla: "):
        kernels.attention(q, q, q, implementation="dispatch")
