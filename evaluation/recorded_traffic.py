"""Recorded traffic: a deterministic request stream cut from documents (the shadow's and
canary's input), its content digest, and its split into stages.

The stream is data, recorded once per rollout and logged: the same documents and seed
give the same requests and the same digest, so a replay can be audited.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field


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
