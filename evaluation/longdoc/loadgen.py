"""The open-loop load generator: a discrete-event replay of the arrivals on one server.

Clock. The clock is simulated, driven by measured service times: arrivals come from the
seeded process (``evaluation.longdoc.arrivals``), one server runs one batch at a time
(work-conserving: as soon as it is free and something waits, the batcher picks the next
batch), and each batch's service time is whatever ``serve(batch)`` reports. With the
real server (``evaluation.longdoc.server``) that is the batch measured for real on the
device (host-to-device copy, the forward, ``block_until_ready``). So a request's

    queue time   = its batch's start - its arrival
    compute time = its batch's service time
    time to result = queue + compute

are exact functions of measured service times and the declared arrivals, and do not
depend on how fast the host replays them (nor on compiles, which happen outside the
measured time; the server reports them apart). What this leaves out, and says so: the
host's own overhead between batches (batch formation and dispatch in a real server)
and any overlap of the next batch's host work with the current one's device work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from evaluation.longdoc.arrivals import Request
from evaluation.longdoc.batcher import Batch, bucket_of, next_batch
from evaluation.longdoc.spec import WorkloadSpec


class BatchOutcome(NamedTuple):
    """What serving one batch gave: ``service_s`` (seconds, measured), ``finite`` (per
    request of the batch, whether its output is all finite; ``None`` on an error) and
    ``error`` (the exception's text, or ``None``)."""

    service_s: float
    finite: tuple[bool, ...] | None = None
    error: str | None = None


ServeFn = Callable[[Batch], BatchOutcome]
"""``serve(batch) -> BatchOutcome``: runs one batch (or, in tests, says how long it took)."""


class RequestRecord(BaseModel):
    """One request as served (seconds from the stream's start; tokens unpadded)."""

    model_config = ConfigDict(frozen=True)

    id: int
    arrival_s: float
    tokens: int
    bucket: int
    batch: int = Field(description="index of its batch in the trace")
    start_s: float
    queue_s: float
    compute_s: float
    time_to_result_s: float
    ok: bool = Field(description="its batch raised no error")
    finite: bool | None = Field(description="output all finite (None on an error)")
    error: str | None = None


class BatchRecord(BaseModel):
    """One batch as served: its bucket, padded rows, request ids, start and service time."""

    model_config = ConfigDict(frozen=True)

    index: int
    bucket: int
    rows: int
    request_ids: list[int]
    start_s: float
    service_s: float
    error: str | None = None


class Trace(BaseModel):
    """Every request (by id) and every batch (in service order) of one replay."""

    requests: list[RequestRecord]
    batches: list[BatchRecord]


def replay(requests: Sequence[Request], spec: WorkloadSpec, serve: ServeFn) -> Trace:
    """Serve ``requests`` (arrival order) through the batcher on one simulated server.

    Args:
        requests: the stream (``draw_requests``), sorted by ``arrival_s``.
        spec: buckets and token budget.
        serve: runs a batch and reports its service time (see :data:`ServeFn`).

    Returns:
        :class:`Trace`, requests sorted by id.

    Raises:
        ValueError: requests out of arrival order, a document that fits no bucket, or a
            service time that is negative or not finite.
    """
    if any(b.arrival_s < a.arrival_s for a, b in zip(requests, requests[1:], strict=False)):
        raise ValueError("requests must be sorted by arrival_s")
    for r in requests:
        bucket_of(r.tokens, spec.buckets)  # refuse before serving anything
    records: dict[int, RequestRecord] = {}
    batches: list[BatchRecord] = []
    clock, nxt, waiting = 0.0, 0, []
    while nxt < len(requests) or waiting:
        if not waiting and requests[nxt].arrival_s > clock:
            clock = requests[nxt].arrival_s
        while nxt < len(requests) and requests[nxt].arrival_s <= clock:
            waiting.append(requests[nxt])
            nxt += 1
        batch = next_batch(waiting, spec)
        outcome = serve(batch)
        s = outcome.service_s
        if not (s >= 0 and math.isfinite(s)):
            raise ValueError(f"service time must be finite and >= 0 s, got {s}")
        chosen = {r.id for r in batch.requests}
        waiting = [r for r in waiting if r.id not in chosen]
        index = len(batches)
        batches.append(BatchRecord(index=index, bucket=batch.bucket, rows=batch.rows,
                                   request_ids=[r.id for r in batch.requests], start_s=clock,
                                   service_s=s, error=outcome.error))
        for j, r in enumerate(batch.requests):
            finite = None if outcome.finite is None else bool(outcome.finite[j])
            records[r.id] = RequestRecord(
                id=r.id, arrival_s=r.arrival_s, tokens=r.tokens, bucket=batch.bucket,
                batch=index, start_s=clock, queue_s=clock - r.arrival_s, compute_s=s,
                time_to_result_s=clock - r.arrival_s + s, ok=outcome.error is None,
                finite=finite, error=outcome.error)
        clock += s
    return Trace(requests=[records[i] for i in sorted(records)], batches=batches)
