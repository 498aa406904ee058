"""The preregistered canary plan: steps, per-step limits and the latency test.

Part of the thresholds schema (``gates.thresholds``); every field declares its looser
direction where it is defined (``gates.directions.limit``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import field_validator, model_validator

from gates.directions import Looser as L
from gates.directions import limit
from gates.schema_base import _KEY, _N, Finite, Name, _Strict


def smallest_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided p-value an exact Mann-Whitney U test can give with samples
    of ``n1`` and ``n2``: one ordering out of ``C(n1 + n2, n1)`` (1.0 when a side is empty).
    With 3 vs 3 it is 1/20 = 0.05, so a test at alpha = 0.05 can never reject."""
    if n1 < 1 or n2 < 1:
        return 1.0
    orderings = math.comb(n1 + n2, n1)
    # a float holds up to ~1e308; beyond it the p-value is 0 for every purpose here
    return 1.0 / orderings if orderings < 10**300 else 0.0


class CanaryStep(_Strict):
    """One canary step: a deterministic fraction of traffic routed to the candidate."""

    name: Name = limit(_N, why=_KEY)
    traffic_fraction: Finite = limit(L.ANY_CHANGE, gt=0, le=1)
    requests: int = limit(L.LOWER, gt=0, le=1_000_000,
                          description="Requests served during the step (both arms).")


class LatencyTest(_Strict):
    """Preregistered one-sided test "is the candidate slower than production?".

    ``scipy.stats.mannwhitneyu(candidate, production, alternative="greater")``; a step
    breaches when ``p < alpha`` and the median slowdown ratio is at least
    ``min_slowdown_ratio`` (practical significance, so a tiny but significant shift on
    many requests does not abort a rollout).
    """

    test: Literal["mannwhitneyu"] = limit(L.ANY_CHANGE, default="mannwhitneyu")
    alternative: Literal["greater"] = limit(L.ANY_CHANGE, default="greater")
    alpha: Finite = limit(L.LOWER, ge=1e-6, lt=0.5)
    min_slowdown_ratio: Finite = limit(L.HIGHER, default=1.0, ge=1.0, le=10.0)


class CanaryPlan(_Strict):
    """Steps and per-step failure limits watched during the canary."""

    steps: list[CanaryStep] = limit(L.FEWER, key="name", min_length=1)
    max_error_count: int = limit(L.HIGHER, ge=0)
    max_nan_count: int = limit(L.HIGHER, ge=0)
    max_output_drift: Finite = limit(
        L.HIGHER, gt=0, lt=1,
        description="Max rel. L2 between candidate and production embeddings, per request.")
    latency: LatencyTest = limit(L.NESTED)
    max_memory_growth_bytes: int = limit(L.HIGHER, ge=0, le=2**40)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        fractions = [s.traffic_fraction for s in steps]
        if fractions != sorted(set(fractions)):
            raise ValueError(f"canary traffic fractions must strictly increase, got {fractions}")
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ValueError(f"canary step names must be unique, got {names}")
        return steps

    @model_validator(mode="after")
    def _limits_and_power(self) -> CanaryPlan:
        fewest = min(s.requests for s in self.steps)
        for name in ("max_error_count", "max_nan_count"):
            if getattr(self, name) > fewest:
                raise ValueError(f"{name} ({getattr(self, name)}) exceeds the requests of the "
                                 f"smallest step ({fewest}): the limit could never be reached")
        for step in self.steps:
            n_candidate = math.floor(step.traffic_fraction * step.requests)
            # production's latencies are taken on the candidate's requests (mirrored)
            smallest = smallest_p_value(n_candidate, n_candidate)
            if smallest >= self.latency.alpha:
                raise ValueError(
                    f"canary step {step.name!r}: with about {n_candidate} candidate and "
                    f"{n_candidate} production latencies (the same requests) the smallest "
                    "one-sided Mann-Whitney "
                    f"p-value is {smallest:.3g}, never below alpha={self.latency.alpha:g}: the "
                    "latency test could never fire; serve more requests in the step")
        return self


