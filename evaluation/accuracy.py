"""Accuracy of attention implementations against the float64 reference and the naive baseline.

For every test case the float64 NumPy reference (``kernels.reference.attention_reference``)
is computed once; every implementation (candidate, naive baseline, production) runs on
the same inputs and is scored against it. The per-category aggregates become the flat
``accuracy.{cat}.*`` metrics of ARCHITECTURE.md.

Error ratio to the baseline. Per case,
``ratio = rel_error / max(baseline_rel_error, floor)`` with the rounding floor
``floor = u_dtype + u_float32 * sqrt(kv_len)`` (``kernels.reference.rounding_floor``; u is
the unit roundoff: 2^-24 for float32, 2^-8 for bfloat16, 2^-11 for float16). The first
term is what rounding the output (and the probabilities) to the storage dtype costs,
the second what float32 accumulation over the case's ``kv_len`` keys costs (random-walk
growth). Below the floor an error is rounding, whatever the implementation, so the ratio
of two rounding-level errors cannot decide a gate: on the H200 a float32 decode case (1
query x 127 keys) had candidate 2.8e-7 against naive 1.1e-7, ratio 2.5 against the
unit-roundoff floor of before (6e-8), 0.38 against this floor (7.3e-7). A kernel 2x
above the floor is past rounding and fails the usual 2.0 bound. Where naive is (nearly)
exact, e.g. constant inputs, the floor also keeps the ratio finite. A non-finite
baseline error is ignored (the floor alone is used), so a baseline that overflows cannot
hide a candidate's error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluation.cases import CATEGORIES, TestCase
from evaluation.coverage import is_refusal
from kernels.api import AttentionFn
from kernels.reference import attention_reference, relative_error, rounding_floor

logger = logging.getLogger(__name__)

AggregateCategory = Literal["ordinary", "hard", "adversarial", "all"]
AGGREGATE_CATEGORIES: tuple[AggregateCategory, ...] = (*CATEGORIES, "all")

ProgressFn = Callable[[int, int, str], None]
"""``progress(done, total, case_id)`` called after each case."""


class CaseAccuracy(BaseModel):
    """One implementation on one case (errors are float64, dimensionless unless noted).

    ``rel_error``/``error_ratio_to_baseline`` are ``inf`` when the output is non-finite
    or the implementation raised (``error`` holds the message).
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    case_id: str
    category: Literal["ordinary", "hard", "adversarial"]
    tags: tuple[str, ...] = ()
    dtype: str
    q_shape: tuple[int, int, int, int]
    kv_shape: tuple[int, int, int, int]
    causal: bool
    rel_error: float = Field(description="||out - ref||_2 / ||ref||_2 against float64")
    max_abs_error: float = Field(description="max |out - ref| (inf if any output is non-finite)")
    nan_count: int = Field(description="NaN output elements (finite inputs)")
    inf_count: int = Field(description="+-inf output elements (finite inputs)")
    baseline_rel_error: float = Field(description="the naive baseline's rel_error on this case")
    error_floor: float = Field(description="max(finite baseline_rel_error, rounding floor "
                                           "u_dtype + u_float32 * sqrt(kv_len))")
    error_ratio_to_baseline: float = Field(description="rel_error / error_floor")
    rel_diff_to_baseline: float = Field(description="||out - naive|| / ||naive||")
    seconds: float = Field(description="wall time of the call, compile included (s)")
    error: str | None = Field(default=None, description="exception raised by the implementation")
    refused: bool = Field(default=False, description="the implementation refused the case by "
                          "contract (NotImplementedError naming why): a coverage failure")


