"""``python -m evaluation.longdoc.served_shapes RESULT --out FILE``: the attention shapes a
long-document workload served, from a committed bench result, for dispatch evidence
measured where the traffic is.

A dispatch policy chooses a kernel per bucket from timings at the bucket's measured
shapes. Measured at one representative shape per bucket (batch 1, 16 heads), a committed
H100 policy named cuDNN from 8k tokens, where the long-document workload's own
calls (batches of 1-4 documents, 12 heads of 64, q_len = kv_len = the length bucket)
ran faster on ``pallas_mosaic_gpu``: over the mix the policy lost 2 % to that single
kernel (BENCHMARKS.md, ``evaluation.longdoc.policy_check``). This command reads what a
replay served and writes those calls' shapes; ``python -m
kernels.tools.dispatch_evidence --served-shapes FILE`` then measures every bucket that
holds one of them at those shapes instead of its default ones.

Which shapes. Every batch of the result's first kernel's trace (``RESULT``: what
``python -m evaluation.longdoc.bench --json`` wrote; both kernels served the same
arrivals, and the batcher's rows depend little on the kernel) is one attention call per
encoder layer of shape ``[rows, bucket, heads, head_dim]`` for q, k and v, not causal, in
the encoder's dtype, with each row's document length as ``kv_lengths``: a shape records the
median share of the bucket its documents fill (``kv_fill``). Measured without it, on an
H100 the evidence named cuDNN from 8k tokens (5 % ahead at the bare shapes) where inside
the workload, lengths passed, ``pallas_mosaic_gpu`` was 1-4 % faster
(``kernels/tools/bench_results/h100-2026-12-06-served-shape-policy/``). Per length
bucket, the most frequent row counts are kept until they cover ``--coverage`` (default
0.8) of that bucket's batches, so a rare large batch does not cost a measurement of its
own. The encoder's heads, head_dim and dtype come from the
workload spec the result names, whose sha256 must be the result's (the shipped spec
changed since: refused).

The file: ``{"workload", "workload_sha256", "source_sha256", "coverage", "shapes": [...],
"batches": {bucket: {rows: count}}}``; ``shapes`` are ``kernels.shapes.AttentionShape``
fields. Exit 0, or 2 on bad input (named).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from pydantic import ValidationError

from evaluation.longdoc.bench import BenchResult, InvalidResult, read_result
from evaluation.longdoc.spec import InvalidWorkload, WorkloadSpec, load_spec, shipped
from kernels.errors import KernelgateError
from kernels.shapes import AttentionShape

COVERAGE = 0.8
"""Share of each bucket's batches whose row counts are measured (most frequent first)."""


class ServedShapesError(KernelgateError, ValueError):
    """A result the served shapes cannot be read from (the message names why)."""


def batch_rows(result: BenchResult) -> dict[int, Counter]:
    """Per length bucket, how many batches of each row count the first kernel served."""
    rows: dict[int, Counter] = {}
    for batch in result.baseline.trace.batches:
        rows.setdefault(batch.bucket, Counter())[batch.rows] += 1
    return rows


def kept_rows(counts: Counter, coverage: float) -> list[int]:
    """The most frequent row counts (ties: the smaller first) until they cover
    ``coverage`` of the batches; at least one."""
    total = sum(counts.values())
    kept, covered = [], 0
    for rows, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        kept.append(rows)
        covered += n
        if covered >= coverage * total:
            break
    return sorted(kept)


def kv_fill(result: BenchResult, bucket: int, rows: int) -> float:
    """The median share of the bucket its documents fill, over the documents of the
    first kernel's batches of ``bucket`` and ``rows`` (two decimals, at least 0.01): the
    encoder passes each document's length as ``kv_lengths``, and kernels that skip padded
    key blocks are timed at that fill, not at the bare padded shape."""
    tokens = {r.id: r.tokens for r in result.baseline.trace.requests}
    shares = [tokens[i] / bucket for b in result.baseline.trace.batches
              if b.bucket == bucket and b.rows == rows for i in b.request_ids]
    return max(0.01, round(statistics.median(shares), 2))


