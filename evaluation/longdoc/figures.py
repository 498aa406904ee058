"""``python -m evaluation.longdoc.figures SOURCE... OUT_DIR``: the plots of committed
long-document results, and the numbers they show.

Each SOURCE is a result ``python -m evaluation.longdoc.bench --json`` wrote, or a folder
of them. For a result ``NAME.json`` it writes under OUT_DIR ``NAME-time-to-result.png``,
``NAME-bucket-effect.png`` (``evaluation.longdoc.plots``) and ``NAME-effects.json``:
the per-bucket effects drawn (``evaluation.longdoc.effect``), the interval's method and
the sha256 of the result they came from, so a figure in the docs can be checked against
its committed output. Prints the effects as a table.

Example (the figures in README.md)::

    python -m evaluation.longdoc.figures kernels/tools/bench_results/h200-2026-12-04-longdoc docs/longdoc
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from evaluation.longdoc.bench import load_result
from evaluation.longdoc.effect import METHOD, Effect, effects
from evaluation.longdoc.plots import write_plots

ROOT = Path(__file__).resolve().parents[2]


def sources(paths: list[Path]) -> list[Path]:
    """The result files named: files as given, folders' ``*.json`` sorted by name."""
    out = []
    for path in paths:
        if path.is_dir():
            out += sorted(path.glob("*.json"))
        elif path.is_file():
            out.append(path)
        else:
            raise SystemExit(f"no such result file or folder: {path}")
    return out


def _fmt(e: Effect) -> str:
    if e.ratio is None:
        return "-"
    interval = f" [{e.low:.3f}, {e.high:.3f}]" if e.low is not None else ""
    return f"{e.ratio:.3f}{interval}"


def _shown(path: Path) -> str:
    """``path`` relative to the project folder when it is inside it (as committed)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def render(path: Path, out_dir: Path) -> dict:
    """Plots and the effects file of one result; returns the effects file's content."""
    result = load_result(path)
    found = effects(result.baseline, result.candidate)
    write_plots(result, out_dir, prefix=f"{path.stem}-", found=found)
    record = {"source": _shown(path),
              "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
              "kernels": result.kernels, "device": result.baseline.device,
              "method": METHOD, "effects": [e.model_dump(mode="json") for e in found]}
    (out_dir / f"{path.stem}-effects.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{path}: {result.kernels[1]} / {result.kernels[0]} on {result.baseline.device}")
    print(f"  {'group':>6} {'pairs':>5} {'failed':>6}  {'time to result':<24} compute")
    for group in dict.fromkeys(e.group for e in found):
        ttr, comp = (next(e for e in found if e.group == group and e.metric == m)
                     for m in ("time_to_result", "compute"))
        print(f"  {group:>6} {ttr.pairs:>5} {ttr.excluded:>6}  {_fmt(ttr):<24} {_fmt(comp)}")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.longdoc.figures",
        description="Plot committed long-document results (time-to-result distributions, "
                    "per-bucket effect with intervals) and write the effects drawn.")
    parser.add_argument("paths", nargs="+", type=Path, metavar="SOURCE... OUT_DIR",
                        help="result JSON files or folders of them, then the output folder")
    args = parser.parse_args(argv)
    if len(args.paths) < 2:
        parser.error("give at least one result and the output folder")
    *given, out_dir = args.paths
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in sources(given):
        render(path, out_dir)
    print(f"wrote {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
