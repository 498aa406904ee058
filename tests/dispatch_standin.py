"""A stand-in dispatch policy for CPU tests of a dispatch rollout: evidence made up over
``xla`` and ``naive`` (the mechanism, not speed), covering every call a rollout makes.

Its space is every call (each dtype, causal flag and size); its twelve buckets split it
by dtype, causal flag and head_dim below 48 or not. Made-up timings make ``naive`` the
choice for non-causal calls of head_dim 48 and above (the build's example shape among
them) and ``xla`` elsewhere, so a rollout's calls go to both kernels.
"""

from __future__ import annotations

from pathlib import Path

from kernels.dispatch_policy import (
    BucketEvidence,
    DispatchPolicy,
    Evidence,
    KernelEvidence,
    Rule,
    ShapeTiming,
    derive_policy,
)
from kernels.dispatch_space import BucketGrid, Region
from kernels.shapes import AttentionShape

GRID = BucketGrid(space=Region(), head_dim_cuts=(48,), seq_cuts=())
"""Twelve buckets: 3 dtypes x causal or not x head_dim below 48 or not."""
KERNELS = ("xla", "naive")


def _timing(shape: AttentionShape, median: float) -> ShapeTiming:
    return ShapeTiming(shape=shape, median_s=median, low_s=median * 0.99,
                       high_s=median * 1.01, coverage=0.988, repeats=11)


def standin_evidence() -> Evidence:
    """Made-up evidence over :data:`GRID`: one shape per bucket, both kernels timed."""
    buckets = []
    for bucket in GRID.buckets():
        head_dim = bucket.head_dim.lo if bucket.head_dim.lo > 1 else 32
        shape = AttentionShape(batch=1, q_len=16, kv_len=16, num_heads=2, num_kv_heads=2,
                               head_dim=head_dim, dtype=bucket.dtypes[0],
                               causal=bucket.causal[0])
        naive_wins = head_dim >= 48 and not shape.causal
        medians = {"xla": 3e-5 if naive_wins else 1e-5, "naive": 1e-5 if naive_wins else 3e-5}
        buckets.append(BucketEvidence(bucket=bucket, shapes=(shape,), kernels=tuple(
            KernelEvidence(kernel=k, timings=(_timing(shape, medians[k]),)) for k in KERNELS)))
    return Evidence(space=GRID.space, device="stand-in CPU", backend="cpu",
                    method="stand-in timings", buckets=tuple(buckets))


def standin_policy() -> DispatchPolicy:
    """The policy :func:`standin_evidence` derives (ties: ``xla`` first)."""
    return derive_policy(standin_evidence(), KERNELS, Rule(priority=("xla",)))


def write_standin_policy(path: Path) -> Path:
    """:func:`standin_policy` as a JSON file at ``path``; returns ``path``."""
    path.write_text(standin_policy().model_dump_json(indent=1))
    return path
