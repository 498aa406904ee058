"""A long-document comparison logged to MLflow: the table, effects, plots, spec and
fingerprints read back from a temporary store."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest

from evaluation.longdoc.bench import load_result
from evaluation.longdoc.effect import METHOD, effects
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.tools import longdoc_log
from tests.longdoc_synthetic import WEIGHTS, comparison, spec, write_spec

ROOT = Path(__file__).resolve().parents[1]
H200_CUDNN = (ROOT / "kernels" / "tools" / "bench_results" / "h200-2026-12-04-longdoc"
              / "longdoc-modernbert-base-cudnn.json")


def test_a_comparison_is_logged_with_its_table_effects_plots_spec_and_fingerprints(tmp_path):
    workload = spec()
    spec_path = write_spec(workload, tmp_path)
    result = comparison(0.8, seed=4, spec_path=spec_path, fail_bucket=32)
    source = result.model_dump_json(indent=1).encode()
    tracking = tr.local_tracking(tmp_path / "store")
    run_id = longdoc_log.log_bench_result(tracking, result, source=source, spec_path=spec_path)
    run = tracking.client().get_run(run_id)
    experiment = tracking.client().get_experiment(run.info.experiment_id)
    assert experiment.name == "bench-synthetic" and tags.FAMILY not in experiment.tags
    assert run.info.status == "FINISHED"
    t = run.data.tags
    assert t[tags.WORKLOAD_SHA256] == hashlib.sha256(spec_path.read_bytes()).hexdigest()
    assert t[tags.WORKLOAD_WEIGHTS_SHA256] == WEIGHTS
    assert (t[tags.BENCH_BASELINE], t[tags.BENCH_CANDIDATE]) == ("base", "cand")
    assert run.data.params["effect_interval"] == METHOD

    found = {(e.group, e.metric): e for e in effects(result.baseline, result.candidate)}
    m = run.data.metrics
    assert m["effect/all/compute_ratio"] == pytest.approx(found[("all", "compute")].ratio)
    assert m["effect/16/time_to_result_high"] == pytest.approx(
        found[("16", "time_to_result")].high)
    assert m["effect/32/compute_pairs"] == 0 and "effect/32/compute_ratio" not in m
    assert m["base/32/errors"] == result.baseline.buckets[32].errors > 0
    assert m["cand/all/p99_s"] == pytest.approx(result.candidate.overall.p99_s)

    def read(path: str) -> bytes:  # every artifact's bytes are the ones whose sha256 it recorded
        return tr.read_verified_artifact(tracking, run_id, f"longdoc/{path}")

    rows = list(csv.DictReader(io.StringIO(read("buckets.csv").decode())))
    assert [r["group"] for r in rows] == ["all", "8", "16", "32"]
    by_group = {r["group"]: r for r in rows}
    assert float(by_group["8"]["base.p50_s"]) == pytest.approx(result.baseline.buckets[8].p50_s)
    assert float(by_group["all"]["compute_low"]) == pytest.approx(found[("all", "compute")].low)
    assert by_group["32"]["compute_ratio"] == "" and by_group["32"]["failed"] == str(
        result.baseline.buckets[32].requests)
    table = json.loads(read("buckets.table.json"))
    column = table["columns"].index("time_to_result_ratio")
    assert [row[column] for row in table["data"]][:3] == pytest.approx(
        [found[(g, "time_to_result")].ratio for g in ("all", "8", "16")])
    logged = json.loads(read("effects.json"))
    assert logged["method"] == METHOD and len(logged["effects"]) == 8
    assert read("result.json") == source
    assert read("workload.yaml") == spec_path.read_bytes()
    plots = tr.list_artifact_files(tracking, run_id, "longdoc/plots")
    assert plots == ["longdoc/plots/bucket-effect.png", "longdoc/plots/time-to-result.png"]
    assert all(read(p.removeprefix("longdoc/")).startswith(b"\x89PNG") for p in plots)


def test_a_spec_that_is_not_the_results_is_refused_before_any_run(tmp_path):
    spec_path = write_spec(spec(), tmp_path)
    result = comparison(0.8, seed=4, spec_path=spec_path)
    spec_path.write_text(spec_path.read_text() + "# edited\n")
    tracking = tr.local_tracking(tmp_path / "store")
    with pytest.raises(ValueError, match="not the spec of this result"):
        longdoc_log.log_bench_result(tracking, result, spec_path=spec_path)
    assert tracking.client().get_experiment_by_name("bench-synthetic") is None


def test_the_command_logs_the_committed_h200_result(tmp_path, capsys):
    assert longdoc_log.main(["--mlflow-store", str(tmp_path), "--from-json",
                             str(H200_CUDNN)]) == 0
    assert "bench-longdoc-modernbert-base" in capsys.readouterr().out
    tracking = tr.local_tracking(tmp_path)
    experiment = tracking.client().get_experiment_by_name("bench-longdoc-modernbert-base")
    (run,) = tracking.client().search_runs([experiment.experiment_id])
    # the shipped spec is the one the H200 ran (its sha256 is the result's)
    assert tr.read_verified_artifact(tracking, run.info.run_id, "longdoc/workload.yaml") == (
        ROOT / "workloads" / "longdoc-modernbert-base.yaml").read_bytes()
    committed = json.loads((ROOT / "docs" / "longdoc" /
                            "longdoc-modernbert-base-cudnn-effects.json").read_text())
    compute = next(e for e in committed["effects"]
                   if e["group"] == "all" and e["metric"] == "compute")
    assert run.data.metrics["effect/all/compute_ratio"] == pytest.approx(compute["ratio"])
    assert run.data.tags[tags.WORKLOAD_WEIGHTS_SHA256] == load_result(
        H200_CUDNN).baseline.weights_sha256


def test_the_command_serves_then_logs_when_given_a_store(tmp_path, capsys):
    path = write_spec(spec(requests=14, rate_per_s=50.0), tmp_path)
    assert longdoc_log.main(["--workload", str(path), "--kernels", "xla,naive",
                             "--mlflow-store", str(tmp_path / "store")]) == 0
    assert "naive / xla" in capsys.readouterr().out  # the bench's table, then the run
    tracking = tr.local_tracking(tmp_path / "store")
    (run,) = tracking.client().search_runs(
        [tracking.client().get_experiment_by_name("bench-synthetic").experiment_id])
    assert tr.read_verified_artifact(tracking, run.info.run_id, "longdoc/workload.yaml") == (
        path.read_bytes())
    result = json.loads(tr.read_verified_artifact(tracking, run.info.run_id,
                                                  "longdoc/result.json"))
    assert result["kernels"] == ["xla", "naive"]
    assert run.data.tags[tags.WORKLOAD_WEIGHTS_SHA256] == result["reports"]["xla"][
        "weights_sha256"]
