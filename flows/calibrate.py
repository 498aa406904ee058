"""``kernelgate calibrate``: production against itself through the exact canary path (a
family with no production yet: the native baseline against itself, so that a fresh
store's first rollout under a plan that requires a calibration can reach production).

Each of ``runs`` A/A canaries cuts a fresh request stream from the held-out documents
(seed = the run's number) into the registered plan's steps, replays every step with
``evaluation.serving.replay_canary_step(..., abba=True)`` with production's version on
both sides (the same endpoint), judges it with the canary's own function
(``flows.traffic.judge_step``, the earlier steps' results included), stops at a breach
as the rollout does, and concludes with ``gates.canary_latency.conclude_canary``. A plan whose canary replays a long-document workload (``canary.workload``) is calibrated on
that workload's documents, each run its own stream, served as its canary serves them. The
verdicts and every run's per-request log ratios become a signed ``calibration`` record
(``lineage.records.calibration``), valid for this device, driver, JAX version, serving code
and request source.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from evaluation import recorded_traffic, serving
from evaluation.documents import assign_splits, load_documents
from evaluation.longdoc import canary_source
from evaluation.longdoc.spec import load_spec, shipped
from evaluation.model import MiniLM
from flows.traffic import judge_step
from gates.canary_latency import another_look, conclude_canary
from gates.canary_plan import CanaryPlan
from gates.serving_contract import ServingContract
from gates.thresholds import load_thresholds
from lineage.aliases import registered_model
from lineage.records import calibration, chain
from lineage.records.environment import collect_environment
from lineage.serving import version_runners
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store.tracking import Tracking


class Calibrated(NamedTuple):
    """A calibration as logged (``run_id``, ``record``) and what a canary on this device
    now finds: the newest pooled run (``None``: the pool exceeds alpha, or holds none) and
    the sentence saying what the pool is or why none counts."""

    run_id: str
    record: calibration.CalibrationRecord
    counted_run_id: str | None
    pooled: str


class RegisteredServing(NamedTuple):
    """What production's registration fixes for a canary: the plan, the registration's
    id (``None`` when read from a fallback file) and the serving contract, whose
    ``model_dtype`` is the dtype MiniLM's attention runs in on both sides."""

    plan: CanaryPlan
    registration_id: str | None
    serving: ServingContract


def registered_plan(tracking: Tracking, family: str, version: str, trust,
                    fallback: Path | None) -> RegisteredServing:
    """The canary plan and serving contract production's version was registered with
    (and the registration id), else those of the ``fallback`` thresholds file.

    Raises:
        ValueError: no readable registration and no ``fallback``.
    """
    evidence = chain.collect(StoreSource(tracking, family, trust), version)
    if evidence.thresholds is not None:
        return RegisteredServing(evidence.thresholds.canary,
                                 evidence.registration.registration_id,
                                 evidence.thresholds.serving)
    if fallback is None:
        raise ValueError(f"production v{version} of {family} has no readable registration; "
                         "pass --thresholds")
    thresholds = load_thresholds(fallback)
    return RegisteredServing(thresholds.canary, None, thresholds.serving)


def serving_model(contract: ServingContract) -> MiniLM:
    """MiniLM with its attention in the contract's ``model_dtype``, as a rollout's canary
    serves it (``flows.results.ServingModel``): a calibration in another dtype would time
    other programs, and a kernel whose contract is bf16 only refuses float32 requests
    (seen on the H200, 2026-12-01: 200 of 200 A/A canaries of a bf16-only production
    "rolled back" because every production request failed)."""
    return MiniLM.load().with_attention_dtype(contract.model_dtype)


def _judged(plan: CanaryPlan, parts: list, replay: Callable) -> tuple[str, str, list[float]]:
    """The canary's looks over ``parts`` (each look's requests, in order), each replayed
    by ``replay(step, part)`` and judged with the earlier steps' results, stopping at a
    breach as a rollout's canary does: ``(verdict, reason, every compared log ratio)``."""
    results = []
    for step, part in zip(plan.looks(), parts, strict=True):
        if not another_look(plan, results):
            break  # a breach, or an extra look the verdict does not need
        results.append(judge_step(plan, replay(step, part), step, results, None))
    verdict = conclude_canary(plan, results)
    return verdict.verdict, verdict.reason, [x for r in results for x in r.log_ratios]


def canary_run(plan: CanaryPlan, production: serving.Endpoint, candidate: serving.Endpoint,
               model: MiniLM, documents, seed: int) -> tuple[str, str, list[float]]:
    """One canary of ``candidate`` against ``production`` through the canary's replay and
    judge: ``(verdict, reason, every compared request's log ratio)``. The request stream
    is cut fresh from ``documents`` with ``seed`` into the plan's steps; each step is
    warmed on both endpoints, replayed with ABBA timing, judged with the earlier steps'
    results, and the canary stops at a breach as a rollout's does."""
    sizes = [s.requests for s in plan.looks()]
    traffic = recorded_traffic.record_traffic(documents, sum(sizes), seed=seed)
    endpoints = [production] if candidate is production else [production, candidate]

    def replay(step, part):
        serving.warm_up(part.requests, endpoints, model)
        return serving.replay_canary_step(part.requests, step.traffic_fraction, production,
                                          candidate, salt=f"calibration-{seed}:{step.name}",
                                          abba=True)

    return _judged(plan, recorded_traffic.split_traffic(traffic, sizes), replay)


