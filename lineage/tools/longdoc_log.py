"""A long-document comparison in MLflow: ``python -m lineage.tools.longdoc_log``.

A result of ``evaluation.longdoc.bench`` (two kernels served on the same arrivals)
becomes one run in the experiment ``bench-<workload>``: an experiment of its own, with
no family, so no rollout, audit or store-freshness check reads it. The run holds:

* tags: the workload's name and its spec's sha256, the seeded encoder's weights
  fingerprint (``weights_sha256``; the same for both kernels, or refused), baseline and
  candidate;
* params: device, arrival rate, SLO, steady window, the effect interval's method;
* metrics: every figure of each kernel per group (``all`` or a bucket's tokens) as
  ``<kernel>/<group>/<figure>``, and the effects as ``effect/<group>/<metric>_ratio``,
  ``_low``, ``_high`` and ``_pairs`` (``evaluation.longdoc.effect``);
* artifacts, each with its sha256 recorded (``lineage.store.tracking``): ``longdoc/buckets.csv``
  (the per-bucket table: both kernels' figures, the effects with their intervals),
  ``longdoc/buckets.table.json`` (the same table through ``MlflowClient.log_table``, which
  the MLflow UI shows as a table), ``longdoc/effects.json``, ``longdoc/result.json`` (the
  result as given, per-request records included), ``longdoc/workload.yaml`` (the spec,
  logged only when its sha256 is the result's) and ``longdoc/plots/*.png``
  (``evaluation.longdoc.plots``).

The command takes the bench's own options and serves the workload as the bench does, then
logs the result to ``--mlflow-store DIR`` (the embedded SQLite store there;
``MLFLOW_TRACKING_URI`` wins); ``--from-json RESULT`` logs a result made elsewhere instead
(the device image runs the bench without MLflow). The bench itself imports no MLflow:
only ``lineage`` and ``flows`` call it (ARCHITECTURE.md).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

from evaluation.longdoc import bench
from evaluation.longdoc.bench import BenchResult
from evaluation.longdoc.effect import METHOD, Effect, effects
from evaluation.longdoc.plots import write_plots
from evaluation.longdoc.report import Figures
from evaluation.longdoc.spec import InvalidWorkload, shipped, spec_sha256
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.store import Tracking, tracking_for

ART = tags.LONGDOC_ARTIFACT_DIR
FIGURES = [name for name, field in Figures.model_fields.items()
           if field.annotation in (float, int, float | None, int | None)]
"""The numeric figures logged per kernel and group (every field of ``Figures``)."""


def experiment_for(workload: str) -> str:
    """The experiment of a workload's benchmark runs: ``bench-<workload>``."""
    return f"bench-{workload}"


def _groups(result: BenchResult) -> list[str]:
    return ["all", *(str(b) for b in sorted(result.baseline.buckets))]


def _figures(result: BenchResult, name: str, group: str) -> Figures | None:
    report = result.reports[name]
    return report.overall if group == "all" else report.buckets.get(int(group))


def bucket_rows(result: BenchResult, found: list[Effect]) -> list[dict]:
    """The per-bucket table: one row per group, both kernels' figures (``<kernel>.<figure>``)
    and the effects (``<metric>_ratio``, ``_low``, ``_high``), pairs and failed requests."""
    rows = []
    for group in _groups(result):
        row: dict = {"group": group}
        for name in result.kernels:
            figs = _figures(result, name, group)
            row.update({f"{name}.{f}": None if figs is None else getattr(figs, f)
                        for f in FIGURES})
        for e in (x for x in found if x.group == group):
            row.update({f"{e.metric}_ratio": e.ratio, f"{e.metric}_low": e.low,
                        f"{e.metric}_high": e.high, "pairs": e.pairs, "failed": e.excluded})
        rows.append(row)
    return rows


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return out.getvalue()


def _metrics(result: BenchResult, found: list[Effect]) -> dict[str, float]:
    values: dict[str, float] = {}
    for name in result.kernels:
        for group in _groups(result):
            figs = _figures(result, name, group)
            for f in FIGURES:
                v = None if figs is None else getattr(figs, f)
                if v is not None:
                    values[f"{name}/{group}/{f}"] = float(v)
    for e in found:
        base = f"effect/{e.group}/{e.metric}"
        values[f"{base}_pairs"] = float(e.pairs)
        for key, v in (("ratio", e.ratio), ("low", e.low), ("high", e.high)):
            if v is not None:
                values[f"{base}_{key}"] = v
    return values


def _spec_bytes(result: BenchResult, spec_path: Path | None) -> bytes | None:
    """The spec file's bytes when its sha256 is the result's; ``None`` when there is no
    file to check (none given, none shipped by that name) or the result records none.

    Raises:
        ValueError: the spec given or shipped is not the one the result was served with.
    """
    if spec_path is None:
        try:
            spec_path = shipped(result.workload)
        except InvalidWorkload:
            return None
    if result.workload_sha256 is None:
        return None
    found = spec_sha256(spec_path)
    if found != result.workload_sha256:
        raise ValueError(f"{spec_path} has sha256 {found[:12]}, the result was served with "
                         f"{result.workload_sha256[:12]}: not the spec of this result")
    return spec_path.read_bytes()


