"""Measure dispatch evidence over a bucket grid and derive a dispatch policy from it.

``python -m kernels.tools.dispatch_evidence --out DIR`` times every candidate kernel
(registry names; an unknown name is a usage error, before any measurement) at every
measured shape of every bucket of a grid
(``kernels.dispatch_space.BucketGrid``), in one process, with the same random inputs for
every kernel at a shape (``kernels.shapes.random_inputs``) and one method
(``kernels.timing.time_samples``: warm-up, repeats of back-to-back calls; the median and
its order-statistic interval, ``median_interval``). A kernel whose own support check
refuses a shape of a bucket, or that fails there, cannot serve that bucket, and the
evidence says why. It writes ``evidence.json`` and ``policy.json``
(``kernels.dispatch_policy.derive_policy``; ties broken by ``--priority``, default the
candidates' order) and prints, per bucket, each kernel's median, interval and ratio to the
bucket's fastest, the choice marked ``*``.

What is measured is data (:class:`Plan`): :data:`DEFAULT_PLAN` is the policy's default
grid (``DEFAULT_GRID``) with a shape per bucket for an accelerator; :data:`QUICK_PLAN`
(``--quick``, and always without an accelerator) is a tiny grid for a CPU host: the
mechanism, not performance. Flags override single fields.

In pieces: the whole default grid takes longer than one device call may run (on an H100
at 11 repeats: bf16 302 s, f16 270 s, float32 more than 580 s; BENCHMARKS.md).
``--slice-dtypes``, ``--slice-causal`` and ``--slice-buckets START:STOP`` (indices in the
grid's order, ``--list`` prints them) measure only those buckets of the whole grid and
write ``piece.json`` (``kernels.dispatch_pieces``) and no policy; ``--budget-s`` cuts a
slice between buckets before a call's limit would cut it inside one (the piece holds what
was measured and the command prints the ``--slice-buckets`` of the rest).
``python -m kernels.tools.dispatch_merge`` joins the pieces into one evidence and its
policy, refusing pieces of another device, method, software stack or space, or that
overlap or leave a gap. Each bucket's inputs are seeded by the seed and its name, so a
bucket measured in a piece sees the inputs it would in a whole run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import platform
import statistics
import sys
import time
from collections.abc import Sequence

import jax
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from kernels.api import default_backend
from kernels.build import combined_digest, source_digests
from kernels.dispatch_pieces import EvidencePiece
from kernels.dispatch_policy import (
    BucketEvidence,
    DispatchPolicy,
    Evidence,
    KernelEvidence,
    ShapeTiming,
)
from kernels.dispatch_space import DEFAULT_GRID, Bucket, BucketGrid, Region
from kernels.registry import IMPLEMENTATIONS
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import DEFAULT_WARMUP_S, median_interval, time_samples
from kernels.tools.bench import attention_fn
from kernels.tools.dispatch_merge import report, write_policy
from kernels.tools.dispatch_slices import (
    evidence_parser,
    piece_report,
    reason,
    select,
    served_shapes,
)

CONFIDENCE = 0.95
"""Of each median's interval (``median_interval``)."""
RUNTIME_DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                         "nvidia-cudnn-cu12")
"""The installed distributions whose versions a piece records (absent ones are skipped)."""