def longdoc_canary_run(plan: CanaryPlan, production, candidate,
                       seed: int) -> tuple[str, str, list[float]]:
    """:func:`canary_run` for a plan whose canary replays a long-document workload
    (``canary.workload``): each A/A canary draws its own stream of the workload's
    documents (``seed``), served by the ``LongdocEndpoint``s as the rollout's canary
    serves them (``evaluation.longdoc.canary_source``)."""
    sizes = [s.requests for s in plan.looks()]
    steps = canary_source.record_steps(plan.workload, sizes, [], seed_offset=seed)
    endpoints = [production] if candidate is production else [production, candidate]

    def replay(step, part):
        canary_source.warm_up(part.documents, endpoints)
        return canary_source.replay_step(part.documents, step.traffic_fraction, production,
                                         candidate, salt=f"calibration-{seed}:{step.name}")

    return _judged(plan, steps, replay)


def a_a_canary(plan: CanaryPlan, endpoint: serving.Endpoint, model: MiniLM, documents,
               seed: int) -> tuple[str, str, list[float]]:
    """One A/A canary (:func:`canary_run` with ``endpoint`` on both sides):
    ``(verdict, reason, every compared request's log ratio)``."""
    return canary_run(plan, endpoint, endpoint, model, documents, seed)


def calibrate(tracking: Tracking, family: str, *, runs: int, signing: Signing,
              thresholds: Path | None = None,
              progress: Callable[[int, int, str], None] | None = None) -> Calibrated:
    """Run ``runs`` A/A canaries of production (none yet: the native baseline, which
    serves until a first promotion, sized by ``thresholds``) and log the signed
    calibration record. Returns it with what a canary on this device now finds (the
    family's fresh calibrations pooled: ``calibration.fresh_calibration``). What a calibration
    vouches for is the serving path's noise and the judge's A/A rate on this device
    (``lineage.records.calibration``: its staleness facts), whichever kernel ran both sides.

    Raises:
        ValueError: no plan to size runs by (no production and no ``thresholds``).
    """
    version = registered_model.alias_version(tracking, family, "production")
    if version is None:
        if thresholds is None:
            raise ValueError(f"{family} has no production version yet: name the thresholds "
                             "file its rollouts will register (--thresholds) to calibrate the "
                             f"native baseline ({version_runners.NATIVE_BASELINE}) that serves "
                             "until then")
        frozen = load_thresholds(thresholds)
        plan, registration_id, contract = frozen.canary, None, frozen.serving
    else:
        plan, registration_id, contract = registered_plan(tracking, family, version,
                                                          signing.trust, thresholds)
    if not plan.paired:
        raise ValueError("the registered plan uses the legacy mannwhitneyu test: nothing to "
                         "calibrate (register signed_rank_abba)")
    model = serving_model(contract)
    pool = version_runners.VersionPool(tracking, family, model, signing.trust)
    try:
        # (no production: the native baseline's endpoint, as a rollout's canary compares with)
        if plan.workload is None:  # MiniLM's requests, cut from the held-out documents
            documents = assign_splits(load_documents(None))["heldout"]
            endpoint = version_runners.endpoint(pool, "production", expect_version=version)

            def one_run(seed):
                return a_a_canary(plan, endpoint, model, documents, seed=seed)
        else:  # the workload's encoder with production's attention, as the canary serves it
            endpoint = version_runners.longdoc_endpoint(
                pool, "production", load_spec(shipped(plan.workload)), expect_version=version)

            def one_run(seed):
                return longdoc_canary_run(plan, endpoint, endpoint, seed=seed)
        verdicts, ratios = [], []
        for i in range(runs):
            verdict, reason, r = one_run(i)
            verdicts.append((verdict, reason))
            ratios.append(r)
            if progress:
                progress(i + 1, runs, verdict)
    finally:
        pool.close()
    facts = calibration.device_facts(collect_environment(),
                                     workload=calibration.request_source(plan.workload))
    served = version or f"none ({version_runners.NATIVE_BASELINE}, the native baseline)"
    record = calibration.summarise(family=family, production_version=served,
                                   registration_id=registration_id, facts=facts,
                                   alpha=plan.latency.alpha, verdicts=verdicts,
                                   log_ratios=ratios)
    run_id = calibration.log_calibration(tracking, record, signing=signing)
    pooled = calibration.fresh_calibration(
        StoreSource(tracking, family, signing.trust, stages=("calibration",)), facts,
        plan.latency.max_calibration_age_days)
    return Calibrated(run_id, record, *pooled)
