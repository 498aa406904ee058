"""Attacks on the server profile, each on databases and an artifact root of its
own: the test process's stack (``tests.services_fixtures``, shared with the other services
modules) gives the Prefect server and the accounts; each attack gets its own MLflow
databases, copied with ``CREATE DATABASE … TEMPLATE`` from copies of the stack's taken
once, its own artifact root and its own MLflow server,
and a family of its own (the Prefect variables that claim its log positions and keep its
checkpoint are per family).

Run with ``make test-services`` (figures into ``reliability/services.json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flows import stack as st
from flows.log_sequencer import PrefectSequencer, checkpoint_name
from lineage.aliases import registered_model, registry
from lineage.log import family_log, log_writer
from lineage.log.checkpoints import read_checkpoint
from lineage.log.family_log import LogDamaged
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store.tracking import Tracking
from tests import services as sv
from tests.services_fixtures import mlflow_templates, stack  # noqa: F401 - fixtures

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]
CLAIMED = sv.CLAIMED
"""The family the shared stack's ``up`` claims for the pipeline (``StackConfig.families``)."""


@pytest.fixture(scope="module")
def servers(stack, mlflow_templates):
    """The process's stack (``tests.services_fixtures``: its Prefect server and accounts)
    and the copies of its MLflow databases each attack's own are made from:
    ``(config, stack, templates)``, the stack's Prefect server this module's client."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    config, running, _ = stack
    with temporary_settings({PREFECT_API_URL: running.prefect_api_url,
                             PREFECT_API_AUTH_STRING: config.secrets.value("prefect_auth")}):
        yield config, running, mlflow_templates


class Attack:
    """One attack's own MLflow (databases from the templates, artifact root, server), a
    family of its own and the pipeline's signing on the worker host."""

    def __init__(self, servers, folder: Path, name: str) -> None:
        config, running, templates = servers
        tag = uuid.uuid4().hex[:6]
        self.databases = st.Databases(prefect=config.databases.prefect,
                                      mlflow=f"{config.databases.mlflow}_{tag}",
                                      mlflow_auth=f"{config.databases.mlflow_auth}_{tag}")
        for field in ("mlflow", "mlflow_auth"):
            sv.create_from(config, getattr(self.databases, field), templates[field])
        self.config = config.model_copy(update={"databases": self.databases})
        self.folder, self.running, self.family = folder, running, f"atk-{name}-{tag}"
        self.artifact_root = folder / "artifacts"
        self.start_mlflow()
        self.env = {**running.client_env("pipeline", config), "MLFLOW_TRACKING_URI": self.url}
        self.key_dir = folder / "keys"
        self.signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(self.key_dir)),
                               trust=keys.folder_trust(self.key_dir), key_dir=self.key_dir,
                               sequencer=PrefectSequencer())

    def start_mlflow(self, port: int = 0) -> None:
        self.pid, _, self.url = st.start_mlflow_server(
            self.config, self.folder, port or st.free_port(self.config.host), self.artifact_root)

    def stop(self) -> None:
        st.stop_process(self.pid)
        for field in ("mlflow", "mlflow_auth"):
            st.drop_database(self.config, getattr(self.databases, field))

    def tracking(self, monkeypatch) -> Tracking:
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        return Tracking(tracking_uri=self.url)

    def log(self, tracking: Tracking):
        return family_log.read(StoreSource(tracking, self.family, self.signing.trust))


@pytest.fixture
def attack(servers, tmp_path, request):
    made = Attack(servers, tmp_path, request.node.name.removeprefix("test_")[:12].replace("_", "-"))
    try:
        yield made
    finally:
        made.stop()


