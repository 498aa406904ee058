"""The adoption decision as a picture (PNG): each required length bucket's effect (or the
pooled effect of a registration without buckets) as its median ``candidate / baseline``
request ratio with its confidence sequence at the deciding look, against the line of no
effect (1.0) and the registration's minimum worthwhile ratio, on a log axis.

Made with ``matplotlib.figure.Figure``, no ``pyplot`` (as ``evaluation.plots``). An
unbounded side of an interval is drawn to the axis edge with an arrow; a bucket with
too few pairs to judge is drawn as a row saying so, never as a point (the median of its
few pairs is no finding).
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, ScalarFormatter

from gates.adoption_decision import AdoptionVerdict

STATUS_COLORS = {"adopt": "tab:green", "adopted": "tab:green", "not_worth_it": "tab:gray",
                 "inconclusive": "tab:orange", "continue": "tab:orange",
                 "not_assessed": "tab:red", "unsafe": "tab:red"}


def _minor_label(low: float, high: float):
    """Labels of the log axis's minor ticks: every one within a decade; over a wider span
    only 2, 3 and 5 of each decade, so that neighbouring labels never overlap."""
    def label(x: float, _pos) -> str:
        if high / low < 10 or x <= 0:
            return f"{x:g}"
        mantissa = round(x / 10 ** math.floor(math.log10(x) + 1e-9), 6)
        return f"{x:g}" if mantissa in (2, 3, 5) else ""
    return label


def _rows(verdict: AdoptionVerdict) -> list[tuple[str, str, float | None, float | None,
                                                  float | None]]:
    """(label, status, median, lower, upper) per bucket; one pooled row without buckets."""
    if verdict.buckets:
        return [(f"{b.bucket} tokens ({b.n_pairs} pairs)", b.status, b.median_ratio,
                 b.ratio_lower, b.ratio_upper) for b in verdict.buckets]
    return [(f"all requests ({verdict.n_pairs} pairs)", verdict.outcome, verdict.median_ratio,
             verdict.ratio_lower, verdict.ratio_upper)]


def plot_adoption(verdict: AdoptionVerdict, minimum_worthwhile_ratio: float,
                  path: str | Path) -> Path:
    """Write the per-bucket effect plot of ``verdict`` to ``path`` (PNG); returns it.

    Args:
        verdict: the rollout's adoption decision (``gates.adoption_decision``).
        minimum_worthwhile_ratio: the registration's ``decision.minimum_worthwhile_ratio``.
        path: the PNG to write (its folder is made).
    """
    rows = _rows(verdict)
    finite = [x for _, _, m, lo, hi in rows for x in (m, lo, hi)
              if x is not None and math.isfinite(x) and x > 0]
    low = min([*finite, minimum_worthwhile_ratio, 1.0]) / 1.25
    high = max([*finite, minimum_worthwhile_ratio, 1.0]) * 1.25
    fig = Figure(figsize=(8, 1.2 + 0.55 * len(rows)))
    ax = fig.subplots()
    for y, (_, status, median, lower, upper) in enumerate(rows):
        color = STATUS_COLORS.get(status, "black")
        if median is None or status == "not_assessed":  # too few pairs: no effect to draw
            ax.text(math.sqrt(low * high), y, f"{status.replace('_', ' ')}: no effect "
                    "judged", ha="center", va="center", color=color)
            continue
        lo = low if lower is None or not math.isfinite(lower) or lower <= 0 else lower
        hi = high if upper is None or not math.isfinite(upper) else upper
        ax.plot([lo, hi], [y, y], color=color, linewidth=2)
        if hi == high:
            ax.plot([hi], [y], marker=">", color=color)
        ax.plot([median], [y], marker="o", color=color, markersize=8,
                label=status.replace("_", " "))
        ax.annotate(f"{median:.3f}  {status.replace('_', ' ')}", (median, y),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="no effect (1.0)")
    ax.axvline(minimum_worthwhile_ratio, color="tab:green", linestyle=":", linewidth=1.5,
               label=f"worthwhile below {minimum_worthwhile_ratio:g}")
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(FuncFormatter(_minor_label(low, high)))
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"median request ratio candidate / {verdict.against} (log; < 1 faster), "
                  "confidence sequence at the deciding look")
    ax.set_title(f"adoption: {verdict.outcome.replace('_', ' ')}")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # no date in the file: the same decision makes the same bytes
    fig.savefig(out, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return out
