"""A/A calibrations: the signed record, staleness, and one A/A canary through the serving
path (``flows.calibrate.a_a_canary``, the function ``kernelgate calibrate`` repeats)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from lineage.records import calibration
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr

FACTS = {"device_kind": "cpu", "driver_version": None, "jax_version": "0.0-test",
         "serving_digest": "ab" * 32}


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


def _record(verdicts, family="calibrated", facts=FACTS):
    return calibration.summarise(family=family, production_version="1", registration_id=None,
                                 facts=facts, alpha=0.05, verdicts=verdicts,
                                 log_ratios=[[0.01, -0.02, 0.0]] * len(verdicts))


def test_the_summary_counts_false_rollbacks_with_an_interval():
    record = _record([("fail", "slower")] * 3 + [("pass", "ok")] * 97)
    assert record.false_rollbacks == 3 and record.false_rollback_rate == 0.03
    low, high = record.rate_95
    assert low < 0.03 < high and record.within_alpha
    assert not _record([("fail", "x")] * 30 + [("pass", "ok")] * 70).within_alpha


def test_a_fresh_matching_calibration_is_found_and_a_stale_one_is_not(tracking, signing):
    family = "calibrated"
    tr.ensure_experiment(tracking, family)
    run_id = calibration.log_calibration(
        tracking, _record([("pass", "ok")] * 50, family), signing=signing)
    source = StoreSource(tracking, family, signing.trust, stages=("calibration",))
    found, about = calibration.fresh_calibration(source, FACTS, 30)
    assert found == run_id and "0/50" in about
    for changed in ("driver_version", "jax_version", "serving_digest", "device_kind"):
        other = {**FACTS, changed: "something else"}
        found, why = calibration.fresh_calibration(source, other, 30)
        assert found is None and changed in why
    later = datetime.now(UTC) + timedelta(days=40)
    found, why = calibration.fresh_calibration(source, FACTS, 30, now=later)
    assert found is None and "days old" in why


def test_a_calibration_that_exceeded_is_pooled_not_dropped_for_a_luckier_one(
        tracking, signing):
    """Calibrating until one passes would vouch for any judge: the canary pools every
    fresh calibration of the device, and more runs, not a rerun, answer an excess."""
    family = "calibrated-pooled"
    tr.ensure_experiment(tracking, family)
    def source():  # read afresh: a source keeps what it read
        return StoreSource(tracking, family, signing.trust, stages=("calibration",))

    exceeded = _record([("fail", "slower")] * 3 + [("pass", "ok")] * 7, family)
    assert not exceeded.within_alpha  # 3/10: Wilson [0.108, 0.603] over alpha 0.05
    calibration.log_calibration(tracking, exceeded, signing=signing)
    lucky = _record([("pass", "ok")] * 5, family)
    assert lucky.within_alpha  # alone it would count: 0/5, [0, 0.434]
    calibration.log_calibration(tracking, lucky, signing=signing)
    found, why = calibration.fresh_calibration(source(), FACTS, 30)
    assert found is None and "pool to 3/15" in why and "over alpha" in why, why
    # enough further runs bring the pooled interval down to alpha: counted, newest cited
    more = calibration.log_calibration(tracking, _record([("pass", "ok")] * 60, family),
                                       signing=signing)
    found, about = calibration.fresh_calibration(source(), FACTS, 30)
    assert found == more and "3/75" in about and "2 earlier fresh one(s)" in about, about
    # a stale calibration is not pooled: on another driver only what was measured there
    other = {**FACTS, "driver_version": "another"}
    found, why = calibration.fresh_calibration(source(), other, 30)
    assert found is None and "driver_version" in why


def test_an_untrusted_calibration_does_not_count(tracking, signing, tmp_path):
    from lineage.signing import keys

    family = "calibrated"
    stranger = keys.folder_trust(tmp_path)  # trusts no key
    source = StoreSource(tracking, family, stranger, stages=("calibration",))
    found, why = calibration.fresh_calibration(source, FACTS, 30)
    assert found is None


def test_the_serving_digest_follows_the_serving_code(tmp_path):
    for name in calibration.SERVING_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    before = calibration.serving_digest(tmp_path)
    (tmp_path / "evaluation" / "serving.py").write_text("changed")
    assert calibration.serving_digest(tmp_path) != before


def _small_plan():
    from gates.canary_plan import CanaryPlan

    return CanaryPlan.model_validate({
        "steps": [{"name": "a", "traffic_fraction": 0.5, "requests": 8},
                  {"name": "b", "traffic_fraction": 1.0, "requests": 8}],
        "max_error_count": 0, "max_nan_count": 0, "max_output_drift": 1e-3,
        "max_memory_growth_bytes": 2**40,
        "latency": {"test": "signed_rank_abba", "alpha": 0.05, "min_slowdown_ratio": 3.0,
                    "power": 0.9, "noise_sd": 0.5, "inconclusive": "reject"}})


def test_one_a_a_canary_through_the_serving_path():
    from evaluation import serving
    from evaluation.documents import assign_splits, load_documents
    from evaluation.model import MiniLM
    from evaluation.runners import LocalRunner
    from flows.calibrate import a_a_canary

    plan = _small_plan()
    model = MiniLM.load()
    endpoint = serving.Endpoint("xla", LocalRunner.for_implementation("xla", model=model))
    documents = assign_splits(load_documents(None))["heldout"]
    verdict, reason, ratios = a_a_canary(plan, endpoint, model, documents, seed=0)
    assert len(ratios) == 12 and verdict in ("pass", "inconclusive", "fail"), reason
    assert verdict != "fail" or "slower" in reason


class _Slower:
    """A runner whose every request reports ``factor`` times the inner runner's latency
    (a planted slowdown that a loaded CI host cannot blur)."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor, self.name = inner, factor, f"{inner.name} x{factor:g}"

    def embed(self, texts):
        embeddings, seconds = self.inner.embed(texts)
        return embeddings, seconds * self.factor