MOVER = """
import concurrent.futures, json, sys, threading
from flows.log_sequencer import PrefectSequencer
from lineage.signing import keys
from lineage.aliases import registry
from lineage.signing.attestations import Signing
from lineage.log.checkpoints import read_checkpoint
from lineage.store.tracking import Tracking
family, key_dir, uri, versions = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(key_dir)),
                  trust=keys.folder_trust(key_dir), key_dir=key_dir, sequencer=PrefectSequencer())
tracking = Tracking(tracking_uri=uri)
barrier = threading.Barrier(len(versions))
def move(v):
    barrier.wait()
    return registry.assign_shadow(tracking, family, v, signing=signing).version
with concurrent.futures.ThreadPoolExecutor(len(versions)) as pool:
    print(json.dumps(list(pool.map(move, versions))))
"""


def test_concurrent_alias_moves_from_two_processes_are_each_signed_once(attack, monkeypatch):
    from tests.conftest_lineage import signed_build

    tracking = attack.tracking(monkeypatch)
    v1 = signed_build(tracking, attack.family, attack.signing)[1]
    v2 = signed_build(tracking, attack.family, attack.signing)[1]
    per_process = 3
    started = time.monotonic()
    movers = [subprocess.Popen(
        [sys.executable, "-c", MOVER, attack.family, str(attack.key_dir), attack.url,
         json.dumps([v1 if (i + p) % 2 else v2 for i in range(per_process)])],
        env={**os.environ, **attack.env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(2)]
    outputs = [m.communicate(timeout=600) for m in movers]
    took = time.monotonic() - started
    for mover, (_, err) in zip(movers, outputs, strict=True):
        assert mover.returncode == 0, err[-3000:]
    moved = [v for out, _ in outputs for v in json.loads(out.strip().splitlines()[-1])]
    log = attack.log(tracking)
    assert log.problems == [], log.problems
    moves, problems = registered_model.store_alias_history(tracking, attack.family,
                                                           attack.signing.trust)
    assert problems == [], problems
    assert [int(m.predicate["sequence"]) for m in moves] == list(range(1, 2 * per_process + 1))
    assert sorted(str(m.predicate["version"]) for m in moves) == sorted(moved)
    for earlier, later in zip(moves, moves[1:], strict=False):
        assert later.predicate["previous_version"] == earlier.predicate["version"]
    assert registered_model.alias_version(tracking, attack.family, "shadow") == \
        registered_model.signed_aliases(moves)["shadow"]
    # the checkpoint outside the store is at the log's head
    kept = PrefectSequencer().checkpoint(attack.family)
    assert kept is not None
    assert read_checkpoint(kept, attack.signing.trust, label="variable") == log.head()
    sv.report("attack_concurrent_moves", {"processes": 2, "moves": 2 * per_process,
                                          "signed_once": True, "history_intact": True,
                                          "seconds": round(took, 1)})


def test_an_older_backup_restored_is_a_cut_log(attack, monkeypatch):
    from tests.conftest_lineage import signed_build

    tracking = attack.tracking(monkeypatch)
    version = signed_build(tracking, attack.family, attack.signing)[1]
    registry.assign_shadow(tracking, attack.family, version, signing=attack.signing)
    dump = attack.folder / "older.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump),
                    attack.config.database_url(attack.databases.mlflow)], check=True, timeout=120)
    registry.rollback(tracking, attack.family, alias="shadow", reason="drill",
                      signing=attack.signing)
    length = attack.log(tracking).length
    # restore the older backup: the rollback's entries are gone from the store
    port = int(attack.url.rsplit(":", 1)[1])
    st.stop_process(attack.pid)
    st.drop_database(attack.config, attack.databases.mlflow)
    st.create_database(attack.config, attack.databases.mlflow)
    subprocess.run(["pg_restore", "--no-owner", "-d",
                    attack.config.database_url(attack.databases.mlflow), str(dump)],
                   check=True, timeout=120)
    attack.start_mlflow(port)
    assert attack.log(tracking).length < length
    # the key folder beside the pipeline is gone too (a worker host rebuilt): only the
    # checkpoint in the Prefect variable is left to see the cut
    signing = attack.signing.model_copy(update={"key_dir": None})
    with pytest.raises(LogDamaged, match=checkpoint_name(attack.family)) as err:
        registry.assign_shadow(tracking, attack.family, version, signing=signing)
    assert "last entries were cut" in str(err.value)
    with pytest.raises(LogDamaged, match="last entries were cut"):
        log_writer.require_intact(tracking, attack.family, signing)
    sv.report("attack_older_backup", {"entries_before": length,
                                      "entries_after_restore": attack.log(tracking).length,
                                      "detected_by": "the Prefect variable `kernelgate-checkpoint-<family>`",
                                      "next_move_refused": True})


