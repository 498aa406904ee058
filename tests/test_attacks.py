"""Replays every kind of attack on the evidence on copies of a
real store, and asserts each is refused or detected with a message naming it.

The pristine store is made once by real rollouts (Prefect flow runs, MLflow on SQLite,
signed attestations): v1 and v2 promoted in turn, v3 rejected at the gate, v4 rolled
back in canary, v5 stopped after canary and before its confirmation. Each attack gets
a copy of that store of its own; the attacker writes anything in the store, but not
the pipeline's key folder.

``KERNELGATE_ATTACK_REPORT=<file.json>`` also writes the table of attacks tried and
caught by kind; ``make attacks`` sets it and replays every variant (RELIABILITY.md
records it).

Which run where (the suite's time): ``make test`` replays the first attack
registered of each kind (23 of the 54 variants, one per kind, so every kind is still
tried on every run); the other 31 variants of those kinds are marked ``slow`` and run
in ``make attacks`` (all 54, the report RELIABILITY.md quotes) and ``make test-slow``.
None is deleted. Why: every variant replays on a copy of the pristine store and most
end in a full audit, and the variants of one kind exercise the same check.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lineage.aliases import registered_model, registry
from lineage.store import tags
from lineage.store import tracking as tr
from tests import faulty_kernels
from tests.faulty_kernels import Fault
from tests.flow_thresholds import untimed_flow_test
from tests.shared_builds import HARNESS_STARTUP_S, built_once, copy_of, flow_testset
from tests.store_copies import copy_store

FAMILY = "attacked"
PROJECT = Path(__file__).resolve().parents[1]
THRESHOLDS = untimed_flow_test()  # tests.flow_thresholds: these rollouts do not time the host

KINDS = {
    1: "the audit decides what to check from editable tags",
    2: "integrity rests on digests kept in the same writable store",
    3: "threshold shopping",
    4: "registry changes are not atomic, and recovery breaks",
    5: "source drift sees only the kernel module",
    6: "input that fails late, or unclearly",
    7: "the approval form loses its rules",
    8: "a canary test that cannot fire counts as assessed",
    9: "a dataset logged again from another folder keeps the first source",
    10: "evidence deleted from the store leaves no trace the rules read",
    11: "the end of the signed history can be cut",
    12: "an exported bundle is trusted unsigned",
    13: "what serves is not what was audited (the loaded model reports its own code digest)",
    14: "an approver's key is a pipeline key",
    15: "the key-compromise procedure (rotate, revoke, reconcile) takes production down",
    16: "lineage facts the MLflow UI shows (environment tags, dataset inputs) are not signed",
    17: "settings that change a verdict are not part of the registration",
    18: "which runs hold the signed history is read from an unsigned tag",
    19: "a float64 reference planted in the cache is scored against",
    20: "the audit's scope follows MLflow's editable parent link",
    21: "a family's log starts again under its old name (experiment and model renamed)",
    22: "another store signed by the same key folder is put in the store's place",
    23: "a family's first approvers, named on first use, are swapped after signing",
}


@dataclass(frozen=True)
class Attack:
    kind: int
    name: str
    expect: str  # a phrase the refusal or the audit's problem must contain
    run: Callable[[Lab], str]


ATTACKS: list[Attack] = []


def attack(kind: int, expect: str):
    def register(fn):
        ATTACKS.append(Attack(kind, fn.__name__, expect, fn))
        return fn
    return register


# --- the lab: a pristine store and a fresh copy per attack ---------------------------------


class Lab:
    """One attack's copy of the pristine store (``pristine``: the fixture's namespace)."""

    def __init__(self, pristine: SimpleNamespace, name: str, *, in_place: bool = True):
        self.root = pristine.root / "attacks" / name
        self.store = self.root / "store"
        copy_store(pristine.path, self.store)  # its runs point at this copy, not the original
        # MLflow caches each run's artifact repository process-wide by run id alone, and
        # every copy has the same run ids: without this an attack's artifact writes and
        # the audit's reads go to whichever copy first touched the run.
        from mlflow.tracking._tracking_service import utils as mlflow_tracking

        mlflow_tracking._artifact_repos_cache.clear()
        self.testset = pristine.testset  # read-only: an attack that edits it takes a copy
        self.tracking = tr.local_tracking(self.store)
        self.versions = pristine.versions
        self.client = self.tracking.client()
        self.model = registered_model.registered_model_name(FAMILY)
        from lineage.signing import keys
        from lineage.signing.attestations import Signing

        # the key folder (with its checkpoints) as the pipeline left it, one per attack: an
        # attack's own signed moves advance its checkpoint only
        self.keys = shutil.copytree(pristine.keys, self.root / "keys")
        self.home = self.root / "home"  # the auditor's remembered heads
        self.signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(self.keys)),
                               trust=keys.folder_trust(self.keys), key_dir=self.keys)
        if in_place:  # the copy is the store where the pipeline wrote it (its key folder says)
            from lineage.store import store_identity

            built = tr.local_tracking(pristine.built).tracking_uri
            store_identity.remember(self.keys, self.tracking.tracking_uri,
                                    store_identity.known(self.keys)[built])

    def witnessing(self, **kw):
        from lineage.log.checkpoints import Witnessing

        return Witnessing(**{"key_dir": self.keys, "home": self.home, **kw})

    def audit(self, target: str = "production", **kw):
        from lineage.audit.audit import audit

        return audit(self.tracking, FAMILY, target, trust=self.signing.trust, load_model=False,
                     witnessing=self.witnessing(), **kw)

    def source(self, **kw):
        from lineage.signing.sources import StoreSource

        return StoreSource(self.tracking, FAMILY, self.signing.trust, **kw)

    def mv(self, version: str):
        return self.client.get_model_version(self.model, version)

    def sql(self, statement: str, *args) -> int:
        with sqlite3.connect(self.store / "mlflow.db") as db:
            return db.execute(statement, args).rowcount


def _detected(report) -> str:
    assert report.exit_code != 0, "the audit passed:\n" + report.render()
    return "\n".join(report.problems)


def _build_pristine(root: Path) -> None:
    """Rollouts v1..v5 (see the module docstring) into ``root/store``, then the pristine
    copy ``root/pristine``, the key folder as they left it (``root/keys``) and the
    versions by label (``root/versions.json``)."""
    from prefect.testing.utilities import prefect_test_harness

    from evaluation import serving
    from flows import rollout as rollout_module
    from flows.rollout import rollout, run_rollout
    from flows.settings import RolloutSettings
    from kernels.shapes import AttentionShape
    from lineage.signing import keys

    shape = AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                           head_dim=32, dtype="float32", causal=False)

    def settings(implementation: str) -> RolloutSettings:
        return RolloutSettings(implementation=f"test_{implementation}", family=FAMILY,
                               thresholds=THRESHOLDS, testset_dir=root / "testset",
                               store_dir=root / "store", shadow_requests=8, perf_repeats=3,
                               perf_shapes=[shape], model_check=False,
                               testset_profile="minimal")

    versions = {}
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S), pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        faulty_kernels.register(mp)
        mp.setattr(Fault, "active", False)
        for label in ("v1", "v2"):
            outcome = rollout(settings("good"))
            assert outcome.result == "promoted", outcome.reason
            versions[label] = outcome.version
        outcome = run_rollout(settings("wrong_scale"))
        assert (outcome.result, outcome.stage) == ("rejected", "gate"), outcome
        versions["rejected_at_gate"] = outcome.version

        real_step = serving.replay_canary_step

        def fault_in_canary(*args, **kwargs):
            Fault.active = True
            return real_step(*args, **kwargs)

        with pytest.MonkeyPatch.context() as canary:
            canary.setattr(serving, "replay_canary_step", fault_in_canary)
            outcome = run_rollout(settings("nan_under_fault"))
        Fault.active = False
        assert outcome.result == "rolled_back" and outcome.stage.startswith("canary"), outcome
        versions["failed_canary"] = outcome.version

        def stopped(context, preregistered, built, testset):
            versions["unconfirmed"] = built.version
            decisions = registered_model.version_tags(context.record.tracking, FAMILY, built.version)
            versions["unconfirmed_decision"] = decisions[tags.DECISION_RUN_ID]
            raise RuntimeError("stopped before confirmation")

        with pytest.MonkeyPatch.context() as cut:
            cut.setattr(rollout_module, "confirm", stopped)
            # a crash in a stage ends the rollout Errored (signed), never a verdict
            from flows.errored import RolloutErrored

            with pytest.raises(RolloutErrored, match="stopped before confirmation"):
                rollout(settings("good"))
    shutil.copytree(root / "store", root / "pristine")
    shutil.copytree(keys.default_key_dir(), root / "keys")
    (root / "versions.json").write_text(json.dumps(versions))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The pristine store, built once per test run (``tests.shared_builds``: ``make test``
    splits this module's attacks over both workers, see ``tests/conftest.py``), and this
    module's own folder for the attacks' copies.

    ``path`` (the pristine store), ``keys``, ``testset`` and ``built`` (the folder the
    rollouts wrote) are shared and read-only; ``root`` is this module's own."""
    def build(folder: Path) -> None:
        # the minimal profile (tests.shared_builds.flow_testset): the attacks are on the
        # evidence, not on a kernel's accuracy; the rollouts add draws to the copy
        copy_of(flow_testset(tmp_path_factory), folder / "testset")
        _build_pristine(folder)

    shared = built_once(tmp_path_factory, "attacks-pristine", build)
    return SimpleNamespace(root=tmp_path_factory.mktemp("attacks"), path=shared / "pristine",
                           keys=shared / "keys", testset=shared / "testset",
                           built=shared / "store",
                           versions=json.loads((shared / "versions.json").read_text()))


