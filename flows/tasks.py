"""Tasks both flows use: opening and closing a rollout's record, preregistration, the
test set and model, and the session that holds the family's lock and closes the record
on failure. Each task calls plain functions of the packages below; the flows order them."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import MissingContextError, ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Completed, State

import kernels
from evaluation.documents import load_documents
from evaluation.model import MiniLM
from evaluation.testset import ensure_testset
from flows.settings import RolloutSettings, RolloutState
from lineage import keys, registration, registry, rollout, tags
from lineage import tracking as tr
from lineage.attestations import Signing
from lineage.bindings import RolloutBindings, bindings_for
from lineage.rollout import Result, RolloutOutcome
from lineage.version_runners import VersionPool

# Arguments include models and clients that do not hash; results are logged to MLflow.
stage_task = task(cache_policy=NO_CACHE, persist_result=False)


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run (lines show in the UI), the
    ``flows`` logger when a task's function is called directly."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")


def signing_for(settings: RolloutSettings) -> Signing:
    """The pipeline's signer (its key created on first use in the key folder) and the
    keys it trusts when it reads its own records back (current and retired, minus
    revoked).

    Raises:
        lineage.keys.KeyFileError: the key file is unusable.
    """
    key_dir = settings.key_dir or keys.default_key_dir()
    signer = keys.load_signer(keys.ensure_pipeline_key(key_dir))
    return Signing(signer=signer, trust=keys.folder_trust(key_dir))


def family_of(settings: RolloutSettings) -> str:
    """The family a rollout works on: ``settings.family``, else the kernel's name."""
    return settings.family or kernels.native_flash_kernel(settings.implementation,
                                                          kernels.default_backend())


@stage_task(name="open")
def open_rollout(settings: RolloutSettings, *, stage: str = "rollout", family: str | None = None,
                 clear_stale_aliases: bool = False, owner_is_dead: bool = False,
                 run_name: str | None = None) -> RolloutState:
    """Start the parent MLflow run, then tidy what crashed rollouts left: their RUNNING
    runs end as KILLED with the reason, the aliases are reconciled with the signed
    history, and (for a new rollout) ``shadow``/``canary`` aliases whose owner is dead
    are cleared. ``owner_is_dead``: the caller holds the family's lock.

    Raises:
        ValueError: unknown implementation or bad family name.
    """
    backend = kernels.default_backend()
    implementation = kernels.native_flash_kernel(settings.implementation, backend)
    tracking = tr.tracking_for(settings.store_dir)
    family = family or family_of(settings)
    record = rollout.open_rollout(tracking, family=family, implementation=implementation,
                                  backend=backend, work_root=settings.store_dir / "runs",
                                  signing=signing_for(settings), stage=stage, run_name=run_name)
    logger = run_logger()
    for run_id in rollout.close_dead_runs(tracking, family, alive_run_id=record.rollout_run_id,
                                          lease_s=settings.stale_alias_after_s,
                                          owner_is_dead=owner_is_dead):
        logger.warning("closed run %s of a rollout that died as KILLED", run_id)
    for change in registry.reconcile(tracking, family, record.signing):
        logger.warning("reconciled %s with its signed alias history: %s", family, change)
    if clear_stale_aliases:
        for alias in registry.clear_stale_aliases(
                tracking, family, lease_s=settings.stale_alias_after_s,
                cleared_by_run_id=record.rollout_run_id, signing=record.signing,
                owner_is_dead=owner_is_dead):
            logger.warning("cleared the stale %s alias of %s", alias, family)
    return RolloutState(settings=settings, record=record)


SLOT_LEASE_S = float(os.environ.get("KERNELGATE_ROLLOUT_SLOT_LEASE_S", "300"))
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
    (where ``lineage.rollout.family_lock`` queues instead) or without a Prefect server.

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
def rollout_session(settings: RolloutSettings, *, stage: str = "rollout",
                    family: str | None = None, clear_stale_aliases: bool = True,
                    run_name: str | None = None) -> Iterator[RolloutState]:
    """A rollout's whole life: the family's lock held (on an embedded store) or its slot
    in the family's Prefect concurrency limit (on a tracking server), the record
    opened, and on any exception the record closed before the exception propagates
    (production untouched, no alias left on the unfinished version, the parent run
    FAILED — or, after a completed promotion, a note that only bookkeeping failed)."""
    family = family or family_of(settings)
    with (rollout.family_lock(settings.store_dir, family) as locked,
          family_slot(family) as slotted):
        state = open_rollout(settings, stage=stage, family=family,
                             owner_is_dead=locked or slotted,
                             clear_stale_aliases=clear_stale_aliases, run_name=run_name)
        try:
            yield state
        except BaseException as err:
            _close_failed(state, f"{type(err).__name__}: {err}")
            raise
        finally:
            if state.versions is not None:
                state.versions.close()


