"""A dispatch policy rolled out like a kernel: ``--implementation dispatch`` with a
stand-in policy (``tests.dispatch_standin``: made-up evidence over ``xla`` and ``naive``)
goes through the real rollout flow (real Prefect flow runs, a real MLflow store, the
version served in the flow's process beside its baseline, since the rollout registers
its policy) to production; then
``kernelgate audit`` of that version passes, and a copy of the store with one bucket's
evidence edited in the stored policy fails it, naming the bucket (the untouched store,
audited again, still passes: the failure is the edit's, not a false alarm).

With that version in production, ``--implementation auto`` resolves to its policy, read
back through the signed build record and pinned to its fingerprint; a store without one,
a policy measured on another backend, or a build record whose policy was edited after
signing leaves ``auto`` what it was, saying why (the edit as a warning). The
environment's policy, when set, overrides the store's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness
from typer.testing import CliRunner

import kernels
from flows.cli import app
from flows.kernel_choice import auto_policy, rollout_kernel
from flows.plan import plan_policy, resolve_plan
from flows.rollout import run_rollout
from flows.settings import RolloutSettings
from kernels.dispatch_audit import PolicyError
from kernels.dispatch_kernel import DispatchKernel
from kernels.dispatch_policy import Rule, derive_policy
from kernels.dispatch_serving import POLICY_ENV, SHA256_ENV
from kernels.registry import IMPLEMENTATIONS, registered
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model
from lineage.log.checkpoints import CHECKPOINTS
from lineage.records import dispatch_record
from lineage.serving.dispatch_version import DISPATCH, worker_environment
from lineage.serving.version_runners import VersionPool, VersionWorker, serves_signed_policy
from lineage.signing.keys import default_key_dir
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store.tracking import local_tracking
from tests.dispatch_standin import (
    KERNELS,
    standin_evidence,
    standin_policy,
    write_standin_policy,
)
from tests.flow_thresholds import FLOW_TEST, untimed
from tests.shared_builds import HARNESS_STARTUP_S, copy_of, flow_testset
from tests.store_copies import copy_store

FAMILY = DISPATCH  # the family auto reads its production policy from
SMALL_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                              head_dim=32, dtype="float32", causal=False)]


@pytest.fixture(scope="module")
def harness():
    """One Prefect test server for the module's flow runs, with no tracking server."""
    with (pytest.MonkeyPatch.context() as mp,
          prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S)):
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv(POLICY_ENV, raising=False)
        mp.delenv(SHA256_ENV, raising=False)
        yield


def _settings(root: Path, store: Path, **kwargs) -> RolloutSettings:
    """The module's rollout settings (its test set under ``root``) against ``store``."""
    return RolloutSettings(
        thresholds=untimed(FLOW_TEST, root / "flow.yaml"), testset_dir=root / "testset",
        store_dir=store, shadow_requests=8, perf_repeats=3, perf_shapes=SMALL_SHAPE,
        model_check=False, testset_profile="minimal", **kwargs)


@pytest.fixture(scope="module")
def promoted(tmp_path_factory, harness):
    """The stand-in policy rolled out to production, its plan resolved before the flow
    as the CLI does: (store folder, outcome)."""
    root = tmp_path_factory.mktemp("dispatch-flow")
    copy_of(flow_testset(tmp_path_factory), root / "testset")
    policy_file = write_standin_policy(root / "policy.json")
    settings = _settings(root, root / "store", implementation="dispatch",
                         dispatch_policy=policy_file, family=FAMILY)
    outcome = run_rollout(settings, resolve_plan(settings, "cpu"))
    return root / "store", outcome


def _own_keys(folder: Path) -> Path:
    """A snapshot of the pipeline's key folder at ``folder`` (its keys, not its
    checkpoints) for a copy of a store whose log goes on its own way from the
    original's: each keeps its own checkpoint of its log."""
    shutil.copytree(default_key_dir(), folder, ignore=shutil.ignore_patterns(CHECKPOINTS))
    return folder


@pytest.fixture(scope="module")
def promoted_again(promoted, tmp_path_factory):
    """A copy of that store in which the production policy was rolled out again, named
    on purpose (``--implementation dispatch --dispatch-policy``, as the refusal of ``auto``
    says): built as a new version of the family and promoted: (store folder, its key
    folder, outcome)."""
    store, _ = promoted
    folder = tmp_path_factory.mktemp("dispatch-auto")
    again, keys = copy_store(store, folder / "store"), _own_keys(folder / "keys")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELGATE_KEY_DIR", str(keys))
        return again, keys, run_rollout(_settings(
            store.parent, again, implementation="dispatch",
            dispatch_policy=store.parent / "policy.json", family=FAMILY))