def test_a_canary_of_another_candidate_uses_it_on_the_candidate_side():
    from evaluation import serving
    from evaluation.documents import assign_splits, load_documents
    from evaluation.model import MiniLM
    from evaluation.runners import LocalRunner
    from flows.calibrate import canary_run

    plan = _small_plan()
    model = MiniLM.load()
    runner = LocalRunner.for_implementation("xla", model=model)
    production = serving.Endpoint("xla", runner)
    slowed = serving.Endpoint("xla slowed", _Slower(runner, 8.0))
    documents = assign_splits(load_documents(None))["heldout"]
    verdict, reason, ratios = canary_run(plan, production, slowed, model, documents, seed=1)
    assert verdict == "fail" and "slower" in reason, reason
    assert np.median(ratios) == pytest.approx(np.log(8.0), abs=0.5)
    # the same stream with production on both sides is not rolled back for speed
    _, _, ratios = canary_run(plan, production, production, model, documents, seed=1)
    assert abs(float(np.median(ratios))) < np.log(8.0) / 2


def test_calibrate_serves_production_in_its_registered_model_dtype(tracking, signing,
                                                                   monkeypatch):
    """On the H200 (2026-12-01) ``kernelgate calibrate`` of a bf16-only production
    (``thresholds/bf16-long.yaml``: model_dtype bfloat16) loaded MiniLM in float32: every
    production request was refused and 200 of 200 A/A canaries were "rolled back". The
    calibration must time what the rollout's canary serves: the registration's dtype."""
    from evaluation import serving
    from evaluation.runners import LocalRunner
    from flows import calibrate as cal
    from gates.serving_contract import ServingContract

    contract = ServingContract(dtypes=["bfloat16"], model_dtype="bfloat16")
    seen = {}

    class Pool:  # the version pool, without a registered version's worker process
        def __init__(self, tracking, family, model, trust):
            seen["dtype"], self.model = model.config.attention_dtype, model

        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(cal.registered_model, "alias_version", lambda *a, **k: "1")
    monkeypatch.setattr(cal, "registered_plan",
                        lambda *a, **k: cal.RegisteredServing(_small_plan(), None, contract))
    monkeypatch.setattr(cal.version_runners, "VersionPool", Pool)
    monkeypatch.setattr(cal.version_runners, "endpoint", lambda pool, alias, **k: serving.Endpoint(
        "xla", LocalRunner.for_implementation("xla", model=pool.model)))
    _, record, *_ = cal.calibrate(tracking, "bf16-only", runs=1, signing=signing)
    assert seen == {"dtype": "bfloat16", "closed": True}
    # the one A/A canary compared requests: none failed on either side
    assert record.runs == 1 and len(record.log_ratios[0]) == 12, record.reasons


def test_a_family_with_no_production_calibrates_its_native_baseline(tmp_path, signing):
    """A fresh store under a plan that needs a calibration: before any production exists
    the native baseline (what serves until a first promotion, and what the first canary
    compares with) is run against itself at the plan's sizes; the rollout's calibration
    lookup then finds it. Without a file to size the runs by, it says what to pass."""
    import yaml

    from flows import calibrate as cal
    from lineage.records.environment import collect_environment
    from tests.flow_thresholds import FLOW_TEST

    tracking = tr.local_tracking(tmp_path / "fresh-store")
    with pytest.raises(ValueError, match="--thresholds"):
        cal.calibrate(tracking, "first", runs=1, signing=signing)
    data = yaml.safe_load(FLOW_TEST.read_text())
    data["canary"]["steps"] = [{"name": "a", "traffic_fraction": 0.5, "requests": 8},
                               {"name": "b", "traffic_fraction": 1.0, "requests": 8}]
    data["canary"]["latency"]["max_calibration_age_days"] = 30
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(data))
    run_id, record, *_ = cal.calibrate(tracking, "first", runs=1, signing=signing,
                                       thresholds=plan)
    assert record.production_version.startswith("none (xla")
    assert record.runs == 1 and len(record.log_ratios[0]) == 12, record.reasons
    found, about = calibration.fresh_calibration(
        StoreSource(tracking, "first", signing.trust),
        calibration.device_facts(collect_environment()), 30)
    assert found == run_id, about


