"""``python -m evaluation.longdoc.policy_check RESULT...``: is a dispatch policy at least
as fast as every single kernel on a long-document mix, bucket by bucket and overall?

Each RESULT is what ``python -m evaluation.longdoc.bench --kernels K,auto --json`` wrote
(``tools/gpu-dispatch.sh longdoc K...`` writes one per kernel ``K``): the workload served
by the single kernel ``K`` and by ``auto`` serving a dispatch policy, on the same arrivals.
The effect of ``auto`` over ``K`` per length bucket and over the whole mix is the median
per-request ratio ``auto / K`` with its interval (``evaluation.longdoc.effect``: steady
requests both served, a sign-based interval widened for neighbouring requests moving
together).

The claim judged (the dispatch issue's acceptance): the policy is *at least as fast as
the best single kernel in every bucket within its interval, and faster than every single
kernel over the whole mix*. Checked against every kernel given, which covers the best of
each bucket whichever it is:

* per bucket and kernel (every bucket the replay served): **not slower** when the
  interval of ``auto / K`` reaches 1 or below (``low <= 1``); **slower** when all of it
  lies above 1; **policy failed** when ``auto`` failed a request ``K`` served (an error
  is never as fast); **kernel failed**
  when ``K`` failed every request of the bucket that ``auto`` served (nothing to compare,
  and the policy serves where the kernel cannot: counted as not slower); **not assessed**
  with too few pairs for an interval;
* over the mix (``all``), per kernel: **faster** when the whole interval lies below 1
  (``high < 1``), else **not faster** (or *policy failed* / *not assessed* as above).

The claim is **shown** only when every bucket row is *not slower* or *kernel failed* and
every mix row is *faster*; a row not assessed makes it *not shown*, never passed over.
The metric is the request's compute time by default (the kernels' own effect; time to
result adds the replay's queueing, which amplifies a compute difference near saturation)
or, with ``--metric time_to_result``, what a user waits.

Exit codes: 0 shown, 1 not shown, 2 bad input (a result whose second kernel is not
``auto``, one kernel given twice, results from different workloads or arrivals).

Example (the committed H100 results, BENCHMARKS.md)::

    python -m evaluation.longdoc.policy_check \\
        kernels/tools/bench_results/h100-2026-12-06-longdoc-cudnn/policy/*.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from evaluation.longdoc.bench import BenchResult, InvalidResult, read_result
from evaluation.longdoc.effect import LEVEL, METHOD, METRICS, group_effect, steady_requests
from kernels.errors import KernelgateError

POLICY = "auto"
"""The registry name that serves the dispatch policy (the second kernel of each result)."""

Verdict = Literal["not slower", "slower", "faster", "not faster", "policy failed",
                  "kernel failed", "not assessed"]
PASSING = {"bucket": {"not slower", "kernel failed"}, "mix": {"faster"}}


class BadInput(KernelgateError, ValueError):
    """A set of results that cannot be judged together (the message says which and why)."""


class Row(BaseModel):
    """``auto`` against one kernel in one group (a bucket's token count, or ``all``)."""

    group: str
    kernel: str
    pairs: int
    ratio: float | None = Field(None, description="median per-request auto / kernel")
    low: float | None = None
    high: float | None = None
    policy_failed: int = Field(0, description="steady requests auto failed")
    kernel_failed: int = Field(0, description="steady requests the kernel failed")
    verdict: Verdict


class PolicyCheck(BaseModel):
    """The judgement over every result given (:func:`check`)."""

    workload: str
    workload_sha256: str | None
    metric: str
    level: float = LEVEL
    method: str = METHOD
    sources: dict[str, str] = Field(description="kernel -> sha256 of its result file")
    buckets: list[Row]
    mix: list[Row]
    shown: bool
    reasons: list[str] = Field(description="each row that keeps the claim from being shown")


def _failures(result: BenchResult, bucket: int | None) -> tuple[int, int]:
    """Steady requests of the group that the kernel failed, and that ``auto`` failed where
    the kernel served them."""
    other = {r.id: r for r in result.candidate.trace.requests}
    kernel_failed = policy_failed = 0
    for r in steady_requests(result.baseline):
        if bucket is not None and r.bucket != bucket:
            continue
        served = r.ok and r.finite
        kernel_failed += not served
        policy_failed += served and not (other[r.id].ok and other[r.id].finite)
    return kernel_failed, policy_failed


def _row(result: BenchResult, metric: str, bucket: int | None, level: float) -> Row:
    effect = group_effect(result.baseline, result.candidate, metric, bucket, level)
    kernel_failed, policy_failed = _failures(result, bucket)
    row = Row(group=effect.group, kernel=result.kernels[0], pairs=effect.pairs,
              ratio=effect.ratio, low=effect.low, high=effect.high,
              policy_failed=policy_failed, kernel_failed=kernel_failed,
              verdict="not assessed")
    if policy_failed:
        row.verdict = "policy failed"
    elif bucket is not None and effect.pairs == 0 and kernel_failed:
        row.verdict = "kernel failed"
    elif effect.low is None:
        row.verdict = "not assessed"
    elif bucket is None:
        row.verdict = "faster" if effect.high < 1 else "not faster"
    else:
        row.verdict = "slower" if effect.low > 1 else "not slower"
    return row


def _consistent(results: dict[str, tuple[Path, BenchResult]]) -> BenchResult:
    """The first result, once every result is ``K,auto`` on the same workload and arrivals."""
    first = None
    for kernel, (path, result) in results.items():
        if result.kernels[1] != POLICY:
            raise BadInput(f"{path}: its kernels are {result.kernels}; each result must serve "
                           f"a single kernel first and {POLICY!r} (the policy) second")
        if kernel == POLICY:
            raise BadInput(f"{path}: {POLICY!r} against itself is an A/A, not a single kernel")
        if first is None:
            first = result
            continue
        if result.workload_sha256 != first.workload_sha256 or result.workload != first.workload:
            raise BadInput(f"{path}: workload {result.workload} "
                           f"({result.workload_sha256}) is not {first.workload} "
                           f"({first.workload_sha256}): one mix must be judged on one workload")
        ids = {r.id: r.arrival_s for r in result.baseline.trace.requests}
        if ids != {r.id: r.arrival_s for r in first.baseline.trace.requests}:
            raise BadInput(f"{path}: its requests or arrival times differ from the first "
                           "result's: not the same arrivals")
    if first is None:
        raise BadInput("no result given")
    return first


def check(paths: list[Path], metric: str = "compute", level: float = LEVEL) -> PolicyCheck:
    """Judge the policy against every single kernel of ``paths`` (one result each).

    Raises:
        BadInput: see :func:`_consistent`; a file that is not a bench result; a kernel
            given twice; an unknown metric.
    """
    if metric not in METRICS:
        raise BadInput(f"metric {metric!r}: one of {sorted(METRICS)}")
    results: dict[str, tuple[Path, BenchResult]] = {}
    for path in paths:
        try:
            result = read_result(path)
        except InvalidResult as err:
            raise BadInput(str(err)) from None
        kernel = result.kernels[0]
        if kernel in results:
            raise BadInput(f"{path}: kernel {kernel!r} is already given by {results[kernel][0]}")
        results[kernel] = (path, result)
    first = _consistent(results)
    # every bucket the replay served, not only the summary's keys (a bucket missing from
    # the summary is still judged)
    buckets = sorted({r.bucket for r in first.baseline.trace.requests} | set(first.baseline.buckets))
    try:
        bucket_rows = [_row(r, metric, b, level) for b in buckets for _, r in results.values()]
        mix_rows = [_row(r, metric, None, level) for _, r in results.values()]
    except (ValueError, KeyError) as err:  # the two reports of one result do not pair
        raise BadInput(f"a result's two reports do not pair request by request: {err}") from None
    reasons = [f"{'mix' if row.group == 'all' else row.group + ' tokens'} against "
               f"{row.kernel}: {row.verdict}{_interval(row)}"
               for kind, rows in (("bucket", bucket_rows), ("mix", mix_rows))
               for row in rows if row.verdict not in PASSING[kind]]
    return PolicyCheck(
        workload=first.workload, workload_sha256=first.workload_sha256, metric=metric,
        level=level, sources={k: hashlib.sha256(p.read_bytes()).hexdigest()
                              for k, (p, _) in results.items()},
        buckets=bucket_rows, mix=mix_rows, shown=not reasons, reasons=reasons)


def _interval(row: Row) -> str:
    if row.ratio is None:
        return ""
    shown = f" {row.ratio:.3f}"
    if row.low is not None:
        shown += f" [{row.low:.3f}, {row.high:.3f}]"
    return shown + f" over {row.pairs} pairs"


def _cell(row: Row) -> str:
    if row.ratio is None:
        return f"- (n={row.pairs})"
    interval = f" [{row.low:.3f}, {row.high:.3f}]" if row.low is not None else ""
    return f"{row.ratio:.3f}{interval} n={row.pairs}"


def text(found: PolicyCheck) -> str:
    """The judgement as a table (ratios ``auto / kernel``) and its one-line verdict."""
    kernels = list(dict.fromkeys(r.kernel for r in found.mix))
    lines = [f"{found.workload}: {POLICY} / each kernel, {found.metric} per request, "
             f"median [{found.level:.0%} interval]"]
    for group, rows in (("all", found.mix), *((b, [r for r in found.buckets if r.group == b])
                                              for b in dict.fromkeys(r.group for r in found.buckets))):
        cells = [f"{r.kernel} {_cell(r)} {r.verdict}"
                 for r in sorted(rows, key=lambda r: kernels.index(r.kernel))]
        lines.append(f"  {group:>6}  " + "; ".join(cells))
    lines.append("SHOWN: at least as fast as every single kernel in every bucket and faster "
                 "over the mix" if found.shown else
                 "NOT SHOWN: " + "; ".join(found.reasons))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command; exit 0 shown, 1 not shown, 2 bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.longdoc.policy_check",
        description="Judge a dispatch policy (auto) against single kernels on a "
                    "long-document mix, from bench results K,auto on the same arrivals.")
    parser.add_argument("results", nargs="+", type=Path, help="bench JSON files, one per kernel")
    parser.add_argument("--metric", default="compute", choices=sorted(METRICS))
    parser.add_argument("--json", type=Path, default=None, help="where to write the judgement")
    args = parser.parse_args(argv)
    try:
        found = check(args.results, args.metric)
        if args.json:  # before the verdict is printed: a failed write says only that
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(found.model_dump(mode="json"), indent=1) + "\n")
    except (BadInput, OSError) as err:
        print(f"policy_check: {err}", file=sys.stderr)
        return 2
    print(text(found))
    return 0 if found.shown else 1


if __name__ == "__main__":
    sys.exit(main())
