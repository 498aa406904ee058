"""The serving path used for shadow and canary: document embedding with MiniLM
through one attention implementation, and a recorded request stream replayed through
two endpoints (production and the candidate).

* Shadow: production serves every request; the candidate gets a mirrored copy;
  outputs and latencies are compared; the candidate's output is never returned.
* Canary: a deterministic fraction of requests (by hash of the request id) is
  served by the candidate; for those, production is mirrored so output drift can be
  measured.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from evaluation.model import MiniLM
from evaluation.runners import Runner
from kernels.reference import relative_error

NON_FINITE = "non-finite output"


class Request(BaseModel):
    """One recorded request: a text to embed."""

    request_id: str
    text: str
    source: str = Field(description="document name the text was cut from")


class RecordedTraffic(BaseModel):
    """A recorded request stream (written as JSON) and its content digest."""

    requests: list[Request]
    seed: int
    documents: list[str]
    digest: str = Field(description="sha256 over request ids and texts")

    def write(self, path: str | os.PathLike) -> Path:
        """Write the stream as JSON (creating parent folders); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1))
        return path


def _traffic_digest(requests: Sequence[Request]) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(r.request_id.encode() + b"\0" + r.text.encode() + b"\0")
    return h.hexdigest()


# A realistic mix of request sizes for a document-processing engine: mostly short
# snippets, some paragraphs, a few long passages (in words).
LENGTH_MIX: tuple[tuple[float, int, int], ...] = ((0.6, 6, 24), (0.3, 25, 80), (0.1, 81, 180))


def record_traffic(documents: Iterable, n_requests: int, *, seed: int = 0) -> RecordedTraffic:
    """Cut a deterministic request stream from documents.

    Args:
        documents: objects with ``.name`` and ``.text`` (``evaluation.documents.Document``).
        n_requests: number of requests (> 0).
        seed: stream seed; the same documents and seed give the same digest.

    Raises:
        ValueError: ``n_requests < 1`` or no document has any words.
    """
    if n_requests < 1:
        raise ValueError(f"n_requests must be >= 1, got {n_requests}")
    docs = [(d.name, re.findall(r"\S+", d.text)) for d in documents]
    docs = [(name, words) for name, words in docs if words]
    if not docs:
        raise ValueError("record_traffic needs at least one document with text")
    rng = random.Random(seed)
    weights = [w for w, _, _ in LENGTH_MIX]
    requests = []
    for i in range(n_requests):
        name, words = docs[i % len(docs)]
        _, lo, hi = rng.choices(LENGTH_MIX, weights=weights)[0]
        n = min(len(words), rng.randint(lo, hi))
        start = rng.randint(0, max(0, len(words) - n))
        requests.append(Request(request_id=f"req-{seed}-{i:05d}",
                                text=" ".join(words[start:start + n]), source=name))
    return RecordedTraffic(requests=requests, seed=seed, documents=sorted({n for n, _ in docs}),
                           digest=_traffic_digest(requests))


