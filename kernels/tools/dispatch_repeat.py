"""How far one measurement's dispatch choices carry to a repeat of it.

``python -m kernels.tools.dispatch_repeat --first A/*.json --second B/*.json`` reads two
measurements of the same buckets (pieces, ``kernels.dispatch_pieces``; each side one
measurement: the same device, method and software within it), derives each bucket's
choice on each side as a policy would (``kernels.dispatch_policy.choose_buckets``; the
candidates' order as the tie-break unless ``--priority``), and, for the buckets both
measured, reports:

* how many buckets keep their choice;
* the **carried regret**: each side's choice timed by the *other* side's medians, over the
  other side's fastest kernel there (1.0: still the fastest; the geometric mean over the
  common buckets, the median, the largest, and how many exceed 1.05);
* per kernel, the ratio of its medians (second over first), whose spread is the between-call
  noise the within-call intervals a choice is made from do not see.

A policy is derived from one measurement, so its "at least as fast as the best kernel of the
bucket within its interval" holds within that measurement; the carried regret says what it
is worth in a later call on the same kind of card. The two sides may differ in method or
software (the point may be to compare them): the table names what differs. Writes JSON with
``--json``. Nothing here is served or signed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from kernels.dispatch_pieces import SHARED, EvidencePiece, measured_buckets
from kernels.dispatch_policy import BucketChoice, BucketEvidence, Rule, choose_buckets
from kernels.tools.piece_files import read_pieces

SHARED_FIELDS = tuple(f for f in SHARED if f != "space")
"""The provenance a repeat may differ in and the report names (the buckets compared are
the ones both measured, whatever each side's space)."""


class CarriedRegret(BaseModel):
    """One side's choices timed by the other side's medians (ratios to its fastest)."""

    geomean: float
    median: float
    largest: float
    largest_bucket: str
    over_5_percent: int


class RepeatReport(BaseModel):
    """What :func:`compare` finds; ``differs`` names the provenance fields the sides differ
    in, ``changed`` the buckets whose choice changed (first's, then second's)."""

    common_buckets: int
    same_choice: int
    changed: dict[str, tuple[str, str]]
    first_carried_into_second: CarriedRegret
    second_carried_into_first: CarriedRegret
    long_from: int
    long_buckets: int
    long_first_carried_into_second: CarriedRegret | None
    long_second_carried_into_first: CarriedRegret | None
    kernel_ratio_second_over_first: dict[str, dict[str, float]]
    differs: dict[str, tuple[str, str]]


def _medians(choice: BucketChoice) -> dict[str, float]:
    return {s.kernel: s.median_s for s in choice.summaries if s.median_s is not None}


def _carried(choices: dict[str, BucketChoice], timed_by: dict[str, BucketChoice],
             names: Sequence[str]) -> CarriedRegret:
    ratios = {}
    for name in names:
        medians = _medians(timed_by[name])
        ratios[name] = medians.get(choices[name].kernel, math.inf) / min(medians.values())
    finite = [r for r in ratios.values() if math.isfinite(r)]
    worst = max(ratios, key=ratios.get)
    return CarriedRegret(
        geomean=math.exp(statistics.fmean(math.log(r) for r in finite)) if finite else math.inf,
        median=statistics.median(ratios.values()), largest=ratios[worst],
        largest_bucket=worst, over_5_percent=sum(r > 1.05 for r in ratios.values()))


def _provenance_differences(first: Sequence[EvidencePiece], second: Sequence[EvidencePiece]
                            ) -> dict[str, tuple[str, str]]:
    out = {}
    for field in SHARED_FIELDS:
        a, b = getattr(first[0], field), getattr(second[0], field)
        if field == "software":
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    out[f"software.{key}"] = (str(a.get(key)), str(b.get(key)))
        elif a != b:
            out[field] = (str(a), str(b))
    return out


def compare(first: Sequence[EvidencePiece], second: Sequence[EvidencePiece],
            candidates: Sequence[str], rule: Rule, long_from: int = 1024) -> RepeatReport:
    """Compare two measurements' choices over the buckets both measured; the carried
    regret also over the *long* buckets alone (q_len and kv_len both from ``long_from``
    tokens), where a call takes long enough for its timing to be steady.

    Raises:
        kernels.dispatch_pieces.PieceError: one side's pieces are not one measurement.
        ValueError: the sides share no bucket; a bad candidate list or rule
            (``choose_buckets``).
    """
    sides = []
    for pieces in (first, second):
        buckets: tuple[BucketEvidence, ...] = measured_buckets(pieces)
        sides.append({c.evidence.bucket.name: c for c in
                      choose_buckets(buckets, candidates, rule)})
    a, b = sides
    # a bucket no kernel serves on either side has no choice to carry
    common = [name for name in a if name in b and a[name].kernel and b[name].kernel]
    if not common:
        raise ValueError("the two measurements share no bucket a kernel serves on both "
                         "sides: nothing to compare")
    ratios: dict[str, list[float]] = {}
    for name in common:
        ma, mb = _medians(a[name]), _medians(b[name])
        for kernel in ma.keys() & mb.keys():
            ratios.setdefault(kernel, []).append(mb[kernel] / ma[kernel])
    long = [n for n in common if a[n].evidence.bucket.q_len.lo >= long_from
            and a[n].evidence.bucket.kv_len.lo >= long_from]
    return RepeatReport(
        long_from=long_from, long_buckets=len(long),
        long_first_carried_into_second=_carried(a, b, long) if long else None,
        long_second_carried_into_first=_carried(b, a, long) if long else None,
        common_buckets=len(common),
        same_choice=sum(a[n].kernel == b[n].kernel for n in common),
        changed={n: (a[n].kernel, b[n].kernel) for n in common if a[n].kernel != b[n].kernel},
        first_carried_into_second=_carried(a, b, common),
        second_carried_into_first=_carried(b, a, common),
        kernel_ratio_second_over_first={
            k: {"buckets": len(r), "median": statistics.median(r), "min": min(r),
                "max": max(r)} for k, r in sorted(ratios.items())},
        differs=_provenance_differences(first, second))


def format_report(report: RepeatReport) -> str:
    """The report as a plain-text table."""
    lines = [f"{report.common_buckets} buckets measured by both; the same choice in "
             f"{report.same_choice}"]
    rows = [("first's choices timed in the second", report.first_carried_into_second,
             report.common_buckets),
            ("second's choices timed in the first", report.second_carried_into_first,
             report.common_buckets)]
    if report.long_buckets:
        rows += [(f"long buckets (q_len, kv_len >= {report.long_from}), first's in the second",
                  report.long_first_carried_into_second, report.long_buckets),
                 (f"long buckets (q_len, kv_len >= {report.long_from}), second's in the first",
                  report.long_second_carried_into_first, report.long_buckets)]
    for label, c, n in rows:
        lines.append(f"{label}: regret geomean {c.geomean:.3f}, median {c.median:.3f}, "
                     f"largest {c.largest:.3f} ({c.largest_bucket}); > 1.05 in "
                     f"{c.over_5_percent} of {n}")
    lines.append("kernel             buckets  median ratio (second/first)   min     max")
    for kernel, r in report.kernel_ratio_second_over_first.items():
        lines.append(f"{kernel:<18} {int(r['buckets']):>7}  {r['median']:>27.3f} "
                     f"{r['min']:>7.3f} {r['max']:>7.3f}")
    lines += [f"changed: {n}: {x} -> {y}" for n, (x, y) in report.changed.items()]
    lines += [f"differs: {f}: {x!r} against {y!r}" for f, (x, y) in report.differs.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0, or 2 on input the comparison refuses or a ``--json`` path that
    cannot be written (the reason printed)."""
    parser = argparse.ArgumentParser(prog="python -m kernels.tools.dispatch_repeat",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", nargs="+", type=Path, required=True,
                        help="the first measurement's piece.json files")
    parser.add_argument("--second", nargs="+", type=Path, required=True,
                        help="the repeat's piece.json files")
    parser.add_argument("--priority", default="",
                        help="tie-break order, comma-separated (default: the candidates' "
                             "order of the first measurement)")
    parser.add_argument("--long-from", type=int, default=1024,
                        help="a bucket is long when q_len and kv_len both start at or above "
                             "this many tokens (default 1024)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    try:
        first, second = read_pieces(args.first), read_pieces(args.second)
        candidates = tuple(k.kernel for k in first[0].buckets[0].kernels)
        priority = tuple(x.strip() for x in args.priority.split(",") if x.strip())
        report = compare(first, second, candidates, Rule(priority=priority or candidates),
                         args.long_from)
    except (ValueError, OSError) as err:
        print(f"dispatch_repeat: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        try:
            args.json.write_text(json.dumps(report.model_dump(), indent=1))
        except OSError as err:
            print(f"dispatch_repeat: cannot write {args.json}: {err.strerror}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
