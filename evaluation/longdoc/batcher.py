"""The length-bucketing batcher: which waiting documents run together, padded to what.

Each document is padded up to the smallest bucket that holds it (one compiled program
per bucket and row count instead of one per length). When the server is free, the
batcher takes the *oldest* waiting document's bucket (first come, first served across
buckets, so a long document is never starved by a stream of short ones) and fills the
batch with that bucket's waiting documents in arrival order, up to the most rows whose
padded tokens fit ``max_batch_tokens``; the rows are padded to a power of two (repeating
the last document, real work as a full batch would do) to bound recompilation, and the
padded rows count against the token budget.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from evaluation.longdoc.arrivals import Request
from evaluation.longdoc.spec import WorkloadSpec, max_rows


class Batch(NamedTuple):
    """One batch: its ``requests`` (arrival order), the padded sequence length ``bucket``
    and the padded row count ``rows`` (a power of two, ``>= len(requests)``)."""

    requests: tuple[Request, ...]
    bucket: int
    rows: int

    @property
    def padded_tokens(self) -> int:
        """Tokens the device processes (``rows * bucket``)."""
        return self.rows * self.bucket


def bucket_of(tokens: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``tokens``.

    Raises:
        ValueError: ``tokens`` < 1 or beyond the largest bucket.
    """
    i = bisect.bisect_left(buckets, tokens)
    if tokens < 1 or i == len(buckets):
        raise ValueError(f"a document of {tokens} tokens fits no bucket of {list(buckets)}")
    return buckets[i]


def next_batch(waiting: Sequence[Request], spec: WorkloadSpec) -> Batch:
    """The batch to run now from ``waiting`` (arrival order; see the module docstring).

    Raises:
        ValueError: nothing is waiting, or a document fits no bucket.
    """
    if not waiting:
        raise ValueError("no request is waiting")
    bucket = bucket_of(waiting[0].tokens, spec.buckets)
    limit = max_rows(spec, bucket)
    chosen = []
    for request in waiting:
        if bucket_of(request.tokens, spec.buckets) == bucket:
            chosen.append(request)
            if len(chosen) == limit:
                break
    rows = 1 << (len(chosen) - 1).bit_length()
    return Batch(tuple(chosen), bucket, rows)