class CategoryAccuracy(BaseModel):
    """Aggregate over the cases of one category (or ``all``). Statistics are ``None``
    when the category has no case."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    category: AggregateCategory
    n_cases: int
    failed_cases: int = Field(description="cases where the implementation raised")
    max_rel_error: float | None = None
    median_rel_error: float | None = None
    max_error_ratio_to_baseline: float | None = None
    median_error_ratio_to_baseline: float | None = None
    max_abs_error: float | None = None
    max_rel_diff_to_baseline: float | None = None
    nan_count: int = 0
    inf_count: int = 0


class AccuracyResult(BaseModel):
    """Per-case rows and per-category aggregates of one implementation."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    implementation: str = Field(description="role or name, e.g. candidate, baseline, production")
    cases: list[CaseAccuracy]
    categories: dict[str, CategoryAccuracy]

    def refused(self) -> dict[str, str]:
        """case_id -> why, for every case the implementation refused."""
        return {c.case_id: c.error or "" for c in self.cases if c.refused}

    def metrics(self) -> dict[str, float]:
        """The flat ``accuracy.{cat}.*`` metrics of ARCHITECTURE.md. Statistics of an
        empty category are absent (``n_cases`` is 0), never NaN."""
        out: dict[str, float] = {}
        for cat, agg in self.categories.items():
            out[f"accuracy.{cat}.n_cases"] = float(agg.n_cases)
            if agg.n_cases == 0:
                continue
            out[f"accuracy.{cat}.max_rel_error"] = agg.max_rel_error
            out[f"accuracy.{cat}.median_rel_error"] = agg.median_rel_error
            out[f"accuracy.{cat}.max_error_ratio_to_baseline"] = agg.max_error_ratio_to_baseline
            out[f"accuracy.{cat}.max_abs_error"] = agg.max_abs_error
            out[f"accuracy.{cat}.nan_count"] = float(agg.nan_count)
            out[f"accuracy.{cat}.inf_count"] = float(agg.inf_count)
        return out


def error_floor(dtype, baseline_rel_error: float, kv_len: int) -> float:
    """``max(baseline_rel_error, rounding_floor(dtype, kv_len))`` (dimensionless); a
    non-finite baseline error counts as absent. See the module docstring for why."""
    floor = rounding_floor(dtype, kv_len)
    return max(baseline_rel_error, floor) if math.isfinite(baseline_rel_error) else floor


def reference_output(case: TestCase) -> np.ndarray:
    """Float64 reference output of a case, ``[batch, q_len, num_heads, head_dim]``."""
    return attention_reference(case.q, case.k, case.v, causal=case.spec.causal,
                               scale=case.spec.scale, q_lengths=case.q_lengths,
                               kv_lengths=case.kv_lengths)


def run_case(fn: AttentionFn, case: TestCase) -> np.ndarray:
    """Run an ``AttentionFn`` on a case and return its output as a NumPy array (blocking).

    Raises whatever ``fn`` raises (``ValueError``/``NotImplementedError`` by contract).
    """
    lengths = {n: None if getattr(case, n) is None else jnp.asarray(getattr(case, n))
               for n in ("q_lengths", "kv_lengths")}
    out = fn(jnp.asarray(case.q), jnp.asarray(case.k), jnp.asarray(case.v),
             causal=case.spec.causal, scale=case.spec.scale, **lengths)
    return np.asarray(jax.block_until_ready(out))


def _score(case: TestCase, out: np.ndarray | None, ref: np.ndarray, base: np.ndarray | None,
           base_err: float, seconds: float, error: str | None) -> CaseAccuracy:
    spec = case.spec
    floor = error_floor(spec.dtype, base_err, spec.kv_shape[1])
    row = dict(case_id=spec.case_id, category=spec.category, tags=spec.tags, dtype=spec.dtype,
               q_shape=spec.q_shape, kv_shape=spec.kv_shape, causal=spec.causal,
               baseline_rel_error=base_err, error_floor=floor, seconds=seconds, error=error,
               refused=is_refusal(error))
    if out is None or out.shape != ref.shape:
        if out is not None:
            row["error"] = f"output shape {out.shape} != expected {ref.shape}"
        return CaseAccuracy(**row, rel_error=math.inf, max_abs_error=math.inf, nan_count=0,
                            inf_count=0, error_ratio_to_baseline=math.inf,
                            rel_diff_to_baseline=math.inf)
    out64 = out.astype(np.float64)
    inputs_finite = all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in (case.q, case.k, case.v))
    finite = np.isfinite(out64)
    rel = relative_error(out64, ref)
    return CaseAccuracy(
        **row,
        rel_error=rel,
        max_abs_error=float(np.max(np.abs(out64 - ref))) if finite.all() else math.inf,
        nan_count=int(np.isnan(out64).sum()) if inputs_finite else 0,
        inf_count=int(np.isinf(out64).sum()) if inputs_finite else 0,
        error_ratio_to_baseline=rel / floor,
        rel_diff_to_baseline=relative_error(out64, base) if base is not None else math.inf,
    )