@pytest.fixture(scope="module")
def results():
    found: list[dict] = []
    yield found
    out = os.environ.get("KERNELGATE_ATTACK_REPORT")
    if out:
        by_kind = {k: {"kind": k, "what": KINDS[k], "tried": 0, "caught": 0} for k in KINDS}
        for row in found:
            by_kind[row["kind"]]["tried"] += 1
            by_kind[row["kind"]]["caught"] += row["caught"]
        Path(out).write_text(json.dumps({"attacks": found, "by_kind": list(by_kind.values())},
                                        indent=1))


def test_a_write_to_one_copy_leaves_the_others_byte_identical(pristine):
    """A signed write into a copied run (whose id the fixture's process has written
    before) lands in that copy only: the pristine store and another copy are unchanged."""
    from lineage.signing.attestations import attest
    from tests.store_copies import tree_digest

    before = tree_digest(pristine.path)
    one = Lab(pristine, "copy-one")
    other = Lab(pristine, "copy-two")
    untouched = tree_digest(other.store / "mlartifacts")
    run_id = one.mv(one.versions["v2"]).run_id
    attest(one.tracking, run_id, "outcome", {"family": FAMILY}, one.signing.signer, name="probe")
    assert _artifact_file(one, run_id, "attestations/probe.dsse.json").is_file()
    assert tree_digest(other.store / "mlartifacts") == untouched
    assert tree_digest(pristine.path) == before
    assert not list(pristine.built.glob("mlartifacts/*/*/artifacts/attestations/probe.dsse.json"))


def test_the_untouched_store_passes_the_audit(pristine):
    lab = Lab(pristine, "untouched")
    report = lab.audit()
    assert report.exit_code == 0, report.render()
    assert report.attestations_verified > 20 and report.artifacts_verified > 20
    assert f"{report.attestations_verified} attestations" in report.summary()
    assert not any("store identity" in w for w in report.warnings), report.render()


def test_a_store_restored_to_another_folder_still_audits(pristine):
    """The store copied to a folder neither the pipeline nor this auditor saw it in (a
    move, a restore from a backup): the audit passes, saying where the store was before;
    the pipeline's writers go on there (and remember the new place)."""
    lab = Lab(pristine, "restored-elsewhere", in_place=False)
    report = lab.audit()
    assert report.exit_code == 0, report.render()
    assert any("moved or restored" in w for w in report.warnings), report.render()
    registry.rollback(lab.tracking, FAMILY, reason="drill after the restore", signing=lab.signing)
    again = lab.audit()
    assert again.exit_code == 0, again.render()
    assert not any("moved or restored" in w for w in again.warnings), again.render()


def representatives(attacks: list[Attack]) -> set[str]:
    """The first attack registered of each kind: the ones ``make test`` replays."""
    first: dict[int, str] = {}
    for a in attacks:
        first.setdefault(a.kind, a.name)
    return set(first.values())


def pytest_generate_tests(metafunc):
    """Parametrize ``case`` once every attack below is registered: the first of each
    kind runs by default, the other variants of a kind are marked ``slow`` (``make
    attacks`` and ``make test-slow`` replay them; see the module docstring)."""
    if "case" not in metafunc.fixturenames:
        return
    default = representatives(ATTACKS)
    metafunc.parametrize("case", [
        pytest.param(a, id=f"kind{a.kind}-{a.name}",
                     marks=() if a.name in default else pytest.mark.slow)
        for a in ATTACKS])


def test_every_kind_keeps_one_attack_in_the_default_suite():
    """Moving variants to ``slow`` must leave each kind of KINDS replayed by ``make test``."""
    default = representatives(ATTACKS)
    assert {a.kind for a in ATTACKS if a.name in default} == set(KINDS)
    assert len(default) == len(KINDS) < len(ATTACKS)


def test_attack_is_refused_or_detected(case: Attack, pristine, results):
    lab = Lab(pristine, case.name)
    caught = False
    try:
        message = case.run(lab)
        assert case.expect.lower() in message.lower(), (
            f"caught, but the message does not name it ({case.expect!r}):\n{message}")
        caught = True
    finally:
        results.append({"kind": case.kind, "attack": case.name, "caught": caught})


# --- kind 1: the audit decides what to check from editable tags ----------------------------


@attack(1, "signed history leaves it")
def production_moved_by_hand_to_a_version_killed_in_canary(lab: Lab) -> str:
    lab.client.set_registered_model_alias(lab.model, "production", lab.versions["failed_canary"])
    return _detected(lab.audit())


@attack(1, "signed history leaves it")
def passing_tags_copied_onto_a_version_that_failed(lab: Lab) -> str:
    bad = lab.versions["failed_canary"]
    for key, value in lab.mv(lab.versions["v2"]).tags.items():
        lab.client.set_model_version_tag(lab.model, bad, key, value)
    lab.client.delete_model_version_tag(lab.model, bad, tags.ROLLBACK_REASON)
    lab.client.set_registered_model_alias(lab.model, "production", bad)
    return _detected(lab.audit())


@attack(1, "shadow")
def link_tags_deleted_to_switch_the_checks_off(lab: Lab) -> str:
    """Deleting the link tags must neither switch checks off nor pass unnoticed."""
    v2 = lab.versions["v2"]
    for key in list(lab.mv(v2).tags):
        lab.client.delete_model_version_tag(lab.model, v2, key)
    report = lab.audit()
    checked = {link.name for link in report.chain if link.ok}
    assert {"shadow run", "canary run", "confirmation decision", "promotion"} <= checked, report.render()
    return _detected(report) + "\n" + " ".join(sorted(checked))


@attack(1, "confirmation")
def promote_without_confirmation(lab: Lab) -> str:
    from lineage.aliases.registry import PromotionRefused

    with pytest.raises(PromotionRefused) as refused:
        registry.promote(lab.tracking, FAMILY, lab.versions["unconfirmed"],
                         decision_run_id=lab.versions["unconfirmed_decision"],
                         expected_previous=lab.versions["v2"], signing=lab.signing)
    assert registered_model.alias_version(lab.tracking, FAMILY, "production") == lab.versions["v2"]
    return str(refused.value)