def _answer_paused(flow_name: str, key: str, run_input: dict, timeout_s: float = 300) -> str:
    """Resume the paused run of ``flow_name`` through the Prefect API (as any holder of the
    stack's Prefect auth string) once the form of pause ``key`` is saved; returns its id."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                             flow_run_filter=paused):
                try:
                    client.read_flow_run_input(flow_run_id=run.id, key=f"paused-{key}-schema")
                except Exception:  # noqa: BLE001 - paused, but the form is not saved yet
                    continue
                resume_flow_run(run.id, run_input=run_input)
                return str(run.id)
            time.sleep(0.5)
    raise AssertionError(f"{flow_name} never paused for {key}")


APPROVAL_TIMEOUT_S = 30
"""The unsigned-approval attack's policy timeout: the attacker answers within seconds of
the form being saved (0.5 s polls), then the flow waits the rest out, nobody signing."""


def test_an_unsigned_production_approval_is_refused(servers, tmp_path):
    """The shipped production policy (``require_signed``, a named approver) asks for
    ``canary->production`` in a flow run on the stack's Prefect server; an attacker holding
    the Prefect auth string (one string for every client, the auditor's included) answers
    through the Prefect API with a typed approval in the named approver's name. The server
    takes the input; the flow refuses it with the message saying how to sign, asks again,
    and — nobody signing — ends as the timeout's rejection, never an approval."""
    import contextvars
    import threading
    from types import SimpleNamespace

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows import promotion
    from gates.thresholds import parse_thresholds
    from tests.test_gates_approval_view import _decision

    shipped = parse_thresholds((ROOT / "thresholds" / "production.yaml").read_bytes()).approval
    assert shipped.require_signed and "canary->production" in shipped.required_for
    alice = keys.create_key(tmp_path / "alice.key")
    policy = shipped.model_copy(update={"timeout_s": APPROVAL_TIMEOUT_S, "approvers": [
        {"name": "alice", "keyid": alice.keyid, "public_key": alice.to_dict()}]})
    policy = type(shipped).model_validate(policy.model_dump())
    transition, name = "canary->production", f"attack-unsigned-{uuid.uuid4().hex[:6]}"

    @flow(name=name)
    def asking():
        context = SimpleNamespace(record=SimpleNamespace(family="xla"))
        gated = SimpleNamespace(thresholds=SimpleNamespace(approval=policy), version="7",
                                decision=_decision())
        return promotion._ask(context, transition, gated, (), None)

    answered: list[str] = []
    errors: list[BaseException] = []

    def attacker():
        try:
            answered.append(_answer_paused(name, promotion.pause_key(transition, 0),
                                           {"decision": "approve", "approver": "alice",
                                            "comment": "looks fine", "signed_approval": ""}))
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(err)

    started = time.monotonic()
    answer = threading.Thread(target=contextvars.copy_context().run, args=(attacker,), daemon=True)
    answer.start()
    record = asking()
    answer.join(timeout=10)
    took = time.monotonic() - started
    if errors:
        raise errors[0]
    assert answered, "the attacker never answered"
    # not promoted: the only way out was the timeout's rejection
    assert (record.approved, record.timed_out, record.approver) == (False, True, "(nobody)")
    with get_client(sync_client=True) as client:
        lines = [log.message for log in client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[answered[0]])))]
    refused = [m for m in lines if "not accepted" in m]
    assert len(refused) == 1, lines
    assert "requires a signed approval" in refused[0]
    assert f"kernelgate approve {answered[0]} --key" in refused[0]
    sv.report("attack_unsigned_approval", {"typed_answers": 1, "refused": True,
                                           "approved": record.approved,
                                           "ended": "timeout rejection",
                                           "seconds": round(took, 1)})


