"""The figures users decide by, from one replay: per request, per length bucket, overall.

Definitions (seconds, tokens, documents; every figure computable by hand from a trace):

* **Steady state.** The first ``arrivals.warmup_requests`` requests (by arrival) are
  served but left out of the latency percentiles; rates are counted over the *window*
  from the first steady request's arrival to the last request's arrival (after it no
  load arrives and the queue only drains, which is not steady state).
* **Time to result** = queue + compute per request; p50/p95/p99 are nearest-rank
  percentiles (the ``ceil(q n)``-th smallest: always an observed value) over the steady
  requests.
* **documents/s, tokens/s**: requests (any, warm-up included) served without error
  whose result came within the window, and their unpadded tokens, per second of window.
  **Goodput**: those of them that were finite and within the SLO, per second; **SLO
  attainment**: the
  share of steady requests served finite within the SLO.
* **Device busy fraction**: seconds of batch service inside the window over the
  window's length (per bucket: that bucket's share).
* **Cost per 1,000 documents**: device-seconds spent on batches (padding included) per
  document served without error, times ``price_per_device_hour / 3600``, times 1,000:
  what the documents cost at the device's price (an idle device is not charged to
  them; the busy fraction says how full it was).
* **Memory**: ``device_peak_bytes`` where the runtime reports one (a GPU:
  ``peak_bytes_in_use``; process-wide since start, so a second kernel in one process
  sees the first's peak too), ``None`` on a CPU host, said in ``memory_note``;
  ``compiled_peak_bytes``: the largest compiled batch program's memory per XLA's memory
  analysis (every backend, per kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field

from evaluation.longdoc.loadgen import BatchRecord, RequestRecord, Trace
from evaluation.longdoc.spec import WorkloadSpec


class Figures(BaseModel):
    """The figures of one group of requests (a bucket, or all); ``None`` where the group
    has no steady request or the window is empty."""

    requests: int = Field(description="steady requests in the group")
    p50_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    queue_p50_s: float | None = None
    compute_p50_s: float | None = None
    docs_per_s: float | None = None
    tokens_per_s: float | None = None
    goodput_docs_per_s: float | None = None
    slo_attainment: float | None = None
    busy_fraction: float | None = None
    errors: int = 0
    non_finite: int = 0
    device_s: float = Field(0.0, description="batch service seconds (all requests)")
    cost_per_1000_docs: float | None = None


class LongdocReport(BaseModel):
    """One serving run of one workload with one attention implementation."""

    workload: str
    workload_sha256: str | None = None
    implementation: str
    device: str
    weights_sha256: str | None = None
    rate_per_s: float
    slo_s: float
    window_s: float
    overall: Figures
    buckets: dict[int, Figures]
    device_peak_bytes: int | None = None
    compiled_peak_bytes: int | None = None
    memory_note: str = ""
    compile_s: float = Field(0.0, description="compiles, outside every measured time")
    trace: Trace


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ``ceil(q n)``-th smallest of ``values`` (``q`` in (0, 1]); ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def _overlap(batch: BatchRecord, start: float, end: float) -> float:
    return max(0.0, min(batch.start_s + batch.service_s, end) - max(batch.start_s, start))


def figures(records: Sequence[RequestRecord], batches: Sequence[BatchRecord],
            steady_ids: set[int], window: tuple[float, float], spec: WorkloadSpec
            ) -> Figures:
    """The :class:`Figures` of ``records`` (one group) served by ``batches`` (the
    group's batches) over ``window`` (start, end seconds); see the module docstring."""
    start, end = window
    length = end - start
    steady = [r for r in records if r.id in steady_ids]
    ttr = [r.time_to_result_s for r in steady]
    done = [r for r in records
            if r.ok and start <= r.time_to_result_s + r.arrival_s <= end]
    good = [r for r in done if r.finite and r.time_to_result_s <= spec.slo_s]
    ok = [r for r in records if r.ok]
    device_s = sum(b.service_s for b in batches)
    rate = (lambda x: x / length) if length > 0 else (lambda x: None)
    cost = (device_s / len(ok) * 1000.0 * spec.price_per_device_hour / 3600.0) if ok else None
    return Figures(
        requests=len(steady), p50_s=nearest_rank(ttr, 0.50), p95_s=nearest_rank(ttr, 0.95),
        p99_s=nearest_rank(ttr, 0.99),
        queue_p50_s=nearest_rank([r.queue_s for r in steady], 0.5),
        compute_p50_s=nearest_rank([r.compute_s for r in steady], 0.5),
        docs_per_s=rate(len(done)), tokens_per_s=rate(sum(r.tokens for r in done)),
        goodput_docs_per_s=rate(len(good)),
        slo_attainment=(sum(1 for r in steady if r.ok and r.finite
                            and r.time_to_result_s <= spec.slo_s) / len(steady)
                        if steady else None),
        busy_fraction=rate(sum(_overlap(b, start, end) for b in batches)),
        errors=sum(1 for r in records if not r.ok),
        non_finite=sum(1 for r in records if r.ok and r.finite is False),
        device_s=device_s, cost_per_1000_docs=cost)


def summarise(trace: Trace, spec: WorkloadSpec, *, implementation: str, device: str,
              rate_per_s: float | None = None, **extra) -> LongdocReport:
    """The report of one replay: overall and per-bucket :class:`Figures`.

    Args:
        trace: the replay (``loadgen.replay``).
        spec: the workload (SLO, price, warm-up count).
        implementation, device: what served it (names, for the report).
        rate_per_s: the arrival rate used, if not the spec's.
        extra: further :class:`LongdocReport` fields (weights_sha256, memory, compile_s).

    Raises:
        ValueError: an empty trace.
    """
    if not trace.requests:
        raise ValueError("the trace has no request")
    by_arrival = sorted(trace.requests, key=lambda r: (r.arrival_s, r.id))
    warm = spec.arrivals.warmup_requests
    if warm >= len(by_arrival):
        raise ValueError(f"warmup_requests ({warm}) leaves no steady request of "
                         f"{len(by_arrival)}")
    steady_ids = {r.id for r in by_arrival[warm:]}
    window = (by_arrival[warm].arrival_s, by_arrival[-1].arrival_s)
    buckets = {}
    for bucket in sorted({r.bucket for r in trace.requests}):
        buckets[bucket] = figures([r for r in trace.requests if r.bucket == bucket],
                                  [b for b in trace.batches if b.bucket == bucket],
                                  steady_ids, window, spec)
    return LongdocReport(
        workload=spec.name, implementation=implementation, device=device,
        rate_per_s=spec.arrivals.rate_per_s if rate_per_s is None else rate_per_s,
        slo_s=spec.slo_s, window_s=window[1] - window[0],
        overall=figures(trace.requests, trace.batches, steady_ids, window, spec),
        buckets=buckets, trace=trace, **extra)