@attack(1, "rolled back")
def rolled_back_version_promoted_again_by_its_old_decision(lab: Lab) -> str:
    """A rollback is read: a version the signed history rolled back cannot come back
    through `promote` on its old evidence."""
    from lineage.aliases.registry import PromotionRefused

    bad = lab.versions["failed_canary"]
    decision = lab.mv(bad).tags.get(tags.DECISION_RUN_ID)
    with pytest.raises(PromotionRefused) as refused:
        registry.promote(lab.tracking, FAMILY, bad, decision_run_id=decision,
                         expected_previous=lab.versions["v2"], signing=lab.signing)
    return str(refused.value)


# --- kind 2: integrity rests on digests kept in the same writable store --------------------


def _artifact_file(lab: Lab, run_id: str, path: str) -> Path:
    uri = lab.client.get_run(run_id).info.artifact_uri
    return Path(uri.removeprefix("file://")) / path


@attack(2, "differs from its signed digest")
def decision_json_rewritten_and_its_digest_tag_updated(lab: Lab) -> str:
    import hashlib

    version = lab.versions["rejected_at_gate"]
    build_run = lab.mv(version).run_id
    run_id = next(a.run_id for a in lab.source().attestations()
                  if a.kind == "decision" and a.predicate.get("build_run_id") == build_run)
    path = _artifact_file(lab, run_id, tags.DECISION_ARTIFACT)
    data = json.loads(path.read_text())
    assert data["verdict"] == "reject"
    data["verdict"] = "promote"
    path.write_text(json.dumps(data))
    lab.client.set_tag(run_id, f"{tags.DIGEST_PREFIX}{tags.DECISION_ARTIFACT}",
                       hashlib.sha256(path.read_bytes()).hexdigest())
    return _detected(lab.audit(version))


@attack(2, "metric")
def accuracy_metric_edited(lab: Lab) -> str:
    run_id = lab.mv(lab.versions["v2"]).tags[tags.EVALUATION_RUN_ID]
    metric = next(k for k in lab.client.get_run(run_id).data.metrics if "error_ratio" in k)
    lab.sql("UPDATE latest_metrics SET value = value / 10 WHERE run_uuid = ? AND key = ?", run_id, metric)
    lab.sql("UPDATE metrics SET value = value / 10 WHERE run_uuid = ? AND key = ?", run_id, metric)
    return _detected(lab.audit())


@attack(2, "param")
def build_param_edited(lab: Lab) -> str:
    run_id = lab.mv(lab.versions["v2"]).run_id
    key = next(iter(lab.client.get_run(run_id).data.params))
    assert lab.sql("UPDATE params SET value = 'edited' WHERE run_uuid = ? AND key = ?", run_id, key) == 1
    return _detected(lab.audit())


@attack(2, tags.IMPLEMENTATION)
def version_tag_implementation_switched_to_naive(lab: Lab) -> str:
    from lineage.serving.versions import recorded_kernel

    v2 = lab.versions["v2"]
    lab.client.set_model_version_tag(lab.model, v2, tags.IMPLEMENTATION, "naive")
    # what runs the version is its signed build, never the tag
    assert recorded_kernel(lab.source(stages=("build",)), v2)["implementation"] == "test_good"
    return _detected(lab.audit())


@attack(2, "deleted")
def every_lineage_run_soft_deleted(lab: Lab) -> str:
    experiment = lab.client.get_experiment_by_name(tr.experiment_name(FAMILY))
    for run in lab.client.search_runs([experiment.experiment_id], max_results=1000):
        lab.client.delete_run(run.info.run_id)
    return _detected(lab.audit())


@attack(2, "mismatch with its signed digest")
def canary_record_flipped_to_passed_on_disk(lab: Lab) -> str:
    version = lab.versions["failed_canary"]
    source = lab.source()
    run_id = next(a.run_id for a in source.attestations()
                  if a.kind == "canary" and str(a.predicate.get("version")) == version
                  and a.predicate.get("passed") is False)
    files = [p for p in tr.list_artifact_files(lab.tracking, run_id) if p.endswith(".json")
             and not p.startswith("attestations/")]
    path = _artifact_file(lab, run_id, files[0])
    path.write_text(path.read_text().replace('"passed": false', '"passed": true'))
    return _detected(lab.audit(version))


@attack(2, "does not verify")
def attestation_forged_with_the_attackers_own_key(lab: Lab) -> str:
    """The attacker can write the store, not the key folder: a statement signed with
    their own key is not trusted."""
    from lineage.signing import keys
    from lineage.signing.attestations import attest

    stranger = keys.load_signer(_stranger_key(lab))
    run_id = lab.mv(lab.versions["failed_canary"]).run_id
    attest(lab.tracking, run_id, "alias", {"family": FAMILY, "alias": "production",
                                           "version": lab.versions["failed_canary"],
                                           "action": "promote", "sequence": 99}, stranger)
    lab.client.set_registered_model_alias(lab.model, "production", lab.versions["failed_canary"])
    return _detected(lab.audit())


def _stranger_key(lab: Lab) -> Path:
    from lineage.signing import keys

    path = lab.root / "attacker" / "attacker.pem"
    keys.create_key(path)
    return path


# --- kind 3: threshold shopping ---------------------------------------------------------


def _thresholds_with(lab: Lab, edit: Callable[[dict], None]) -> Path:
    data = yaml.safe_load(THRESHOLDS.read_text())
    edit(data)
    path = lab.root / "thresholds.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _load_refused(path: Path) -> str:
    from gates.thresholds import load_thresholds

    with pytest.raises(ValueError) as refused:
        load_thresholds(path)
    return str(refused.value)


@attack(3, "finite")
def infinite_bound_switches_the_latency_test_off(lab: Lab) -> str:
    return _load_refused(_thresholds_with(
        lab, lambda d: d["canary"]["latency"].update(min_slowdown_ratio=float("inf"))))


@attack(3, "max_error_count")
def error_count_bound_of_a_billion(lab: Lab) -> str:
    return _load_refused(_thresholds_with(lab, lambda d: d["canary"].update(max_error_count=1e9)))


@attack(3, "alpha")
def alpha_of_1e_300(lab: Lab) -> str:
    return _load_refused(_thresholds_with(lab, lambda d: d["canary"]["latency"].update(alpha=1e-300)))


@attack(3, "loosens")
def looser_registration_after_a_rejection(lab: Lab) -> str:
    from lineage.records.registration import LooseningRefused, preregister

    def loosen(d):
        for criterion in d["platforms"]["cpu"]["value"]:
            if criterion["name"] == "hard-error-ratio":
                criterion["value"] = 50.0
    path = _thresholds_with(lab, loosen)
    with pytest.raises(LooseningRefused) as refused:
        preregister(path, tracking=lab.tracking, family=FAMILY, signing=lab.signing)
    assert "hard-error-ratio" in str(refused.value)
    return str(refused.value)


# --- kind 4: registry changes are not atomic, and recovery breaks ----------------------------


@attack(4, "no longer exists")
def previous_production_deleted_before_the_nightly_rollback(lab: Lab) -> str:
    lab.client.delete_model_version(lab.model, lab.versions["v1"])
    change = registry.rollback(lab.tracking, FAMILY, reason="nightly re-validation failed",
                               signing=lab.signing)
    assert change.version is None
    assert registered_model.alias_version(lab.tracking, FAMILY, "production") is None
    report = lab.audit(lab.versions["v2"])
    assert not any("signed history" in p for p in report.problems), report.render()
    return change.reason


@attack(4, "restored")
def corrupted_history_tag_before_a_rollback(lab: Lab) -> str:
    lab.client.set_registered_model_tag(lab.model, tags.PRODUCTION_HISTORY, "{not json")
    change = registry.rollback(lab.tracking, FAMILY, reason="nightly re-validation failed",
                               signing=lab.signing)
    assert change.version == lab.versions["v1"]
    assert registered_model.alias_version(lab.tracking, FAMILY, "production") == lab.versions["v1"]
    return f"restored v{change.version}"