def _audit(store: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", "production", "--family", FAMILY,
                                      "--store-dir", str(store), *extra],
                                catch_exceptions=False)
    return result.exit_code, result.output


def test_a_dispatch_policy_is_rolled_out_to_production_and_its_version_serves_it(
        promoted, signing, tmp_path):
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


def test_a_dispatch_version_runs_in_the_process_that_registers_its_signed_policy(
        promoted, signing, tmp_path):
    """Placement: where this process serves the version's own signed policy (a rollout of
    it), the version runs here beside its baseline, so a canary compares kernels, not
    processes; with no policy registered, another policy, or a signed record edited since,
    it does not."""
    store, outcome = promoted
    tracking = local_tracking(store)
    source = StoreSource(tracking, FAMILY, signing.trust, stages=("build",))
    assert not serves_signed_policy(source, outcome.version)  # nothing registered
    with registered(DispatchKernel(standin_policy())):
        assert serves_signed_policy(source, outcome.version)
        runner = VersionPool(tracking, FAMILY, None, signing.trust).runner(outcome.version)
        assert not isinstance(runner, VersionWorker)
        assert runner.name == f"dispatch@v{outcome.version}"
        assert runner.describe()["config"] == {"policy_sha256": standin_policy().fingerprint()}
        edited, _ = _edited_copy(store, tmp_path / "edited")
        assert not serves_signed_policy(StoreSource(local_tracking(edited), FAMILY,
                                                    signing.trust), outcome.version)
    other = derive_policy(standin_evidence(), KERNELS, Rule(priority=("naive",)))
    assert other.fingerprint() != standin_policy().fingerprint()
    with registered(DispatchKernel(other)):
        assert not serves_signed_policy(source, outcome.version)


def test_the_rollouts_flow_parameter_names_the_policy_instead_of_carrying_it(promoted):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    store, _ = promoted
    policy_file = (store.parent / "policy.json").resolve()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(
            name=FlowFilterName(any_=["kernelgate-rollout"])))
    (plan,) = [r.parameters["plan"] for r in runs
               if (r.parameters.get("plan") or {}).get("implementation") == "dispatch"
               and r.parameters["plan"]["dispatch_policy"]["path"] == str(policy_file)]
    assert plan["dispatch_policy"] == {"fingerprint": standin_policy().fingerprint(),
                                       "path": str(policy_file)}
    stored = json.dumps(plan)
    # the policy's own keys (a field named like noise_within_buckets is no bucket)
    assert '"evidence":' not in stored and '"buckets":' not in stored
    assert len(json.dumps(plan["dispatch_policy"])) < 250 < policy_file.stat().st_size


def test_a_policy_file_changed_after_the_plan_was_resolved_is_refused_in_the_flow(
        tmp_path, harness):
    policy_file = write_standin_policy(tmp_path / "policy.json")
    settings = _settings(tmp_path, tmp_path / "store", implementation="dispatch",
                         dispatch_policy=policy_file, family=FAMILY)
    plan = resolve_plan(settings, "cpu")
    planned = standin_policy().fingerprint()
    assert plan_policy(plan, settings, "cpu").fingerprint() == planned  # unchanged: served
    other = derive_policy(standin_evidence(), KERNELS, Rule(priority=("naive",)))
    assert other.fingerprint() != planned
    policy_file.write_text(other.model_dump_json())  # valid and audited, but not the planned
    with pytest.raises(PolicyError) as refused:
        run_rollout(settings, plan)
    assert f"({policy_file.resolve()}, fingerprint {planned}) is not served" in str(refused.value)
    assert other.fingerprint() in str(refused.value)
    assert not (tmp_path / "store").exists()  # refused before anything was opened
    assert "dispatch" not in IMPLEMENTATIONS


def test_a_store_policy_changed_after_the_plan_was_resolved_is_refused(promoted, tmp_path,
                                                                        monkeypatch):
    store, _ = promoted
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    plan = _auto_plan(store)
    planned = standin_policy().fingerprint()
    assert plan_policy(plan, RolloutSettings(store_dir=store), "cpu").fingerprint() == planned
    edited, _ = _edited_copy(store, tmp_path / "edited")  # its production policy fails audit
    with pytest.raises(PolicyError, match=f"was {planned} when this rollout was planned and "
                                          "is now none"):
        plan_policy(plan, RolloutSettings(store_dir=edited), "cpu")