def _timed(fn: AttentionFn, case: TestCase) -> tuple[np.ndarray | None, float, str | None]:
    start = time.perf_counter()
    try:
        out = run_case(fn, case)
    except Exception as err:  # noqa: BLE001 - an untrusted kernel must not stop the evaluation
        # A kernel may refuse a case by contract (ValueError, NotImplementedError) or
        # crash; either is scored as a failed case (infinite error), never skipped, so
        # refusing cannot improve the numbers.
        logger.warning("%s raised on %s: %s", getattr(fn, "__name__", fn), case.spec.case_id, err)
        return None, time.perf_counter() - start, f"{type(err).__name__}: {err}"
    return out, time.perf_counter() - start, None


def aggregate(rows: Sequence[CaseAccuracy]) -> dict[str, CategoryAccuracy]:
    """Per-category aggregates (max, median, counts) plus ``all``."""
    out: dict[str, CategoryAccuracy] = {}
    for cat in AGGREGATE_CATEGORIES:
        sel = [r for r in rows if cat == "all" or r.category == cat]
        if not sel:
            out[cat] = CategoryAccuracy(category=cat, n_cases=0, failed_cases=0)
            continue
        rel = np.array([r.rel_error for r in sel])
        ratio = np.array([r.error_ratio_to_baseline for r in sel])
        out[cat] = CategoryAccuracy(
            category=cat, n_cases=len(sel), failed_cases=sum(r.error is not None for r in sel),
            max_rel_error=float(rel.max()), median_rel_error=float(np.median(rel)),
            max_error_ratio_to_baseline=float(ratio.max()),
            median_error_ratio_to_baseline=float(np.median(ratio)),
            max_abs_error=float(max(r.max_abs_error for r in sel)),
            max_rel_diff_to_baseline=float(max(r.rel_diff_to_baseline for r in sel)),
            nan_count=sum(r.nan_count for r in sel), inf_count=sum(r.inf_count for r in sel),
        )
    return out


class CaseOffload(Protocol):
    """Where some cases' outputs come from instead of this process
    (``evaluation.case_processes.CaseHelper``)."""

    def submit(self, cases: Sequence[TestCase]) -> Mapping[int, Callable[[], dict | None]]:
        """index -> a call that waits for that case's ``role -> (output, seconds,
        error)`` (None, or a role missing: run here)."""


ReferenceFn = Callable[[TestCase], tuple[np.ndarray, "np.ndarray | None"]]
"""``reference(case) -> (float64 reference, rows)``; ``rows`` are the query rows it covers
(``None``: all). ``evaluation.reference_cache.ReferenceCache`` is one."""


def full_reference(case: TestCase) -> tuple[np.ndarray, None]:
    """The NumPy float64 reference of every row of ``case`` (a ``ReferenceFn``)."""
    return reference_output(case), None


def _rows(out: np.ndarray | None, rows: np.ndarray | None) -> np.ndarray | None:
    return out if out is None or rows is None or out.ndim != 4 else out[:, rows]