class Plan(BaseModel):
    """What a run measures: the buckets (``grid``), the shapes measured in each (every
    combination of the listed sizes that lies in the bucket; kv_len from ``seqs`` too, or
    equal to q_len where the grid leaves kv_len whole), the candidates and the timing
    (``repeats`` of ``target_repeat_s`` seconds each after ``warmup_s``).

    ``served``: shapes a workload called (``--served-shapes FILE``: ``python -m
    evaluation.longdoc.served_shapes``); a bucket holding any is measured at those instead
    (its choice made where the traffic is), the others at the listed sizes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid: BucketGrid = DEFAULT_GRID
    kernels: tuple[str, ...] = Field(("xla", "cudnn", "pallas_gpu", "pallas_mosaic_gpu", "fa3"),
                                     min_length=1)
    head_dims: tuple[PositiveInt, ...] = (64, 128, 256)
    seqs: tuple[PositiveInt, ...] = (256, 2048, 16384)
    batches: tuple[PositiveInt, ...] = (1,)
    heads: PositiveInt = 16
    kv_heads: PositiveInt | None = None
    repeats: int = Field(21, ge=2)
    target_repeat_s: PositiveFloat = 0.02
    warmup_s: float = Field(DEFAULT_WARMUP_S, ge=0)
    seed: int = 0
    served: tuple[AttentionShape, ...] = ()

    def shapes(self, bucket: Bucket) -> list[AttentionShape]:
        """The shapes measured in ``bucket``: the served shapes inside it, if any, else
        the combinations of the listed sizes.

        Raises:
            ValueError: none of the listed sizes lies in the bucket on some axis (the
                bucket and the axis named).
        """
        inside = [s for s in self.served if bucket.contains_shape(s)]
        if inside:
            return inside
        split_kv = self.grid.split_kv_len
        sizes = {"head_dim": self.head_dims, "q_len": self.seqs, "batch": self.batches,
                 **({"kv_len": self.seqs} if split_kv else {})}
        for axis, values in sizes.items():
            if not any(v in getattr(bucket, axis) for v in values):
                raise ValueError(f"bucket {bucket.name!r}: no measured {axis} of {values} "
                                 f"lies in {getattr(bucket, axis).label}; add one")
        pairs = [(s, t) for s in self.seqs for t in (self.seqs if split_kv else (s,))
                 if s in bucket.q_len and t in bucket.kv_len]
        return [AttentionShape(batch=n, q_len=s, kv_len=t, num_heads=self.heads,
                               num_kv_heads=self.kv_heads or self.heads, head_dim=d,
                               dtype=bucket.dtypes[0], causal=bucket.causal[0])
                for d in self.head_dims if d in bucket.head_dim for s, t in pairs
                for n in self.batches if n in bucket.batch]


DEFAULT_PLAN = Plan()
"""An accelerator's run: the default grid (162 buckets), one shape per bucket at head_dim
64/128/256 and 256/2048/16384 tokens (16 heads, batch 1), the GPU's candidates."""

QUICK_PLAN = Plan(grid=BucketGrid(space=Region(), head_dim_cuts=(48,), seq_cuts=(32,)),
                  kernels=("xla", "naive"), head_dims=(32, 64), seqs=(16, 64), heads=2,
                  repeats=7, target_repeat_s=0.002, warmup_s=0.0)
"""A CPU host's run: tiny shapes, two kernels, no warm-up (the mechanism, not speed)."""


def _short(err: BaseException) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first}"[:300]


def bucket_seed(seed: int, bucket: Bucket) -> int:
    """The inputs' seed in ``bucket``: ``seed`` plus the first 3 bytes of the sha256 of
    its name (the same in a piece as in a whole run)."""
    return seed + int.from_bytes(hashlib.sha256(bucket.name.encode()).digest()[:3], "big")


