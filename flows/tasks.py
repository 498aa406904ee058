"""Tasks every flow uses: opening and closing a rollout's record, preregistration, the test
set, the session that holds the family's lock and closes the record on failure (by what the
record says), and ``stage_task``, the decorator of every stage. Each task calls plain
functions of the packages below; the flows order them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, TerminationSignal
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Completed, State

import kernels
from evaluation.documents import load_documents
from evaluation.testset import ensure_testset
from flows.dispatch_candidate import serving
from flows.errored import OUTCOME_ATTRIBUTE, stage_of
from flows.log_sequencer import server_sequencer
from flows.plan import RolloutPlan, plan_policy, resolve_plan, something_to_roll_out
from flows.results import Prepared, Preregistered, RolloutContext, ServingModel
from flows.settings import RolloutSettings
from flows.stack_config import StackConfig
from flows.stages import StageTask, run_logger, stage_clock, stage_task  # noqa: F401 - re-exported
from gates.canary import CanaryStepResult
from gates.decision import GateDecision
from gates.headline import caveat
from lineage.family_store import FamilyStore
from lineage.records import registration
from lineage.records.bindings import RolloutBindings, bindings_for, check_bound_testset
from lineage.rollout import dead_runs, rollout
from lineage.rollout.rollout import Result, RolloutOutcome
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.store import tags
from lineage.store import tracking as tr


def signing_for(settings: RolloutSettings) -> Signing:
    """The pipeline's signer (its key created on first use in the key folder) and the
    keys it trusts when it reads its own records back (current and retired, minus
    revoked). On a tracking server with a Prefect server, appends to a family's log are
    claimed in Prefect variables and the log's checkpoint is kept there too
    (``flows.log_sequencer``).

    Raises:
        lineage.signing.keys.KeyFileError: the key file is unusable.
    """
    key_dir = settings.key_dir or keys.default_key_dir()
    signer = keys.load_signer(keys.ensure_pipeline_key(key_dir))
    return Signing(signer=signer, trust=keys.folder_trust(key_dir), key_dir=key_dir,
                   sequencer=server_sequencer())


@task(name="open", cache_policy=NO_CACHE, persist_result=False)
def open_rollout(settings: RolloutSettings, plan: RolloutPlan | None = None, *,
                 stage: str = "rollout", clear_stale_aliases: bool = False,
                 owner_is_dead: bool = False, run_name: str | None = None) -> RolloutContext:
    """Start the parent MLflow run of ``plan`` (resolved from ``settings`` when None),
    then tidy what crashed rollouts left: their RUNNING runs end as KILLED with the
    reason, the aliases are reconciled with the signed history, and (for a new rollout)
    ``shadow``/``canary`` aliases whose owner is dead are cleared. ``owner_is_dead``: the
    caller holds the family's lock.

    Raises:
        ValueError: unknown implementation, bad family name or thresholds file.
    """
    backend = kernels.default_backend()
    plan = plan or resolve_plan(settings, backend)
    tracking = tr.tracking_for(settings.store_dir)
    family = plan.family
    record = rollout.open_rollout(tracking, family=family, implementation=plan.implementation,
                                  backend=backend, work_root=settings.store_dir / "runs",
                                  signing=signing_for(settings), stage=stage, run_name=run_name)
    logger = run_logger()
    logger.info("kernel: %s", plan.why)
    if (flow_run_id := flow_run.get_id()) is not None:  # the rollout run links its flow run
        rollout.link(record, {tags.PREFECT_FLOW_RUN_ID: str(flow_run_id)})
    for run_id in dead_runs.close_dead_runs(tracking, family, alive_run_id=record.rollout_run_id,
                                          lease_s=settings.stale_alias_after_s,
                                          owner_is_dead=owner_is_dead, signing=record.signing):
        logger.warning("closed run %s of a rollout that died as KILLED", run_id)
    store = FamilyStore.of(record)
    for change in store.reconcile():
        logger.warning("reconciled %s with its signed alias history: %s", family, change)
    if clear_stale_aliases:
        for alias in store.clear_stale_aliases(lease_s=settings.stale_alias_after_s,
                                               cleared_by_run_id=record.rollout_run_id,
                                               owner_is_dead=owner_is_dead):
            logger.warning("cleared the stale %s alias of %s", alias, family)
    return RolloutContext(settings=settings, plan=plan, record=record,
                          serving=ServingModel(record, plan.serving))


SLOT_LEASE_S = float(os.environ.get("KERNELGATE_ROLLOUT_SLOT_LEASE_S",
                                    StackConfig.model_fields["rollout_slot_lease_s"].default))
"""Lease of a rollout's slot in its family's queue (seconds): renewed while the rollout
lives; a killed rollout's slot frees this long after its last renewal."""


