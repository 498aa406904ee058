"""The measurements a dispatch policy is derived from, as frozen, fingerprinted data.

Per bucket of a policy's space (``kernels.dispatch_space``): the shapes measured there
and, per candidate kernel, its timing at every one of them (:class:`ShapeTiming`: median
and an order-statistic interval in seconds, ``kernels.timing.median_interval``) or why
its own support check refused one (:class:`KernelEvidence`); :class:`Evidence` holds every
bucket of one device, backend and method. Every model here is frozen and has a
fingerprint: the sha256 of its canonical JSON (sorted keys, no whitespace), so a file's
layout or key order does not move it and any value does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from kernels.dispatch_space import Bucket, Region, check_partition
from kernels.shapes import AttentionShape


class FrozenModel(BaseModel):
    """A frozen model with a canonical JSON form and its sha256."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def canonical_json(self) -> bytes:
        """The model as canonical JSON (sorted keys, no whitespace, UTF-8)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False).encode()

    def fingerprint(self) -> str:
        """sha256 (hex) of :meth:`canonical_json`: a file's layout or key order does not
        move it; any value does."""
        return hashlib.sha256(self.canonical_json()).hexdigest()


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A measured duration: positive and finite (a timing of inf or nan would rank a kernel)."""


class ShapeTiming(FrozenModel):
    """One kernel at one shape: seconds per call, the median of ``repeats`` repeats and an
    interval for it holding the true median with probability ``coverage``."""

    shape: AttentionShape
    median_s: Seconds
    low_s: Seconds
    high_s: Seconds
    coverage: float = Field(gt=0, le=1)
    repeats: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.low_s <= self.median_s <= self.high_s:
            raise ValueError(f"a timing needs low_s <= median_s <= high_s, got {self.low_s}, "
                             f"{self.median_s}, {self.high_s} at {self.shape.label}")
        return self


class KernelEvidence(FrozenModel):
    """One candidate in one bucket: its timing at every shape measured there, or why its
    own support check refused the bucket (the first refusal met)."""

    kernel: str
    timings: tuple[ShapeTiming, ...] = ()
    refused: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if bool(self.timings) == (self.refused is not None):
            raise ValueError(f"{self.kernel}: evidence holds timings or a refusal, exactly one")
        return self


class BucketEvidence(FrozenModel):
    """What was measured in one bucket: its shapes (each inside it) and each candidate's
    evidence (a kernel's timings cover exactly these shapes)."""

    bucket: Bucket
    shapes: tuple[AttentionShape, ...] = Field(min_length=1)
    kernels: tuple[KernelEvidence, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        outside = [s.label for s in self.shapes if not self.bucket.contains_shape(s)]
        if outside:
            raise ValueError(f"bucket {self.bucket.name!r} holds shapes outside it: {outside}")
        names = [k.kernel for k in self.kernels]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket {self.bucket.name!r} lists a kernel twice: {names}")
        for k in self.kernels:
            if k.timings and [t.shape for t in k.timings] != list(self.shapes):
                raise ValueError(f"bucket {self.bucket.name!r}: {k.kernel}'s timings are not "
                                 "at the bucket's shapes, in order")
        return self


class Evidence(FrozenModel):
    """Measurements for a policy: per bucket (the buckets partition ``space``), on one
    device, by one method (both in words, e.g. ``NVIDIA H200`` and the timing method),
    with one software stack (``software``: name -> version or digest, e.g. ``jax``, the
    kernels' source digest; empty: not recorded)."""

    space: Region = Region()
    device: str
    backend: str
    method: str
    software: dict[str, str] = Field(default_factory=dict)
    buckets: tuple[BucketEvidence, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _partition(self) -> Self:
        check_partition(self.space, [b.bucket for b in self.buckets])
        return self
