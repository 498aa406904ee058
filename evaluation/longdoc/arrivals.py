"""Open-loop arrivals of a workload: when each document arrives and how long it is.

Open loop: arrival times come from the process alone, never from the server's progress
(a closed loop, where the next request waits for the last answer, hides queueing: the
load drops exactly when the server slows down). Gaps are exponential at the declared
rate (a Poisson process); lengths follow the declared distribution. Both are drawn
from one ``numpy.random.Generator`` seeded by ``arrivals.seed``, so a spec names one
request stream: every kernel is served the same documents at the same times (paired).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evaluation.longdoc.spec import HistogramLengths, LogNormalLengths, WorkloadSpec


class Request(NamedTuple):
    """One document: ``id`` (its index in arrival order), ``arrival_s`` (seconds from the
    start of the stream) and ``tokens`` (its length, before padding)."""

    id: int
    arrival_s: float
    tokens: int


def draw_lengths(lengths: LogNormalLengths | HistogramLengths, n: int,
                 rng: np.random.Generator) -> np.ndarray:
    """``n`` document lengths (int64 tokens, within ``[min_tokens, max_tokens]``)."""
    if isinstance(lengths, LogNormalLengths):
        raw = np.exp(np.log(lengths.median_tokens) + lengths.sigma * rng.standard_normal(n))
        out = np.rint(raw)
    else:
        weights = np.array([b.weight for b in lengths.bins], dtype=np.float64)
        which = rng.choice(len(weights), size=n, p=weights / weights.sum())
        low = np.array([b.low for b in lengths.bins])[which]
        high = np.array([b.high for b in lengths.bins])[which]
        out = rng.integers(low, high + 1)
    return np.clip(out, lengths.min_tokens, lengths.max_tokens).astype(np.int64)


def draw_requests(spec: WorkloadSpec, *, rate_per_s: float | None = None) -> list[Request]:
    """The spec's request stream, in arrival order (deterministic given the spec).

    Args:
        spec: the workload.
        rate_per_s: override of ``spec.arrivals.rate_per_s`` (requests/s, > 0): the same
            gaps scaled, the same lengths (for calibrating a rate to a device).

    Raises:
        ValueError: a rate that is not positive and finite.
    """
    rate = spec.arrivals.rate_per_s if rate_per_s is None else rate_per_s
    if not (rate > 0 and np.isfinite(rate)):
        raise ValueError(f"rate_per_s must be positive and finite, got {rate}")
    rng = np.random.default_rng(spec.arrivals.seed)
    n = spec.arrivals.requests
    gaps = rng.standard_exponential(n)  # unit rate; scaled below so a rate change keeps them
    lengths = draw_lengths(spec.lengths, n, rng)
    times = np.cumsum(gaps) / rate
    return [Request(i, float(t), int(x)) for i, (t, x) in enumerate(zip(times, lengths,
                                                                        strict=True))]