def software_record(plan: Plan) -> dict[str, str]:
    """The software a measurement ran: Python, the installed runtime distributions'
    versions, the kernels' source digest (``kernels.build``) and each candidate's
    third-party distributions (version and sha256, or ``not installed``)."""
    record = {"python": platform.python_version(),
              "kernels_source_sha256": combined_digest(source_digests())}
    for name in RUNTIME_DISTRIBUTIONS:
        try:
            record[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    for kernel in plan.kernels:
        if kernel in IMPLEMENTATIONS:
            for dist, found in IMPLEMENTATIONS[kernel].third_party_code().items():
                record[dist] = ("not installed" if found is None
                                else f"{found['version']} sha256 {found['sha256']}")
    return record


def _measure_bucket(plan: Plan, bucket: Bucket, seed: int) -> BucketEvidence:
    """Every candidate timed at each of the bucket's shapes (the same inputs for all), or
    the first refusal or failure it met there."""
    shapes = plan.shapes(bucket)
    timings: dict[str, list[ShapeTiming]] = {n: [] for n in plan.kernels}
    refused: dict[str, str] = {}
    for j, shape in enumerate(shapes):
        qkv = random_inputs(shape, seed + j)
        for name in [n for n in plan.kernels if n not in refused]:
            try:
                jitted = jax.jit(attention_fn(name, shape, None))
                jax.block_until_ready(jitted(*qkv))  # compiled outside any timing
                samples, _ = time_samples(jitted, qkv, repeats=plan.repeats,
                                          target_repeat_s=plan.target_repeat_s,
                                          warmup_s=plan.warmup_s)
            except (NotImplementedError, ImportError) as err:
                refused[name] = f"refused at {shape.label}: {_short(err)}"
                continue
            except Exception as err:  # noqa: BLE001 - a kernel that fails cannot serve here
                refused[name] = f"failed at {shape.label}: {_short(err)}"
                continue
            low, high, coverage = median_interval(samples, CONFIDENCE)
            timings[name].append(ShapeTiming(shape=shape, median_s=statistics.median(samples),
                                             low_s=low, high_s=high, coverage=coverage,
                                             repeats=len(samples)))
    kernels = [KernelEvidence(kernel=n, refused=refused[n]) if n in refused
               else KernelEvidence(kernel=n, timings=tuple(timings[n])) for n in plan.kernels]
    return BucketEvidence(bucket=bucket, shapes=tuple(shapes), kernels=tuple(kernels))


def _measure_all(plan: Plan, buckets: Sequence[Bucket],
                 budget_s: float | None = None) -> tuple[BucketEvidence, ...]:
    """Each bucket's evidence in order, with its wall time on the progress line; with
    ``budget_s``, no bucket is started that the longest bucket so far would carry past
    the budget (the first bucket always runs), so a device call's time limit cuts a piece
    between buckets, never inside one."""
    for bucket in buckets:
        plan.shapes(bucket)
    measured, longest, start = [], 0.0, time.monotonic()
    for i, bucket in enumerate(buckets):
        elapsed = time.monotonic() - start
        if budget_s is not None and measured and elapsed + longest > budget_s:
            print(f"[dispatch_evidence] stopping at the time budget ({budget_s:g} s): "
                  f"{elapsed:.0f} s spent, the longest bucket took {longest:.0f} s",
                  file=sys.stderr, flush=True)
            break
        t0 = time.monotonic()
        measured.append(_measure_bucket(plan, bucket, bucket_seed(plan.seed, bucket)))
        took = time.monotonic() - t0
        longest = max(longest, took)
        print(f"[dispatch_evidence] {i + 1}/{len(buckets)} {bucket.name} ({took:.1f} s)",
              file=sys.stderr, flush=True)
    return tuple(measured)


def provenance(plan: Plan) -> dict[str, object]:
    """Where and how ``plan`` is measured here: device, backend, method and software."""
    method = (f"kernels.timing.time_samples: {plan.repeats} repeats of back-to-back calls of "
              f"~{plan.target_repeat_s} s after {plan.warmup_s} s of warm-up; the median and "
              f"its order-statistic interval ({CONFIDENCE}); one process, the same random "
              f"inputs (seed {plan.seed} plus a hash of the bucket's name) for every kernel "
              f"at a shape")
    return {"device": jax.devices()[0].device_kind, "backend": default_backend(),
            "method": method, "software": software_record(plan)}


def measure(plan: Plan) -> Evidence:
    """The evidence of every bucket of ``plan``'s grid, on this process's device.

    Raises:
        ValueError: a bucket without a measured size on some axis (:meth:`Plan.shapes`),
            checked for every bucket before anything is timed.
    """
    measured = _measure_all(plan, plan.grid.buckets())
    return Evidence(space=plan.grid.space, buckets=measured, **provenance(plan))


def measure_piece(plan: Plan, buckets: Sequence[Bucket], label: str,
                  budget_s: float | None = None) -> EvidencePiece:
    """The evidence of ``buckets`` (some of ``plan``'s grid) as a piece of its space; with
    ``budget_s``, of the leading buckets measured within that many seconds (the label then
    says where it was cut: the piece is complete for the buckets it holds, and the merge
    names the gap until the rest is measured).

    Raises:
        ValueError: as :func:`measure`, for these buckets; no bucket selected.
    """
    if not buckets:
        raise ValueError(f"slice {label!r} selects no bucket of the grid")
    measured = _measure_all(plan, buckets, budget_s)
    if len(measured) < len(buckets):
        label = f"{label} (cut at the time budget: {len(measured)} of {len(buckets)} buckets)"
    return EvidencePiece(label=label, space=plan.grid.space, buckets=measured,
                         **provenance(plan))


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``; ``dispatch_slices.evidence_parser``); unset flags keep
    the plan's values."""
    return evidence_parser(__doc__.split("\n\n")[0])