def evaluate_accuracy(cases: Sequence[TestCase], implementations: Mapping[str, AttentionFn], *,
                      baseline: str = "baseline", reference: ReferenceFn = full_reference,
                      compile_workers: int = 0, helper: CaseOffload | None = None,
                      progress: ProgressFn | None = None) -> dict[str, AccuracyResult]:
    """Score several implementations on the same cases in one pass.

    Args:
        cases: test cases (NumPy arrays; finite inputs expected).
        implementations: role -> ``AttentionFn``; must contain ``baseline`` (the naive
            kernel), whose output and error set the per-case ratio floor for every role,
            including its own (so its ratios are <= 1).
        baseline: the key of the baseline in ``implementations``.
        reference: where each case's float64 reference comes from; when it covers a
            sample of query rows (long cases), every output is scored on those rows.
        compile_workers: above 1, first compile every in-process implementation for
            every case at once in this many threads (``precompile``); ``seconds`` of a
            case then leaves its compile time out.
        helper: a second process (``evaluation.case_processes``) that runs its share
            of the cases for the roles it has; this process runs the rest meanwhile,
            then scores every case in order as before.
        progress: optional ``progress(done, total, case_id)`` callback.

    Returns:
        role -> ``AccuracyResult`` (per-case rows and per-category aggregates).

    Raises:
        ValueError: no cases, or ``baseline`` missing from ``implementations``.
    """
    if not cases:
        raise ValueError("evaluate_accuracy needs at least one test case")
    if baseline not in implementations:
        raise ValueError(f"implementations must include the baseline {baseline!r}; "
                         f"got {sorted(implementations)}")
    rows: dict[str, list[CaseAccuracy]] = {role: [] for role in implementations}
    if compile_workers > 1:
        precompile(cases, implementations, workers=compile_workers)
    theirs = helper.submit(cases) if helper is not None else {}
    outputs: dict[int, dict[str, tuple]] = {}
    for i in [i for i in range(len(cases)) if i not in theirs] + sorted(theirs):
        done = theirs[i]() if i in theirs else None
        outputs[i] = {role: done[role] if done and role in done
                      else _timed(implementations[role], cases[i])
                      for role in (baseline, *(r for r in implementations if r != baseline))}
    for i, case in enumerate(cases):
        ref, ref_rows = reference(case)
        base_out, base_s, base_error = outputs[i][baseline]
        base_out = _rows(base_out, ref_rows)
        base_err = relative_error(base_out, ref) if base_out is not None else math.inf
        for role in implementations:
            out, seconds, error = ((base_out, base_s, base_error) if role == baseline
                                   else outputs[i].pop(role))
            out = out if role == baseline else _rows(out, ref_rows)
            rows[role].append(_score(case, out, ref, base_out, base_err, seconds, error))
        del outputs[i]
        if progress is not None:
            progress(i + 1, len(cases), case.spec.case_id)
    return {role: AccuracyResult(implementation=role, cases=r, categories=aggregate(r))
            for role, r in rows.items()}


PRECOMPILE_MAX_PAIRS = 4096 * 4096
"""Cases up to this many query x key pairs per head are warmed concurrently; longer ones
(a few, large on the device) compile in the scoring loop, one at a time."""


def precompile(cases: Sequence[TestCase], implementations: Mapping[str, AttentionFn], *,
               workers: int) -> float:
    """Compile (by calling once) every in-process implementation on every case of at most
    ``PRECOMPILE_MAX_PAIRS`` in ``workers`` threads; returns the wall time (seconds).

    A test set has dozens of shapes and each is a fresh compile per implementation
    (Triton or XLA: 0.5-30 s on an H200 host; seen 3.5 min for 38 cases done one after
    another). XLA and Triton compile outside the GIL, so threads overlap them; but where
    an implementation's first calls must not overlap others' (``GuardedAttention.
    concurrent_first_calls``: cuDNN) every case is warmed in this thread. Runners of
    another process are left alone; errors are met again, recorded, in the scoring call.
    """
    from concurrent.futures import ThreadPoolExecutor

    local = [fn for fn in implementations.values() if hasattr(fn, "attention_fn")
             or not hasattr(fn, "embed")]
    small = [c for c in cases if c.spec.q_shape[1] * c.spec.kv_shape[1] <= PRECOMPILE_MAX_PAIRS]
    serial = [name for name, fn in implementations.items() if fn in local and not getattr(
        getattr(fn, "attention_fn", fn), "concurrent_first_calls", True)]
    if serial:
        workers = 1
        logger.info("precompiling one case at a time: %s must not compile or load beside "
                    "other threads", ", ".join(serial))
    start = time.perf_counter()

    def warm(job):
        fn, case = job
        with contextlib.suppress(Exception):  # met again, and recorded, by the scoring call
            run_case(fn, case)

    jobs = [(fn, case) for case in small for fn in local]
    if workers <= 1:
        for job in jobs:
            warm(job)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(warm, jobs))
    seconds = time.perf_counter() - start
    logger.info("precompiled %d implementations x %d cases in %.1f s (%d threads)",
                len(local), len(small), seconds, workers)
    return seconds
