"""``python -m evaluation.longdoc.bench``: serve a workload with two kernels on the same
arrivals and compare them per length bucket.

Each kernel serves the spec's whole request stream (same arrival times, same synthetic
documents, same seeded weights) on the default device, one after the other in this
process (``evaluation.longdoc.run``). The table shows, per bucket and overall, each
kernel's p50/p99 time to result, documents/s, goodput and device busy fraction, and the
pair's median per-request ratio of time to result and of compute time (second kernel
over first), and the output drift between them (the smallest cosine of a request's two
embeddings). The JSON holds both reports (per-request records included) and the pair.

It lives in ``evaluation/`` rather than ``kernels/tools/``: it serves an encoder, and
``kernels`` imports nothing of ours (ARCHITECTURE.md's layering).

It imports no MLflow, so it runs on a device image without it. The same command with
``--mlflow-store DIR`` (or ``--from-json`` to log a result made elsewhere) is
``python -m lineage.tools.longdoc_log``: MLflow calls live in ``lineage/`` (ARCHITECTURE.md).
Plots of a result: ``python -m evaluation.longdoc.figures``.

Examples::

    python -m evaluation.longdoc.bench                       # the CPU spec, xla vs naive
    python -m evaluation.longdoc.bench --workload longdoc-modernbert-base \\
        --kernels xla,pallas_mosaic_gpu --json out/longdoc.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ValidationError, model_validator

from evaluation.longdoc.report import LongdocReport
from kernels.errors import KernelgateError

BUSY_TARGET = 0.7
"""The baseline's busy fraction a workload's rate is meant to reach (queueing matters)."""


class BenchResult(BaseModel):
    """What the command writes with ``--json``: both reports (per-request records
    included), baseline first in ``kernels``, and the pair's medians (:func:`paired`)."""

    workload: str
    workload_sha256: str | None = None
    kernels: list[str]
    paired: dict[str, dict]
    reports: dict[str, LongdocReport]

    @model_validator(mode="after")
    def _two_reported(self) -> BenchResult:
        if len(self.kernels) != 2 or any(k not in self.reports for k in self.kernels):
            raise ValueError(f"kernels {self.kernels}: two names, baseline first, each with "
                             f"a report (reports: {sorted(self.reports)})")
        return self

    @property
    def baseline(self) -> LongdocReport:
        return self.reports[self.kernels[0]]

    @property
    def candidate(self) -> LongdocReport:
        return self.reports[self.kernels[1]]


def load_result(path: str | Path) -> BenchResult:
    """Read a result the command wrote (``--json``)."""
    return BenchResult.model_validate_json(Path(path).read_bytes())


class InvalidResult(KernelgateError, ValueError):
    """A file that is not a result of this command (the message names the first field)."""


def read_result(path: str | Path) -> BenchResult:
    """:func:`load_result` for the commands that judge results: a file that is not one is
    refused in one line.

    Raises:
        InvalidResult: not JSON, or a field missing or wrong (the first one named).
        OSError: the file cannot be read.
    """
    try:
        return load_result(path)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the file"
        raise InvalidResult(f"{path}: not a result of python -m evaluation.longdoc.bench "
                            f"--json ({where}: {first['msg']})") from None


def parser() -> argparse.ArgumentParser:
    """The command's options (``lineage.tools.longdoc_log`` adds its MLflow ones to them)."""
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.longdoc.bench",
        description="Serve a long-document workload with two attention kernels on the same "
                    "arrivals; print a per-bucket table and write JSON.")
    parser.add_argument("--workload", default="longdoc-cpu-small",
                        help="a shipped spec's name (workloads/NAME.yaml) or a YAML path")
    parser.add_argument("--kernels", default=None,
                        help="two registry names, baseline first (default: xla,naive on a "
                             "CPU host, xla,pallas_mosaic_gpu on a GPU)")
    parser.add_argument("--rate", type=float, default=None,
                        help="arrival rate override, requests/s (default: the spec's)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON")
    return parser


def _ratio(a: list[float], b: list[float]) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    return float(np.exp(np.median([np.log(y / x) for x, y in pairs]))) if pairs else None


