"""The long-document workload as a request source of the canary's paired comparison.

The canary compares candidate and production request by request: each compared request
is served by both, timed ABBA (``evaluation.serving.replay_canary_step``), and its
``log((c1 + c2) / (p1 + p2))`` is one pair (``gates.latency_judge``). This module gives
that replay long documents instead of MiniLM texts: the workload spec's documents (its
length distribution and seeded synthetic token ids, ``evaluation.longdoc.arrivals``,
``LongDocEncoder.document_ids``), each served alone as a one-row batch padded to its
length bucket by ``evaluation.longdoc.server.EncoderServer`` (the encoder of the spec,
its attention through the kernel contract). Every served request records its bucket
(``ServedRequest.length_bucket``), so the adoption test can judge each declared bucket
on its own pairs (``gates.adoption_buckets``).

Why one request at a time, not the open-loop queue of ``evaluation.longdoc.bench``:
the adoption and latency tests need pairs that are independent and order-balanced
(``gates.adoption``); times to result in one queue are not (a slow batch delays every
request behind it: the committed H200 pairs' lag-1 autocorrelation is 0.48,
``evaluation.longdoc.effect``). So the canary's pairs are compute times of the same
document on both sides, back to back; queueing, throughput and goodput under load
stay the bench's figures.

Compilation: the first request of a bucket shape compiles it outside the measured time
(``EncoderServer.compile_s``); :func:`warm_up` serves one document per bucket on each
endpoint first, so no compared latency follows a cold compile.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluation.longdoc.arrivals import Request, draw_lengths
from evaluation.longdoc.batcher import Batch, bucket_of
from evaluation.longdoc.encoder import LongDocEncoder
from evaluation.longdoc.server import EncoderServer
from evaluation.longdoc.spec import InvalidWorkload, WorkloadSpec, load_spec, shipped, spec_sha256
from evaluation.serving import NON_FINITE, TrafficResult, replay_canary_step, replay_shadow
from kernels.api import AttentionFn


class LongDocument(BaseModel):
    """One long-document request of the canary: ``index`` seeds its token ids."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    index: int = Field(ge=0)
    tokens: int = Field(ge=1, description="its length before padding")
    bucket: int = Field(ge=1, description="the padded length it is served at (tokens)")


