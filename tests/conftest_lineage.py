"""Shared helpers for the gates/lineage tests (imported explicitly, not a pytest conftest).

A pydantic stand-in for the evaluation report (gates read reports duck-typed), a small
thresholds file whose numbers the tests reason about, and a builder for the MLflow chain
preregistration -> build -> evaluation -> gate decision -> model version.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from evaluation.report import EvaluationReport, ImplementationInfo, ValidationSummary
from gates.approval import ApprovalInput, ApprovalRecord, record_answer, record_auto_approval
from gates.canary import analyse_canary_step
from gates.canary_plan import CanaryStep
from gates.decision import GateDecision, decide
from gates.preregistration import Registration
from gates.thresholds import load_thresholds
from lineage.aliases import registered_model, registry
from lineage.aliases.registered_model import register_build
from lineage.log.log_writer import append
from lineage.records.records import log_approval, log_canary_step, log_decision, log_shadow
from lineage.records.registration import preregister, registered_thresholds
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking


class StandInReport(BaseModel):
    """The attributes of evaluation.report.EvaluationReport that gates read."""

    metrics: dict[str, float]
    baseline_metrics: dict[str, float]
    production_metrics: dict[str, float] | None = None
    speed_assessed: bool = True
    speed_not_assessed_reason: str | None = None
    target_platform: str = "gpu"
    device_platform: str = "gpu"
    started_at: datetime


def evaluation_report(metrics: dict[str, float], *, production_metrics=None,
                      started_at: datetime | None = None, split: str = "heldout",
                      split_digest: str = "d" * 64) -> EvaluationReport:
    """A real ``EvaluationReport`` carrying the given metrics (what the audit re-derives
    decisions from), for a GPU kernel evaluated on a GPU."""
    info = {"name": "x", "native": True, "target_platform": "gpu"}
    return EvaluationReport(
        candidate=ImplementationInfo(role="candidate", **info),
        baseline=ImplementationInfo(role="baseline", **info),
        production=ImplementationInfo(role="production", **info) if production_metrics else None,
        split=split, testset_dir="/nowhere", testset_digest="t" * 64, split_digest=split_digest,
        started_at=started_at or datetime.now(UTC), target_platform="gpu", device_platform="gpu",
        device_kind="test", jax_version="0", speed_assessed=True,
        validation=ValidationSummary(success=True), metrics=metrics,
        baseline_metrics=baseline_metrics(), production_metrics=production_metrics)


def thresholds_yaml(
    *,
    profile: str = "test",
    not_assessed_blocks: bool = False,
    required_for: tuple[str, ...] = (),
    auto_approve: bool = False,
    min_cases: int = 2,
) -> str:
    """A thresholds file with round numbers; the same criteria on every platform."""
    criteria = """    value:
      - {name: nan-free, metric: accuracy.all.nan_count, kind: accuracy, op: "==", value: 0}
      - {name: error-ratio, metric: accuracy.hard.max_error_ratio_to_baseline, kind: accuracy, op: "<=", value: 2.0}
      - {name: cosine, metric: model.min_cosine_similarity, kind: accuracy, op: ">=", value: 0.999}
    change:
      - {name: speedup, metric: latency.p50_s, kind: speed, against: baseline, better: lower, min_improvement: 1.2}
      - {name: vs-production, metric: latency.p50_s, kind: speed, against: production, better: lower, max_regression: 1.1}
      - {name: memory, metric: memory.peak_bytes, kind: memory, native_only: true, against: baseline, better: lower, max_regression: 1.0}
"""
    platforms = "".join(f"  {p}:\n{criteria}" for p in ("tpu", "gpu", "cpu"))
    reason = "auto_approve_reason: test dry run\n  " if auto_approve else ""
    return f"""schema_version: 2
profile: {profile}
not_assessed_blocks_promotion: {str(not_assessed_blocks).lower()}
min_cases_per_category: {min_cases}
platforms:
{platforms}canary:
  steps:
    - {{name: s5, traffic_fraction: 0.05, requests: 100}}
    - {{name: s50, traffic_fraction: 0.5, requests: 100}}
  max_error_count: 0
  max_nan_count: 0
  max_output_drift: 1.0e-3
  latency: {{test: signed_rank_abba, alternative: greater, alpha: 0.05, min_slowdown_ratio: 1.2,
            power: 0.9, noise_sd: 0.1, spending: by_requests, inconclusive: reject}}
  max_memory_growth_bytes: 1000000
approval:
  required_for: {json.dumps(list(required_for))}
  timeout_s: 60
  auto_approve: {str(auto_approve).lower()}
  {reason}