def sigkilled_rollout_run(lab: Lab, name: str, logged: dict[str, str] | None = None) -> str:
    """A rollout run started in a process of its own, which logs ``logged`` (artifact path
    -> text, never signed) and is then SIGKILLed: it stays RUNNING. Returns its id."""
    script = textwrap.dedent(f"""
        import os, signal
        from lineage.store import tracking as tr
        t = tr.local_tracking({str(lab.store)!r})
        run = tr.start_run(t, {FAMILY!r}, "rollout", run_name={name!r})
        for path, text in {dict(logged or {})!r}.items():
            tr.log_text(t, run, text, path)
        print(run, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120)
    return done.stdout.strip().splitlines()[-1]


@attack(4, "KILLED")
def sigkilled_rollout_leaves_a_running_run(lab: Lab) -> str:
    from lineage.rollout.dead_runs import close_dead_runs
    from lineage.rollout.rollout import family_lock

    doomed = sigkilled_rollout_run(lab, "doomed")
    assert lab.client.get_run(doomed).info.status == "RUNNING"
    with family_lock(lab.store, FAMILY, timeout_s=5) as held:
        closed = close_dead_runs(lab.tracking, FAMILY, alive_run_id="", lease_s=3600,
                                 owner_is_dead=held)
    run = lab.client.get_run(doomed)
    assert doomed in closed and run.info.status == "KILLED"
    return f"{run.info.status}: {run.data.tags.get(tags.NOTE)}"


@attack(4, "not the v")
def second_rollout_promotes_against_a_stale_production(lab: Lab) -> str:
    """The second of two overlapping rollouts was judged against v1; v2 was promoted
    meanwhile: compare-and-swap refuses."""
    from lineage.aliases.registry import PromotionRefused

    v2 = lab.versions["v2"]
    with pytest.raises(PromotionRefused) as refused:
        registry.promote(lab.tracking, FAMILY, v2, decision_run_id=lab.mv(v2).tags[tags.DECISION_RUN_ID],
                         expected_previous=lab.versions["v1"], signing=lab.signing)
    return str(refused.value)


@attack(4, "lock")
def two_rollouts_of_one_family_at_once(lab: Lab) -> str:
    import filelock

    from lineage.rollout.rollout import family_lock

    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from lineage.rollout.rollout import family_lock
        with family_lock(Path({str(lab.store)!r}), {FAMILY!r}):
            print("held", flush=True)
            time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(filelock.Timeout) as blocked, family_lock(lab.store, FAMILY, timeout_s=1):
            pass
        holder.kill()  # the lock goes with its owner
        holder.wait()
        with family_lock(lab.store, FAMILY, timeout_s=10) as held:
            assert held
    finally:
        holder.kill()
    return f"second rollout blocked on the family lock: {blocked.value}"


@attack(4, "0 errors")
def four_processes_write_version_tags_at_once(lab: Lab) -> str:
    script = textwrap.dedent(f"""
        import sys
        from lineage.aliases import registered_model
        from lineage.store import tracking as tr
        t = tr.local_tracking({str(lab.store)!r})
        for i in range(40):
            registered_model.tag_version(t, {FAMILY!r}, {lab.versions['v2']!r},
                                         {{f"kernelgate.load.{{sys.argv[1]}}.{{i % 5}}": str(i)}})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(n)], cwd=PROJECT,
                              stderr=subprocess.PIPE, text=True) for n in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    failed = [e for p, e in zip(procs, errors, strict=True) if p.returncode != 0]
    assert not failed, failed[0][-2000:]
    return f"160 concurrent tag writes, {len(failed)} errors"


# --- kind 5: source drift sees only the kernel module -----------------------------------------


@attack(5, "own process")
def dispatch_edited_outside_the_kernel_module(lab: Lab) -> str:
    from lineage.serving.versions import recorded_kernel

    checkout = lab.root / "checkout"
    shutil.copytree(PROJECT, checkout, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".kernelgate", "__pycache__", "*.egg-info", "tests"))
    api = checkout / "kernels" / "api.py"
    api.write_text(api.read_text() + "\n# dispatch edited: pallas_tpu -> naive\n")
    digest = subprocess.run(
        [sys.executable, "-c", "from lineage.serving.versions import this_process_code; "
         "print(this_process_code()[0])"], cwd=checkout, capture_output=True, text=True,
        timeout=300, check=True).stdout.strip()
    recorded = recorded_kernel(lab.source(stages=("build",)), lab.versions["v2"])["code_sha256"]
    assert digest != recorded
    return (f"kernels/api.py edited: this checkout's code is {digest[:12]}, v2 recorded "
            f"{recorded[:12]}: v2 runs from its own snapshot in its own process")


# --- kind 6: input that fails late, or unclearly ----------------------------------------------


@attack(6, "timeout_s")
def infinite_approval_timeout(lab: Lab) -> str:
    return _load_refused(_thresholds_with(lab, lambda d: d["approval"].update(timeout_s=float("inf"))))


@attack(6, "canary-5%")
def canary_step_name_mlflow_refuses(lab: Lab) -> str:
    return _load_refused(_thresholds_with(
        lab, lambda d: d["canary"]["steps"][0].update(name="canary-5%")))


def _cli(lab: Lab, *args: str, env: dict | None = None) -> tuple[int, str]:
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, [*args], env=env, catch_exceptions=False)
    return result.exit_code, result.output


def _versions(lab: Lab) -> int:
    return len(lab.client.search_model_versions(f"name='{lab.model}'"))


@attack(6, "greater than or equal to 1")
def block_q_of_zero(lab: Lab) -> str:
    code, out = _cli(lab, "rollout", "--implementation", "xla", "--block-q", "0",
                     "--store-dir", str(lab.store), "--family", FAMILY)
    assert code == 2
    return out


@attack(6, "block")
def block_sizes_for_a_kernel_without_tiles(lab: Lab) -> str:
    before = _versions(lab)
    code, out = _cli(lab, "rollout", "--implementation", "xla", "--block-q", "64",
                     "--store-dir", str(lab.store), "--family", FAMILY)
    assert code == 2 and _versions(lab) == before
    return out


@attack(6, "cudnn")
def implementation_that_cannot_run_here(lab: Lab) -> str:
    before = _versions(lab)
    code, out = _cli(lab, "rollout", "--implementation", "cudnn", "--store-dir", str(lab.store),
                     "--family", FAMILY)
    assert code == 2 and _versions(lab) == before
    return out


@attack(6, "letters, digits")
def family_with_a_path_in_it(lab: Lab) -> str:
    code, out = _cli(lab, "audit", "--family", "../x", "--store-dir", str(lab.store))
    assert code == 2 and "Traceback" not in out
    return out


@attack(6, FAMILY)
def family_typo(lab: Lab) -> str:
    experiments = len(lab.client.search_experiments())
    code, out = _cli(lab, "revalidate", "--family", "atacked", "--store-dir", str(lab.store))
    assert code == 2 and len(lab.client.search_experiments()) == experiments
    return out


