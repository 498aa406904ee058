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
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, Field

from evaluation.model import DEFAULT_MAX_LENGTH, MiniLM, bucket_length
from evaluation.recorded_traffic import Request
from evaluation.runners import Runner
from kernels.reference import relative_error

NON_FINITE = "non-finite output"


def candidate_share(request_ids: Sequence[str], fraction: float, *,
                    salt: str = "canary") -> set[str]:
    """Deterministic traffic split: the ``floor(fraction * len(request_ids))`` ids whose
    salted SHA-256 ranks lowest go to the candidate.

    Exactly that many: 5 % of 100 requests is 5, never 1 by a hash's luck, so the
    latency test gets the samples its plan's power check assumed (the same floor). The
    same ids and salt always give the same split (replayable, auditable).

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


class PairedEndpoint(Protocol):
    """What the paired replay needs of an endpoint: a name and ``serve(payload)`` giving
    ``(output [d] or None, latency seconds, error or None)`` (:class:`Endpoint` serves a
    text; ``evaluation.longdoc.canary_source.LongdocEndpoint`` a long document)."""

    name: str

    def serve(self, payload: Any) -> tuple[np.ndarray | None, float, str | None]: ...


class ServedRequest(BaseModel):
    """What happened to one request: who served it, and both endpoints' observations
    where both ran (the served one plus the mirrored one)."""

    request_id: str
    served_by: str = Field(description="'candidate' or 'production'")
    candidate_latency_s: float | None = None
    production_latency_s: float | None = None
    # every timing of each side in the order run (two under ABBA; the first is *_latency_s)
    candidate_timings_s: list[float] = Field(default_factory=list)
    production_timings_s: list[float] = Field(default_factory=list)
    order: str = Field("", description="who ran when: 'CPPC' (C candidate, P production)")
    candidate_error: str | None = None
    production_error: str | None = None
    output_drift: float | None = Field(
        None, description="||candidate - production|| / ||production|| of the embeddings")
    length_bucket: int | None = Field(
        None, description="the request's padded length in tokens, where its source records "
        "one (the long-document workload); None: not recorded")


class TrafficResult(BaseModel):
    """Per-request records of a shadow run or a canary step, plus memory readings (bytes)."""

    stage: str
    fraction: float = Field(description="share of requests served by the candidate")
    candidate: str
    production: str
    records: list[ServedRequest]
    memory_start_bytes: int
    memory_end_bytes: int
    interpreter: str | None = Field(
        None, description="the Pallas interpreter the candidate ran under where it is an "
        "interpreted Pallas TPU kernel (kernels.interpreters); None: native, a kernel that "
        "ignores the choice, or not recorded")

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

    def abba_timings(self) -> tuple[np.ndarray, np.ndarray]:
        """``(candidate, production)``, each ``[n, 2]`` float seconds: both timings of
        each side on the requests timed ABBA (two timings a side) that both sides
        served without error; ``gates.latency_judge.abba_log_ratios`` takes them."""
        rows = [(r.candidate_timings_s, r.production_timings_s) for r in self.records
                if len(r.candidate_timings_s) == 2 and len(r.production_timings_s) == 2
                and r.candidate_error is None and r.production_error is None]
        shape = (len(rows), 2)
        return (np.array([c for c, _ in rows], dtype=np.float64).reshape(shape),
                np.array([p for _, p in rows], dtype=np.float64).reshape(shape))

    def abba_buckets(self) -> list[int] | None:
        """Each :meth:`abba_timings` row's request length bucket (tokens), in the same
        order; None where a compared request's source recorded none."""
        rows = [r.length_bucket for r in self.records
                if len(r.candidate_timings_s) == 2 and len(r.production_timings_s) == 2
                and r.candidate_error is None and r.production_error is None]
        return None if any(b is None for b in rows) else [int(b) for b in rows]

    def drifts(self) -> list[float]:
        """Output drift (relative L2, dimensionless) of every request where both endpoints produced an output."""
        return [r.output_drift for r in self.records if r.output_drift is not None]

    def errors(self, side: str = "candidate") -> int:
        """Requests where ``side`` failed (exception or non-finite output)."""
        return sum(1 for r in self.records if getattr(r, f"{side}_error"))

    def failed_buckets(self, side: str) -> dict[int, int]:
        """Requests ``side`` failed, counted per length bucket (tokens -> count); only
        requests whose source records a bucket are counted."""
        counts: dict[int, int] = {}
        for r in self.records:
            if getattr(r, f"{side}_error") and r.length_bucket is not None:
                counts[r.length_bucket] = counts.get(r.length_bucket, 0) + 1
        return counts

    def nan_count(self, side: str = "candidate") -> int:
        """Requests where ``side`` returned a non-finite output."""
        return sum(1 for r in self.records if getattr(r, f"{side}_error") == NON_FINITE)

    def served_count(self, side: str) -> int:
        """Requests served (not mirrored) by ``side`` ('candidate' or 'production')."""
        return sum(1 for r in self.records if r.served_by == side)


