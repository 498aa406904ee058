"""A dispatch policy rolled out like a kernel: ``--implementation dispatch`` with a
stand-in policy (``tests.dispatch_standin``: made-up evidence over ``xla`` and ``naive``)
goes through the real rollout flow (real Prefect flow runs, a real MLflow store, the
version served from a process of its own with its signed policy) to production; then
``kernelgate audit`` of that version passes, and a copy of the store with one bucket's
evidence edited in the stored policy fails it, naming the bucket (the untouched store,
audited again, still passes: the failure is the edit's, not a false alarm).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness
from typer.testing import CliRunner

from flows.cli import app
from flows.rollout import run_rollout
from flows.settings import RolloutSettings
from kernels.dispatch_serving import SHA256_ENV
from kernels.registry import IMPLEMENTATIONS
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model
from lineage.records import dispatch_record
from lineage.serving.dispatch_version import worker_environment
from lineage.signing.sources import StoreSource
from lineage.store import tags
from tests.dispatch_standin import standin_policy, write_standin_policy
from tests.flow_thresholds import FLOW_TEST, untimed
from tests.shared_builds import HARNESS_STARTUP_S, copy_of, flow_testset
from tests.store_copies import copy_store

FAMILY = "dispatch-test"
SMALL_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                              head_dim=32, dtype="float32", causal=False)]


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    """The stand-in policy rolled out to production: (store folder, outcome)."""
    root = tmp_path_factory.mktemp("dispatch-flow")
    copy_of(flow_testset(tmp_path_factory), root / "testset")
    policy_file = write_standin_policy(root / "policy.json")
    settings = RolloutSettings(
        implementation="dispatch", dispatch_policy=policy_file, family=FAMILY,
        thresholds=untimed(FLOW_TEST, root / "flow.yaml"), testset_dir=root / "testset",
        store_dir=root / "store", shadow_requests=8, perf_repeats=3, perf_shapes=SMALL_SHAPE,
        model_check=False, testset_profile="minimal")
    with (pytest.MonkeyPatch.context() as mp,
          prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S)):
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        outcome = run_rollout(settings)
    return root / "store", outcome


def _audit(store: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", "production", "--family", FAMILY,
                                      "--store-dir", str(store), *extra],
                                catch_exceptions=False)
    return result.exit_code, result.output


def test_a_dispatch_policy_is_rolled_out_to_production_and_its_version_serves_it(
        promoted, signing, tmp_path):
    from lineage.store.tracking import local_tracking

    store, outcome = promoted
    assert outcome.result == "promoted", outcome.reason
    assert "dispatch" not in IMPLEMENTATIONS  # registered for the rollout's session only
    tracking = local_tracking(store)
    version = registered_model.alias_version(tracking, FAMILY, "production")
    assert version == outcome.version
    assert registered_model.version_tags(tracking, FAMILY, version)[tags.IMPLEMENTATION] == (
        "dispatch")
    source = StoreSource(tracking, FAMILY, signing.trust)
    (build,) = [a for a in source.attestations() if a.kind == "build"]
    fingerprint = standin_policy().fingerprint()
    assert build.predicate["config"] == {"policy_sha256": fingerprint}  # signed
    assert dispatch_record.version_problems(source, build.run_id, build.predicate) == []
    # what its runners are started with: the signed policy, pinned
    assert worker_environment(source, version, tmp_path)[SHA256_ENV] == fingerprint


def test_the_audit_re_derives_the_policy_and_names_an_edited_bucket(promoted, tmp_path):
    store, _ = promoted
    code, out = _audit(store)
    assert code == 0, out
    assert "loaded model" in out
    edited = copy_store(store, tmp_path / "edited")
    (policy_file,) = edited.rglob(dispatch_record.POLICY_ARTIFACT)
    data = json.loads(policy_file.read_text())
    # the bucket the build's shape fell in (naive chosen): xla made the fastest there
    index = next(i for i, b in enumerate(data["buckets"]) if b["kernel"] == "naive")
    bucket = data["buckets"][index]["evidence"]["bucket"]["name"]
    (entry,) = [k for k in data["buckets"][index]["evidence"]["kernels"] if k["kernel"] == "xla"]
    entry["timings"][0].update(median_s=1e-7, low_s=0.99e-7, high_s=1.01e-7)
    policy_file.write_text(json.dumps(data, indent=1))
    code, out = _audit(edited, "--no-load-model")
    assert code == 1, out
    assert "altered after signing" in out and f"bucket {bucket!r}" in out, out
    code, out = _audit(store)  # the untouched store still passes: the edit failed it
    assert code == 0, out


@pytest.mark.parametrize("args, match", [
    (["--implementation", "dispatch"], "pass --dispatch-policy POLICY.json"),
    (["--implementation", "xla", "--dispatch-policy", "{good}"],
     "--dispatch-policy is for --implementation dispatch, not 'xla'"),
    (["--implementation", "dispatch", "--dispatch-policy", "{bad}"],
     "is not a valid policy: buckets: Tuple should have at least 1 item"),
    (["--implementation", "dispatch", "--dispatch-policy", "{forged}"],
     "records naive, but its evidence derives xla"),
])
def test_a_bad_policy_argument_is_refused_naming_the_constraint_with_nothing_written(
        tmp_path, args, match):
    good = write_standin_policy(tmp_path / "good.json")
    data = json.loads(good.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "buckets": []}))
    index = next(i for i, b in enumerate(data["buckets"]) if b["kernel"] == "naive")
    (entry,) = [k for k in data["buckets"][index]["evidence"]["kernels"] if k["kernel"] == "xla"]
    entry["timings"][0].update(median_s=1e-7, low_s=0.99e-7, high_s=1.01e-7)
    forged = tmp_path / "forged.json"  # one bucket's evidence edited, its choice not
    forged.write_text(json.dumps(data))
    files = {"good": good, "bad": bad, "forged": forged}
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["rollout", *[a.format(**files) for a in args],
                                      "--store-dir", str(store)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert match in " ".join(result.output.split()), result.output
    assert not store.exists()  # refused before anything was written
