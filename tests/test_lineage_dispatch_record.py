"""A dispatch build's policy in the signed record: an untouched one passes the audit (every
bucket re-derived from the signed evidence) and is handed to ``auto`` pinned; a bucket's
evidence edited after signing fails it, as does a policy signed with a choice its
evidence does not derive, or a build config naming another fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels.dispatch_serving import POLICY_ENV, SHA256_ENV, configured_policy
from lineage.aliases.registered_model import register_build
from lineage.log.log_writer import append
from lineage.records import dispatch_record
from lineage.records.dispatch_record import DispatchRecordError, audit_dispatch_build
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from tests.test_kernels_dispatch_policy import _edited, _policy


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


def _dispatch_build(tracking, signing, family, policy, config_sha256=None) -> str:
    """A signed dispatch build run serving ``policy`` (its config: ``config_sha256``,
    default the policy's fingerprint); returns the run id."""
    sha256 = config_sha256 or policy.fingerprint()
    with tr.stage_run(tracking, family, "build") as run_id:
        dispatch_record.log_policy(tracking, run_id, policy)
        version = register_build(tracking, family, run_id, implementation="dispatch",
                                 config=None, artifact_path="dispatch")
        append(tracking, run_id, "build", {
            "family": family, "version": version, "build_run_id": run_id,
            "implementation": "dispatch", "config": {"policy_sha256": sha256},
            "code_sha256": "0" * 64,
            "version_tags": {tags.IMPLEMENTATION: "dispatch", tags.CONFIG: "null"}}, signing)
    return run_id


def _artifact(tracking, run_id: str) -> Path:
    uri = tracking.client().get_run(run_id).info.artifact_uri
    return Path(uri.removeprefix("file://")) / dispatch_record.POLICY_ARTIFACT


def test_an_untouched_signed_policy_passes_and_is_served_pinned(tracking, signing, tmp_path):
    run_id = _dispatch_build(tracking, signing, "dispatch-untouched", _policy())
    source = StoreSource(tracking, "dispatch-untouched", signing.trust)
    audit, policy = audit_dispatch_build(source, run_id)
    assert audit.problems == [] and policy == _policy()
    assert (audit.policy_sha256, audit.buckets) == (_policy().fingerprint(), 4)
    assert audit.kernels == ["xla", "naive"]
    env = dispatch_record.serving_environment(source, run_id, tmp_path)
    assert env[SHA256_ENV] == _policy().fingerprint()
    assert configured_policy(env) == _policy()
    assert set(env) == {POLICY_ENV, SHA256_ENV}


def test_a_buckets_evidence_edited_after_signing_fails_the_audit(tracking, signing, tmp_path):
    run_id = _dispatch_build(tracking, signing, "dispatch-edited", _policy())
    stored = _artifact(tracking, run_id)
    data = json.loads(stored.read_text())
    timing = data["buckets"][0]["evidence"]["kernels"][1]["timings"][0]  # naive at (32, 16)
    timing.update(median_s=1e-6, low_s=0.99e-6, high_s=1.01e-6)
    stored.write_text(json.dumps(data, indent=1))
    source = StoreSource(tracking, "dispatch-edited", signing.trust)
    audit, policy = audit_dispatch_build(source, run_id)
    assert policy is None
    (problem,) = audit.problems
    assert problem.startswith(f"run {run_id}: {dispatch_record.POLICY_ARTIFACT} differs from "
                              "its signed digest (altered after signing); read as stored, ")
    assert f"bucket {data['buckets'][0]['evidence']['bucket']['name']!r}" in problem  # edited
    with pytest.raises(DispatchRecordError, match="altered after signing"):
        dispatch_record.serving_environment(source, run_id, tmp_path)
    dispatch = {"implementation": "dispatch"}
    assert dispatch_record.version_problems(source, run_id, dispatch) == audit.problems
    assert dispatch_record.version_problems(source, run_id, {"implementation": "xla"}) == []
    assert dispatch_record.version_problems(source, None, dispatch) == []


def test_a_policy_signed_with_a_choice_its_evidence_does_not_derive_fails_the_audit(
        tracking, signing):
    forged = _edited(_policy(), (32, 16), "naive", 1e-6)  # naive fastest; xla recorded
    run_id = _dispatch_build(tracking, signing, "dispatch-forged", forged)
    source = StoreSource(tracking, "dispatch-forged", signing.trust)
    audit, _ = audit_dispatch_build(source, run_id)
    (problem,) = audit.problems
    assert "bucket 'float32 full d[1, 48) q[1, 32)" in problem
    assert "records xla, but its evidence derives naive" in problem


def test_a_build_config_naming_another_fingerprint_fails_the_audit(tracking, signing):
    run_id = _dispatch_build(tracking, signing, "dispatch-other", _policy(),
                             config_sha256="a" * 64)
    audit, _ = audit_dispatch_build(StoreSource(tracking, "dispatch-other", signing.trust),
                                    run_id)
    assert audit.problems == [f"run {run_id}: the dispatch policy's fingerprint is "
                              f"{_policy().fingerprint()}, not the {'a' * 64} signed: it "
                              "changed after signing"]
