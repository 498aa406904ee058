"""GPU autotuning: write the measured selection table behind ``auto`` on a GPU.

``python -m kernels.tools.autotune --testset DIR --out kernels/gpu_table.json`` times, per
shape, every candidate config of each kernel the registry declares ``tuned`` (its
``Kernel.candidate_configs``, and a second pass where its ``refined_candidates`` asks for
one) and the cuDNN kernel (``kernels.timing``, the benchmark's method), keeps only
candidates whose output matches cuDNN/XLA, and writes a versioned table (schema version,
JAX version, device kind, date, per shape: the fastest implementation, its TFLOP/s and
each tuned kernel's best config in its own config type's fields) that
``kernels.selection`` reads. A kernel that does not run a shape (pallas_mosaic_gpu off a
Hopper GPU or in float32) has its candidates recorded with the reason and no config.

Tuning data: the shapes of the test set's ``tuning`` split (``--testset``; the split
exists for this and is never used by a gate), or the benchmark grid's shapes
(``kernels.tools.bench.grid``) without one. Inputs are fresh random normal arrays of those
shapes: no held-out or confirmation case is ever read, so tuning cannot leak into the
gate's evidence.

The search spaces are the kernels' own (pallas_gpu tries only tilings that fit the
device's shared memory for the shape's dtype and head_dim, ``kernels.gpu_limits``).
``--serving`` tunes MiniLM's serving shapes (``kernels.tools.bench_serving``: 12 heads x
head_dim 32, float32 and bf16) and merges the entries into the existing table.
``--convert`` rewrites an older table at ``--out`` as the current schema without
re-measuring anything (``kernels.selection.converted``), recording that it did.

Kept in one module (over 350 lines) because it is one command: the tuning passes, the
conversion and the table they write belong to one run and one table schema.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from kernels.api import attention, default_backend
from kernels.config import KernelConfig
from kernels.contract import validate
from kernels.reference import relative_error
from kernels.registry import IMPLEMENTATIONS, tuned
from kernels.selection import (
    DEFAULT_TABLE_PATH,
    TABLE_SCHEMA_VERSION,
    CandidateResult,
    SelectionTable,
    TableEntry,
    converted,
    load_table,
    merge_tables,
)
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import DEFAULT_WARMUP_S, compile_and_warm, time_call
from kernels.tools import bench_serving
from kernels.tools.bench import grid

AGREEMENT_LIMIT = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
"""Max ||candidate - cudnn|| / ||cudnn|| for a candidate to count as correct (both
are flash kernels with float32 softmax; bf16 rounding of P dominates the difference)."""


def _bound(name: str, shape: AttentionShape, config: KernelConfig | None):
    spec, _, _ = validate(*shape.structs(), causal=shape.causal)
    # Each kernel's own check says where it runs (pallas_gpu: interpreted on a CPU).
    IMPLEMENTATIONS[name].check_supported(spec, default_backend(), config)

    def fn(q, k, v):
        return attention(q, k, v, causal=shape.causal, implementation=name, config=config)
    return fn


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"


def _tune(name: str, configs: Sequence[KernelConfig | None], shape: AttentionShape, args,
          baseline, **timing) -> list[CandidateResult]:
    """Check each config of ``name`` against ``baseline`` and time the correct ones."""
    results = []
    for cfg in configs:
        result = CandidateResult(config=cfg.fields_set() if cfg is not None else {})
        try:
            compiled, *_ = compile_and_warm(_bound(name, shape, cfg), args)
            out = compiled(*args).astype(jnp.float32)
            result.rel_diff_to_baseline = relative_error(out, baseline)
            if not result.rel_diff_to_baseline <= AGREEMENT_LIMIT[shape.dtype]:
                raise ValueError(f"output differs from baseline by "
                                 f"{result.rel_diff_to_baseline:.2e}")
            result.tflops = shape.flops() / time_call(compiled, args, **timing).median_s / 1e12
        except (NotImplementedError, ImportError) as err:
            result.error = "unsupported: " + _short(err)
        except Exception as err:  # noqa: BLE001 - a failing tiling is a tuning result
            result.error = _short(err)
        results.append(result)
    return results


REFERENCES = ("cudnn", "xla")
"""The output every candidate must agree with: cuDNN's where it runs, else XLA's."""


def search_space(name: str, shape: AttentionShape, quick: bool,
                 max_tilings: int | None = None) -> list[KernelConfig | None]:
    """The configs of the tuned kernel ``name`` to try on ``shape`` (its
    ``Kernel.candidate_configs``), at most ``max_tilings`` of them: the space's first two
    (the default and the space's first alternative) kept, the other slots spread evenly
    over the rest."""
    space = IMPLEMENTATIONS[name].candidate_configs(shape, quick)
    if max_tilings is not None and len(space) > max_tilings:
        kept, rest = space[:min(2, max_tilings)], space[min(2, max_tilings):]
        slots = max_tilings - len(kept)
        step = len(rest) / slots if slots else 0
        space = kept + [rest[int(i * step)] for i in range(slots)]
    return space


def tune_shape(shape: AttentionShape, *, quick: bool, seed: int, repeats: int,
               target_repeat_s: float, kernels: Sequence[str] | None = None,
               max_tilings: int | None = None) -> TableEntry:
    """Time cudnn and every candidate config of each tuned kernel (``kernels``; default
    every kernel the registry declares ``tuned``) on one shape; the fastest correct one
    wins. A kernel's second pass (``Kernel.refined_candidates``) runs only without
    ``max_tilings``.

    Raises:
        RuntimeError: no config of any tuned kernel ran correctly (the entry would say
            nothing about them).
    """
    q, k, v = random_inputs(shape, seed)
    warmup_s = 0.0 if quick else DEFAULT_WARMUP_S
    flops = shape.flops()
    tflops: dict[str, float] = {}
    baseline = None
    for name in REFERENCES:
        try:
            compiled, *_ = compile_and_warm(_bound(name, shape, None), (q, k, v))
            baseline = compiled(q, k, v).astype(jnp.float32)
            if name == "cudnn":
                timing = time_call(compiled, (q, k, v), repeats=repeats,
                                   target_repeat_s=target_repeat_s, warmup_s=warmup_s)
                tflops["cudnn"] = flops / timing.median_s / 1e12
            break
        except (NotImplementedError, ImportError):
            continue
    timing = dict(repeats=repeats, target_repeat_s=target_repeat_s, warmup_s=warmup_s)
    results: dict[str, list[CandidateResult]] = {}
    best: dict[str, CandidateResult] = {}
    for name in (tuned() if kernels is None else kernels):
        kernel = IMPLEMENTATIONS[name]
        results[name] = _tune(name, search_space(name, shape, quick, max_tilings), shape,
                              (q, k, v), baseline, **timing)
        if max_tilings is None:
            tried = [(kernel.config_from(r.config), r.tflops) for r in results[name]]
            results[name] += _tune(name, kernel.refined_candidates(tried, shape, quick), shape,
                                   (q, k, v), baseline, **timing)
        if good := [r for r in results[name] if r.tflops]:
            best[name] = max(good, key=lambda r: r.tflops)
            tflops[name] = best[name].tflops
    if not best:
        raise RuntimeError(f"no tuned kernel's config ran correctly for {shape.label}: "
                           + "; ".join(f"{n}: {r.error}" for n, rs in results.items()
                                       for r in rs))
    return TableEntry(dtype=shape.dtype, batch=shape.batch, seq=shape.q_len,
                      num_heads=shape.num_heads, head_dim=shape.head_dim,
                      causal=shape.causal, best=max(tflops, key=tflops.get), tflops=tflops,
                      configs={n: r.config for n, r in best.items()}, candidates=results)


def tuning_shapes(testset_dir: Path) -> list[AttentionShape]:
    """The distinct problem shapes of a test set's ``tuning`` split.

    Reads ``manifest.json`` as JSON (the kernels package does not import the
    evaluation package that writes it); only the tuning split is read.

    Raises:
        FileNotFoundError: no manifest; KeyError: no tuning split.
    """
    manifest = json.loads((Path(testset_dir) / "manifest.json").read_text())
    shapes: list[AttentionShape] = []
    for case in manifest["splits"]["tuning"]["cases"]:
        (b, q_len, h, d), (_, kv_len, kv_h, _) = case["q_shape"], case["kv_shape"]
        shape = AttentionShape(batch=b, q_len=q_len, kv_len=kv_len, num_heads=h,
                               num_kv_heads=kv_h, head_dim=d, dtype=case["dtype"],
                               causal=case["causal"])
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def autotune(shapes: Sequence[AttentionShape], *, quick: bool, repeats: int,
             target_repeat_s: float, command: str, tuning_data: str,
             kernels: Sequence[str] | None = None,
             max_tilings: int | None = None) -> SelectionTable:
    """Tune every shape (``kernels``: the tuned kernels to time, default all); return
    the table (not yet written)."""
    entries = []
    for i, shape in enumerate(shapes):
        entry = tune_shape(shape, quick=quick, seed=1000 + i, repeats=repeats,
                           target_repeat_s=target_repeat_s, kernels=kernels,
                           max_tilings=max_tilings)
        print(f"[autotune] {shape.label}: best {entry.best} "
              + " ".join(f"{k}={v:.1f}" for k, v in entry.tflops.items()) + " "
              + " ".join(f"{n}={c}" for n, c in entry.configs.items()),
              file=sys.stderr, flush=True)
        entries.append(entry.model_copy(update={"device_kind": jax.devices()[0].device_kind}))
    return SelectionTable(
        jax_version=jax.__version__, device_kind=jax.devices()[0].device_kind,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), command=command,
        tuning_data=tuning_data, entries=entries)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: tune and write the table (atomically: a temp file, then rename)."""
    parser = argparse.ArgumentParser(prog="python -m kernels.tools.autotune",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_TABLE_PATH)
    parser.add_argument("--testset", type=Path, default=None,
                        help="tune on the shapes of this test set's tuning split")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, two tilings (always so without a GPU)")
    parser.add_argument("--serving", action="store_true",
                        help="tune MiniLM's serving shapes (kernels.tools.bench_serving: 12 heads x "
                             "head_dim 32; default dtypes float32 bfloat16); implies --merge")
    parser.add_argument("--dtypes", nargs="+", default=None,
                        help="default bfloat16 float16 (--serving: float32 bfloat16)")
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqs", nargs="+", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-repeat-s", type=float, default=0.01)
    parser.add_argument("--skip", nargs="+", default=[], metavar="KERNEL",
                        help="tuned kernels not to time (the table then never picks them)")
    parser.add_argument("--with-grid", action="store_true",
                        help="with --testset: also tune the benchmark grid's shapes")
    parser.add_argument("--max-tilings", type=int, default=None,
                        help="at most this many tilings per tuned kernel and shape (so per "
                             "head_dim), spread over its search space")
    parser.add_argument("--merge", action="store_true",
                        help="add to the table at --out (same device and JAX) instead of "
                             "replacing it; re-measured shapes replace their entries")
    parser.add_argument("--convert", action="store_true",
                        help="measure nothing: rewrite the table at --out, written under an "
                             "older schema, as the current one (recorded in its notes)")
    args = parser.parse_args(argv)
    if args.convert:
        return convert(args.out)
    quick = args.quick or jax.default_backend() not in ("gpu", "cuda")
    if args.serving:
        shapes = bench_serving.serving_shapes(quick, args.dtypes or bench_serving.SERVING_DTYPES)
        data = ("random normal q/k/v with MiniLM's serving shapes (kernels.tools.bench_serving); "
                "no held-out or confirmation data")
    elif args.testset is not None:
        shapes = tuning_shapes(args.testset)
        data = (f"shapes of the tuning split of {args.testset} (random normal inputs); "
                "no held-out or confirmation data")
        if args.with_grid:
            shapes += [s for s in grid(quick, args.seqs, args.dtypes, args.head_dims)
                       if s not in shapes]
            data += "; and the benchmark grid's shapes (kernels.tools.bench.grid)"
    else:
        shapes = grid(quick, args.seqs, args.dtypes or ["bfloat16", "float16"], args.head_dims)
        data = ("random normal q/k/v with the benchmark grid's shapes and dtypes "
                "(kernels.tools.bench.grid); no held-out or confirmation data")
    table = autotune(shapes, quick=quick, repeats=3 if quick else args.repeats,
                     target_repeat_s=0.0 if quick else args.target_repeat_s,
                     command=" ".join(["python -m kernels.tools.autotune", *sys.argv[1:]]),
                     tuning_data=data, max_tilings=args.max_tilings,
                     kernels=[n for n in tuned() if n not in args.skip])
    if (args.merge or args.serving) and (old := load_table(args.out)) is not None:
        table = merge_tables(old, table)
    write_table(table, args.out)
    return 0