def served_shapes(result: BenchResult, spec: WorkloadSpec,
                  coverage: float = COVERAGE) -> list[AttentionShape]:
    """The attention shapes to measure (see the module docstring), by bucket then rows,
    each with its documents' median fill (:func:`kv_fill`)."""
    enc = spec.encoder
    return [AttentionShape(batch=rows, q_len=bucket, kv_len=bucket, num_heads=enc.heads,
                           num_kv_heads=enc.heads, head_dim=enc.head_dim, dtype=enc.dtype,
                           causal=False, kv_fill=kv_fill(result, bucket, rows))
            for bucket, counts in sorted(batch_rows(result).items())
            for rows in kept_rows(counts, coverage)]


def _spec_of(result: BenchResult, path: Path | None) -> WorkloadSpec:
    if path is None:
        try:
            path = shipped(result.workload)
        except InvalidWorkload as err:
            raise ServedShapesError(f"the result's workload: {err}") from None
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    if result.workload_sha256 is not None and sha != result.workload_sha256:
        raise ServedShapesError(
            f"{path} (sha256 {sha[:12]}) is not the spec the result served "
            f"(sha256 {result.workload_sha256[:12]}): the encoder's shapes may differ")
    return load_spec(path)


def record(path: Path, coverage: float = COVERAGE, workload: Path | None = None) -> dict:
    """The served-shapes file's content for the bench result at ``path`` (``workload``:
    the spec it served, default the shipped spec it names).

    Raises:
        ServedShapesError: not a bench result, an unknown or changed workload spec or one
            of another name, a coverage outside (0, 1], a trace with no batch, or a batch
            that gives no attention shape.
    """
    if not 0 < coverage <= 1:
        raise ServedShapesError(f"coverage {coverage}: must lie in (0, 1]")
    try:
        result = read_result(path)
    except InvalidResult as err:
        raise ServedShapesError(str(err)) from None
    if not result.baseline.trace.batches:
        raise ServedShapesError(f"{path}: its trace holds no batch")
    spec = _spec_of(result, workload)
    if spec.name != result.workload:
        raise ServedShapesError(f"the spec names workload {spec.name!r}; the result served "
                                f"{result.workload!r}")
    try:
        shapes = served_shapes(result, spec, coverage)
    except ValidationError as err:
        first = err.errors()[0]
        raise ServedShapesError(f"{path}: a batch gives no attention shape "
                                f"({'.'.join(map(str, first['loc']))}: {first['msg']})") from None
    return {"workload": result.workload, "workload_sha256": result.workload_sha256,
            "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "coverage": coverage, "shapes": [s.model_dump(mode="json") for s in shapes],
            "batches": {str(b): {str(r): n for r, n in sorted(c.items())}
                        for b, c in sorted(batch_rows(result).items())}}


def main(argv: list[str] | None = None) -> int:
    """The command; exit 0, or 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.longdoc.served_shapes",
        description="Write the attention shapes a long-document bench result served, for "
                    "dispatch evidence measured at them (dispatch_evidence --served-shapes).")
    parser.add_argument("result", type=Path, help="a bench JSON (evaluation.longdoc.bench --json)")
    parser.add_argument("--out", type=Path, required=True, help="the shapes file to write")
    parser.add_argument("--workload", type=Path, default=None,
                        help="the spec YAML the result served (default: the shipped one it names)")
    parser.add_argument("--coverage", type=float, default=COVERAGE,
                        help="share of each bucket's batches whose row counts are kept")
    args = parser.parse_args(argv)
    try:
        found = record(args.result, args.coverage, args.workload)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    except (ServedShapesError, InvalidWorkload, OSError) as err:
        print(f"served_shapes: {err}", file=sys.stderr)
        return 2
    for bucket, counts in found["batches"].items():
        kept = [s["batch"] for s in found["shapes"] if str(s["q_len"]) == bucket]
        print(f"{bucket:>6} tokens: batches by rows {counts} -> measured rows {kept}")
    print(f"wrote {len(found['shapes'])} shapes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
