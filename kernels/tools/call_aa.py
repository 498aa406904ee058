"""The A/A of one benchmark call: the registered kernel timed twice in the same interleaved
passes (``kernels.tools.variants`` times :data:`AA_VARIANT` last in each pass), the spread
between the two timings, and rows against a peer sorted by it.

Two timings of one kernel differ by the call's noise alone: the board's clock under its
power cap, the order within a pass. A difference between two kernels of the call smaller
than that spread is not read as one. Used by ``kernels.tools.grid_summary``; needs only the
standard library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

AA_VARIANT = "default-again"
"""The registered kernel timed a second time in the same passes (``kernels.tools.variants``
times it last in each pass): its ratio to ``default`` on each shape is the call's A/A, the
spread a difference between two kernels of the call has to exceed to be read as one. Not a
variant: the floor and goal are not judged for it."""


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values))


def a_a(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The call's A/A: on each shape where both ``default`` and :data:`AA_VARIANT` have a
    correct timed row, the twin's TFLOP/s over the default's (``ratios``), their geomean,
    and ``band``, the largest ``|log ratio|`` (``None`` with no pair). Two timings of one
    kernel differ by the call's noise alone (the board's clock under its power cap, the
    order within a pass), so ``exp(band)`` is the widest ratio that noise gave in this call.
    It is a calibrated yardstick, not a bound: where a peer is timed with the same noise
    and equals the kernel, its ratio's ``|log|`` and the ``n`` A/A pairs' are ``n + 1``
    exchangeable draws, so the row falls outside the band with probability ``1 / (n + 1)``
    (1/9 at eight rows: :func:`resolved`'s false-resolution rate).
    ``not_assessed`` names shapes with one of the pair missing, failed or incorrect."""
    def timed(name):
        return {r["shape"]: r for r in rows if r["variant"] == name
                and "tflops" in r and "error" not in r and r.get("correct")}

    base, twin = timed("default"), timed(AA_VARIANT)
    shapes = sorted({r["shape"] for r in rows if r["variant"] in ("default", AA_VARIANT)})
    ratios = {s: twin[s]["tflops"] / base[s]["tflops"] for s in shapes
              if s in base and s in twin}
    return {
        "ratios": ratios,
        "geomean": _geomean(list(ratios.values())) if ratios else None,
        "band": max(abs(math.log(r)) for r in ratios.values()) if ratios else None,
        "not_assessed": [s for s in shapes if s not in ratios],
    }


def resolved(ratios: dict[str, float], band: float | None) -> dict[str, list[str]] | None:
    """``ratios`` (shape -> ours over a peer) sorted against the call's A/A ``band``:
    ``ahead`` where ``log ratio > band``, ``behind`` where ``< -band``, ``within``
    otherwise (a difference that two timings of one kernel also showed). ``None`` without
    a band: the call timed no A/A, so no row is resolved either way."""
    if band is None:
        return None
    out: dict[str, list[str]] = {"ahead": [], "behind": [], "within": []}
    for shape, r in ratios.items():
        key = "ahead" if math.log(r) > band else "behind" if math.log(r) < -band else "within"
        out[key].append(shape)
    return out


def format_a_a(aa: dict[str, Any]) -> str:
    """The call's A/A (:func:`a_a`) in a few lines: each shape's ratio, geomean, band."""
    if not aa["ratios"]:
        return f"A/A ({AA_VARIANT} over default): not timed in this call"
    lines = [f"A/A ({AA_VARIANT} over default, the same kernel timed twice): geomean "
             f"{aa['geomean']:.3f}, widest +-{math.expm1(aa['band']):.1%}"]
    lines += [f"  {shape:<40} {r:.3f}" for shape, r in aa["ratios"].items()]
    lines += [f"  not assessed: {shape}" for shape in aa["not_assessed"]]
    return "\n".join(lines)