"""


def baseline_metrics() -> dict[str, float]:
    """Naive baseline: 2 ms p50, 1 GB peak."""
    return {
        "accuracy.all.nan_count": 0.0,
        "accuracy.all.n_cases": 12.0,
        "accuracy.hard.n_cases": 4.0,
        "accuracy.hard.max_error_ratio_to_baseline": 1.0,
        "model.min_cosine_similarity": 0.99999,
        "latency.p50_s": 2.0e-3,
        "memory.peak_bytes": 1.0e9,
    }


def passing_metrics() -> dict[str, float]:
    """A candidate that meets every criterion of thresholds_yaml(): 2x faster, less memory."""
    return {
        "accuracy.all.nan_count": 0.0,
        "accuracy.all.n_cases": 12.0,
        "accuracy.hard.n_cases": 4.0,
        "accuracy.hard.max_error_ratio_to_baseline": 1.3,
        "model.min_cosine_similarity": 0.9995,
        "latency.p50_s": 1.0e-3,
        "memory.peak_bytes": 2.5e8,
    }


def slug(text: str) -> str:
    """A family name from a test name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)[:60]


class Chain(BaseModel):
    """The ids of one candidate's records."""

    registration: Registration
    build_run_id: str
    evaluation_run_id: str
    decision_run_id: str
    version: str
    decision: GateDecision


def signed_build(tracking: Tracking, family: str, signing: Signing, *,
                 implementation: str = "xla") -> tuple[str, str]:
    """A build run with stand-in artifacts, registered and signed: ``(run id, version)``."""
    with tr.stage_run(tracking, family, "build") as build_run_id:
        tr.log_text(tracking, build_run_id, '{"block_q": 128}', "build/config.json")
        tr.log_bytes(tracking, build_run_id, b"\x00exported-module\x01", "build/export/gpu.bin")
        version = register_build(tracking, family, build_run_id, implementation=implementation,
                                 config=None, artifact_path="build")
        append(tracking, build_run_id, "build", {
            "family": family, "version": version, "build_run_id": build_run_id,
            "implementation": implementation, "config": None, "code_sha256": "0" * 64,
            "version_tags": {tags.IMPLEMENTATION: implementation, tags.CONFIG: "null"}},
            signing)
    return build_run_id, version


def signed_evaluation(tracking: Tracking, family: str, signing: Signing, *, build_run_id: str,
                      registration_id: str, version: str, report: EvaluationReport) -> str:
    """An evaluation run holding ``report``, its metrics and tags, signed; returns its id."""
    run_tags = {tags.BUILD_RUN_ID: build_run_id, tags.REGISTRATION_ID: registration_id,
                tags.SPLIT: report.split}
    with tr.stage_run(tracking, family, "evaluation", run_tags=run_tags) as run_id:
        tr.log_model_json(tracking, run_id, report, "evaluation/evaluation_report.json")
        for name, value in report.metrics.items():
            tracking.client().log_metric(run_id, name, value)
        append(tracking, run_id, "evaluation", {
            "family": family, "version": version, "build_run_id": build_run_id,
            "registration_id": registration_id, "split": report.split,
            "split_digest": report.split_digest, "metrics": report.metrics,
            "report_artifact": "evaluation/evaluation_report.json", "tags": run_tags},
            signing)
    return run_id


def build_chain(
    tracking: Tracking,
    family: str,
    thresholds_path: Path,
    metrics: dict[str, float],
    *,
    signing: Signing,
    production_metrics: dict[str, float] | None = None,
    registration: Registration | None = None,
    built: tuple[str, str] | None = None,
) -> Chain:
    """Preregister (unless given), build (unless ``built`` gives an already registered and
    signed ``(build run id, version)``), evaluate, decide: all signed."""
    registration = registration or preregister(thresholds_path, tracking=tracking, family=family,
                                               signing=signing)
    build_run_id, version = built or signed_build(tracking, family, signing)
    report = evaluation_report(metrics, production_metrics=production_metrics)
    evaluation_run_id = signed_evaluation(tracking, family, signing, build_run_id=build_run_id,
                                          registration_id=registration.registration_id,
                                          version=version, report=report)
    decision = decide(report, load_thresholds(thresholds_path), registration)
    decision_run_id = log_decision(tracking, family, decision, build_run_id=build_run_id,
                                   evaluation_run_id=evaluation_run_id, version=version,
                                   signing=signing)
    return Chain(registration=registration, build_run_id=build_run_id,
                 evaluation_run_id=evaluation_run_id, decision_run_id=decision_run_id,
                 version=version, decision=decision)