def canary_documents(spec: WorkloadSpec, n: int, *, seed_offset: int = 0) -> list[LongDocument]:
    """``n`` documents drawn from the spec's length distribution (deterministic given the
    spec and ``seed_offset``; the stream's own seed is ``arrivals.seed + seed_offset``).

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"the canary needs at least one document, got n={n}")
    rng = np.random.default_rng(spec.arrivals.seed + seed_offset)
    lengths = draw_lengths(spec.lengths, n, rng)
    return [LongDocument(request_id=f"{spec.name}-{seed_offset}-{i:06d}", index=i,
                         tokens=int(t), bucket=bucket_of(int(t), spec.buckets))
            for i, t in enumerate(lengths)]


class LongdocEndpoint:
    """One side of the comparison: the spec's encoder with ``attention_fn``, serving one
    document at a time (``evaluation.serving.PairedEndpoint``).

    Attributes:
        name: what serves (a version, a kernel).
        server: the encoder server (its ``compile_s``: seconds compiling, never measured).
    """

    def __init__(self, name: str, spec: WorkloadSpec, attention_fn: AttentionFn, *,
                 ids_seed: int = 0):
        self.name = name
        self.server = EncoderServer(LongDocEncoder.for_spec(spec.encoder), attention_fn,
                                    ids_seed=ids_seed)

    def serve(self, document: LongDocument) -> tuple[np.ndarray | None, float, str | None]:
        """Encode ``document``: ``(embedding float32 [hidden] or None, compute seconds,
        error or None)``; a non-finite embedding is an error (``NON_FINITE``), as in
        ``evaluation.serving.Endpoint``."""
        request = Request(document.index, 0.0, document.tokens)
        outcome = self.server(Batch((request,), document.bucket, 1))
        if outcome.error is not None:
            return None, outcome.service_s, outcome.error
        embedding = self.server.outputs.pop(document.index, None)
        if embedding is None or outcome.finite is None or not all(outcome.finite):
            return None, outcome.service_s, NON_FINITE
        return embedding, outcome.service_s, None


class LongdocStep(BaseModel):
    """The documents one canary look replays, and the workload they were drawn from
    (its name and the sha256 of its file's bytes when drawn)."""

    model_config = ConfigDict(frozen=True)

    workload: str
    spec_sha256: str
    documents: list[LongDocument]

    def spec(self) -> WorkloadSpec:
        """The workload spec, checked to be the bytes the documents were drawn from.

        Raises:
            InvalidWorkload: no such shipped workload, or its file changed since.
        """
        path = shipped(self.workload)
        if spec_sha256(path) != self.spec_sha256:
            raise InvalidWorkload(f"{path} changed since the canary's documents were drawn "
                                  f"from it (sha256 {self.spec_sha256}): the canary stops "
                                  "rather than replay another workload")
        return load_spec(path)


def check_buckets(spec: WorkloadSpec, buckets: list[int]) -> None:
    """Refuse declared adoption buckets the workload cannot fill.

    Raises:
        ValueError: a bucket that is not one of the spec's (naming both lists).
    """
    missing = [b for b in buckets if b not in spec.buckets]
    if missing:
        raise ValueError(f"decision.buckets {missing} are not buckets of workload "
                         f"{spec.name} ({spec.buckets}): no request would ever fill them")


SHADOW_SEED_OFFSET = 1_000_003
"""The stream the shadow stage's documents are drawn from (``seed_offset``): apart from the
canary's (0) and every A/A canary of a calibration (its run number)."""


def record_steps(workload: str, sizes: list[int], buckets: list[int], *,
                 seed_offset: int = 0) -> list[LongdocStep]:
    """The documents of each canary look (``sizes``: requests per look, in order),
    disjoint and consecutive in one stream drawn from the shipped ``workload``
    (``seed_offset``: another stream, as each A/A canary of a calibration draws its own).

    Raises:
        InvalidWorkload: no such shipped workload (the message lists them).
        ValueError: a look of no request, or a declared bucket the spec lacks.
    """
    path = shipped(workload)
    spec = load_spec(path)
    check_buckets(spec, buckets)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"every canary look needs at least one request, got {sizes}")
    documents = canary_documents(spec, sum(sizes), seed_offset=seed_offset)
    cuts = np.cumsum([0, *sizes]).tolist()
    digest = spec_sha256(path)
    return [LongdocStep(workload=workload, spec_sha256=digest, documents=documents[a:b])
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def expected_pairs(steps: list[LongdocStep], fractions: list[float],
                   buckets: list[int]) -> dict[int, int]:
    """Compared requests each of ``buckets`` is expected to get over the registered looks
    (``fractions``: each look's traffic fraction, in order): per look,
    ``floor(fraction * documents)`` are compared (``evaluation.serving.candidate_share``),
    spread over buckets as that look's documents are (rounded down).

    Raises:
        ValueError: ``fractions`` longer than ``steps``.
    """
    if len(fractions) > len(steps):
        raise ValueError(f"{len(fractions)} fractions for {len(steps)} looks")
    out = dict.fromkeys(buckets, 0.0)
    for step, fraction in zip(steps, fractions, strict=False):
        compared = math.floor(fraction * len(step.documents))
        for d in step.documents:
            if d.bucket in out:
                out[d.bucket] += compared / len(step.documents)
    return {b: math.floor(n) for b, n in out.items()}


def write_steps(steps: list[LongdocStep], path: str | Path) -> Path:
    """Write the canary's documents per look as JSON (creating parent folders)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([s.model_dump() for s in steps], indent=1))
    return path


def warm_up(documents: list[LongDocument], endpoints: list[LongdocEndpoint]) -> int:
    """Serve one document per bucket present on each endpoint (compiling its shape);
    returns how many documents were served."""
    first = {d.bucket: d for d in reversed(documents)}
    for endpoint in endpoints:
        for document in first.values():
            endpoint.serve(document)
    return len(first) * len(endpoints)


def replay_step(documents: list[LongDocument], fraction: float, production: LongdocEndpoint,
                candidate: LongdocEndpoint, *, salt: str = "canary",
                abba: bool = True) -> TrafficResult:
    """A canary step over long documents: ``evaluation.serving.replay_canary_step`` with
    each document as the payload and its bucket recorded per request.

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    return replay_canary_step(documents, fraction, production, candidate, salt=salt,
                              abba=abba, payload=_itself, bucket=_bucket)


def replay_shadow_documents(documents: list[LongDocument], production: LongdocEndpoint,
                            candidate: LongdocEndpoint, *,
                            progress=None) -> TrafficResult:
    """The shadow stage over long documents: production serves each, the candidate a
    mirrored copy (``evaluation.serving.replay_shadow``), each request's bucket recorded.
    A registration whose canary replays a workload shadows the same workload: a kernel is
    mirrored on what it will serve (a head_dim-128 kernel never meets MiniLM's 32)."""
    return replay_shadow(documents, production, candidate, progress=progress,
                         payload=_itself, bucket=_bucket)


def _itself(document: LongDocument) -> LongDocument:
    return document


def _bucket(document: LongDocument) -> int:
    return document.bucket
