"""Synthetic long-document comparisons with a known effect, for the plot, effect and
MLflow tests: two replays of one arrival stream through the real batcher and replay,
with injected service times instead of an encoder.

One row per batch (the token budget is the largest bucket), so both kernels serve the
same batches in the same order and a request's compute is its own batch's service time:
``seconds_per_token * bucket * exp(noise)`` for the baseline and ``factor`` times that
(fresh noise) for the candidate, the noise independent per request and kernel. The
median per-request compute ratio is then ``factor`` exactly (the log ratio is ``log
factor`` plus a symmetric difference of noises).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import yaml

from evaluation.longdoc import bench
from evaluation.longdoc.arrivals import draw_requests
from evaluation.longdoc.batcher import Batch
from evaluation.longdoc.bench import BenchResult
from evaluation.longdoc.loadgen import BatchOutcome, replay
from evaluation.longdoc.report import summarise
from evaluation.longdoc.spec import WorkloadSpec

WEIGHTS = "ab" * 32


def spec(requests: int = 160, rate_per_s: float = 60.0, seed: int = 5) -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "name": "synthetic", "encoder": {"layers": 2, "hidden": 64, "heads": 2, "head_dim": 32,
                                         "mlp_hidden": 96, "vocab": 97, "seed": 3},
        "lengths": {"kind": "lognormal", "median_tokens": 12, "sigma": 0.7,
                    "min_tokens": 2, "max_tokens": 32},
        "arrivals": {"rate_per_s": rate_per_s, "requests": requests, "warmup_requests": 10,
                     "seed": seed},
        "buckets": [8, 16, 32], "max_batch_tokens": 32, "slo_s": 0.5,
        "price_per_device_hour": 3600.0})


def write_spec(workload: WorkloadSpec, folder: Path) -> Path:
    path = folder / f"{workload.name}.yaml"
    path.write_text(yaml.safe_dump(workload.model_dump(mode="json")))
    return path


def _serve(factor: float | dict[int, float], rng: np.random.Generator, noise: float,
           fail_bucket: int | None, shift: float = 1.0):
    def serve(batch: Batch) -> BatchOutcome:
        if batch.bucket == fail_bucket:
            return BatchOutcome(0.0, None, "RuntimeError: out of memory")
        f = factor.get(batch.bucket, 1.0) if isinstance(factor, dict) else factor
        s = shift * f * 5e-4 * batch.bucket * float(np.exp(noise * rng.standard_normal()))
        return BatchOutcome(s, tuple(True for _ in batch.requests))
    return serve


def comparison(factor: float | dict[int, float], *, seed: int = 0, noise: float = 0.2,
               workload: WorkloadSpec | None = None, spec_path: Path | None = None,
               fail_bucket: int | None = None, fail_candidate: bool = False,
               kernels: tuple[str, str] = ("base", "cand"),
               second_shift: float = 1.0) -> BenchResult:
    """Baseline and candidate (``factor`` times slower; < 1 faster; a dict: per bucket,
    1 where a bucket is not named) on the same arrivals; the baseline (the candidate with
    ``fail_candidate``) fails every batch of ``fail_bucket`` (an error, like an
    out-of-memory). ``kernels``: the two names the result gives them. ``second_shift``:
    a factor on every service time of the replay that runs second (the candidate's), as
    a device left warm by the first replay would add."""
    workload = workload or spec()
    requests = draw_requests(workload)
    sha = hashlib.sha256(spec_path.read_bytes()).hexdigest() if spec_path else None
    rng = np.random.default_rng(seed)
    reports = {}
    fails = (None, fail_bucket) if fail_candidate else (fail_bucket, None)
    for name, f, fail, shift in ((kernels[0], 1.0, fails[0], 1.0),
                                 (kernels[1], factor, fails[1], second_shift)):
        trace = replay(requests, workload, _serve(f, rng, noise, fail, shift))
        reports[name] = summarise(trace, workload, implementation=name, device="cpu:synthetic",
                                  weights_sha256=WEIGHTS, workload_sha256=sha)
    return BenchResult(workload=workload.name, workload_sha256=sha, kernels=list(kernels),
                       paired=bench.paired(reports[kernels[0]], reports[kernels[1]], {}, {}),
                       reports=reports)


def ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """An AR(1) series of ``n`` with lag-1 correlation ``phi`` and marginal sd ``sd``."""
    shocks = rng.standard_normal(n) * sd * np.sqrt(1 - phi ** 2)
    x = np.empty(n)
    x[0] = rng.standard_normal() * sd
    for i in range(1, n):
        x[i] = phi * x[i - 1] + shocks[i]
    return x