def slot_name(family: str) -> str:
    """The Prefect global concurrency limit that queues rollouts of ``family``."""
    return f"kernelgate-rollout-{family}"


@contextlib.contextmanager
def family_slot(family: str, *, timeout_s: float | None = None) -> Iterator[bool]:
    """Hold the family's one slot in a Prefect global concurrency limit (created with
    limit 1 when missing) while a rollout runs against a tracking server and a Prefect
    server: a second rollout of the family waits here, and then judges against whatever
    the first promoted. Yields True when a slot is held; False on the embedded store
    (where ``lineage.rollout.rollout.family_lock`` queues instead) or without a Prefect server.

    Holding the slot means every other rollout of the family has ended or died (a
    slot's lease lapses ``SLOT_LEASE_S`` seconds after its holder stops renewing it).

    Raises:
        TimeoutError: no slot within ``timeout_s`` seconds (``None``: wait).
    """
    if not os.environ.get("MLFLOW_TRACKING_URI") or not PREFECT_API_URL.value():
        yield False
        return
    name = slot_name(family)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
    run_logger().info("waiting for the %s slot (one rollout of %s at a time)", name, family)
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, lease_duration=SLOT_LEASE_S,
                     strict=True):
        run_logger().info("holding the %s slot", name)
        yield True


@contextlib.contextmanager
def rollout_session(settings: RolloutSettings, plan: RolloutPlan | None = None, *,
                    stage: str = "rollout", clear_stale_aliases: bool = True,
                    run_name: str | None = None, new_version: bool = False) -> Iterator[RolloutContext]:
    """A rollout's whole life under one plan (``plan``, or the one ``settings`` resolve to,
    resolved here once): the plan's dispatch policy served as the ``dispatch`` kernel (if any),
    the family's lock held (on an embedded store) or its slot in the family's Prefect
    concurrency limit (on a tracking server), the record opened, and on any exception the
    record closed before the exception propagates (production untouched, no alias left on the
    unfinished version, the parent run FAILED — or, after a completed promotion, a note that
    only bookkeeping failed). What it had done when it failed is read from its record.

    Raises (before anything is opened or locked):
        ValueError, FileNotFoundError: the settings resolve to no plan (a bad thresholds
            file, an unknown kernel), or the plan's dispatch policy changed since it was
            resolved (``flows.plan.plan_policy``); ``flows.plan.NothingToRollOut`` with
            ``new_version`` (a rollout), where ``auto`` resolved to its family's production.
    """
    plan = plan or resolve_plan(settings, kernels.default_backend())
    if new_version:
        something_to_roll_out(settings.implementation, plan)
    family, policy = plan.family, plan_policy(plan, settings, kernels.default_backend())
    with (serving(policy), rollout.family_lock(settings.store_dir, family) as locked,
          family_slot(family) as slotted):
        context = open_rollout(settings, plan, stage=stage,
                               owner_is_dead=locked or slotted,
                               clear_stale_aliases=clear_stale_aliases, run_name=run_name)
        try:
            yield context
        except BaseException as err:
            interrupted = isinstance(err, KeyboardInterrupt)
            closed = _close_failed(context.record, _reason(err), stage_of(err),
                                   interrupted=interrupted)
            if closed is not None and (interrupted or isinstance(err, Exception)):
                setattr(err, OUTCOME_ATTRIBUTE, closed)  # the flow ends Errored with it
            raise
        finally:
            context.serving.close()