def paired(first, second, first_outputs: dict, second_outputs: dict) -> dict:
    """Per bucket (and ``all``): median per-request ratios (second / first) of time to
    result and of compute time, and the smallest output cosine between the kernels."""
    out = {}
    groups = {"all": None, **{str(b): b for b in sorted(first.buckets)}}
    for name, bucket in groups.items():
        a = [r for r in first.trace.requests if bucket is None or r.bucket == bucket]
        b = {r.id: r for r in second.trace.requests}
        b = [b[r.id] for r in a]
        cosines = []
        for r in a:
            x, y = first_outputs.get(r.id), second_outputs.get(r.id)
            if x is not None and y is not None:
                cosines.append(float(x @ y / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-30)))
        out[name] = {
            "requests": len(a),
            "ttr_ratio_median": _ratio([r.time_to_result_s for r in a],
                                       [r.time_to_result_s for r in b]),
            "compute_ratio_median": _ratio([r.compute_s for r in a], [r.compute_s for r in b]),
            "min_output_cosine": min(cosines) if cosines else None}
    return out


def _fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def table(names: list[str], reports: list, pair: dict) -> str:
    """The per-bucket table as text (times in ms)."""
    head = ["bucket", "n"]
    for n in names:
        head += [f"{n} p50", f"{n} p99", f"{n} doc/s", f"{n} good/s", f"{n} busy"]
    head += ["ttr ratio", "compute ratio", "min cos"]
    rows = [head]
    for key in pair:
        figs = [r.overall if key == "all" else r.buckets[int(key)] for r in reports]
        row = [key, str(figs[0].requests)]
        for f in figs:
            row += [_fmt(f.p50_s and f.p50_s * 1e3), _fmt(f.p99_s and f.p99_s * 1e3),
                    _fmt(f.docs_per_s), _fmt(f.goodput_docs_per_s), _fmt(f.busy_fraction, ".2f")]
        p = pair[key]
        row += [_fmt(p["ttr_ratio_median"], ".3f"), _fmt(p["compute_ratio_median"], ".3f"),
                _fmt(p["min_output_cosine"], ".6f")]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit 0, or 2 when a kernel had errors or non-finite outputs."""
    return run(parser().parse_args(argv))[1]


def run(args: argparse.Namespace) -> tuple[dict, int]:
    """Serve, print the table, write ``--json`` if asked; returns the result (the JSON's
    content) and the exit code (:func:`main`)."""
    import jax

    from evaluation.longdoc.run import serve_workload
    from evaluation.longdoc.spec import load_spec, shipped

    path = Path(args.workload) if args.workload.endswith((".yaml", ".yml")) else shipped(
        args.workload)
    spec = load_spec(path)
    platform = jax.devices()[0].platform
    names = (args.kernels or ("xla,pallas_mosaic_gpu" if platform == "gpu" else "xla,naive")
             ).split(",")
    if len(names) != 2:
        raise SystemExit(f"--kernels takes two names, baseline first; got {names}")
    reports, outputs = [], []
    for name in names:
        report, server = serve_workload(spec, name, rate_per_s=args.rate, spec_path=path)
        print(f"{name}: {len(report.trace.batches)} batches, compile {report.compile_s:.1f} s "
              f"(not measured), device {report.overall.device_s:.2f} s, "
              f"memory: {report.device_peak_bytes or '-'} ({report.memory_note}); "
              f"compiled peak {report.compiled_peak_bytes}", file=sys.stderr)
        reports.append(report)
        outputs.append(server.outputs)
    pair = paired(reports[0], reports[1], outputs[0], outputs[1])
    print(f"{spec.name} on {reports[0].device}, rate {reports[0].rate_per_s:g}/s, "
          f"SLO {spec.slo_s:g} s, window {reports[0].window_s:.2f} s; times in ms; "
          f"ratios: {names[1]} / {names[0]}")
    print(table(names, reports, pair))
    busy = reports[0].overall.busy_fraction
    if busy is not None and busy < BUSY_TARGET:
        print(f"note: {names[0]}'s busy fraction {busy:.2f} is below {BUSY_TARGET}: queueing "
              "plays little part at this rate (raise --rate)")
    result = {"workload": spec.name, "workload_sha256": reports[0].workload_sha256,
              "kernels": names, "paired": pair,
              "reports": {n: r.model_dump(mode="json") for n, r in zip(names, reports,
                                                                       strict=True)}}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    failed = any(r.overall.errors or r.overall.non_finite for r in reports)
    return result, 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