def candidate_share(request_ids: Sequence[str], fraction: float, *,
                    salt: str = "canary") -> set[str]:
    """Deterministic traffic split: the ``floor(fraction * len(request_ids))`` ids whose
    salted SHA-256 ranks lowest go to the candidate.

    Exactly that many, not "about": a step of 100 requests at 5 % gives the candidate
    5 requests, never 1 by a hash's luck, so the latency test gets the samples its
    preregistered plan was checked for (``CanaryPlan``'s power check uses the same
    floor). The same ids and salt always give the same split, so a step can be replayed
    and audited.

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"traffic fraction must lie in [0, 1], got {fraction}")
    count = math.floor(fraction * len(request_ids))
    ranked = sorted(request_ids,
                    key=lambda rid: hashlib.sha256(f"{salt}:{rid}".encode()).digest())
    return set(ranked[:count])


def memory_in_use_bytes() -> int:
    """Device bytes in use (``memory_stats``) where the backend reports them, else
    this process's resident set size (bytes) as the CPU stand-in."""
    import jax

    stats = jax.devices()[0].memory_stats()
    if stats and "bytes_in_use" in stats:
        return int(stats["bytes_in_use"])
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Endpoint:
    """A serving endpoint: the embedding model behind one implementation.

    Attributes:
        name: what serves (e.g. ``pallas_tpu@v3`` or ``xla (native baseline)``).
        runner: where it runs (``evaluation.runners``: this process, or the version's
            own process with its own code).
    """

    name: str
    runner: Runner

    def serve(self, text: str) -> tuple[np.ndarray | None, float, str | None]:
        """Embed one request. Returns ``(embedding [d] or None, latency seconds, error)``;
        the latency is measured inside the runner. A non-finite embedding is an error
        (``"non-finite output"``), never served."""
        start = time.perf_counter()
        try:
            embeddings, latency = self.runner.embed([text])
            emb = np.asarray(embeddings)[0]
        except Exception as err:  # noqa: BLE001 - a failing kernel is an observation, not a crash
            return None, time.perf_counter() - start, f"{type(err).__name__}: {err}"
        if not np.all(np.isfinite(emb)):
            return None, latency, NON_FINITE
        return emb, latency, None


class ServedRequest(BaseModel):
    """What happened to one request: who served it, and both endpoints' observations
    where both ran (the served one plus the mirrored one)."""

    request_id: str
    served_by: str = Field(description="'candidate' or 'production'")
    candidate_latency_s: float | None = None
    production_latency_s: float | None = None
    candidate_error: str | None = None
    production_error: str | None = None
    output_drift: float | None = Field(
        None, description="||candidate - production|| / ||production|| of the embeddings")


class TrafficResult(BaseModel):
    """Per-request records of a shadow run or a canary step, plus memory readings (bytes)."""

    stage: str
    fraction: float = Field(description="share of requests served by the candidate")
    candidate: str
    production: str
    records: list[ServedRequest]
    memory_start_bytes: int
    memory_end_bytes: int

    def latencies(self, side: str) -> list[float]:
        """Latencies (seconds) of successful requests on ``side`` ('candidate' or 'production')."""
        key = f"{side}_latency_s"
        return [getattr(r, key) for r in self.records
                if getattr(r, key) is not None and getattr(r, f"{side}_error") is None]

    def matched_latencies(self) -> tuple[list[float], list[float]]:
        """Latencies (seconds) of the requests that *both* endpoints served successfully,
        as ``(candidate, production)`` lists of equal length, request by request.

        The canary's latency test compares these rather than everything each side served:
        the same texts (so the request-length mix cancels) timed back to back (so load
        that comes and goes on the host hits both sides alike)."""
        pairs = [(r.candidate_latency_s, r.production_latency_s) for r in self.records
                 if r.candidate_latency_s is not None and r.production_latency_s is not None
                 and r.candidate_error is None and r.production_error is None]
        return [c for c, _ in pairs], [p for _, p in pairs]

    def drifts(self) -> list[float]:
        """Output drift (relative L2, dimensionless) of every request where both endpoints produced an output."""
        return [r.output_drift for r in self.records if r.output_drift is not None]

    def errors(self, side: str = "candidate") -> int:
        """Requests where ``side`` failed (exception or non-finite output)."""
        return sum(1 for r in self.records if getattr(r, f"{side}_error"))

    def nan_count(self, side: str = "candidate") -> int:
        """Requests where ``side`` returned a non-finite output."""
        return sum(1 for r in self.records if getattr(r, f"{side}_error") == NON_FINITE)

    def served_count(self, side: str) -> int:
        """Requests served (not mirrored) by ``side`` ('candidate' or 'production')."""
        return sum(1 for r in self.records if r.served_by == side)