def _drift(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    return None if a is None or b is None else relative_error(a, b)


ABBA = ("CPPC", "PCCP")
"""Orders of a compared request under ``abba=True``, alternating over the compared
requests: each side runs in each slot on half of them, so an order effect and a linear
drift within a request cancel (``gates.latency_judge``)."""


def _serve_in_order(order: str, payload: Any, production: PairedEndpoint,
                    candidate: PairedEndpoint):
    """Serve ``payload`` in ``order``; per side its first output, first error, timings."""
    out: dict[str, list] = {"C": [None, None, []], "P": [None, None, []]}
    for side in order:
        endpoint = candidate if side == "C" else production
        emb, latency, err = endpoint.serve(payload)
        got = out[side]
        if not got[2]:
            got[0] = emb
        got[1] = got[1] or err
        got[2].append(latency)
    return out["C"], out["P"]


def _text(request: Request) -> str:
    return request.text


def _no_bucket(request: Any) -> int | None:
    return None


def _replay(stage: str, requests: Sequence[Any], fraction: float, production: PairedEndpoint,
            candidate: PairedEndpoint, *, mirror_all: bool, salt: str,
            progress: Callable[[int, int], None] | None, abba: bool = False,
            payload: Callable[[Any], Any] = _text,
            bucket: Callable[[Any], int | None] = _no_bucket) -> TrafficResult:
    mem0 = memory_in_use_bytes()
    records = []
    share = candidate_share([r.request_id for r in requests], fraction, salt=salt)
    compared = 0
    for i, req in enumerate(requests):
        to_candidate = req.request_id in share
        if to_candidate or mirror_all:
            # Who goes first alternates over the compared requests, so neither side
            # always runs on the other's warm caches.
            order = ABBA[compared % 2] if abba else ("CP" if compared % 2 else "PC")
            compared += 1
        else:
            order = "P"
        (c_out, c_err, c_times), (p_out, p_err, p_times) = _serve_in_order(
            order, payload(req), production, candidate)
        records.append(ServedRequest(
            request_id=req.request_id, served_by="candidate" if to_candidate else "production",
            candidate_latency_s=c_times[0] if c_times else None,
            production_latency_s=p_times[0] if p_times else None,
            candidate_timings_s=c_times, production_timings_s=p_times, order=order,
            candidate_error=c_err, production_error=p_err, output_drift=_drift(c_out, p_out),
            length_bucket=bucket(req)))
        if progress:
            progress(i + 1, len(requests))
    return TrafficResult(stage=stage, fraction=fraction, candidate=candidate.name,
                         production=production.name, records=records,
                         memory_start_bytes=mem0, memory_end_bytes=memory_in_use_bytes())


def replay_shadow(requests: Sequence[Any], production: PairedEndpoint,
                  candidate: PairedEndpoint, *,
                  progress: Callable[[int, int], None] | None = None,
                  payload: Callable[[Any], Any] = _text,
                  bucket: Callable[[Any], int | None] = _no_bucket) -> TrafficResult:
    """Shadow: production serves every request; the candidate gets a mirrored copy.

    The candidate's output is only compared (``output_drift``), never returned.
    ``payload`` and ``bucket`` as in :func:`replay_canary_step` (another request source).
    """
    return _replay("shadow", requests, 0.0, production, candidate, mirror_all=True,
                   salt="shadow", progress=progress, payload=payload, bucket=bucket)


def replay_canary_step(requests: Sequence[Any], fraction: float, production: PairedEndpoint,
                       candidate: PairedEndpoint, *, salt: str = "canary",
                       progress: Callable[[int, int], None] | None = None,
                       abba: bool = False, payload: Callable[[Any], Any] = _text,
                       bucket: Callable[[Any], int | None] = _no_bucket) -> TrafficResult:
    """Canary step: the requests ``candidate_share(ids, fraction)`` picks are served
    by the candidate, the rest by production. Production also runs on the
    candidate's requests (mirrored) so output drift is measured on every one.
    With ``abba``, each compared request is timed twice a side in ABBA order
    (:data:`ABBA`) for the paired latency test; the first output of each side is the
    one served and compared.

    ``requests`` are recorded MiniLM requests (:class:`Request`, served as their text) by
    default; another source gives ``payload`` (what its endpoints' ``serve`` takes, from a
    request with a ``request_id``) and ``bucket`` (its padded length in tokens, recorded
    per request as ``length_bucket``).

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    return _replay(f"canary@{fraction:g}", requests, fraction, production, candidate,
                   mirror_all=False, salt=salt, progress=progress, abba=abba,
                   payload=payload, bucket=bucket)


_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""runner -> the padded lengths it has served in this process (its compiled programs live
as long as it does: the version pool keeps one runner per version for the session)."""


def warm_up(requests: Sequence[Request], endpoints: Sequence[Endpoint], model: MiniLM) -> int:
    """Serve one request per padded length bucket (``model`` tokenises) on each
    endpoint, so compilation stays out of every latency that is later compared. A bucket
    the endpoint's runner already served in this process (an earlier stage: shadow, then
    each canary step) is compiled already and is not served again. Returns requests
    served."""
    texts = model.one_text_per_bucket([r.text for r in requests])
    _, lengths = model.tokenize(texts)
    buckets = [bucket_length(int(n), DEFAULT_MAX_LENGTH) for n in lengths]
    served = 0
    for endpoint in endpoints:
        try:
            done = _WARMED.setdefault(endpoint.runner, set())
        except TypeError:  # a runner that cannot be weakly referenced: always warmed
            done = set()
        for text, bucket in zip(texts, buckets, strict=True):
            if bucket in done:
                continue
            _, _, error = endpoint.serve(text)
            if error is None:
                done.add(bucket)
            served += 1
    return served


def traffic_summary(result: TrafficResult) -> str:
    """One JSON line summarising a traffic result (for logs)."""
    return json.dumps({
        "stage": result.stage,
        "served_by_candidate": result.served_count("candidate"),
        "served_by_production": result.served_count("production"),
        "candidate_errors": result.errors("candidate"),
        "production_errors": result.errors("production"),
        "max_drift": max(result.drifts(), default=None),
    })