def _edited_copy(store: Path, folder: Path) -> tuple[Path, str]:
    """A copy of ``store`` whose signed policy artifact has one bucket's evidence edited
    (in the bucket the build's shape fell in, naive chosen: xla made the fastest there);
    returns the copy and that bucket's name."""
    edited = copy_store(store, folder)
    (policy_file,) = edited.rglob(dispatch_record.POLICY_ARTIFACT)
    data = json.loads(policy_file.read_text())
    index = next(i for i, b in enumerate(data["buckets"]) if b["kernel"] == "naive")
    bucket = data["buckets"][index]["evidence"]["bucket"]["name"]
    (entry,) = [k for k in data["buckets"][index]["evidence"]["kernels"] if k["kernel"] == "xla"]
    entry["timings"][0].update(median_s=1e-7, low_s=0.99e-7, high_s=1.01e-7)
    policy_file.write_text(json.dumps(data, indent=1))
    return edited, bucket


def test_the_audit_re_derives_the_policy_and_names_an_edited_bucket(promoted, tmp_path):
    store, _ = promoted
    code, out = _audit(store)
    assert code == 0, out
    assert "loaded model" in out
    edited, bucket = _edited_copy(store, tmp_path / "edited")
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
    (["--implementation", "dispatch", "--dispatch-policy", "{other_backend}"],
     "a dispatch policy measured on gpu (a GPU); this host's backend is cpu"),
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
    other_backend = tmp_path / "gpu.json"  # valid and audited, measured on another backend
    elsewhere = standin_evidence().model_copy(update={"backend": "gpu", "device": "a GPU"})
    other_backend.write_text(derive_policy(elsewhere, KERNELS, Rule(priority=("xla",)))
                             .model_dump_json())
    files = {"good": good, "bad": bad, "forged": forged, "other_backend": other_backend}
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["rollout", *[a.format(**files) for a in args],
                                      "--store-dir", str(store)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert match in " ".join(result.output.split()), result.output
    assert not store.exists()  # refused before anything was written


def _auto_plan(store: Path):
    """The plan of ``--implementation auto`` against ``store`` on this CPU host."""
    return resolve_plan(RolloutSettings(store_dir=store), "cpu")


def test_auto_serves_the_stores_production_dispatch_policy_pinned(promoted, monkeypatch):
    store, outcome = promoted
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    plan = _auto_plan(store)
    fingerprint = standin_policy().fingerprint()
    assert (plan.implementation, plan.family) == ("dispatch", FAMILY)
    assert plan.dispatch_policy.fingerprint == fingerprint and plan.dispatch_policy.path is None
    assert plan.why == (f"auto -> dispatch v{outcome.version} (the store's production "
                        f"dispatch policy, sha256 {fingerprint[:12]}…)")
    assert "dispatch" not in IMPLEMENTATIONS  # registered only while the plan is resolved


def test_a_plain_rollout_of_the_production_policy_has_nothing_to_roll_out(promoted,
                                                                         monkeypatch):
    """``kernelgate rollout`` with no kernel named resolves ``auto`` to the store's
    production dispatch policy: that is the family's production already, so it is refused
    (exit 2) naming the version and its sha256, and no version is built."""
    store, outcome = promoted
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    client = local_tracking(store).client()

    def versions() -> list[str]:
        return sorted(v.version for v in client.search_model_versions(f"name='{FAMILY}'"))

    before = versions()
    result = CliRunner().invoke(app, ["rollout", "--store-dir", str(store)],
                                catch_exceptions=False)
    text = " ".join(result.output.split())
    fingerprint = standin_policy().fingerprint()
    assert result.exit_code == 2, result.output
    assert (f"nothing to roll out: auto -> dispatch v{outcome.version} (the store's production "
            "dispatch policy") in text, text
    assert f"production of family {FAMILY} already (sha256 {fingerprint})" in text, text
    assert "--implementation dispatch --dispatch-policy POLICY.json" in text, text
    assert versions() == before  # nothing built or registered
    assert registered_model.alias_version(local_tracking(store), FAMILY, "production") == (
        outcome.version)


def test_a_scheduled_rollout_of_the_production_policy_ends_nothing_to_roll_out(
        promoted, tmp_path, monkeypatch):
    """A deployment's rollout with default settings (``auto``) once a policy is promoted:
    the flow run ends *NothingToRollOut*, Completed-type, naming the version, and writes
    no run, version or log entry; the same flow with the policy named builds a version
    (the refusal is ``auto``'s alone: tested by ``promoted_again``)."""
    from prefect.states import StateType

    from flows.rollout import rollout

    store, outcome = promoted
    copy = copy_store(store, tmp_path / "store")
    monkeypatch.setenv("KERNELGATE_KEY_DIR", str(_own_keys(tmp_path / "keys")))
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    client = local_tracking(copy).client()

    def written() -> tuple:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return (sorted(r.info.run_id for r in runs),
                sorted(v.version for v in client.search_model_versions(f"name='{FAMILY}'")),
                sorted(p.name for p in copy.rglob("*") if p.is_file()))

    before = written()
    state = rollout(_settings(store.parent, copy), return_state=True)
    assert (state.name, state.type) == ("NothingToRollOut", StateType.COMPLETED), state.message
    assert state.message.startswith(
        f"nothing to roll out: auto -> dispatch v{outcome.version} (the store's production"), (
        state.message)
    assert written() == before


def test_auto_without_a_production_dispatch_policy_is_what_it_was(tmp_path, signing,
                                                                  monkeypatch):
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    today = rollout_kernel("auto", "cpu", None)
    plan = _auto_plan(tmp_path / "no-store")
    assert plan.implementation == today[0] == kernels.native_flash_kernel("auto", "cpu")
    assert plan.dispatch_policy is None
    assert plan.why == (f"{today[1]} (no dispatch policy served: there is no store yet, so no "
                        "policy is in production)")
    assert not (tmp_path / "no-store").exists()  # a read never creates a store
    found = auto_policy(local_tracking(tmp_path / "empty"), signing.trust, "cpu")
    assert (found.policy, found.why) == (
        None, f"no policy is in production (family {FAMILY}); one is rolled out with "
        "`--implementation dispatch`")


def test_auto_passes_over_a_policy_measured_on_another_backend(promoted, signing,
                                                               monkeypatch):
    store, outcome = promoted
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    found = auto_policy(local_tracking(store), signing.trust, "tpu")
    assert found.policy is None
    assert found.why == (f"the store's production dispatch policy ({FAMILY} "
                         f"v{outcome.version}) was measured on cpu, not tpu")
    name, why = rollout_kernel("auto", "tpu", None, found)
    assert name == kernels.native_flash_kernel("auto", "tpu")
    assert why == f"{kernels.why_picked('auto', 'tpu')} (no dispatch policy served: {found.why})"


def test_auto_never_serves_a_policy_edited_after_signing_and_warns(promoted, tmp_path,
                                                                   monkeypatch, caplog):
    store, outcome = promoted
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    edited, bucket = _edited_copy(store, tmp_path / "edited")
    with caplog.at_level("WARNING", logger="flows.kernel_choice"):
        plan = _auto_plan(edited)
    assert plan.implementation == kernels.native_flash_kernel("auto", "cpu")
    assert plan.dispatch_policy is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"{FAMILY} v{outcome.version}, the store's production "
                              "dispatch policy, fails its audit and is not served:"), warning
    assert "altered after signing" in warning and f"bucket {bucket!r}" in warning, warning
    assert f"(no dispatch policy served: WARNING: {warning})" in plan.why