def plan_from(args: argparse.Namespace, backend: str) -> Plan:
    """The plan: :data:`QUICK_PLAN` with ``--quick`` or on a CPU host, else
    :data:`DEFAULT_PLAN`, with the flags given.

    Raises:
        ValueError: a value the plan or its grid refuses (the field named).
    """
    plan = QUICK_PLAN if args.quick or backend == "cpu" else DEFAULT_PLAN
    space = {**plan.grid.space.model_dump(),
             **({"dtypes": args.dtypes} if args.dtypes else {}),
             **({"causal": (args.causal == "causal",)} if args.causal else {})}
    cuts = {field: value for field, value in (("seq_cuts", args.seq_cuts),
                                              ("batch_cuts", args.batch_cuts)) if value}
    grid = BucketGrid.model_validate({**plan.grid.model_dump(), "space": space, **cuts})
    fields = {"kernels": args.kernels, "head_dims": args.head_dims, "seqs": args.seqs,
              "repeats": args.repeats, "seed": args.seed,
              "served": served_shapes(args.served_shapes, grid) if args.served_shapes else None}
    return Plan.model_validate({**plan.model_dump(), "grid": grid,
                                **{k: v for k, v in fields.items() if v is not None}})


def run(args: argparse.Namespace, plan: Plan
        ) -> tuple[Evidence, DispatchPolicy] | EvidencePiece:
    """Measure ``plan`` (:func:`plan_from` of ``args``): a slice (``--slice-*``) as
    ``piece.json``; else the whole grid and its policy (``evidence.json``, ``policy.json``).

    Raises:
        ValueError: as :func:`measure`, :func:`measure_piece`.
    """
    sliced = select(plan.grid, args)
    if sliced is not None:
        piece = measure_piece(plan, *sliced, budget_s=args.budget_s)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "piece.json").write_text(piece.model_dump_json(indent=1))
        return piece
    evidence = measure(plan)
    return evidence, write_policy(evidence, plan.kernels, args.priority, args.out)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: 0; 2 when some bucket has no kernel (the table says why), or on a
    usage error (a value the plan refuses, a slice of no bucket, a budget without a slice,
    an unknown kernel)."""
    args = build_parser().parse_args(argv)
    try:  # usage errors, before any work (--list: the accelerator's grid unless --quick)
        plan = plan_from(args, ("cpu" if args.quick else "gpu") if args.list
                         else default_backend())
        sliced = select(plan.grid, args)
        if args.list:
            print("\n".join(f"{i:4d} {b.name}" for i, b in enumerate(plan.grid.buckets())))
            return 0
        if args.out is None:  # only --list writes nothing
            raise ValueError("the following arguments are required: --out (or --list)")
        if args.budget_s is not None and sliced is None:
            raise ValueError("--budget-s measures a piece: give a --slice-* flag too "
                             "(--slice-buckets 0: for the whole grid)")
        if sliced is not None and not sliced[0]:
            raise ValueError(f"slice {sliced[1]!r} selects no bucket of the grid")
        args.out.mkdir(parents=True, exist_ok=True)  # before hours of measurement, not after
    except (ValueError, OSError) as err:
        build_parser().error(reason(err))
    result = run(args, plan)
    if isinstance(result, EvidencePiece):
        print(piece_report(plan.grid, args, result))
        return 0
    return report(result[1], args.out)


if __name__ == "__main__":
    raise SystemExit(main())