def _close_failed(state: RolloutState, reason: str) -> None:
    record = state.record
    if state.closed:
        return
    state.closed = True
    if state.promoted:
        rollout.close_rollout(record, result="promoted", stage="promotion", version=state.version,
                              reason=f"promoted; a step after the promotion failed: {reason}")
        return
    try:
        if state.version is not None:
            registry.reject(record.tracking, record.family, state.version,
                            f"rollout failed: {reason}", signing=record.signing,
                            parent_run_id=record.rollout_run_id)
    finally:
        rollout.close_rollout(record, result="failed", stage="error", reason=reason,
                              version=state.version)


@stage_task(name="preregister")
def preregister(state: RolloutState) -> None:
    """Freeze the thresholds file in MLflow, signed, before anything is evaluated.

    Raises:
        ValueError: the file does not parse against the thresholds schema.
        lineage.registration.LooseningRefused: it loosens the family's thresholds after a
            rejection without a named approval.
    """
    record, settings = state.record, state.settings
    approval = settings.loosening_approval.read_bytes() if settings.loosening_approval else None
    if state.testset_dir is None:  # its digest is bound by the registration
        prepare_testset.fn(state)
    state.registration = registration.preregister(
        settings.thresholds, tracking=record.tracking, family=record.family,
        signing=record.signing, parent_run_id=record.rollout_run_id, loosening_approval=approval,
        bindings=rollout_bindings(settings, state.testset_dir, record.backend))
    rollout.link(record, {tags.REGISTRATION_ID: state.registration.registration_id})


def rollout_bindings(settings: RolloutSettings, testset_dir, backend: str) -> RolloutBindings:
    """The settings of ``settings`` that can change a verdict, as the registration binds
    them (``lineage.bindings``)."""
    return bindings_for(perf_shapes=settings.perf_shapes, perf_repeats=settings.perf_repeats,
                        shadow_requests=settings.shadow_requests,
                        model_check=settings.model_check,
                        testset_profile=settings.testset_profile_for(backend),
                        testset_dir=testset_dir,
                        documents=load_documents(settings.documents_dir))


def encoder(state: RolloutState) -> MiniLM:
    """The serving model, loaded once per rollout, and the pool of versions that run
    with it (closed when the rollout's session ends)."""
    if state.model is None:
        state.model = MiniLM.load()
        state.versions = VersionPool(state.record.tracking, state.record.family, state.model,
                                     state.record.signing.trust)
    return state.model


@stage_task(name="prepare-testset")
def prepare_testset(state: RolloutState) -> None:
    """Load the serving model and the test set (built, deterministically, when missing)."""
    settings = state.settings
    encoder(state)
    profile = settings.testset_profile_for(state.record.backend)
    folder = settings.testset_dir or settings.store_dir / "testsets" / profile
    state.testset_dir = ensure_testset(folder, profile=profile,
                                       documents_dir=settings.documents_dir, model=state.model)


def finish(state: RolloutState, result: Result, stage: str, reason: str) -> RolloutOutcome:
    """Close the rollout's record with its outcome, and show it in the Prefect UI."""
    if state.versions is not None:
        state.versions.close()
    decision = state.decision
    state.closed = True
    outcome = rollout.close_rollout(
        state.record, result=result, stage=stage, reason=reason, version=state.version,
        decision_summary=decision.summary if decision else None,
        not_assessed_note=decision.not_assessed_note if decision else None)
    logger = run_logger()
    try:
        create_markdown_artifact(outcome.markdown(),
                                 key=f"rollout-{state.record.family.replace('_', '-').lower()}",
                                 description=f"kernelgate rollout of {state.record.family}")
    except Exception as err:  # noqa: BLE001 - the MLflow record is complete; this is a courtesy
        logger.warning("could not write the Prefect summary artifact: %s", err)
    logger.info("rollout %s: %s at %s — %s", outcome.family, outcome.result, outcome.stage,
                outcome.reason)
    return outcome


STATE_NAMES: dict[str, str] = {"promoted": "Promoted", "rejected": "Rejected",
                               "rolled_back": "RolledBack", "passed": "Passed",
                               "evaluated": "Evaluated", "built": "Built",
                               "nothing_in_production": "NothingInProduction"}
"""Result -> the name of the Completed-type state a flow run ends in (the Prefect UI's
runs list shows it; a failure stays Prefect's own *Failed*)."""

RESULT_TAG_PREFIX = "kernelgate-result:"
"""Flow-run tag naming the result (``kernelgate-result:promoted``), to filter runs on."""


def end_state(result: str, reason: str, data: object) -> State:
    """The flow run's final state: ``Completed`` named for ``result`` (*Promoted*,
    *Rejected*, *RolledBack*, …) with ``reason`` as its message and ``data`` as its
    result; also tags the flow run ``kernelgate-result:<result>``. Return it from the
    flow: Prefect ends the run in that state and the caller gets ``data``."""
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
    return Completed(name=STATE_NAMES.get(result, "Completed"), message=reason[:500], data=data)
