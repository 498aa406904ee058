"""Plots of a long-document comparison (``evaluation.longdoc.bench``'s result), PNG files.

Made with ``matplotlib.figure.Figure``, no ``pyplot`` (as ``evaluation.plots``):

* time to result: per kernel, the empirical distribution (ECDF) over the steady requests
  of time to result, queue time and compute time, on a log axis. Each curve counts the
  requests with a result by time *t* over *all* steady requests, so a kernel that failed
  requests tops out below 1 (an error is never a result); queue times of 0 (a request
  that found the server idle) are drawn at :data:`FLOOR`.
* per-bucket effect: per length bucket and overall, the median per-request ratio
  candidate / baseline of time to result and of compute, with its interval
  (``evaluation.longdoc.effect``); each bucket names its pairs and the requests a kernel
  failed (left out of the ratio).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from evaluation.longdoc.bench import BenchResult
from evaluation.longdoc.effect import METRICS, Effect, effects, steady_requests
from evaluation.longdoc.report import nearest_rank

FLOOR = 1e-4
"""Seconds: where a time of exactly 0 is drawn on the log axis."""
ROLE_COLORS = ("tab:orange", "tab:blue")  # baseline, candidate (evaluation.plots' colors)
METRIC_STYLE = {"time_to_result": ("o", "time to result (queue + compute)"),
                "compute": ("s", "compute")}


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # no date in the file: the same result makes the same bytes (committed figures)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def _ms(x: float | None) -> str:
    return "-" if x is None else "never" if x == float("inf") else f"{x * 1e3:.0f} ms"


def plot_time_to_result(result: BenchResult, path: str | Path) -> Path:
    """ECDFs of time to result, queue and compute per kernel (see the module docstring)."""
    fig = Figure(figsize=(13, 4.2))
    axes = fig.subplots(1, 3, sharey=True)
    fields = (("time_to_result_s", "time to result = queue + compute (s)"),
              ("queue_s", f"queue (s; 0 drawn at {FLOOR:g})"), ("compute_s", "compute (s)"))
    for i, name in enumerate(result.kernels):
        report = result.reports[name]
        steady = steady_requests(report)
        served = [r for r in steady if r.ok and r.finite]
        # a failed request never gets a result: infinite here (the report's percentiles
        # count its time to the error instead)
        ttr = [r.time_to_result_s if r.ok and r.finite else float("inf") for r in steady]
        label = (f"{name}: p50 {_ms(nearest_rank(ttr, 0.5))}, p99 "
                 f"{_ms(nearest_rank(ttr, 0.99))}, {len(steady) - len(served)} of "
                 f"{len(steady)} failed")
        for ax, (field, _) in zip(axes, fields, strict=True):
            values = np.sort(np.maximum([getattr(r, field) for r in served], FLOOR))
            share = np.arange(1, len(values) + 1) / max(len(steady), 1)
            ax.step(values, share, where="post", color=ROLE_COLORS[i % 2],
                    label=label if field == "time_to_result_s" else None)
    slo = result.baseline.slo_s
    axes[0].axvline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    for ax, (_, xlabel) in zip(axes, fields, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("share of steady requests with a result by then")
    axes[0].set_ylim(0, 1.02)
    fig.legend(loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.06),
               frameon=False)
    b = result.baseline
    fig.suptitle(f"{result.workload} on {b.device}: {b.overall.requests} steady requests, "
                 f"Poisson arrivals at {b.rate_per_s:g}/s, one server")
    return _save(fig, Path(path))


def _minor_label(v: float, _pos) -> str:
    """Minor log ticks labelled at 2, 3 and 5 times a power of ten only."""
    lead = v / 10 ** np.floor(np.log10(v)) if v > 0 else 0
    return f"{v:.2g}" if round(lead) in (2, 3, 5) and abs(lead - round(lead)) < 1e-6 else ""


def _group_label(group: str, found: list[Effect]) -> str:
    first = found[0]
    text = f"{group}\nn={first.pairs}"
    return text + (f"\n{first.excluded} failed" if first.excluded else "")


def _failed_all(result: BenchResult, group: str) -> list[str]:
    """The kernels that failed every steady request of ``group``."""
    names = []
    for name in result.kernels:
        rows = [r for r in steady_requests(result.reports[name])
                if group == "all" or r.bucket == int(group)]
        if rows and not any(r.ok and r.finite for r in rows):
            names.append(name)
    return names or ["a kernel"]


def plot_bucket_effect(result: BenchResult, found: list[Effect], path: str | Path) -> Path:
    """Per bucket and overall: the median per-request ratio candidate / baseline of time to
    result and of compute, with its interval, on a log axis around 1."""
    groups = list(dict.fromkeys(e.group for e in found if e.group != "all")) + ["all"]
    fig = Figure(figsize=(max(7.0, 1.2 * len(groups) + 2), 4.6))
    ax = fig.subplots()
    offsets = np.linspace(-0.12, 0.12, len(METRICS))
    for offset, metric in zip(offsets, METRICS, strict=True):
        marker, label = METRIC_STYLE[metric]
        for j, group in enumerate(groups):
            e = next(x for x in found if x.group == group and x.metric == metric)
            if e.ratio is None:
                continue
            if e.low is not None:
                ax.errorbar([j + offset], [e.ratio], yerr=[[e.ratio - e.low], [e.high - e.ratio]],
                            fmt=marker, color="tab:blue" if metric == "compute" else "black",
                            capsize=3, markersize=5)
            else:
                ax.plot([j + offset], [e.ratio], marker=marker, color="grey")
        ax.errorbar([], [], yerr=[], fmt=marker, capsize=3, label=label,
                    color="tab:blue" if metric == "compute" else "black")
    for j, group in enumerate(groups):
        if all(e.ratio is None for e in found if e.group == group):
            ax.text(j, 0.5, "no pair:\n" + "\n".join(_failed_all(result, group)) + "\nfailed all",
                    ha="center", va="center", fontsize=8, color="red",
                    transform=ax.get_xaxis_transform())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no effect (1x)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(groups)),
                  [_group_label(g, [e for e in found if e.group == g]) for g in groups],
                  fontsize=8)
    ax.set_xlabel("length bucket (tokens, padded); n: pairs in the ratio")
    baseline, candidate = result.kernels
    level = found[0].level if found else 0.95
    ax.set_ylabel(f"{candidate} / {baseline} per request (< 1: faster)")
    ax.set_title(f"Per-bucket effect on {result.baseline.device}: median per-request ratio, "
                 f"{level:.0%} interval (serial dependence allowed for)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, Path(path))


def write_plots(result: BenchResult, out_dir: str | Path, prefix: str = "",
                found: list[Effect] | None = None) -> list[Path]:
    """Both plots under ``out_dir`` as ``<prefix>time-to-result.png`` and
    ``<prefix>bucket-effect.png``; ``found``: the effects if already computed."""
    out_dir = Path(out_dir)
    found = effects(result.baseline, result.candidate) if found is None else found
    return [plot_time_to_result(result, out_dir / f"{prefix}time-to-result.png"),
            plot_bucket_effect(result, found, out_dir / f"{prefix}bucket-effect.png")]
