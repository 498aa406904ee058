"""One plan per session: after preregistration every stage reads the registration.

A rollout resolves its kernel and parses its thresholds once, when its session opens
(``flows.plan``); the registration freezes exactly those bytes, and every later stage
(evaluation, gate, traffic, confirmation) reads the registered copy and the bindings it
signed. Re-validation reads nothing else: a version registered under a bf16-only
contract is re-judged under that contract, its bound test set, perf shapes and repeats,
whatever settings or thresholds file the nightly job holds.

The stand-in is ``tests.bf16_only_kernel`` (through ``KERNELGATE_KERNELS``): correct
in bf16 and refusing float32, so a float32 contract (the default file's) fails its
``coverage`` criterion while its own registration passes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.testing.utilities import prefect_test_harness

from flows.settings import RolloutSettings
from kernels.registry import IMPLEMENTATIONS, PLUGINS_ENV
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model
from lineage.store import tags
from tests import bf16_only_kernel
from tests.flow_thresholds import FLOW_TEST, untimed
from tests.shared_builds import HARNESS_STARTUP_S, copy_of, flow_testset

FAMILY = "bf16-only"
BF16_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                             head_dim=64, dtype="bfloat16", causal=False)]
REGISTERED_REPEATS = 3


def bf16_thresholds(out: Path) -> Path:
    """The flow-test profile serving bf16 only, MiniLM's attention in bf16 (the ordinary
    category, MiniLM's own float32 Q/K/V, is outside it: its criterion goes)."""
    untimed(FLOW_TEST, out)
    data = yaml.safe_load(out.read_text())
    data["profile"] = "flow-test-bf16"
    data["serving"] = {"dtypes": ["bfloat16"], "model_dtype": "bfloat16"}
    for platform in data["platforms"].values():
        platform["value"] = [c for c in platform["value"]
                             if c["name"] != "ordinary-error-ratio"]
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store whose default test-set folder (``<store>/testsets/minimal``) holds the
    run's minimal test set, so default settings find what the registration bound."""
    store_dir = tmp_path_factory.mktemp("plan") / "store"
    copy_of(flow_testset(tmp_path_factory), store_dir / "testsets" / "minimal")
    return store_dir


@pytest.fixture(scope="module")
def promoted(prefect_server, store, tmp_path_factory):
    """``test_bf16_only`` promoted under the bf16 registration; the registry entry and
    the plugin variable stay for the module (a version process reads the variable)."""
    from flows.rollout import rollout

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv(PLUGINS_ENV, bf16_only_kernel.PLUGIN)
        mp.setitem(IMPLEMENTATIONS, bf16_only_kernel.NAME, bf16_only_kernel.Bf16OnlyKernel())
        thresholds = bf16_thresholds(tmp_path_factory.mktemp("thresholds") / "bf16.yaml")
        outcome = rollout(RolloutSettings(
            implementation=bf16_only_kernel.NAME, family=FAMILY, thresholds=thresholds,
            store_dir=store, shadow_requests=8, perf_repeats=REGISTERED_REPEATS,
            perf_shapes=BF16_SHAPE, model_check=False, testset_profile="minimal"))
        assert outcome.result == "promoted", outcome.reason
        yield outcome


def _evaluation(store: Path, run_id: str, tmp_path: Path):
    """The held-out evaluation run under the revalidation run ``run_id``, and its report."""
    from evaluation.report import EvaluationReport
    from lineage.store.tracking import local_tracking

    client = local_tracking(store).client()
    experiment = client.get_run(run_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=(
        f"tags.`{tags.PARENT}` = '{run_id}' and tags.`{tags.STAGE}` = 'evaluation'"))
    assert len(runs) == 1, [r.info.run_id for r in runs]
    path = client.download_artifacts(runs[0].info.run_id, "evaluation/evaluation_report.json",
                                     str(tmp_path))
    return runs[0], EvaluationReport.model_validate_json(Path(path).read_text())