def test_a_manual_rollback_during_a_rollout_waits_for_its_slot(attack, monkeypatch):
    """A release manager's ``kernelgate rollback`` (its own process) started while a
    rollout holds the family's Prefect concurrency slot waits until the slot is free,
    then rolls back: the rollout's alias move and the rollback's are one history, every
    move once, in the order the slot gave them."""
    import threading

    from flows.tasks import family_slot
    from tests.conftest_lineage import promotable_chain, promote, signed_build, thresholds_yaml

    tracking = attack.tracking(monkeypatch)
    thresholds = attack.folder / "thresholds.yaml"
    thresholds.write_text(thresholds_yaml())
    # one version in production: the rollback takes production down (the native baseline
    # serves), as cheap a rollback as there is
    promote(tracking, attack.family, promotable_chain(tracking, attack.family, thresholds,
                                                      signing=attack.signing), attack.signing)
    before = registered_model.aliases(tracking, attack.family)
    candidate = signed_build(tracking, attack.family, attack.signing)[1]
    lines: list[str] = []
    with family_slot(attack.family) as held:  # what a rollout of the family holds
        assert held
        rollback = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "rollback", "--reason", "drill: bad latency",
             "--requested-by", "rm@example.com", "--family", attack.family],
            env={**os.environ, **attack.env, "PYTHONPATH": str(ROOT),
                 "KERNELGATE_KEY_DIR": str(attack.key_dir)},
            cwd=attack.folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=lambda: lines.extend(rollback.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 300
        while not any("waiting for the" in line for line in lines):
            assert rollback.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        waiting_since = time.monotonic()
        time.sleep(5)  # it keeps waiting while the rollout holds the slot
        assert rollback.poll() is None and not any("holding the" in line for line in lines)
        assert registered_model.aliases(tracking, attack.family) == before
        registry.assign_shadow(tracking, attack.family, candidate, signing=attack.signing)
        released = time.monotonic()
    assert rollback.wait(timeout=300) == 0, "".join(lines)[-3000:]
    reader.join(timeout=10)
    after = registered_model.aliases(tracking, attack.family)
    assert before.get("production") and after.get("production") is None
    assert after["shadow"] == candidate
    log = attack.log(tracking)
    assert log.problems == [], log.problems
    moves, problems = registered_model.store_alias_history(tracking, attack.family,
                                                           attack.signing.trust)
    assert problems == [], problems
    assert [int(m.predicate["sequence"]) for m in moves] == list(range(1, len(moves) + 1))
    # the rollout's move came first, the rollback's after it: serialised by the slot
    assert [m.predicate["alias"] for m in moves[-2:]] == ["shadow", "production"], \
        [m.predicate for m in moves[-2:]]
    sv.report("attack_rollback_during_rollout", {
        "waited_s": round(released - waiting_since, 1), "rolled_back_after_release": True,
        "history_intact": True, "moves": len(moves)})


def _as(monkeypatch, attack: Attack, account: str) -> Tracking:
    """The attack's MLflow as ``account`` (its client environment)."""
    for key, value in attack.running.client_env(account, attack.config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", attack.url)
    return Tracking(tracking_uri=attack.url)


def _audit(attack: Attack, target: str = "production"):
    """``kernelgate audit`` of the attack's family as the account the environment names."""
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, ["audit", target, "--family", attack.family, "--key-dir",
                                    str(attack.key_dir), "--no-load-model",
                                    "--recheck-reference", "0"])


def test_a_squatted_family_is_refused_naming_its_owner(attack, monkeypatch):
    """The auditor creates ``kernelgate-<family>`` (experiment, a run, registered model)
    before the pipeline: the pipeline's first write is refused with an error saying the
    family is another account's and how an admin hands it back (``stack up``, which has
    the admin, names the owner); after the README's hand-back the
    pipeline writes. ``kernelgate audit`` flags the squatted family naming its owner, and
    no longer once it is handed back. A family ``stack up`` claimed cannot be written by
    the auditor."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client

    from lineage.store.ownership import FamilyOwnedElsewhere
    from lineage.store.tracking import experiment_name, start_run
    from tests.conftest_lineage import signed_build

    name = experiment_name(attack.family)
    squatter = _as(monkeypatch, attack, "auditor").client()
    experiment_id = squatter.create_experiment(name)
    squatter.create_run(experiment_id)
    squatter.create_registered_model(name)
    tracking = _as(monkeypatch, attack, "pipeline")
    with pytest.raises(FamilyOwnedElsewhere) as err:
        signed_build(tracking, attack.family, attack.signing)
    said = str(err.value)
    assert "owned by another account" in said and "'pipeline'" in said and name in said
    assert "README" in said and "A squatted family" in said
    # where an admin is at hand (`stack up` claiming the family), the owner is named
    with pytest.raises(st.StackError, match="owned by: auditor"):
        st.claim_families(attack.config.model_copy(update={"families": [attack.family]}),
                          attack.url)
    # the audit flags the squatted family, naming the owner: read with the admin's password
    # (in this process's environment, as `stack up`'s), and without it by the squatting
    # auditor's own permissions (the others said not read)
    _as(monkeypatch, attack, "auditor")
    audited = _audit(attack)
    assert audited.exit_code == 1, audited.output
    for resource in ("experiment", "registered model"):
        assert f"PROBLEM: the {resource} `{name}` of family {attack.family!r} is owned by " \
               "'auditor'" in audited.output, audited.output
    with monkeypatch.context() as without:
        without.delenv(attack.config.secrets.mlflow_admin)
        audited = _audit(attack)
    assert audited.exit_code == 1 and "is owned by 'auditor'" in audited.output, audited.output
    assert "read for 'auditor' only" in audited.output, audited.output
    # the registered model alone squatted: the model-version write is refused the same way
    _as(monkeypatch, attack, "admin")
    auth = get_app_client("basic-auth", tracking_uri=attack.url)
    auth.grant_user_permission("pipeline", "experiment", experiment_id, "MANAGE")
    tracking = _as(monkeypatch, attack, "pipeline")
    with pytest.raises(FamilyOwnedElsewhere, match="create a model version"):
        signed_build(tracking, attack.family, attack.signing)
    # the README's hand-back (as the admin), then the pipeline writes
    _as(monkeypatch, attack, "admin")
    auth.grant_user_permission("pipeline", "registered_model", name, "MANAGE")
    auth.revoke_user_permission("auditor", "experiment", experiment_id)
    auth.revoke_user_permission("auditor", "registered_model", name)
    tracking = _as(monkeypatch, attack, "pipeline")
    handed_back = signed_build(tracking, attack.family, attack.signing)[1]
    assert handed_back
    _as(monkeypatch, attack, "auditor")
    audited = _audit(attack, handed_back)
    # the audit ran to its report (of a bare build), and no owner but the pipeline is left
    assert f"audit {name} {handed_back} -> version {handed_back}" in audited.output, audited.output
    assert "owned by" not in audited.output, audited.output
    # the family claimed at `stack up`: the pipeline owns it, the auditor may only read it
    tracking = _as(monkeypatch, attack, "pipeline")
    assert start_run(tracking, CLAIMED, "build")
    _as(monkeypatch, attack, "auditor")
    claimed = tracking.client().get_experiment_by_name(experiment_name(CLAIMED))
    assert claimed is not None
    with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
        tracking.client().create_run(claimed.experiment_id)
    sv.report("attack_squatting", {"refused": True, "owner_named_at_stack_up": "auditor",
                                   "owner_named_by_audit": "auditor",
                                   "handed_back_by_admin": True, "claimed_at_stack_up": True})