def _drift(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    return None if a is None or b is None else relative_error(a, b)


def _replay(stage: str, requests: Sequence[Request], fraction: float, production: Endpoint,
            candidate: Endpoint, *, mirror_all: bool, salt: str,
            progress: Callable[[int, int], None] | None) -> TrafficResult:
    mem0 = memory_in_use_bytes()
    records = []
    share = candidate_share([r.request_id for r in requests], fraction, salt=salt)
    for i, req in enumerate(requests):
        to_candidate = req.request_id in share
        c_out = c_lat = c_err = None
        # Who goes first alternates, so neither side always runs on the other's warm caches.
        candidate_first = i % 2 == 1
        if (to_candidate or mirror_all) and candidate_first:
            c_out, c_lat, c_err = candidate.serve(req.text)
        p_out, p_lat, p_err = production.serve(req.text)
        if (to_candidate or mirror_all) and not candidate_first:
            c_out, c_lat, c_err = candidate.serve(req.text)
        records.append(ServedRequest(
            request_id=req.request_id, served_by="candidate" if to_candidate else "production",
            candidate_latency_s=c_lat, production_latency_s=p_lat,
            candidate_error=c_err, production_error=p_err, output_drift=_drift(c_out, p_out)))
        if progress:
            progress(i + 1, len(requests))
    return TrafficResult(stage=stage, fraction=fraction, candidate=candidate.name,
                         production=production.name, records=records,
                         memory_start_bytes=mem0, memory_end_bytes=memory_in_use_bytes())


def replay_shadow(requests: Sequence[Request], production: Endpoint, candidate: Endpoint,
                  *, progress: Callable[[int, int], None] | None = None) -> TrafficResult:
    """Shadow: production serves every request; the candidate gets a mirrored copy.

    The candidate's output is only compared (``output_drift``), never returned.
    """
    return _replay("shadow", requests, 0.0, production, candidate, mirror_all=True,
                   salt="shadow", progress=progress)


def replay_canary_step(requests: Sequence[Request], fraction: float, production: Endpoint,
                       candidate: Endpoint, *, salt: str = "canary",
                       progress: Callable[[int, int], None] | None = None) -> TrafficResult:
    """Canary step: the requests ``candidate_share(ids, fraction)`` picks are served
    by the candidate, the rest by production. Production also runs on the
    candidate's requests (mirrored) so output drift is measured on every one.

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    return _replay(f"canary@{fraction:g}", requests, fraction, production, candidate,
                   mirror_all=False, salt=salt, progress=progress)


def warm_up(requests: Sequence[Request], endpoints: Sequence[Endpoint], model: MiniLM) -> int:
    """Serve one request per padded length bucket (``model`` tokenises) on each
    endpoint, so compilation stays out of every latency that is later compared.
    Returns requests served."""
    texts = model.one_text_per_bucket([r.text for r in requests])
    for endpoint in endpoints:
        for text in texts:
            endpoint.serve(text)
    return len(texts) * len(endpoints)


def traffic_summary(result: TrafficResult) -> str:
    """One JSON line summarising a traffic result (for logs)."""
    return json.dumps({
        "stage": result.stage,
        "served_by_candidate": result.served_count("candidate"),
        "served_by_production": result.served_count("production"),
        "candidate_errors": result.errors("candidate"),
        "max_drift": max(result.drifts(), default=None),
    })


def split_traffic(traffic: RecordedTraffic, sizes: Sequence[int]) -> list[RecordedTraffic]:
    """Consecutive, disjoint slices of a recorded stream, ``sizes[i]`` requests each.

    Raises:
        ValueError: the sizes ask for more requests than the stream has.
    """
    if sum(sizes) > len(traffic.requests):
        raise ValueError(f"segments of {list(sizes)} requests need {sum(sizes)}, the stream "
                         f"has {len(traffic.requests)}")
    out, start = [], 0
    for n in sizes:
        out.append(traffic.model_copy(update={"requests": traffic.requests[start:start + n]}))
        start += n
    return out