def assert_judged_as_registered(store: Path, outcome, promoted, tmp_path: Path) -> None:
    """The revalidation's evaluation ran under v1's registration, with its bindings: the
    bf16 perf shape at 3 repeats, the minimal test set, no MiniLM check."""
    from lineage.store.tracking import local_tracking

    assert outcome.result == "passed", outcome.reason
    tracking = local_tracking(store)
    assert registered_model.alias_version(tracking, FAMILY, "production") == promoted.version
    run, report = _evaluation(store, outcome.revalidation_run_id, tmp_path)
    assert run.data.tags[tags.REGISTRATION_ID] == \
        registered_model.version_tags(tracking, FAMILY, promoted.version)[tags.REGISTRATION_ID]
    assert report.performance.repeats == REGISTERED_REPEATS
    assert [s.shape for s in report.performance.shapes] == BF16_SHAPE
    assert Path(report.testset_dir) == store / "testsets" / "minimal"
    assert not report.model_accuracy
    assert report.metrics["coverage.refused_cases"] == 0


def test_revalidation_with_default_settings_judges_by_the_registration(
        promoted, store, tmp_path):
    """The nightly job's default settings name the float32 local-dry-run file, the
    ``auto`` test-set profile, default perf shapes and the MiniLM check: none of it is
    what v1 was registered with. Judged by its registration, v1 still passes."""
    from flows.revalidate import revalidate_production

    outcome = revalidate_production(FAMILY, RolloutSettings(store_dir=store))
    assert_judged_as_registered(store, outcome, promoted, tmp_path)


def test_revalidation_ignores_another_thresholds_file_in_hand(promoted, store, tmp_path):
    """A file in hand that differs from the registration (the float32 flow-test profile,
    and other perf settings) changes nothing: the registration judges."""
    from flows.revalidate import revalidate_production

    other = untimed(FLOW_TEST, tmp_path / "float32.yaml")
    outcome = revalidate_production(FAMILY, RolloutSettings(
        store_dir=store, thresholds=other, perf_repeats=1, model_check=True,
        testset_profile="ci"))
    assert_judged_as_registered(store, outcome, promoted, tmp_path)


def test_the_nightly_job_rejudges_every_family_in_production(promoted, store):
    """``kernelgate revalidate`` with no family and no thresholds file (the nightly
    deployment's parameters: none): every family with a production version is re-judged,
    each under its own registration; exit 0 when all pass."""
    import json

    from typer.testing import CliRunner

    from flows.cli import app
    from lineage.store.tracking import local_tracking

    in_production = registered_model.families_in_production(local_tracking(store))
    assert in_production == {FAMILY: promoted.version}
    result = CliRunner().invoke(app, ["revalidate", "--store-dir", str(store)])
    assert result.exit_code == 0, result.output
    nightly = json.loads(result.stdout[result.stdout.index("{"):])
    assert [(o["family"], o["version"], o["result"]) for o in nightly["outcomes"]] == [
        (FAMILY, promoted.version, "passed")]
    assert nightly["errors"] == {}


def test_altered_registered_bytes_are_an_error_never_a_rollback(promoted, store):
    """The frozen thresholds edited in the store (a looser criterion, no key): the
    re-validation refuses to judge — nothing is opened, production stays."""
    from flows.revalidate import NotJudgeable, revalidate_production
    from lineage.store.tracking import local_tracking

    tracking = local_tracking(store)
    registration_id = registered_model.version_tags(
        tracking, FAMILY, promoted.version)[tags.REGISTRATION_ID]
    folder = Path(tracking.client().get_run(registration_id).info.artifact_uri
                  .removeprefix("file://"))
    (frozen,) = (folder / "thresholds").glob("*.yaml")
    original = frozen.read_bytes()
    runs_before = len(tracking.client().search_runs(
        [tracking.client().get_run(registration_id).info.experiment_id]))
    frozen.write_bytes(original.replace(b"max_nan_count: 0", b"max_nan_count: 9"))
    try:
        with pytest.raises(NotJudgeable, match="altered"):
            revalidate_production(FAMILY, RolloutSettings(store_dir=store))
    finally:
        frozen.write_bytes(original)
    assert registered_model.alias_version(tracking, FAMILY, "production") == promoted.version
    assert len(tracking.client().search_runs(
        [tracking.client().get_run(registration_id).info.experiment_id])) == runs_before