def test_the_environments_policy_overrides_the_stores(promoted, tmp_path, monkeypatch):
    store, _ = promoted
    edited, _ = _edited_copy(store, tmp_path / "edited")  # the store's own is not served
    policy = standin_policy()
    monkeypatch.setenv(POLICY_ENV, str(write_standin_policy(tmp_path / "policy.json")))
    monkeypatch.setenv(SHA256_ENV, policy.fingerprint())
    plan = _auto_plan(edited)
    assert plan.implementation == "dispatch"
    assert plan.dispatch_policy.fingerprint == policy.fingerprint()
    assert plan.dispatch_policy.path == str((tmp_path / "policy.json").resolve())
    assert plan.why == (f"auto -> dispatch (the policy {POLICY_ENV} names, sha256 "
                        f"{policy.fingerprint()[:12]}…; the environment overrides the "
                        "store's production dispatch policy)")


def test_the_policy_rolled_out_again_by_name_is_a_new_version_a_rollback_restores_the_first(
        promoted, promoted_again, signing, monkeypatch):
    from flows.rollback import manual_rollback
    from lineage.audit.audit import audit

    _, first = promoted
    store, keys, again = promoted_again
    monkeypatch.setenv("KERNELGATE_KEY_DIR", str(keys))
    assert again.result == "promoted", again.reason
    tracking = local_tracking(store)
    source = StoreSource(tracking, FAMILY, signing.trust)
    configs = {a.predicate["version"]: a.predicate["config"] for a in source.attestations()
               if a.kind == "build"}
    pinned = {"policy_sha256": standin_policy().fingerprint()}
    assert configs == {first.version: pinned, again.version: pinned}

    state = manual_rollback(reason="policy drill", requested_by="rm@example.com",
                            to_version=int(first.version), family=FAMILY,
                            store_dir=str(store), return_state=True)
    assert state.name == "RolledBack", state.message
    assert registered_model.alias_version(tracking, FAMILY, "production") == first.version
    report = audit(tracking, FAMILY, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    text = report.render()
    assert f"restored to production by a rollback from v{again.version}" in text, text
    assert "rm@example.com: policy drill" in text, text


def test_auto_never_serves_a_version_the_production_alias_was_moved_to_by_hand(
        promoted_again, signing, tmp_path, monkeypatch, caplog):
    """The MLflow alias is not signed: moved to another built, signed version by a store
    editor, ``auto`` serves no policy and warns; the untouched copy serves the signed one."""
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv(SHA256_ENV, raising=False)
    store, _, _ = promoted_again
    moved = copy_store(store, tmp_path / "moved")
    tracking = local_tracking(moved)
    signed = registered_model.alias_version(tracking, FAMILY, "production")
    assert auto_policy(tracking, signing.trust, "cpu").policy is not None  # untouched: served
    (other,) = {a.predicate["version"] for a in StoreSource(tracking, FAMILY, signing.trust)
                .attestations() if a.kind == "build"} - {signed}
    tracking.client().set_registered_model_alias(
        registered_model.registered_model_name(FAMILY), "production", str(other))
    with caplog.at_level("WARNING", logger="flows.kernel_choice"):
        found = auto_policy(tracking, signing.trust, "cpu")
    assert found.policy is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == (f"the store's {FAMILY} production alias names v{other}, its signed "
                       f"alias history v{signed}: no policy is served"), warning
    assert found.why == f"WARNING: {warning}"


def test_revalidation_re_judges_a_production_dispatch_version_and_fails_an_edited_policy(
        promoted, harness, tmp_path):
    from flows.revalidate import revalidate_production

    store, outcome = promoted
    intact = copy_store(store, tmp_path / "intact")
    judged = revalidate_production(FAMILY, _settings(store.parent, intact,
                                                     key_dir=_own_keys(tmp_path / "keys")))
    assert (judged.result, judged.version) == ("passed", outcome.version), judged.reason
    assert judged.loaded.startswith("in its own process"), judged.loaded
    edited, bucket = _edited_copy(store, tmp_path / "edited")
    failed = revalidate_production(FAMILY, _settings(store.parent, edited, key_dir=_own_keys(
        tmp_path / "edited-keys")), return_state=True)
    result = failed.result(raise_on_failure=False)
    assert getattr(result, "result", None) == "rolled_back", (failed.name, result)
    assert "altered after signing" in result.reason and f"bucket {bucket!r}" in result.reason
    assert registered_model.alias_version(local_tracking(edited), FAMILY, "production") != (
        outcome.version)


H100_POLICY = (Path(__file__).parent.parent / "kernels/tools/bench_results"
               / "h100-2026-12-05-dispatch-evidence/merged/policy.json")
PREFECT_PARAMETER_LIMIT = 524_288  # bytes; the Prefect server's 422 names this limit


def test_a_whole_gpu_policy_resolves_to_a_plan_prefect_accepts_as_a_flow_parameter(tmp_path):
    """The committed H100 policy (162 buckets with their evidence) was refused by Prefect
    when the plan carried it by value (570,777 bytes of parameters); by reference the
    rollout's parameters stay far under the server's limit."""
    assert H100_POLICY.stat().st_size > PREFECT_PARAMETER_LIMIT  # by value it cannot fit
    settings = _settings(tmp_path, tmp_path / "store", implementation="dispatch",
                         dispatch_policy=H100_POLICY)
    plan = resolve_plan(settings, "gpu")
    parameters = json.dumps({"settings": settings.model_dump(mode="json"),
                             "plan": plan.model_dump(mode="json")})
    assert len(parameters) < PREFECT_PARAMETER_LIMIT // 8
    assert plan.dispatch_policy.path == str(H100_POLICY.resolve())
    assert plan.dispatch_policy.fingerprint.startswith("2d0295e48abf53d1")
