"""A/A calibrations of the canary's latency judge: signed records of their own kind.

``kernelgate calibrate --family F`` (``flows.cli_calibrate``) runs production against
itself through the exact canary path many times; what it found (the false-rollback
rate with its Wilson 95 % interval, the per-request log-ratio noise, every run's verdict
and raw per-request log ratios) is logged as a ``calibration`` run of the family's
experiment, its record a JSON artifact signed by a ``calibration`` attestation (so the
family's evidence log covers it).

A calibration describes one serving device, one serving path and one request source: it
is *stale* when the device kind, the driver, the JAX version, the serving code's digest
(:func:`serving_digest`) or what the canary replays (MiniLM's requests, or a long-document
workload by its spec's digest) differ from the canary's, or when it is older than the
registration's ``max_calibration_age_days``. The canary's verdict cites the calibration
it used (:func:`fresh_calibration`).
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from evaluation.longdoc.spec import shipped, spec_sha256
from lineage.log import log_writer
from lineage.records.environment import EnvironmentFacts
from lineage.signing.attestations import AttestationError, Signing
from lineage.signing.sources import EvidenceSource, StoreSource, signed_artifact
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

ARTIFACT = "calibration/calibration.json"
SERVING_FILES = ("evaluation/serving.py", "evaluation/runners.py", "evaluation/model.py",
                 "evaluation/longdoc/canary_source.py", "gates/canary.py",
                 "gates/canary_latency.py", "gates/latency_judge.py")
"""The serving path and the judge a calibration vouches for (their digest)."""
STALENESS_FACTS = ("device_kind", "driver_version", "jax_version", "serving_digest", "workload")
MINILM_REQUESTS = "minilm-recorded-requests"
"""What a canary without ``canary.workload`` replays, as a calibration records it."""
BEFORE_WORKLOADS = {"workload": MINILM_REQUESTS}
"""A fact a record made before it was recorded had: every canary then replayed MiniLM."""
__all__ = ["CalibrationRecord", "StoreSource", "device_facts", "fresh_calibration",
           "log_calibration", "serving_digest", "summarise", "wilson_interval"]


def serving_digest(root: Path | None = None) -> str:
    """sha256 over :data:`SERVING_FILES` (path and bytes) of this checkout."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for name in SERVING_FILES:
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()


def request_source(workload: str | None) -> str:
    """What a canary replays, as a calibration names it: MiniLM's recorded requests
    (``workload`` None), or the shipped long-document workload by name and spec digest
    (``evaluation.longdoc.spec``). An A/A calibration on one says nothing of the other's
    noise.

    Raises:
        evaluation.longdoc.spec.InvalidWorkload: no such shipped workload.
    """
    if workload is None:
        return MINILM_REQUESTS
    return f"{workload}@{spec_sha256(shipped(workload))}"


def device_facts(env: EnvironmentFacts, digest: str | None = None,
                 workload: str = MINILM_REQUESTS) -> dict[str, str | None]:
    """The facts a calibration is valid for (:data:`STALENESS_FACTS`); ``workload``: what
    the canary replays (:func:`request_source`)."""
    return {"device_kind": env.device_kind, "driver_version": env.driver_version,
            "jax_version": env.jax_version, "serving_digest": digest or serving_digest(),
            "workload": workload}


def wilson_interval(k: int, n: int) -> tuple[float, float]:
    """The Wilson 95 % interval of ``k`` successes in ``n`` trials."""
    if n <= 0:
        return 0.0, 1.0
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class CalibrationRecord(BaseModel):
    """One A/A calibration (see the module docstring)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    family: str
    production_version: str
    registration_id: str | None = None
    created_at: str
    facts: dict[str, str | None]
    alpha: float
    runs: int
    false_rollbacks: int
    false_rollback_rate: float
    rate_95: tuple[float, float]
    within_alpha: bool  # alpha lies at or above the interval's lower end
    inconclusive: int
    noise_sd: float | None  # robust sd of every run's log ratios pooled
    verdicts: list[str]
    reasons: list[str]
    log_ratios: list[list[float]]  # per run, every step's compared requests in order


def summarise(*, family: str, production_version: str, registration_id: str | None,
              facts: dict, alpha: float, verdicts: list[tuple[str, str]],
              log_ratios: list[list[float]]) -> CalibrationRecord:
    """A :class:`CalibrationRecord` from the runs' ``(verdict, reason)`` and log ratios."""
    from gates.latency_judge import robust_sd

    n = len(verdicts)
    fails = sum(1 for v, _ in verdicts if v == "fail")
    low, high = wilson_interval(fails, n)
    pooled = [x for run in log_ratios for x in run]
    sd = robust_sd(pooled) if len(pooled) >= 2 else math.nan
    return CalibrationRecord(
        family=family, production_version=production_version,
        registration_id=registration_id, created_at=datetime.now(UTC).isoformat(),
        facts=facts, alpha=alpha, runs=n, false_rollbacks=fails,
        false_rollback_rate=fails / n if n else math.nan, rate_95=(low, high),
        within_alpha=low <= alpha, inconclusive=sum(1 for v, _ in verdicts if v == "inconclusive"),
        noise_sd=None if math.isnan(sd) else sd, verdicts=[v for v, _ in verdicts],
        reasons=[r for _, r in verdicts], log_ratios=log_ratios)