@attack(6, "heldout.npz")
def truncated_arrays_file(lab: Lab) -> str:
    from evaluation.testset import load_split

    copy = shutil.copytree(lab.testset, lab.root / "testset")
    arrays = copy / "heldout.npz"
    arrays.write_bytes(arrays.read_bytes()[: arrays.stat().st_size // 2])
    with pytest.raises(ValueError) as refused:
        load_split(copy, "heldout")
    return str(refused.value)


@attack(6, "http://127.0.0.1:9")
def tracking_server_down(lab: Lab) -> str:
    started = time.monotonic()
    code, out = _cli(lab, "audit", "--family", FAMILY,
                     env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    seconds = time.monotonic() - started
    assert code != 0 and seconds < 30, (code, seconds)
    return out


# --- kind 7: the approval form loses its rules -----------------------------------------------


@attack(7, "approver")
def resume_without_approver_or_with_a_blank_one(lab: Lab) -> str:
    """The form's schema (what Prefect's server checks on resume) keeps approver and
    comment required; a blank approver passes the schema's minLength, so the flow
    validates the answer again and asks again (tests/test_flows_rollout.py replays
    that through a real pause)."""
    from pydantic import ValidationError

    from flows.promotion import ApprovalForm
    from gates.approval import ApprovalInput

    schema = ApprovalForm.with_initial_data(description="approve?").model_json_schema()
    assert {"decision", "approver", "comment"} <= set(schema["required"])
    assert schema["properties"]["approver"]["minLength"] == 1
    with pytest.raises(ValidationError) as refused:
        ApprovalInput.model_validate({"decision": "approve", "approver": "   ", "comment": "ok"})
    return str(refused.value)


# --- kind 8: a canary test that cannot fire counts as assessed -------------------------------


@attack(8, "alpha")
def three_versus_three_requests_plan(lab: Lab) -> str:
    def tiny(d):
        for step in d["canary"]["steps"]:
            step["requests"] = 6  # ~3 per side at 50%
    return _load_refused(_thresholds_with(lab, tiny))


@attack(8, "cannot reach its power")
def underpowered_plan_at_runtime(lab: Lab) -> str:
    """On a profile where not-assessed does not block, an underpowered paired plan loads;
    a ten-times-slower candidate then is *not assessed*, with the reason, never passed
    as assessed."""
    import numpy as np

    from gates.canary import analyse_canary_step
    from gates.thresholds import load_thresholds

    plan = load_thresholds(THRESHOLDS).canary
    small = plan.model_copy(update={"steps": [s.model_copy(update={"requests": 16})
                                              for s in plan.steps]})
    n = small.pairs_per_step()[0]
    ten_times_slower = analyse_canary_step(
        small.steps[0], [1.0] * n, [0.1] * n, [0.0] * n, 0, 0, 0, 0, small,
        abba=(np.full((n, 2), 1.0), np.full((n, 2), 0.1)))
    assert not ten_times_slower.latency_assessed
    return str(ten_times_slower.latency_not_assessed_reason)


# --- kind 9: a dataset logged again from another folder keeps the first source ---------------


@attack(9, "testset-copy")
def same_test_set_from_another_folder(lab: Lab) -> str:
    from lineage.rollout.evidence import log_evaluation_inputs

    copy = shutil.copytree(lab.testset, lab.root / "testset-copy")
    record = SimpleNamespace(tracking=lab.tracking)
    sources = []
    for folder in (lab.testset, copy):
        with tr.stage_run(lab.tracking, FAMILY, "evaluation", run_name="dataset") as run_id:
            log_evaluation_inputs(record, run_id, testset_dir=folder, split="heldout", model=None)
        run = lab.client.get_run(run_id)
        sources.append(json.loads(run.inputs.dataset_inputs[0].dataset.source)["uri"])
    assert sources[0] != sources[1]
    return " vs ".join(sources)


# --- kind 10: evidence deleted from the store leaves no trace the rules read ------------------


def _loosened(lab: Lab) -> Path:
    def loosen(d):
        for criterion in d["platforms"]["cpu"]["value"]:
            if criterion["name"] == "hard-error-ratio":
                criterion["value"] = 50.0
    return _thresholds_with(lab, loosen)


def _delete_envelopes(lab: Lab, which: Callable) -> list[str]:
    gone = []
    for a in lab.source().attestations():
        if which(a):
            _artifact_file(lab, a.run_id, a.path).unlink()
            gone.append(f"{a.run_id}/{a.path}")
    assert gone
    return gone


def _loosening_refused_and_named(lab: Lab) -> str:
    """What a rollout with the loosened file meets: its preregistration refuses, the
    reconcile its open starts with refuses, the audit names the gap."""
    from lineage.log.family_log import LogDamaged
    from lineage.records.registration import LooseningRefused, preregister

    with pytest.raises(LooseningRefused) as refused:
        preregister(_loosened(lab), tracking=lab.tracking, family=FAMILY, signing=lab.signing)
    with pytest.raises(LogDamaged):
        registry.reconcile(lab.tracking, FAMILY, lab.signing)
    return str(refused.value) + "\n" + _detected(lab.audit())


@attack(10, "is missing")
def rejection_decision_deleted_then_loosened_rollout(lab: Lab) -> str:
    """A rollout with loosened thresholds is refused; the attacker deletes the
    rejection's decision.dsse.json and rolls out again with the loosened file."""
    from lineage.records.registration import LooseningRefused, preregister

    with pytest.raises(LooseningRefused):
        preregister(_loosened(lab), tracking=lab.tracking, family=FAMILY, signing=lab.signing)
    _delete_envelopes(lab, lambda a: a.kind == "decision" and a.predicate.get("verdict") == "reject")
    return _loosening_refused_and_named(lab)


@attack(10, "is missing")
def failed_canary_and_its_rollbacks_deleted_then_loosened_rollout(lab: Lab) -> str:
    """Every envelope that says a candidate failed (the failed canary, its rollbacks, the
    gate rejection, the rollouts' outcomes): what is left in the store shows no rejection
    at all, and the rule that read "what is still in the store" was fooled by that."""
    from lineage.records.registration import _rejects

    _delete_envelopes(lab, _rejects)
    assert not any(_rejects(a) for a in lab.source().attestations())
    return _loosening_refused_and_named(lab)


# --- kind 11: the end of the signed history can be cut ----------------------------------------


def _signed_rollback(lab: Lab):
    change = registry.rollback(lab.tracking, FAMILY, reason="nightly re-validation failed",
                               signing=lab.signing)
    assert (change.previous_version, change.version) == (lab.versions["v2"], lab.versions["v1"])
    return change


@attack(11, "were cut")
def signed_rollback_cut_from_the_end_of_the_history(lab: Lab) -> str:
    """After a signed rollback v2 -> v1: delete the rollback's alias.dsse.json, set
    production back to v2, delete v2's rollback tags. The log alone has no gap; the
    pipeline's checkpoint and the head the auditor remembered see the cut, and reconcile
    refuses instead of keeping v2."""
    from lineage.log.family_log import LogDamaged

    _signed_rollback(lab)
    assert lab.audit().exit_code == 0  # remembered: the head after the rollback
    moves, _ = registered_model.store_alias_history(lab.tracking, FAMILY, lab.signing.trust)
    _artifact_file(lab, moves[-1].run_id, moves[-1].path).unlink()
    lab.client.set_registered_model_alias(lab.model, "production", lab.versions["v2"])
    for key in (tags.ROLLBACK_REASON, tags.ROLLED_BACK_AT):
        lab.client.delete_model_version_tag(lab.model, lab.versions["v2"], key)
    with pytest.raises(LogDamaged) as refused:
        registry.reconcile(lab.tracking, FAMILY, lab.signing)
    report = lab.audit()
    found = _detected(report)
    assert "pipeline's checkpoint" in found and "head you verified before" in found
    # the auditor's own head alone (the key's owner could rewrite the checkpoint)
    shutil.rmtree(lab.keys / "checkpoints")
    alone = _detected(lab.audit())
    assert "head you verified before" in alone
    return f"{refused.value}\n{found}"


def test_kernelgate_audit_passes_an_untouched_store_with_a_rolled_back_version(pristine):
    """The judges of kind 11 are silent on an untouched store: the CLI audit (the pipeline's
    checkpoint in its key folder, the head remembered in KERNELGATE_HOME) exits 0 with a
    signed rollback in the history, twice (the second against the remembered head)."""
    lab = Lab(pristine, "untouched-cli")
    _signed_rollback(lab)
    env = {"KERNELGATE_KEY_DIR": str(lab.keys), "KERNELGATE_HOME": str(lab.home)}
    args = ("audit", "--family", FAMILY, "--store-dir", str(lab.store), "--no-load-model",
            "--recheck-reference", "0")
    for _ in range(2):
        code, out = _cli(lab, *args, env=env)
        assert code == 0, out
    assert list((lab.home / "witnessed").glob(f"*/{FAMILY}.json"))


# --- kind 12: an exported bundle is trusted unsigned ------------------------------------------


@attack(12, "were cut")
def rollback_cut_from_an_exported_bundle(lab: Lab) -> str:
    """Delete the rollback's folder from an exported bundle and edit its unsigned
    store_view.json: the checkpoint the bundle carries (signed) sees the cut; a bundle
    whose checkpoint is deleted too fails for carrying none."""
    from lineage.audit.audit import audit
    from lineage.audit.bundle import STORE_VIEW, BundleSource, export_bundle

    change = _signed_rollback(lab)
    out = lab.root / "bundle"
    export_bundle(lab.tracking, FAMILY, lab.audit(), sorted(lab.keys.glob("*.pub.json")), out,
                  key_dir=lab.keys)

    def offline():
        source = BundleSource(out, lab.signing.trust)
        return audit(None, FAMILY, "production", source=source, witnessing=lab.witnessing(
            key_dir=None, home=None, require=True, files=source.checkpoint_files()))

    assert offline().exit_code == 0, offline().render()
    moves, _ = registered_model.store_alias_history(lab.tracking, FAMILY, lab.signing.trust)
    assert moves[-1].predicate["action"] == "rollback" and change.version == lab.versions["v1"]
    for folder in ("attestations", "artifacts"):
        shutil.rmtree(out / folder / moves[-1].run_id, ignore_errors=True)
    view = json.loads((out / STORE_VIEW).read_text())
    view["aliases"]["production"] = lab.versions["v2"]
    (out / STORE_VIEW).write_text(json.dumps(view))
    found = _detected(offline())
    shutil.rmtree(out / "checkpoints")
    assert "no signed checkpoint" in _detected(offline())
    return found
# --- kind 13: what serves is not what was audited ------------------------------------------


def _doctored_copy(lab: Lab, version: str) -> Path:
    """A copy of the version's model whose wrapper serves constant embeddings (and whose
    describe() still reports the signed code digest), with the version's storage
    location pointed at it."""
    import mlflow.artifacts

    name = registered_model.registered_model_name(FAMILY)
    doctored = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=lab.client.get_model_version_download_uri(name, version),
        dst_path=str(lab.root / "doctored"), tracking_uri=lab.tracking.tracking_uri))
    wrapper = doctored / "code" / "lineage" / "model.py"
    text = wrapper.read_text()
    needle = "return self.encoder.embed(list(texts), attention_fn=self.attention_fn)"
    assert needle in text
    wrapper.write_text(text.replace(needle, "return np.ones((len(texts), 384), np.float32)"))
    assert lab.sql("UPDATE model_versions SET storage_location = ? WHERE name = ? AND version = ?",
                   doctored.as_uri(), name, int(version)) == 1
    return doctored


@attack(13, "code/lineage/model.py")
def storage_location_pointed_at_a_doctored_model(lab: Lab) -> str:
    from lineage.serving.version_runners import VersionPool, VersionWorker

    v2 = lab.versions["v2"]
    _doctored_copy(lab, v2)
    for make in (lambda: VersionWorker(lab.tracking, FAMILY, v2, trust=lab.signing.trust),
                 lambda: VersionPool(lab.tracking, FAMILY, None, lab.signing.trust).runner(v2)):
        with pytest.raises(RuntimeError, match="code/lineage/model.py"):
            make()
    return _detected(lab.audit())


@attack(13, "model/artifacts/kernel.json")
def model_file_edited_under_its_storage_location(lab: Lab) -> str:
    """kernel.json edited in place: the run's artifact digest and the file manifest both
    name it."""
    v2 = lab.versions["v2"]
    path = _artifact_file(lab, lab.mv(v2).run_id, "model/artifacts/kernel.json")
    data = json.loads(path.read_text())
    data["implementation"] = "naive"
    path.write_text(json.dumps(data))
    return _detected(lab.audit())


# --- kind 14: an approver's key is a pipeline key -------------------------------------------


@attack(14, "pipeline-role")
def approver_key_created_with_keys_create_promotes(lab: Lab) -> str:
    from flows.cli_keys import keys_app
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    key_dir = lab.keys
    from typer.testing import CliRunner

    done = CliRunner().invoke(keys_app, ["create", "--name", "alice", "--key-dir", str(key_dir)])
    assert done.exit_code == 0, done.output
    alice = keys.load_signer(key_dir / keys.APPROVER_DIR / "alice.pem")
    assert alice.public_key.keyid not in keys.folder_trust(key_dir).public_keys
    with pytest.raises(ValueError) as refused:
        registry.promote(lab.tracking, FAMILY, lab.versions["v1"],
                         decision_run_id=lab.mv(lab.versions["v1"]).tags[tags.DECISION_RUN_ID],
                         expected_previous=lab.versions["v2"],
                         signing=Signing(signer=alice, trust=keys.folder_trust(key_dir)))
    assert registered_model.alias_version(lab.tracking, FAMILY, "production") == lab.versions["v2"]
    return str(refused.value)


# --- kind 15: rotation and revocation take production down ----------------------------------


@attack(15, "AUDIT PASSED")
def rotate_revoke_then_the_reconcile_every_rollout_starts_with(lab: Lab) -> str:
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    key_dir = lab.keys
    old = keys.load_signer(key_dir / "pipeline.pem").public_key.keyid
    code, out = _cli(lab, "keys", "rotate", "--key-dir", str(key_dir), "--store-dir",
                     str(lab.store))
    assert code == 0 and "re-attested attacked: production" in out, out
    code, out = _cli(lab, "keys", "revoke", old, "--key-dir", str(key_dir), "--store-dir",
                     str(lab.store))
    assert code == 0 and "revoked" in out and "logged in attacked's signed log" in out, out
    signing = Signing(signer=keys.load_signer(key_dir / "pipeline.pem"),
                      trust=keys.folder_trust(key_dir))
    assert registry.reconcile(lab.tracking, FAMILY, signing) == []
    assert registered_model.alias_version(lab.tracking, FAMILY, "production") == lab.versions["v2"]
    code, out = _cli(lab, "audit", "--family", FAMILY, "--store-dir", str(lab.store),
                     "--key-dir", str(key_dir), "--no-load-model", "--recheck-reference", "0")
    assert code == 0, out
    # the rotation and the revocation are entries of the family's log, in that order
    assert "key changes (signed log order):" in out, out
    assert out.index(f"pipeline key {old[:12]} retired") < out.index(f"key {old[:12]} revoked")
    return f"production stays v{lab.versions['v2']}; audit: " + out.splitlines()[-1]


# --- kind 16: lineage facts the MLflow UI shows are not signed -------------------------------


@attack(16, "kernelgate.env.device_kind")
def device_kind_tag_rewritten_in_the_backend_store(lab: Lab) -> str:
    run_id = lab.mv(lab.versions["v2"]).run_id
    assert lab.sql("UPDATE tags SET value = 'NVIDIA H100' WHERE run_uuid = ? AND key = ?",
                   run_id, "kernelgate.env.device_kind") == 1
    return _detected(lab.audit())


@attack(16, "dataset input")
def evaluation_dataset_digest_rewritten_in_the_backend_store(lab: Lab) -> str:
    assert lab.sql("UPDATE datasets SET digest = ? WHERE name LIKE 'kernelgate-testset%'",
                   "0" * 32) >= 1
    return _detected(lab.audit())


# --- kind 17: verdict-changing settings are not part of the registration ---------------------


@attack(17, "shadow_requests")
def same_registration_rolled_out_with_fewer_shadow_requests(lab: Lab) -> str:
    from lineage.records.bindings import BindingsRefused, RolloutBindings, whole_numbers
    from lineage.records.registration import latest_registration, preregister

    newest, _ = latest_registration(lab.source())
    bound = RolloutBindings.model_validate(whole_numbers(newest.predicate["bindings"]))
    with pytest.raises(BindingsRefused) as refused:
        preregister(THRESHOLDS, tracking=lab.tracking, family=FAMILY, signing=lab.signing,
                    bindings=bound.model_copy(update={"shadow_requests": 2}))
    preregister(THRESHOLDS, tracking=lab.tracking, family=FAMILY, signing=lab.signing,
                bindings=bound)  # the registered values: accepted
    return str(refused.value)


# --- kind 18: which runs hold the signed history is read from an unsigned tag -------------


@attack(18, "as signed")
def a_signed_rollback_retagged_as_another_stage_then_reconciled(lab: Lab) -> str:
    """A signed rollback's run re-tagged ``kernelgate.stage=evaluation``: the alias history
    still holds the move, so ``reconcile`` leaves production where the rollback put it."""
    change = registry.rollback(lab.tracking, FAMILY, reason="nightly re-validation failed",
                               signing=lab.signing)
    experiment = lab.client.get_experiment_by_name(tr.experiment_name(FAMILY))
    (run,) = lab.client.search_runs([experiment.experiment_id], filter_string=(
        f"tags.`{tags.STAGE}` = 'rollback'"), order_by=["attributes.start_time DESC"],
        max_results=1)
    lab.client.set_tag(run.info.run_id, tags.STAGE, "evaluation")
    changed = registry.reconcile(lab.tracking, FAMILY, lab.signing)
    now = registered_model.alias_version(lab.tracking, FAMILY, "production")
    assert now == change.version, f"reconcile moved production to v{now}: {changed}"
    return f"production stays v{now} as signed (reconcile changed {changed or 'nothing'})"


# --- kind 19: a float64 reference planted in the cache is scored against ------------------


@attack(19, "recomputed")
def every_cached_reference_planted_at_1_02_times_the_truth(lab: Lab) -> str:
    """Every array in ``<store>/reference-cache`` rewritten as 1.02 x the reference (the
    seals left as they were): an evaluation's cache serves none of them; each is
    recomputed from the case and the index says why."""
    import numpy as np

    from evaluation.reference_cache import ReferenceCache
    from evaluation.testset import load_split
    from lineage.signing.reference_seal import SignedReferences

    folder = lab.store / "reference-cache"
    truth = {path: np.load(path) for path in sorted(folder.glob("*.npy"))}
    assert truth, "the rollouts cached no reference"
    for path, array in truth.items():
        np.save(path, array * 1.02)
    cache = ReferenceCache(folder, seal=SignedReferences(lab.signing))
    served = 0
    for case in load_split(lab.testset, "heldout"):
        reference, _ = cache(case)
        path = folder / f"{cache.index.entries[-1].key}.npy"
        if path in truth:
            assert np.array_equal(reference, truth[path]), f"{case.spec.case_id}: planted served"
            served += 1
    assert served, "no held-out case met its cached reference"
    why = sorted({e.recomputed for e in cache.index.entries if e.recomputed})
    return f"{served} planted references recomputed ({'; '.join(why)})"


def test_a_killed_rollouts_files_are_signed_as_interrupted_by_the_next_one(pristine):
    """A rollout SIGKILLed after logging its traffic and canary verdict (never signed):
    the next rollout, holding the lock, closes the run KILLED and signs its
    ``interrupted`` outcome over the files as found, so the audit's cross-check no longer
    reports them "added after signing" with no tamperer (before: every audit, forever);
    a later change to one of them is still caught."""
    from lineage.audit import store_check
    from lineage.rollout.dead_runs import close_dead_runs
    from lineage.rollout.rollout import family_lock

    lab = Lab(pristine, "killed-after-logging")
    doomed = sigkilled_rollout_run(lab, "doomed", {"canary/verdict.json": '{"verdict": "pass"}',
                                                   "traffic/shadow.json": "[1, 2, 3]"})

    def found() -> list[str]:
        _, _, problems = store_check.cross_check(lab.tracking, lab.source(), {doomed}, FAMILY,
                                                 lab.versions["v2"], None)
        return problems

    assert any("added after signing" in p for p in found())  # the false alarm, reproduced
    with family_lock(lab.store, FAMILY, timeout_s=5) as held:
        closed = close_dead_runs(lab.tracking, FAMILY, alive_run_id="", lease_s=3600,
                                 owner_is_dead=held, signing=lab.signing)
    assert doomed in closed and lab.client.get_run(doomed).info.status == "KILLED"
    assert found() == []
    (outcome,) = [a for a in lab.source().attestations()
                  if a.kind == "outcome" and a.run_id == doomed]
    assert outcome.predicate["result"] == "interrupted"
    assert outcome.predicate["orphans"] == ["canary/verdict.json", "traffic/shadow.json"]
    verdict = _artifact_file(lab, doomed, "canary/verdict.json")
    verdict.write_text('{"verdict": "fail"}')
    assert any("altered after signing" in p for p in found())


def test_a_rollout_killed_before_it_logged_any_file_is_sealed_by_the_next_one(pristine):
    """A rollout that died before it logged a file of its own (its only artifact the
    signed entries, e.g. a crash while evaluating): the next rollout still closes it and
    signs its ``interrupted`` outcome, over a record of the interruption, rather than
    failing to sign a statement with no subject (in-toto needs one) and so never starting."""
    from lineage.rollout.dead_runs import close_dead_runs
    from lineage.rollout.rollout import family_lock

    lab = Lab(pristine, "killed-before-logging")
    doomed = sigkilled_rollout_run(lab, "doomed-early")
    assert tr.list_artifact_files(lab.tracking, doomed) == []
    with family_lock(lab.store, FAMILY, timeout_s=5) as held:
        closed = close_dead_runs(lab.tracking, FAMILY, alive_run_id="", lease_s=3600,
                                 owner_is_dead=held, signing=lab.signing)
    assert doomed in closed and lab.client.get_run(doomed).info.status == "KILLED"
    (outcome,) = [a for a in lab.source().attestations()
                  if a.kind == "outcome" and a.run_id == doomed]
    assert outcome.predicate["result"] == "interrupted"
    assert outcome.predicate["orphans"] == []
    assert outcome.subjects, "an in-toto statement needs at least one subject"
    record = json.loads(_artifact_file(lab, doomed, tags.INTERRUPTED_ARTIFACT).read_text())
    assert record["reason"] == outcome.predicate["reason"]
    assert "its rollout died" in record["reason"]


# --- kind 20: the audit's scope follows MLflow's editable parent link ---------------------


@attack(20, "re-pointed outside the pipeline")
def production_promotion_reparented_then_its_rollout_outcome_edited(lab: Lab) -> str:
    """The promotion run of production re-pointed (``mlflow.parentRunId``) at a decoy
    rollout run, then the real rollout run's ``outcome.json`` edited: the audit follows
    the signed parent, so the edit stays in scope, and the re-pointing is named."""
    moves, _ = registered_model.store_alias_history(lab.tracking, FAMILY, lab.signing.trust)
    promotion = [m for m in moves if m.predicate.get("action") == "promote"
                 and m.predicate.get("alias") == "production"
                 and str(m.predicate.get("version")) == lab.versions["v2"]][-1]
    rollout_run = promotion.predicate["parent_run_id"]
    decoy = tr.start_run(lab.tracking, FAMILY, "rollout", run_name="decoy")
    tr.end_run(lab.tracking, decoy, "FINISHED")
    lab.client.set_tag(promotion.run_id, tags.PARENT, decoy)
    outcome = _artifact_file(lab, rollout_run, tags.OUTCOME_ARTIFACT)
    edited = json.loads(outcome.read_text()) | {"decided_by": "the CTO (approved in person)"}
    outcome.write_text(json.dumps(edited))
    message = _detected(lab.audit())
    assert f"artifact {tags.OUTCOME_ARTIFACT!r} of run {rollout_run}" in message, message
    return message


# --- kind 21: a family's log starts again under its old name -------------------------------


def _renamed_away(lab: Lab) -> None:
    """The family's experiment and registered model renamed with MLflow's client: the
    store has no ``kernelgate-attacked`` any more, its old log sits under another name."""
    experiment = lab.client.get_experiment_by_name(tr.experiment_name(FAMILY))
    lab.client.rename_experiment(experiment.experiment_id, f"{tr.experiment_name(FAMILY)}-old")
    lab.client.rename_registered_model(lab.model, f"{lab.model}-old")


def _fresh_promotion(tracking, folder: Path, signing) -> None:
    """A new log of the family in ``tracking``: a registration of a loose thresholds file
    (written in ``folder``), a build judged by it and promoted (``tests.conftest_lineage``:
    the signed chain, no kernel)."""
    from tests.conftest_lineage import promotable_chain, promote, thresholds_yaml

    loose = folder / "loose.yaml"
    loose.write_text(thresholds_yaml().replace('op: "<=", value: 2.0', 'op: "<=", value: 40.0'))
    promote(tracking, FAMILY, promotable_chain(tracking, FAMILY, loose, signing=signing), signing)


@attack(21, "restarted")
def experiment_and_model_renamed_then_a_new_family_of_the_old_name(lab: Lab) -> str:
    """The rename: after renaming, ``rollout --new-family`` of the old name is refused,
    and so is the fresh log's first entry by the writer. An insider who also removed the
    checkpoints beside the key gets the fresh log written and promoted: the auditor who
    remembered the family's head fails it as a restarted log."""
    from lineage.log.family_log import LogDamaged
    from lineage.records.registration import preregister

    assert lab.audit().exit_code == 0  # the auditor remembers the family's head
    _renamed_away(lab)
    code, out = _cli(lab, "rollout", "--implementation", "xla", "--new-family", "--family",
                     FAMILY, "--store-dir", str(lab.store), "--key-dir", str(lab.keys),
                     "--thresholds", str(THRESHOLDS))
    assert code == 2 and "has or had a log" in out, out
    with pytest.raises(LogDamaged) as refused:
        preregister(THRESHOLDS, tracking=lab.tracking, family=FAMILY, signing=lab.signing)
    assert not lab.source().attestations(), "the refused writer logged an entry"
    shutil.rmtree(lab.keys / "checkpoints")
    _fresh_promotion(lab.tracking, lab.root, lab.signing)
    return f"{out}\n{refused.value}\n{_detected(lab.audit())}"


# --- kind 22: another store signed by the same key folder put in the store's place --------


@attack(22, "another store was put in its place")
def another_store_of_the_same_key_folder_copied_over_this_one(lab: Lab) -> str:
    """A second store the same key folder signs (its own family ``attacked``, a loose
    registration promoted) copied over this one: the pipeline's key folder and the
    auditor both knew this place as the other store; the writer refuses and the audit
    fails."""
    from lineage.log.family_log import LogDamaged
    from tests.store_copies import copy_store, forget_artifact_locations, recorded_root, relocate

    assert lab.audit().exit_code == 0  # the auditor saw this store here
    _fresh_promotion(tr.local_tracking(lab.root / "other"), lab.root, lab.signing)
    swap = copy_store(lab.root / "other", lab.root / "swap")
    relocate(swap / "mlflow.db", recorded_root(swap / "mlflow.db"), str(lab.store.resolve()))
    with sqlite3.connect(swap / "mlflow.db") as src, sqlite3.connect(lab.store / "mlflow.db") as dst:
        src.backup(dst)  # in place: the open connections to this store read the other one
    shutil.rmtree(lab.store / "mlartifacts")
    shutil.copytree(swap / "mlartifacts", lab.store / "mlartifacts")
    forget_artifact_locations()
    with pytest.raises(LogDamaged) as refused:
        registry.reconcile(lab.tracking, FAMILY, lab.signing)
    found = _detected(lab.audit())
    assert "your kernelgate home knows" in found and "key folder knows" in found, found
    return f"{refused.value}\n{found}"


# --- kind 23: a family's first approvers, named on first use, swapped after signing ------


def _roster_founded(lab: Lab) -> tuple[str, Path]:
    """The family's first approver (alice, no approval: the registration it loosens names
    none and a candidate was rejected) registered by the pipeline; returns the founding
    registration's id and the attacker's key (mallory's: the attacker holds it)."""
    from lineage.records.registration import preregister
    from lineage.records.roster import approver_entry
    from lineage.signing import keys

    alice = keys.load_signer(_key(lab, "alice"))
    founding = _thresholds_with(lab, lambda d: d["approval"].update(
        approvers=[approver_entry(alice, FAMILY, "alice")]))
    registration = preregister(founding, tracking=lab.tracking, family=FAMILY,
                               signing=lab.signing)
    report = lab.audit()
    assert report.exit_code == 0 and len(report.notices) == 1, report.render()
    return registration.registration_id, _key(lab, "mallory")


def _key(lab: Lab, name: str) -> Path:
    from lineage.signing import keys

    path = lab.root / "people" / f"{name}.pem"
    if not path.exists():
        keys.create_key(path)
    return path


@attack(23, "the roster founded at registration")
def first_approver_swapped_for_the_attackers_key_in_the_frozen_thresholds(lab: Lab) -> str:
    """The founding's frozen thresholds rewritten to name the attacker's key (with a valid
    proof by that key): the approval the attacker then signs is refused by the writer,
    and the audit names the founding whose thresholds were altered."""
    from lineage.records.loosening_approval import sign_loosening
    from lineage.records.registration import latest_registration, preregister
    from lineage.records.roster import approver_entry
    from lineage.signing import keys

    registration_id, mallory = _roster_founded(lab)
    entry = approver_entry(keys.load_signer(mallory), FAMILY, "alice")
    swapped = _thresholds_with(lab, lambda d: d["approval"].update(approvers=[entry]))
    frozen = _artifact_file(lab, registration_id, "thresholds/thresholds.yaml")
    frozen.write_bytes(swapped.read_bytes())

    def loosen(d):
        d["approval"]["approvers"] = [entry]
        d["canary"]["max_nan_count"] = 5
    loose = _thresholds_with(lab, loosen)
    with pytest.raises(Exception, match="altered") as refused:
        newest = latest_registration(lab.source())[0]
        approval = sign_loosening(keys.load_signer(mallory), FAMILY, loose, "trust me",
                                  previous=newest, bindings=None)
        preregister(loose, tracking=lab.tracking, family=FAMILY, signing=lab.signing,
                    loosening_approval=approval)
    return f"{refused.value}\n{_detected(lab.audit())}"


@attack(23, "does not verify")
def first_approver_swapped_in_the_signed_founding_record(lab: Lab) -> str:
    """The signed record edited to name the attacker's key as the founded approver (and
    the frozen thresholds with it): the attacker cannot sign it again."""
    import base64
    import hashlib

    from lineage.records.roster import approver_entry
    from lineage.signing import keys

    registration_id, mallory = _roster_founded(lab)
    entry = approver_entry(keys.load_signer(mallory), FAMILY, "alice")
    swapped = _thresholds_with(lab, lambda d: d["approval"].update(approvers=[entry]))
    _artifact_file(lab, registration_id, "thresholds/thresholds.yaml").write_bytes(
        swapped.read_bytes())
    envelope = _artifact_file(lab, registration_id, "attestations/registration.dsse.json")
    data = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    statement["predicate"]["roster_founded"]["approvers"] = [
        {"name": "alice", "keyid": entry["keyid"]}]
    digest = hashlib.sha256(swapped.read_bytes()).hexdigest()
    statement["predicate"]["thresholds_sha256"] = digest
    for subject in statement["subject"]:
        if subject["name"].endswith("thresholds/thresholds.yaml"):
            subject["digest"]["sha256"] = digest
    data["payload"] = base64.b64encode(json.dumps(statement, sort_keys=True).encode()).decode()
    envelope.write_text(json.dumps(data, sort_keys=True))
    return _detected(lab.audit())