def _reason(err: BaseException) -> str:
    if isinstance(err, KeyboardInterrupt):
        return "interrupted by a person (Ctrl-C) before the stage finished"
    if isinstance(err, TerminationSignal):  # SIGTERM: a cancel from the UI or API, a worker stopping
        return (f"stopped by signal {err.signal} before the stage finished (a cancellation "
                "from the Prefect UI or API, or its worker stopping)")
    if isinstance(err, asyncio.CancelledError):  # what Prefect raises inside a run it stops
        return ("cancelled by Prefect from inside the run before the stage finished: most "
                "likely the lease of its family's slot could not be renewed (the run's logs "
                "say so: \"Concurrency lease renewal failed\")")
    return f"{type(err).__name__}: {err}"


def _close_failed(record: rollout.RolloutRecord, reason: str,
                  stage: str = "error", *, interrupted: bool = False) -> RolloutOutcome | None:
    """Close a crashed (``interrupted``: stopped by a person) rollout by what its record
    says it did: nothing when its outcome is written (the run ended); a note when its
    candidate already serves (promoted); else the candidate (if one was registered)
    rejected and the run closed *errored* (FAILED) or *interrupted* (KILLED) at
    ``stage``, signed. Returns the outcome written, if any."""
    if record.tracking.client().get_run(record.rollout_run_id).info.status != "RUNNING":
        return None
    version = dead_runs.built_version(record.tracking, record.family, record.rollout_run_id)
    store = FamilyStore.of(record)
    if version is not None and version == store.production_version():
        return rollout.close_rollout(record, result="promoted", stage="promotion", version=version,
                                     reason=f"promoted; a step after the promotion failed: {reason}")
    try:
        if version is not None:
            store.reject(version, f"rollout failed: {reason}",
                         parent_run_id=record.rollout_run_id)
    finally:
        outcome = rollout.close_rollout(record, result="interrupted" if interrupted else "errored",
                                        stage=stage, reason=reason, version=version)
    return outcome


@stage_task(name="preregister")
def preregister(context: RolloutContext) -> Preregistered:
    """Freeze the plan's thresholds bytes in MLflow, signed, before anything is
    evaluated, with the settings that can change a verdict (``lineage.records.bindings``); return
    the registration as every later stage reads it (read back from the signed record).

    Raises:
        ValueError: the bytes do not parse against the thresholds schema.
        lineage.records.registration.LooseningRefused: they loosen the family's thresholds after a
            rejection without a named approval.
        lineage.records.bindings.BindingsRefused: the family's newest registration froze the same
            file with other verdict-changing settings (named).
    """
    record, settings, plan = context.record, context.settings, context.plan
    approval = settings.loosening_approval.read_bytes() if settings.loosening_approval else None
    # the test set's digest is bound by the registration: prepared first (idempotent)
    testset_dir = prepare_testset.fn(context).testset_dir
    registered = context.store.preregister(
        plan.thresholds_bytes, plan.thresholds_file, parent_run_id=record.rollout_run_id,
        loosening_approval=approval, source=str(settings.thresholds),
        bindings=rollout_bindings(settings, plan, testset_dir))
    rollout.link(record, {tags.REGISTRATION_ID: registered.registration_id})
    source = context.store.source(stages=("preregistration",))
    return Preregistered.read_back(registration.frozen_registration(source,
                                                                    registered.registration_id))


def rollout_bindings(settings: RolloutSettings, plan: RolloutPlan,
                     testset_dir) -> RolloutBindings:
    """The settings of ``settings`` that can change a verdict, as the registration binds
    them (``lineage.records.bindings``; the test-set profile is the plan's)."""
    return bindings_for(perf_shapes=settings.perf_shapes, perf_repeats=settings.perf_repeats,
                        shadow_requests=settings.shadow_requests,
                        model_check=settings.model_check,
                        testset_profile=plan.testset_profile,
                        testset_dir=testset_dir,
                        documents=load_documents(settings.documents_dir))


