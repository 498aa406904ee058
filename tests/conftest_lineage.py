"""Shared helpers for the gates/lineage tests (imported explicitly, not a pytest conftest).

A pydantic stand-in for the evaluation report (gates read reports duck-typed), a small
thresholds file whose numbers the tests reason about, and a builder for the MLflow chain
preregistration -> build -> evaluation -> gate decision -> model version.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from gates.approval import ApprovalInput, record_answer, record_auto_approval
from gates.canary import analyse_canary_step
from gates.decision import GateDecision, decide
from gates.preregistration import Registration
from gates.thresholds import CanaryStep, load_thresholds
from lineage import registry, tags
from lineage import tracking as tr
from lineage.records import log_approval, log_canary_step, log_decision, log_shadow
from lineage.registration import preregister, registered_thresholds
from lineage.registry import register_build
from lineage.tracking import Tracking


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
    return f"""schema_version: 1
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
  latency: {{test: mannwhitneyu, alternative: greater, alpha: 0.05, min_slowdown_ratio: 1.05}}
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


def build_chain(
    tracking: Tracking,
    family: str,
    thresholds_path: Path,
    metrics: dict[str, float],
    *,
    production_metrics: dict[str, float] | None = None,
    registration: Registration | None = None,
) -> Chain:
    """Preregister (unless given), build, evaluate, decide and register one candidate."""
    registration = registration or preregister(thresholds_path, tracking=tracking, family=family)
    with tr.stage_run(tracking, family, "build") as build_run_id:
        tr.log_text(tracking, build_run_id, '{"block_q": 128}', "build/config.json")
        tr.log_bytes(tracking, build_run_id, b"\x00exported-module\x01", "build/export/gpu.bin")
    started = datetime.now(UTC)
    with tr.stage_run(
        tracking,
        family,
        "evaluation",
        run_tags={
            tags.BUILD_RUN_ID: build_run_id,
            tags.REGISTRATION_ID: registration.registration_id,
        },
    ) as evaluation_run_id:
        report = StandInReport(
            metrics=metrics,
            baseline_metrics=baseline_metrics(),
            production_metrics=production_metrics,
            started_at=started,
        )
        tr.log_model_json(tracking, evaluation_run_id, report, "reports/evaluation.json")
    decision = decide(report, load_thresholds(thresholds_path), registration)
    decision_run_id = log_decision(
        tracking,
        family,
        decision,
        build_run_id=build_run_id,
        evaluation_run_id=evaluation_run_id,
    )
    version = register_build(tracking, family, build_run_id, implementation="xla", config=None)
    return Chain(
        registration=registration,
        build_run_id=build_run_id,
        evaluation_run_id=evaluation_run_id,
        decision_run_id=decision_run_id,
        version=version,
        decision=decision,
    )


def _passing_step(step, plan):
    """A traffic-stage analysis that passes: equal latency distributions, no drift."""
    rng = np.random.default_rng(len(step.name))
    latencies = rng.lognormal(np.log(0.01), 0.05, 40)
    return analyse_canary_step(step, latencies, latencies * 1.0, np.zeros(10), error_count=0,
                               nan_count=0, memory_start_bytes=0, memory_end_bytes=0, plan=plan)


def complete_chain(tracking: Tracking, family: str, chain: Chain, *,
                   approve: dict[str, ApprovalInput] | None = None,
                   confirmation_metrics: dict[str, float] | None = None) -> Chain:
    """Log the rest of the evidence promotion needs for ``chain.version``: a passed
    shadow stage, every approval the registered policy requires (a person's approval,
    or ``approve[transition]``; auto-approval where the policy says so), one passed
    canary run per registered step, and a confirmation decision (accuracy criteria) on
    ``confirmation_metrics`` (default: the passing metrics)."""
    thresholds = registered_thresholds(chain.registration, tracking=tracking)
    plan, policy = thresholds.canary, thresholds.approval
    shadow = _passing_step(CanaryStep(name="shadow", traffic_fraction=1.0, requests=10), plan)
    shadow_run = log_shadow(tracking, family, chain.version, shadow, shadow,
                            decision_run_id=chain.decision_run_id)
    registry.link_traffic_run(tracking, family, chain.version, "shadow", shadow_run)
    for transition in policy.required_for:
        about = dict(transition=transition, family=family, version=chain.version)
        if policy.auto_approve:
            record = record_auto_approval(policy, **about)
        else:
            answer = (approve or {}).get(transition) or ApprovalInput(
                approve=True, approver="rm@example.com", comment="evidence reviewed")
            record = record_answer(answer, **about)
        run_id = log_approval(tracking, record, decision_run_id=chain.decision_run_id)
        registry.link_approval(tracking, family, chain.version, transition, run_id)
    for step in plan.steps:
        run_id = log_canary_step(tracking, family, _passing_step(step, plan),
                                 decision_run_id=chain.decision_run_id)
        registry.link_traffic_run(tracking, family, chain.version, "canary", run_id)
    started = datetime.now(UTC)
    with tr.stage_run(tracking, family, "evaluation", run_tags={
            tags.BUILD_RUN_ID: chain.build_run_id,
            tags.REGISTRATION_ID: chain.registration.registration_id,
            tags.SPLIT: "confirmation"}) as evaluation_run_id:
        report = StandInReport(metrics=confirmation_metrics or passing_metrics(),
                               baseline_metrics=baseline_metrics(), started_at=started)
        tr.log_model_json(tracking, evaluation_run_id, report, "reports/evaluation.json")
    confirmation = decide(report, thresholds, chain.registration, kinds={"accuracy"})
    decision_run_id = log_decision(tracking, family, confirmation, build_run_id=chain.build_run_id,
                                   evaluation_run_id=evaluation_run_id)
    registry.link_confirmation(tracking, family, chain.version, decision_run_id)
    return chain


def promotable_chain(tracking: Tracking, family: str, thresholds_path: Path,
                     metrics: dict[str, float] | None = None, **kwargs) -> Chain:
    """``build_chain`` plus ``complete_chain``: a version ``registry.promote`` accepts."""
    chain = build_chain(tracking, family, thresholds_path, metrics or passing_metrics(), **kwargs)
    return complete_chain(tracking, family, chain)
