"""``python -m evaluation.longdoc.policy_check RESULT...``: is a dispatch policy at least
as fast as every single kernel on a long-document mix, bucket by bucket and overall?

Each RESULT is what ``python -m evaluation.longdoc.bench --kernels K,auto --json`` (or
``auto,K``) wrote (``tools/gpu-dispatch.sh longdoc K...`` writes both per kernel ``K``):
the workload served by the single kernel ``K`` and by ``auto`` serving a dispatch policy,
one after the other on the same arrivals. The effect of ``auto`` over ``K`` per length
bucket and over the whole mix is the median per-request ratio ``auto / K`` with its
interval (``evaluation.longdoc.effect``: steady requests both served, a sign-based
interval widened for neighbouring requests moving together).

Run order. Whichever kernel serves second runs on a device the first replay left warm:
on an H100 the second replay's compute was 2.5-2.7 % longer in the 1k-2k buckets with the
same kernel on both sides, which a single order's interval reads as an effect (``auto``
first: 0.964 [0.947, 0.981] against the identical kernel;
``kernels/tools/bench_results/h100-2026-12-06-seq-cut-2048-policy/``). So each kernel is
judged in both orders: with ``K,auto`` and ``auto,K`` given, a request's log ratio is the
mean of its two (``effect.balanced_log_ratios``), where the shift cancels. A kernel given
in one order only is judged on it, and the claim is then not shown (named as a reason).

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

Exit codes: 0 shown, 1 not shown, 2 bad input (a result that does not serve one kernel
and ``auto``, one kernel given twice in one order, results from different workloads or
arrivals, or with different warm-ups).

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
from evaluation.longdoc.effect import (
    LEVEL,
    METHOD,
    METRICS,
    balanced_log_ratios,
    series_effect,
    steady_requests,
)
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
    orders: list[str] = Field(default_factory=list,
                              description="the run orders judged, e.g. 'cudnn first'")


class PolicyCheck(BaseModel):
    """The judgement over every result given (:func:`check`)."""

    workload: str
    workload_sha256: str | None
    metric: str
    level: float = LEVEL
    method: str = METHOD
    sources: dict[str, str] = Field(description="a result's kernels in run order "
                                    "('K,auto') -> sha256 of its file")
    buckets: list[Row]
    mix: list[Row]
    shown: bool
    one_order: list[str] = Field(default_factory=list,
                                 description="kernels judged in one run order only")
    reasons: list[str] = Field(description="each row that keeps the claim from being shown")


def _kernel_of(result: BenchResult) -> str:
    return result.kernels[1] if result.kernels[0] == POLICY else result.kernels[0]


def _failures(replays: list[BenchResult], bucket: int | None) -> tuple[int, int]:
    """Steady requests of the group that the kernel failed in every replay (a kernel that
    served a request in one run order could serve it), and that ``auto`` failed in any
    replay where the kernel served them (an error is never as fast, whichever order)."""
    kernel_failed: list[set[int]] = []
    policy_failed: set[int] = set()
    for result in replays:
        kernel, policy = result.reports[_kernel_of(result)], result.reports[POLICY]
        other = {r.id: r for r in policy.trace.requests}
        kernel_failed.append(set())
        for r in steady_requests(kernel):
            if bucket is not None and r.bucket != bucket:
                continue
            if not (r.ok and r.finite):
                kernel_failed[-1].add(r.id)
            elif not (other[r.id].ok and other[r.id].finite):
                policy_failed.add(r.id)
    return len(set.intersection(*kernel_failed)), len(policy_failed)


def _row(replays: list[BenchResult], metric: str, bucket: int | None, level: float) -> Row:
    kernel = _kernel_of(replays[0])
    effect = series_effect(
        *balanced_log_ratios([(r.reports[kernel], r.reports[POLICY]) for r in replays],
                             METRICS[metric], bucket), metric=metric, bucket=bucket, level=level)
    kernel_failed, policy_failed = _failures(replays, bucket)
    row = Row(group=effect.group, kernel=kernel, pairs=effect.pairs,
              ratio=effect.ratio, low=effect.low, high=effect.high,
              policy_failed=policy_failed, kernel_failed=kernel_failed,
              verdict="not assessed", orders=[f"{r.kernels[0]} first" for r in replays])
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


def _serves_the_policy(path: Path, result: BenchResult) -> None:
    """Refuse a result that is not ``K,auto`` or ``auto,K``."""
    if POLICY not in result.kernels:
        raise BadInput(f"{path}: its kernels are {result.kernels}; each result must serve "
                       f"a single kernel and {POLICY!r} (the policy), in either order")
    if result.kernels == [POLICY, POLICY]:
        raise BadInput(f"{path}: {POLICY!r} against itself is an A/A, not a single kernel")


def _consistent(results: list[tuple[Path, BenchResult]]) -> BenchResult:
    """The first result, once every result is on its workload and arrivals."""
    if not results:
        raise BadInput("no result given")
    first = results[0][1]
    arrivals = {r.id: r.arrival_s for r in first.baseline.trace.requests}
    for path, result in results[1:]:
        if result.workload_sha256 != first.workload_sha256 or result.workload != first.workload:
            raise BadInput(f"{path}: workload {result.workload} "
                           f"({result.workload_sha256}) is not {first.workload} "
                           f"({first.workload_sha256}): one mix must be judged on one workload")
        if {r.id: r.arrival_s for r in result.baseline.trace.requests} != arrivals:
            raise BadInput(f"{path}: its requests or arrival times differ from the first "
                           "result's: not the same arrivals")
    return first


def check(paths: list[Path], metric: str = "compute", level: float = LEVEL) -> PolicyCheck:
    """Judge the policy against every single kernel of ``paths`` (one result each).

    Raises:
        BadInput: see :func:`_consistent`; a file that is not a bench result; a kernel
            given twice; an unknown metric.
    """
    if metric not in METRICS:
        raise BadInput(f"metric {metric!r}: one of {sorted(METRICS)}")
    results: list[tuple[Path, BenchResult]] = []
    given: dict[tuple[str, ...], Path] = {}
    for path in paths:
        try:
            result = read_result(path)
        except InvalidResult as err:
            raise BadInput(str(err)) from None
        order = tuple(result.kernels)
        _serves_the_policy(path, result)  # before it counts as given
        if order in given:
            raise BadInput(f"{path}: kernel {_kernel_of(result)!r} in the order "
                           f"{','.join(order)} is already given by {given[order]}")
        given[order] = path
        results.append((path, result))
    first = _consistent(results)
    replays: dict[str, list[BenchResult]] = {}
    for _, result in results:
        replays.setdefault(_kernel_of(result), []).append(result)
    # every bucket the replay served, not only the summary's keys (a bucket missing from
    # the summary is still judged)
    buckets = sorted({r.bucket for r in first.baseline.trace.requests} | set(first.baseline.buckets))
    try:
        bucket_rows = [_row(r, metric, b, level) for b in buckets for r in replays.values()]
        mix_rows = [_row(r, metric, None, level) for r in replays.values()]
    except (ValueError, KeyError) as err:  # the two reports of one result do not pair
        raise BadInput(f"a result's two reports do not pair request by request: {err}") from None
    reasons = [f"{'mix' if row.group == 'all' else row.group + ' tokens'} against "
               f"{row.kernel}: {row.verdict}{_interval(row)}"
               for kind, rows in (("bucket", bucket_rows), ("mix", mix_rows))
               for row in rows if row.verdict not in PASSING[kind]]
    one_order = [k for k, r in replays.items() if len(r) < 2]
    reasons += [f"{k}: served in one run order only ({replays[k][0].kernels[0]} first), "
                f"where a shift of the second replay is outside the interval; serve "
                f"{','.join(reversed(replays[k][0].kernels))} too" for k in one_order]
    return PolicyCheck(
        workload=first.workload, workload_sha256=first.workload_sha256, metric=metric,
        level=level, sources={",".join(r.kernels): hashlib.sha256(p.read_bytes()).hexdigest()
                              for p, r in results},
        buckets=bucket_rows, mix=mix_rows, shown=not reasons, one_order=one_order,
        reasons=reasons)


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
    lines.append("  orders  " + "; ".join(
        f"{r.kernel} {'both' if len(r.orders) > 1 else 'one (' + r.orders[0] + ')'}"
        if r.orders else f"{r.kernel} not recorded"
        for r in found.mix))
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
                    "long-document mix, from bench results K,auto and auto,K on the same "
                    "arrivals.")
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