@stage_task(name="prepare-testset")
def prepare_testset(context: RolloutContext) -> Prepared:
    """Load the serving model and the test set of the plan's profile (built,
    deterministically, when missing). A plan read from a registration (re-validation)
    must find the test set it bound: another set is refused, naming both digests.

    Raises:
        lineage.records.bindings.BindingsRefused: the test set on disk is not the bound one.
    """
    settings, plan = context.settings, context.plan
    folder = settings.testset_dir or settings.store_dir / "testsets" / plan.testset_profile
    prepared = Prepared(testset_dir=ensure_testset(
        folder, profile=plan.testset_profile, documents_dir=settings.documents_dir,
        model=context.model.with_attention_dtype("float32")))  # the set as built, any contract
    if plan.bindings is not None:
        check_bound_testset(plan.bindings, prepared.testset_dir)
    return prepared


def finish(context: RolloutContext, result: Result, stage: str, reason: str, *,
           version: str | None, decision: GateDecision | None = None,
           decided_by: str | None = None, traffic: Sequence[CanaryStepResult] = (),
           inconclusive: bool = False, evidence: str | None = None) -> RolloutOutcome:
    """Close the rollout's record with its outcome (``version``: the candidate;
    ``decision``: its gate decision, summarised; ``traffic``: the shadow and canary steps
    judged; ``decided_by``: who or what decided; ``inconclusive``: stopped for want of
    evidence, not for a finding about the kernel; ``evidence``: markdown shown under the
    version page's verdict, e.g. the adoption test's), and show it in the Prefect UI.
    Every verdict line says what was not assessed (``gates.headline``)."""
    context.serving.close()
    outcome = rollout.close_rollout(
        context.record, result=result, stage=stage, reason=reason, version=version,
        decision_summary=decision.summary if decision else None,
        not_assessed_note=decision.not_assessed_note if decision else None,
        decided_by=decided_by, not_assessed=caveat(decision, traffic),
        inconclusive=inconclusive, evidence=evidence)
    logger = run_logger()
    try:
        create_markdown_artifact(outcome.markdown(),
                                 key=f"rollout-{context.record.family.replace('_', '-').lower()}",
                                 description=f"kernelgate rollout of {context.record.family}")
    except Exception as err:  # noqa: BLE001 - the MLflow record is complete; this is a courtesy
        logger.warning("could not write the Prefect summary artifact: %s", err)
    logger.info("rollout %s: %s", outcome.title(), outcome.summary())
    return outcome


STATE_NAMES: dict[str, str] = {"promoted": "Promoted", "rejected": "Rejected",
                               "timed_out": "TimedOut", "rolled_back": "RolledBack", "passed": "Passed",
                               "evaluated": "Evaluated", "built": "Built",
                               "nothing_in_production": "NothingInProduction",
                               "not_adopted": "NotAdopted", "errored": "Errored",
                               "nothing_to_roll_out": "NothingToRollOut"}
"""Result -> the name of the state a flow run ends in (the Prefect UI's runs list shows
it). Completed-type from :func:`end_state`; the rollout's own ends are typed by what they
mean (``flows.end_states``: only *Promoted* is Completed). *Errored* (a crash) is
Failed-type (``flows.errored``); a failure before the record opened stays Prefect's own
*Failed*."""

RESULT_TAG_PREFIX = "kernelgate-result:"
"""Flow-run tag naming the result (``kernelgate-result:promoted``), to filter runs on."""


def end_state(result: str, reason: str, data: object) -> State:
    """The flow run's final state: ``Completed`` named for ``result`` (*Built*,
    *Evaluated*, *Passed*, *RolledBack* of a manual rollback or a re-validation, …) with
    ``reason`` as its message and ``data`` as its result; also tags the flow run
    ``kernelgate-result:<result>``. Return it from the flow: Prefect ends the run in that
    state and the caller gets ``data``. A rollout's end: ``flows.end_states``."""
    tag_result(result)
    return Completed(name=STATE_NAMES.get(result, "Completed"), message=reason[:500], data=data)


def tag_result(result: str) -> None:
    """Tag the current flow run ``kernelgate-result:<result>`` (a warning if it cannot)."""
    run_id = flow_run.get_id()
    if run_id is not None:
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                current = client.read_flow_run(run_id).tags or []
                client.update_flow_run(run_id, tags=sorted({*current,
                                                            f"{RESULT_TAG_PREFIX}{result}"}))
        except Exception as err:  # noqa: BLE001 - the state below still says it
            run_logger().warning("could not tag the flow run with its result: %s", err)