def _run(tracking: Tracking, experiment: str, run_name: str, run_tags: dict[str, str]) -> str:
    client = tracking.client()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        location = (f"{tracking.artifact_root.rstrip('/')}/{experiment}"
                    if tracking.artifact_root else None)
        experiment_id = client.create_experiment(
            experiment, artifact_location=location,
            tags={tags.EXPERIMENT_KIND: tags.CLASSIC_EXPERIMENT})
    else:
        experiment_id = found.experiment_id
    return client.create_run(experiment_id, run_name=run_name, tags=run_tags).info.run_id


def log_bench_result(tracking: Tracking, result: BenchResult, *, source: bytes | None = None,
                     spec_path: str | Path | None = None, experiment: str | None = None
                     ) -> str:
    """Log ``result`` as one run (see the module docstring); returns the run id.

    Args:
        tracking: the store.
        result: the comparison.
        source: the result's JSON bytes as written (default: the result re-serialised).
        spec_path: the workload file (default: the shipped spec of the result's name).
        experiment: the experiment's name (default :func:`experiment_for`).

    Raises:
        ValueError: the spec is not the result's, or the kernels ran different weights.
    """
    weights = {r.weights_sha256 for r in result.reports.values()}
    if len(weights) != 1:
        raise ValueError(f"the kernels served different weights: {sorted(map(str, weights))}")
    spec = _spec_bytes(result, Path(spec_path) if spec_path else None)
    baseline, candidate = result.kernels
    run_tags = {tags.WORKLOAD: result.workload, tags.BENCH_BASELINE: baseline,
                tags.BENCH_CANDIDATE: candidate,
                tags.WORKLOAD_SHA256: result.workload_sha256 or "unknown",
                tags.WORKLOAD_WEIGHTS_SHA256: next(iter(weights)) or "unknown"}
    run_id = _run(tracking, experiment or experiment_for(result.workload),
                  f"{candidate}-vs-{baseline}", run_tags)
    try:
        found = effects(result.baseline, result.candidate)
        b = result.baseline
        tr.log_params(tracking, run_id, {
            "device": b.device, "rate_per_s": b.rate_per_s, "slo_s": b.slo_s,
            "window_s": b.window_s, "steady_requests": b.overall.requests,
            "effect_interval": METHOD})
        tr.log_metrics(tracking, run_id, _metrics(result, found))
        rows = bucket_rows(result, found)
        tr.log_text(tracking, run_id, _csv(rows), f"{ART}/buckets.csv")
        _log_table(tracking, run_id, rows, f"{ART}/buckets.table.json")
        tr.log_text(tracking, run_id, json.dumps(
            {"method": METHOD, "effects": [e.model_dump(mode="json") for e in found]},
            indent=1), f"{ART}/effects.json")
        tr.log_bytes(tracking, run_id, source if source is not None
                     else result.model_dump_json(indent=1).encode(), f"{ART}/result.json")
        if spec is not None:
            tr.log_bytes(tracking, run_id, spec, f"{ART}/workload.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            write_plots(result, tmp, found=found)
            tr.log_directory(tracking, run_id, tmp, f"{ART}/plots")
    except BaseException:
        tr.end_run(tracking, run_id, "FAILED")
        raise
    tr.end_run(tracking, run_id, "FINISHED")
    return run_id


def _log_table(tracking: Tracking, run_id: str, rows: list[dict], artifact_path: str) -> None:
    """``MlflowClient.log_table`` (the UI's table view), its sha256 recorded as every
    artifact's is: the bytes MLflow wrote are read back and hashed."""
    columns = {k: [row[k] for row in rows] for k in rows[0]}
    tracking.client().log_table(run_id, data=columns, artifact_file=artifact_path)
    data = tr.read_artifact(tracking, run_id, artifact_path)
    tr.set_tags(tracking, run_id, {tags.DIGEST_PREFIX + artifact_path:
                                   hashlib.sha256(data).hexdigest()})


def main(argv: list[str] | None = None) -> int:
    """The bench, then its result logged; exit as the bench does (0 for ``--from-json``)."""
    parser = bench.parser()
    parser.prog = "python -m lineage.tools.longdoc_log"
    parser.description = ("Serve a long-document workload with two kernels on the same "
                          "arrivals (python -m evaluation.longdoc.bench) and log the result, "
                          "its per-bucket table and plots to MLflow.")
    parser.add_argument("--mlflow-store", type=Path, required=True, metavar="DIR",
                        help="the store (the embedded SQLite store in DIR; "
                             "MLFLOW_TRACKING_URI wins)")
    parser.add_argument("--from-json", type=Path, default=None, metavar="RESULT",
                        help="log this result (bench --json) instead of serving")
    parser.add_argument("--experiment", default=None,
                        help="experiment name (default bench-<workload>)")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        source, code = args.from_json.read_bytes(), 0
    else:
        content, code = bench.run(args)
        source = json.dumps(content, indent=1).encode()
    result = BenchResult.model_validate_json(source)
    spec_path = Path(args.workload) if args.workload.endswith((".yaml", ".yml")) else None
    run_id = log_bench_result(tracking_for(args.mlflow_store), result, source=source,
                              spec_path=spec_path, experiment=args.experiment)
    print(f"logged {result.kernels[1]} vs {result.kernels[0]} on {result.workload} as MLflow "
          f"run {run_id} (experiment {args.experiment or experiment_for(result.workload)})")
    return code


if __name__ == "__main__":
    sys.exit(main())