_SYMMETRIC = (0.01 * (1 + np.arange(40) // 2) * np.resize([1, -1], 40))[:, None]
"""Per-request log ratios symmetric about 0 (each magnitude once each way)."""


def _passing_step(step, plan, earlier=(), slowdown: float = 1.0):
    """A traffic-stage analysis that passes: equal latency distributions (timed ABBA,
    ``slowdown`` on the candidate side), no drift."""
    rng = np.random.default_rng(len(step.name))
    latencies = rng.lognormal(np.log(0.01), 0.05, 40)
    abba = np.stack([latencies, latencies], axis=1)
    return analyse_canary_step(step, latencies, latencies * 1.0, np.zeros(10), error_count=0,
                               nan_count=0, memory_start_bytes=0, memory_end_bytes=0, plan=plan,
                               abba=(abba * slowdown, abba * np.exp(_SYMMETRIC)),
                               earlier=list(earlier))


def complete_chain(tracking: Tracking, family: str, chain: Chain, *, signing: Signing,
                   approve: dict[str, ApprovalRecord] | None = None,
                   confirmation_metrics: dict[str, float] | None = None,
                   confirmation_digest: str | None = None) -> Chain:
    """Log the rest of the signed evidence promotion needs for ``chain.version``: a passed
    shadow stage, every approval the registered policy requires (a person's approval, or
    ``approve[transition]``; auto-approval where the policy says so), one passed canary
    run per registered step, and a confirmation decision (accuracy criteria) on
    ``confirmation_metrics`` (default: the passing metrics) over a fresh split."""
    source = StoreSource(tracking, family, signing.trust)
    thresholds = registered_thresholds(source, chain.registration)
    plan, policy = thresholds.canary, thresholds.approval
    shadow = _passing_step(CanaryStep(name="shadow", traffic_fraction=1.0, requests=10), plan)
    shadow_run = log_shadow(tracking, family, chain.version, shadow, shadow,
                            decision_run_id=chain.decision_run_id, signing=signing)
    registered_model.link_traffic_run(tracking, family, chain.version, "shadow", shadow_run)
    for transition in policy.required_for:
        about = dict(transition=transition, family=family, version=chain.version)
        if (approve or {}).get(transition) is not None:
            record = approve[transition]
        elif policy.auto_approve:
            record = record_auto_approval(policy, **about)
        else:
            record = record_answer(ApprovalInput(decision="approve", approver="rm@example.com",
                                                 comment="evidence reviewed"), **about)
        run_id = log_approval(tracking, record, decision_run_id=chain.decision_run_id,
                              signing=signing)
        registered_model.link_approval(tracking, family, chain.version, transition, run_id)
    earlier = []
    for step in plan.steps:
        earlier.append(_passing_step(step, plan, earlier))
        run_id = log_canary_step(tracking, family, earlier[-1], version=chain.version,
                                 decision_run_id=chain.decision_run_id, signing=signing)
        registered_model.link_traffic_run(tracking, family, chain.version, "canary", run_id)
    report = evaluation_report(confirmation_metrics or passing_metrics(), split="confirmation",
                               split_digest=confirmation_digest or uuid.uuid4().hex * 2)
    evaluation_run_id = signed_evaluation(tracking, family, signing, build_run_id=chain.build_run_id,
                                          registration_id=chain.registration.registration_id,
                                          version=chain.version, report=report)
    confirmation = decide(report, thresholds, chain.registration, kinds={"accuracy"})
    decision_run_id = log_decision(tracking, family, confirmation, build_run_id=chain.build_run_id,
                                   evaluation_run_id=evaluation_run_id, version=chain.version,
                                   signing=signing)
    registered_model.link_confirmation(tracking, family, chain.version, decision_run_id)
    return chain


def promotable_chain(tracking: Tracking, family: str, thresholds_path: Path,
                     metrics: dict[str, float] | None = None, *, signing: Signing,
                     **kwargs) -> Chain:
    """``build_chain`` plus ``complete_chain``: a version ``registry.promote`` accepts."""
    chain = build_chain(tracking, family, thresholds_path, metrics or passing_metrics(),
                        signing=signing, **kwargs)
    return complete_chain(tracking, family, chain, signing=signing)


def promote(tracking: Tracking, family: str, chain: Chain, signing: Signing):
    """Promote ``chain.version`` against whatever production is now."""
    return registry.promote(tracking, family, chain.version, decision_run_id=chain.decision_run_id,
                            expected_previous=registered_model.alias_version(tracking, family, "production"),
                            signing=signing)
