"""Plots of an evaluation (matplotlib's object-oriented API, PNG files).

Figures are made with ``matplotlib.figure.Figure`` directly, not ``pyplot``: a file-only
figure needs no GUI backend and no global figure registry (nothing to close).

* error by category: relative L2 error per case, one box and the individual cases per
  category, for each implementation, on a log axis;
* latency distribution: one box per implementation per benchmark shape, in seconds;
* speedup against sequence length: naive p50 / implementation p50 per shape.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from evaluation.accuracy import AGGREGATE_CATEGORIES, AccuracyResult
from evaluation.performance import PerformanceResult

COLORS = {"candidate": "tab:blue", "baseline": "tab:orange", "production": "tab:green"}
_TINY = 1e-12  # stands in for an exact (0) error on the log axis
_DTYPE_MARKERS = {"float32": "o", "bfloat16": "s", "float16": "^"}


def _color(role: str, i: int) -> str:
    return COLORS.get(role, f"C{i + 3}")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_error_by_category(accuracy: dict[str, AccuracyResult], path: str | Path, *,
                           threshold: float | None = None, title_suffix: str = "") -> Path:
    """Relative L2 error vs the float64 reference, per category and implementation.

    Args:
        accuracy: role -> result (e.g. candidate, baseline, production).
        path: PNG to write.
        threshold: optional horizontal line (e.g. a preregistered max_rel_error).

    Marker shape gives the dtype; cases that raised or returned non-finite values are
    red crosses at the top of the axis.
    """
    cats = list(AGGREGATE_CATEGORIES)
    roles = list(accuracy)
    width = 0.8 / max(len(roles), 1)
    fig = Figure(figsize=(max(7.0, 2.4 * len(cats)), 4.8))
    ax = fig.subplots()
    rng = np.random.default_rng(0)  # jitter only
    finite_all = [r.rel_error for a in accuracy.values() for r in a.cases if np.isfinite(r.rel_error)]
    top = max(finite_all + [threshold or 0.0, _TINY]) * 10
    for i, role in enumerate(roles):
        color = _color(role, i)
        for j, cat in enumerate(cats):
            rows = [r for r in accuracy[role].cases if cat == "all" or r.category == cat]
            if not rows:
                continue
            x = j + (i - (len(roles) - 1) / 2) * width
            errs = np.array([r.rel_error for r in rows], dtype=float)
            finite = np.isfinite(errs)
            if finite.any():
                ax.boxplot(np.maximum(errs[finite], _TINY), positions=[x], widths=width * 0.8,
                           showfliers=False, whis=(0, 100), patch_artist=True,
                           boxprops=dict(facecolor=color, alpha=0.2), medianprops=dict(color=color))
            for dtype, marker in _DTYPE_MARKERS.items():
                sel = finite & np.array([r.dtype == dtype for r in rows])
                ax.scatter(x + rng.uniform(-width / 4, width / 4, sel.sum()),
                           np.maximum(errs[sel], _TINY), s=14, marker=marker, color=color,
                           alpha=0.85, zorder=3)
            if (~finite).any():
                ax.scatter([x] * int((~finite).sum()), [top] * int((~finite).sum()), marker="x",
                           s=40, color="red", zorder=4)
        ax.scatter([], [], marker="s", s=40, color=color, alpha=0.6, label=role)
    for dtype, marker in _DTYPE_MARKERS.items():
        ax.scatter([], [], marker=marker, color="grey", label=dtype)
    if any(not np.isfinite(r.rel_error) for a in accuracy.values() for r in a.cases):
        ax.scatter([], [], marker="x", color="red", label="raised / non-finite")
    if threshold is not None:
        ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(cats)))
    n = {c: next(iter(accuracy.values())).categories[c].n_cases for c in cats} if accuracy else {}
    ax.set_xticklabels([f"{c}\n(n={n.get(c, 0)})" for c in cats])
    ax.set_ylabel("relative L2 error vs float64 (dimensionless)")
    ax.set_xlabel(f"test-case category (boxes: min-quartiles-max; exact results drawn at {_TINY:g})")
    ax.set_title(f"Attention error by test-case category{title_suffix}")
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _save(fig, Path(path))


def plot_latency_distribution(perf: PerformanceResult, path: str | Path) -> Path:
    """Latency per call (seconds, log axis): a box per implementation for each shape."""
    roles = sorted({r for s in perf.shapes for r in s.implementations},
                   key=lambda r: (list(COLORS).index(r) if r in COLORS else 9, r))
    width = 0.8 / max(len(roles), 1)
    fig = Figure(figsize=(max(6.0, 1.8 * len(perf.shapes) + 2), 4.8))
    ax = fig.subplots()
    for i, role in enumerate(roles):
        color = _color(role, i)
        for j, shape in enumerate(perf.shapes):
            run = shape.implementations.get(role)
            if run is None or not run.latencies_s:
                continue
            ax.boxplot(run.latencies_s, positions=[j + (i - (len(roles) - 1) / 2) * width],
                       widths=width * 0.8, patch_artist=True, whis=(1, 99),
                       boxprops=dict(facecolor=color, alpha=0.4), medianprops=dict(color="black"),
                       flierprops=dict(markersize=3, markeredgecolor=color))
        ax.plot([], [], color=color, linewidth=8, alpha=0.4, label=role)
    ax.set_yscale("log")
    ax.set_xticks(range(len(perf.shapes)))
    ax.set_xticklabels([s.shape.label.replace(" ", "\n", 2) for s in perf.shapes], fontsize=7)
    ax.set_ylabel("latency per call (s)")
    ax.set_xlabel("benchmark shape (whiskers: p1-p99)")
    ax.set_title(f"Attention latency, {perf.repeats} interleaved repeats on {perf.device_kind}")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, Path(path))


def plot_speedup_vs_seq_len(perf: PerformanceResult, path: str | Path) -> Path:
    """Speedup (naive p50 / implementation p50) against kv sequence length, one line per
    implementation and shape family (head_dim, dtype, causal, heads)."""
    series: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for s in perf.shapes:
        sh = s.shape
        family = (f"d{sh.head_dim} {sh.dtype} h{sh.num_heads}/{sh.num_kv_heads}"
                  + (" causal" if sh.causal else ""))
        for role, speedup in s.speedup_vs_baseline.items():
            if role != perf.baseline:
                series[(role, family)].append((sh.kv_len, speedup))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    markers = "osD^v<>"
    families = sorted({f for _, f in series})
    roles = sorted({r for r, _ in series})
    for (role, family), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[families.index(family) % 7],
                color=_color(role, roles.index(role)), label=f"{role}: {family}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label=f"{perf.baseline} (1x)")
    ax.set_xscale("log", base=2)
    # Speedups span orders of magnitude (an interpreted kernel is ~0.01x, a native one
    # several x): a log axis keeps both readable around the 1x line.
    ax.set_yscale("log")
    lengths = sorted({s.shape.kv_len for s in perf.shapes})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_xlabel("kv sequence length (tokens)")
    ax.set_ylabel(f"speedup over {perf.baseline} at p50 (x)")
    ax.set_title(f"Speedup against sequence length on {perf.device_kind}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, Path(path))


def write_plots(accuracy: dict[str, AccuracyResult], perf: PerformanceResult | None,
                out_dir: str | Path, *, threshold: float | None = None) -> list[Path]:
    """Write every plot that has data under ``out_dir``; returns the PNG paths."""
    out_dir = Path(out_dir)
    paths = []
    if accuracy:
        paths.append(plot_error_by_category(accuracy, out_dir / "error_by_category.png",
                                            threshold=threshold))
    if perf is not None and perf.shapes:
        paths.append(plot_latency_distribution(perf, out_dir / "latency_distribution.png"))
        paths.append(plot_speedup_vs_seq_len(perf, out_dir / "speedup_vs_seq_len.png"))
    return paths