def test_a_first_calibration_without_family_is_for_the_native_family_and_says_so(
        tmp_path, monkeypatch):
    """README's walkthrough calibrates a store with no family yet and names none: the
    calibration is for the family ``rollout --implementation native`` rolls out here
    (xla on a CPU host), whose rollouts look it up, not the host's ``auto`` kernel."""
    from pathlib import Path
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import kernels
    from flows import calibrate as cal
    from flows.cli import app

    asked = {}

    def recorded(tracking, family, **kwargs):
        asked["family"] = family
        return cal.Calibrated("run-1", SimpleNamespace(
            rate_95=(0.0, 0.79), false_rollbacks=0, runs=1, false_rollback_rate=0.0,
            alpha=0.01, within_alpha=True, inconclusive=0, noise_sd=0.1,
            facts={"device_kind": "cpu"}), "run-1", "calibration run-1 (0/1 A/A ...)")

    monkeypatch.setattr(cal, "calibrate", recorded)
    staging = str(Path(__file__).parents[1] / "thresholds" / "staging.yaml")
    result = CliRunner().invoke(app, ["calibrate", "--thresholds", staging,
                                      "--runs", "1", "--store-dir", str(tmp_path / "store")])
    native = kernels.native_flash_kernel("native", kernels.default_backend())
    assert result.exit_code == 0, result.output
    assert asked["family"] == native and f"calibrating family {native}" in result.output


def test_a_calibration_holds_only_for_the_requests_it_replayed(tracking, signing):
    """What the canary replays is a staleness fact: a calibration on MiniLM's requests says
    nothing of a long-document canary's noise, nor the other way round; a record made
    before the fact was recorded replayed MiniLM's requests and counts as such."""
    longdoc = calibration.request_source("longdoc-cpu-small")
    assert longdoc.startswith("longdoc-cpu-small@") and longdoc != calibration.MINILM_REQUESTS

    def source():  # read afresh: a StoreSource reads the store's attestations once
        return StoreSource(tracking, "by-workload", signing.trust)

    minilm_facts = FACTS | {"workload": calibration.MINILM_REQUESTS}
    legacy = calibration.log_calibration(tracking, _record([("pass", "")] * 3,
                                                           family="by-workload"),
                                         signing=signing)  # FACTS: no workload named
    found, _ = calibration.fresh_calibration(source(), minilm_facts, 30)
    assert found == legacy
    found, why = calibration.fresh_calibration(source(), FACTS | {"workload": longdoc}, 30)
    assert found is None and "stale (workload changed)" in why, why
    on_docs = calibration.log_calibration(tracking, _record(
        [("pass", "")] * 3, family="by-workload", facts=FACTS | {"workload": longdoc}),
        signing=signing)
    found, _ = calibration.fresh_calibration(source(), FACTS | {"workload": longdoc}, 30)
    assert found == on_docs
    found, _ = calibration.fresh_calibration(source(), minilm_facts, 30)
    assert found == legacy  # the newer long-document one does not count for MiniLM


def test_a_plan_replaying_a_workload_is_calibrated_on_its_documents(tmp_path, signing):
    """A registration whose canary replays a long-document workload: each A/A canary draws
    its own stream of the workload's documents and compares them as the canary does, and
    the record names the workload, so the rollout's lookup (same facts) finds it."""
    import yaml

    from flows import calibrate as cal
    from lineage.records.environment import collect_environment
    from tests.flow_thresholds import FLOW_TEST

    data = yaml.safe_load(FLOW_TEST.read_text())
    data["canary"]["steps"] = [{"name": "a", "traffic_fraction": 0.5, "requests": 8},
                               {"name": "b", "traffic_fraction": 1.0, "requests": 8}]
    data["canary"]["workload"] = "longdoc-cpu-small"
    data["canary"]["latency"]["max_calibration_age_days"] = 30
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(data))
    tracking = tr.local_tracking(tmp_path / "store")
    run_id, record, *_ = cal.calibrate(tracking, "longdoc", runs=2, signing=signing,
                                       thresholds=plan)
    assert record.facts["workload"] == calibration.request_source("longdoc-cpu-small")
    assert [len(r) for r in record.log_ratios] == [12, 12], record.reasons  # 4 + 8 compared
    assert record.log_ratios[0] != record.log_ratios[1]  # two streams, not one replayed twice
    env = collect_environment()
    source = StoreSource(tracking, "longdoc", signing.trust)
    found, about = calibration.fresh_calibration(source, calibration.device_facts(
        env, workload=record.facts["workload"]), 30)
    assert found == run_id, about
    found, why = calibration.fresh_calibration(source, calibration.device_facts(env), 30)
    assert found is None and "workload changed" in why