def log_calibration(tracking: Tracking, record: CalibrationRecord, *, signing: Signing) -> str:
    """Log ``record`` as a signed ``calibration`` run of the family; returns its run id."""
    run_tags = {tags.MODEL_VERSION: record.production_version,
                tags.NOTE: (f"A/A calibration: {record.false_rollbacks}/{record.runs} false "
                            f"rollbacks (alpha {record.alpha:g}) on {record.facts['device_kind']}")}
    with tr.stage_run(tracking, record.family, "calibration", run_tags=run_tags,
                      run_name=f"calibration-v{record.production_version}") as run_id:
        tr.log_model_json(tracking, run_id, record, ARTIFACT)
        client = tracking.client()
        client.log_metric(run_id, "calibration.false_rollback_rate", record.false_rollback_rate)
        if record.noise_sd is not None:
            client.log_metric(run_id, "calibration.noise_sd", record.noise_sd)
        # an entry of the family's log like every other attestation (lineage.log.log_writer)
        log_writer.append(tracking, run_id, "calibration", {
            "family": record.family, "version": record.production_version,
            "facts": record.facts, "created_at": record.created_at, "runs": record.runs,
            "false_rollbacks": record.false_rollbacks, "alpha": record.alpha,
            "within_alpha": record.within_alpha, "tags": run_tags}, signing)
    return run_id


def fresh_calibration(source: EvidenceSource, facts: dict, max_age_days: float | None,
                      now: datetime | None = None) -> tuple[str | None, str]:
    """Whether the family's fresh calibrations vouch for the canary's judge on this device:
    every verified calibration matching ``facts`` (device kind, driver, JAX version,
    serving digest, workload) and at most ``max_age_days`` old (``None``: any age) is
    pooled, and the pooled A/A false-rollback rate must be within alpha (the newest
    record's) by its Wilson interval. Pooled, not the newest that passed: a calibration
    that exceeded is never dropped for a luckier one run after it (calibrating until one
    passes would vouch for any judge); more runs, which narrow the pooled interval, are
    what answers it. Returns ``(newest pooled run id, what the pool is)`` or ``(None, why
    none counts)``."""
    now = now or datetime.now(UTC)
    found = sorted((a for a in source.attestations() if a.kind == "calibration"),
                   key=lambda a: a.predicate.get("created_at", ""), reverse=True)
    why = [f"no calibration of family {source.family}"] if not found else []
    pool: list[tuple[str, CalibrationRecord, float]] = []
    for attestation in found:
        try:
            _, data = signed_artifact(source, attestation.run_id, "calibration", ARTIFACT)
        except AttestationError as err:
            why.append(str(err))
            continue
        record = CalibrationRecord.model_validate_json(data)
        stale = [k for k in STALENESS_FACTS if record.facts.get(k, BEFORE_WORKLOADS.get(k))
                 != facts.get(k, BEFORE_WORKLOADS.get(k))]
        age = (now - datetime.fromisoformat(record.created_at)).total_seconds() / 86400
        if stale:
            why.append(f"run {attestation.run_id}: stale ({', '.join(stale)} changed)")
        elif max_age_days is not None and age > max_age_days:
            why.append(f"run {attestation.run_id}: {age:.1f} days old > {max_age_days:g}")
        else:
            pool.append((attestation.run_id, record, age))
    if not pool:
        return None, "; ".join(why)
    (newest_id, newest, age), others = pool[0], pool[1:]
    fails, runs = sum(r.false_rollbacks for _, r, _ in pool), sum(r.runs for _, r, _ in pool)
    low, high = wilson_interval(fails, runs)
    pooled = (f"{fails}/{runs} A/A false rollbacks (95% [{low:.3f}, {high:.3f}], alpha "
              f"{newest.alpha:g})" + (f" over calibration {newest_id} and {len(others)} "
                                      "earlier fresh one(s)" if others else ""))
    if low > newest.alpha:
        return None, (f"the fresh calibrations pool to {pooled}: over alpha; more A/A runs "
                      "narrow it (kernelgate calibrate --runs N; a calibration that exceeded "
                      "is pooled, never dropped)")
    sd = f"noise sd {newest.noise_sd:.3g}, " if newest.noise_sd is not None else ""
    return newest_id, f"calibration {newest_id} ({pooled}, {sd}{age:.1f} days old)"