def write_table(table: SelectionTable, path: Path) -> None:
    """Write ``table`` to ``path`` as the autotuner does (one-space indented JSON),
    atomically: a temporary file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table.model_dump(mode="json"), indent=1))
    tmp.replace(path)
    print(f"wrote {path} ({len(table.entries)} entries)")


CONVERT_COMMAND = "python -m kernels.tools.autotune --convert"


def convert(path: Path) -> int:
    """Rewrite the table at ``path`` as schema version ``TABLE_SCHEMA_VERSION``
    (``kernels.selection.converted``: each config in its kernel's own fields, every
    figure unchanged), appending the command to ``command`` and a note saying it was
    converted, not re-measured. A table already at the current version is left alone.

    Returns:
        0 (the exit status).

    Raises:
        FileNotFoundError: no table at ``path``.
    """
    table = load_table(path)
    if table is None:
        raise FileNotFoundError(path)
    if table.schema_version == TABLE_SCHEMA_VERSION:
        print(f"{path} is schema version {TABLE_SCHEMA_VERSION} already; nothing to do")
        return 0
    note = (f"converted from schema version {table.schema_version} to "
            f"{TABLE_SCHEMA_VERSION} by `{CONVERT_COMMAND}`: each tuned kernel's configs in "
            "its own config type's fields (pallas_mosaic_gpu's num_stages is its "
            "kv_ring_depth, its num_warps 12 dropped); nothing was re-measured, every "
            "figure, date and entry is the measured one")
    out = converted(table, note).model_copy(
        update={"command": f"{table.command} ; {CONVERT_COMMAND}"})
    write_table(out, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
