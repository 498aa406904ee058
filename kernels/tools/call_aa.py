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
import statistics
from collections.abc import Sequence
from typing import Any

FLOOR_READINGS = 16
"""The FA3 floor reads every head_dim-128 row (8) in each of two consecutive calls."""
AA_VARIANT = "default-again"
"""The registered kernel timed a second time in the same passes (``kernels.tools.variants``
times it last in each pass): its ratio to ``default`` on each shape is the call's A/A, the
spread a difference between two kernels of the call has to exceed to be read as one. Not a
variant: the floor and goal are not judged for it."""


def a_a(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The call's A/A over ``rows``: on each shape where both ``default`` and
    :data:`AA_VARIANT` have a correct row with a finite positive TFLOP/s, the twin's
    TFLOP/s over the default's (``ratios``), their number ``pairs``, geomean, ``lowest``
    and ``highest``, and ``band``, the largest ``|log ratio|`` (``None`` with no pair).
    ``twin_timed`` says whether the call timed the twin at all; ``not_assessed`` names the
    shapes with one of the pair missing, failed, incorrect or not a finite positive rate.

    Two timings of one kernel differ by the call's noise alone (the board's clock under
    its power cap, the order within a pass: the twin runs last, so a position effect
    shows as a geomean away from 1), so ``exp(band)`` is the widest ratio that noise gave
    in this call. A yardstick, not a bound: where a peer equal to the kernel is timed with
    the same noise on every shape, its ratio's ``|log|`` and the ``n`` pairs' are ``n + 1``
    exchangeable draws, and a row falls outside the band with probability ``1 / (n + 1)``
    (1/9 at eight rows). Where the noise differs between shapes (wider at 16k than at 4k),
    that is the average over rows: a noisy row is resolved more often, a quiet one less.
    Pass only the rows of the shapes the band is for (``grid_summary`` passes the FA3
    rows' shapes)."""
    def timed(name):
        return {r["shape"]: r for r in rows if r["variant"] == name and "error" not in r
                and r.get("correct") and _rate(r) is not None}

    base, twin = timed("default"), timed(AA_VARIANT)
    twin_timed = any(r["variant"] == AA_VARIANT for r in rows)
    shapes = sorted({r["shape"] for r in rows if r["variant"] in ("default", AA_VARIANT)})
    ratios = {s: twin[s]["tflops"] / base[s]["tflops"] for s in shapes
              if s in base and s in twin}
    return {
        "ratios": ratios,
        "pairs": len(ratios),
        "geomean": statistics.geometric_mean(ratios.values()) if ratios else None,
        "lowest": min(ratios.values()) if ratios else None,
        "highest": max(ratios.values()) if ratios else None,
        "band": max(abs(math.log(r)) for r in ratios.values()) if ratios else None,
        "log_sd": statistics.stdev(math.log(r) for r in ratios.values())
        if len(ratios) >= 2 else None,
        "twin_timed": twin_timed,
        "not_assessed": [s for s in shapes if s not in ratios] if twin_timed else [],
    }


def floor_lead(log_sd: float, readings: int = FLOOR_READINGS,
               probability: float = 0.9) -> float:
    """The true lead (as a log ratio) a kernel needs on every row for ``readings`` noisy
    readings, each with normal noise of ``log_sd`` in log, all to clear 1.0 together with
    ``probability``: each must clear it with ``probability ** (1 / readings)``, so the lead
    is that quantile of the standard normal times ``log_sd``. The readings are taken as
    independent; a ratio to a peer carries about the A/A's noise (two kernels timed alike).

    Raises:
        ValueError: ``log_sd`` negative, ``readings`` < 1, ``probability`` outside (0, 1).
    """
    if log_sd < 0 or readings < 1 or not 0 < probability < 1:
        raise ValueError(f"floor_lead needs log_sd >= 0, readings >= 1 and 0 < probability "
                         f"< 1, got {log_sd}, {readings}, {probability}")
    return statistics.NormalDist().inv_cdf(probability ** (1 / readings)) * log_sd


def _rate(row: dict[str, Any]) -> float | None:
    """The row's TFLOP/s where it is a finite positive number, else ``None``."""
    x = row.get("tflops")
    return x if isinstance(x, (int, float)) and math.isfinite(x) and x > 0 else None


def resolved(ratios: dict[str, float], band: float | None) -> dict[str, list[str]] | None:
    """``ratios`` (shape -> ours over a peer) sorted against the call's A/A ``band``:
    ``ahead`` where ``log ratio > band``, ``behind`` where ``< -band``, ``within``
    otherwise (a difference that two timings of one kernel also showed). ``None`` without
    a band (no A/A pair was timed and assessable): no row is resolved either way."""
    if band is None:
        return None
    out: dict[str, list[str]] = {"ahead": [], "behind": [], "within": []}
    for shape, r in ratios.items():
        key = "ahead" if math.log(r) > band else "behind" if math.log(r) < -band else "within"
        out[key].append(shape)
    return out


def format_a_a(aa: dict[str, Any]) -> str:
    """The call's A/A (:func:`a_a`) in a few lines: its pairs, geomean and range, each
    shape's ratio and what was not assessed."""
    if not aa["ratios"]:
        head = (f"A/A ({AA_VARIANT} over default): timed, but no shape assessable"
                if aa["twin_timed"] else f"A/A ({AA_VARIANT} over default): not timed in this call")
        return "\n".join([head] + [f"  not assessed: {s}" for s in aa["not_assessed"]
                                   if aa["twin_timed"]])
    lines = [f"A/A ({AA_VARIANT} over default, the same kernel timed twice): {aa['pairs']} "
             f"pairs, geomean {aa['geomean']:.3f}, range [{aa['lowest']:.3f}, "
             f"{aa['highest']:.3f}], band +-{aa['band']:.3f} in log"]
    if aa["log_sd"] is not None:
        lead = math.expm1(floor_lead(aa["log_sd"]))
        lines.append(f"  noise {aa['log_sd']:.4f} in log: the floor's {FLOOR_READINGS} row "
                     f"readings all >= 1.0 with probability 0.9 need a true lead of "
                     f"{lead:.1%} on every row")
    lines += [f"  {shape:<40} {r:.3f}" for shape, r in aa["ratios"].items()]
    lines += [f"  not assessed: {shape}" for shape in aa["not_assessed"]]
    return "\n".join(lines)
