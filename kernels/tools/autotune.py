"""GPU autotuning: write the measured selection table behind ``auto`` on a GPU.

``python -m kernels.tools.autotune --testset DIR --out kernels/gpu_table.json`` times, per
shape, every candidate tiling of ``pallas_gpu`` (block_q, block_kv, num_warps,
num_stages) and of ``pallas_mosaic_gpu`` (block_q, block_kv and the K/V ring depth
num_stages), and the cuDNN kernel (``kernels.timing``, the benchmark's method), keeps
only candidates whose output matches cuDNN/XLA, and writes a versioned table (schema
version, JAX version, device kind, date, per shape: the fastest implementation, its
TFLOP/s and each Pallas kernel's best config) that ``kernels.selection`` reads.
pallas_mosaic_gpu is tried only where it runs (bf16/f16 on a Hopper GPU); elsewhere its
candidates are recorded with the reason and the entry has no ``mosaic_config``.

Tuning data: the shapes of the test set's ``tuning`` split (``--testset``; the split
exists for this and is never used by a gate), or the benchmark grid's shapes
(``kernels.tools.bench.grid``) without one. Inputs are fresh random normal arrays of those
shapes: no held-out or confirmation case is ever read, so tuning cannot leak into the
gate's evidence.

Only tilings that fit the device's shared memory for the shape's dtype and head_dim are
tried (``kernels.gpu_limits``). ``--serving`` tunes MiniLM's serving shapes
(``kernels.tools.bench_serving``: 12 heads x head_dim 32, float32 and bf16) with a grid for
small head_dim and short sequences, in two passes (tile shape and warps at 2 stages, then
1 and 3 stages around the three fastest), and merges the entries into the existing table.

Kept in one module (over 350 lines) because it is one command: the search spaces, the
tuning passes and the table they write belong to one run and one table schema.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from kernels import pallas_mosaic_gpu
from kernels.api import attention, default_backend
from kernels.config import BlockSizes
from kernels.contract import validate
from kernels.gpu_limits import shared_memory_budget, shared_memory_bytes
from kernels.pallas_gpu import default_config, fitted_config
from kernels.reference import relative_error
from kernels.registry import IMPLEMENTATIONS, tuned
from kernels.selection import (
    DEFAULT_TABLE_PATH,
    TABLE_FIELDS,
    CandidateResult,
    SelectionTable,
    TableEntry,
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


def candidate_configs(head_dim: int, quick: bool = False,
                      dtype: str | None = None) -> list[BlockSizes]:
    """Tilings to try (FlashAttention-2 style: 64/128-row query tiles, 32..128-row key
    tiles, 4 or 8 warps, 2..4 pipeline stages), the default first. With ``dtype``, only
    tilings that fit the device's shared memory for ``dtype`` and ``head_dim``
    (``kernels.gpu_limits``), the fitted default first. Head dims up to 32 (MiniLM, the
    serving workload) get :func:`serving_candidate_configs`."""
    if quick:
        return [BlockSizes(block_q=16, block_kv=16), BlockSizes(block_q=32, block_kv=16)]
    if head_dim <= 32:
        return serving_candidate_configs(head_dim, dtype or "bfloat16")
    # Pruned with the first H200 sweep (NOTES-gpu.md): 64-row tiles with 4 warps lead
    # at head_dim 64, 128x128 with 8 warps and 3 stages at 128; the rest bracket them.
    if head_dim <= 64:
        grid = [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 128, 4, 3),
                (128, 64, 8, 3), (64, 32, 4, 4), (128, 64, 4, 3)]
    elif head_dim <= 128:
        grid = [(128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3),
                (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 2)]
    else:
        grid = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 3)]
    return _fitting([default_config(head_dim), *(_tiling(*t) for t in grid)], head_dim, dtype)


SERVING_HEAD_DIM = 32
"""Head dims up to this are tuned with the serving grid (MiniLM: 32)."""


def serving_candidate_configs(head_dim: int, dtype: str) -> list[BlockSizes]:
    """Tilings for small head_dim and short sequences (MiniLM: head_dim 32, S <= 512),
    first pass: block_q in {16, 32, 64, 128} x block_kv in {16, 32, 64, 128} x warps in
    {1, 2, 4} (at least 16 query rows per warp), 2 stages; 36 tilings plus the default.

    Short sequences give few programs per (batch, head), so smaller query tiles and fewer
    warps can keep the GPU's 132 SMs busy where 64-128-row tiles leave them idle. The key
    loop has 1-16 iterations here, so the pipeline depth is tuned second, around the
    fastest tilings only (:func:`stage_variants`).
    """
    configs = [default_config(head_dim)]
    for bq, bkv, warps in itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (1, 2, 4)):
        if warps * 16 <= bq:
            configs.append(_tiling(bq, bkv, warps, 2))
    return _fitting(configs, head_dim, dtype)


def stage_variants(results: Sequence[CandidateResult], shape: AttentionShape,
                   top: int = 3) -> list[BlockSizes]:
    """Second pass of the serving search: the ``top`` fastest tilings of ``results`` with
    1 and 3 pipeline stages, those not yet tried and that fit the device."""
    ranked = sorted((r for r in results if r.tflops), key=lambda r: -r.tflops)[:top]
    tried = [BlockSizes(**r.config) for r in results]
    out = []
    for r in ranked:
        for stages in (1, 3):
            cfg = BlockSizes(**r.config).model_copy(update={"num_stages": stages})
            if cfg not in tried and cfg not in out:
                out.append(cfg)
    return _fitting(out, shape.head_dim, shape.dtype, with_default=False)


def _tiling(bq: int, bkv: int, warps: int, stages: int) -> BlockSizes:
    return BlockSizes(block_q=bq, block_kv=bkv, num_warps=warps, num_stages=stages)


def _fitting(configs: Sequence[BlockSizes], head_dim: int, dtype: str | None,
             with_default: bool = True) -> list[BlockSizes]:
    """Distinct tilings in order; with a dtype, only those that fit the device (and, with
    ``with_default``, the fitted default first)."""
    if dtype is not None:
        budget = shared_memory_budget()
        fitted = fitted_config(dtype, head_dim, 4096, 4096, budget=budget)
        configs = [c for c in configs if shared_memory_bytes(c, dtype=dtype, head_dim=head_dim)
                   <= budget.bytes]
        configs = ([fitted] if fitted is not None and with_default else []) + configs
    out: list[BlockSizes] = []
    for cfg in configs:
        if cfg not in out:
            out.append(cfg)
    return out


def mosaic_candidate_configs(head_dim: int, quick: bool = False) -> list[BlockSizes]:
    """pallas_mosaic_gpu tilings to try, the default first: 64- or 128-row consumer tiles,
    64..256-row K/V tiles, ring depth 2..4 (FlashAttention-3 and tokamax's SM90 sweep
    bracket these). Tilings over the shared-memory limit are left out; at head_dim 128
    a 256-row K/V tile does not fit, nor does a 3-deep ring of 128 rows with separate
    output buffers (the kernel then stages the output in the query buffers). Second comes
    the 64 x 256 tile (where it fits: head_dim 64), which ``search_space`` always keeps: on
    the H200 it beat the tuned tiling by 6-10 % at head_dim 64 without a mask (bf16 and f16,
    ``kernels.tools.variants``, BENCHMARKS.md sessions 5 and 6), but the even spread of
    ``--max-tilings 4`` had left it out of the table's tuning."""
    grid = [(64, 256, 2), (64, 128, 2), (64, 128, 3), (64, 64, 2), (64, 64, 3), (64, 64, 4),
            (128, 64, 2), (128, 128, 2)]
    if quick:
        grid = grid[:2]
    configs = [pallas_mosaic_gpu.default_config(head_dim)]
    for bq, bkv, stages in grid:
        cfg = BlockSizes(block_q=bq, block_kv=bkv, num_warps=pallas_mosaic_gpu.NUM_WARPS,
                         num_stages=stages)
        fits = pallas_mosaic_gpu.smem_bytes(cfg, head_dim) <= pallas_mosaic_gpu.SMEM_LIMIT_BYTES
        if fits and cfg not in configs:
            configs.append(cfg)
    return configs


def _bound(name: str, shape: AttentionShape, config: BlockSizes | None):
    spec, _, _ = validate(*shape.structs(), causal=shape.causal)
    # Each kernel's own check says where it runs (pallas_gpu: interpreted on a CPU).
    IMPLEMENTATIONS[name].check(spec, default_backend(), config)

    def fn(q, k, v):
        return attention(q, k, v, causal=shape.causal, implementation=name, config=config)
    return fn


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"


def _tune(name: str, configs: Sequence[BlockSizes], shape: AttentionShape, args, baseline,
          **timing) -> list[CandidateResult]:
    """Check each tiling of ``name`` against ``baseline`` and time the correct ones."""
    results = []
    for cfg in configs:
        result = CandidateResult(config=cfg.model_dump())
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


SEARCH_SPACES = {
    "pallas_gpu": lambda shape, quick: candidate_configs(shape.head_dim, quick,
                                                         dtype=shape.dtype),
    "pallas_mosaic_gpu": lambda shape, quick: mosaic_candidate_configs(shape.head_dim, quick),
}
"""The tilings tried per tuned kernel (``Kernel.tuned``); a tuned kernel without an
entry is timed at its own default tiling only (``Kernel.resolve_config``)."""
REFERENCES = ("cudnn", "xla")
"""The output every candidate must agree with: cuDNN's where it runs, else XLA's."""


def search_space(name: str, shape: AttentionShape, quick: bool,
                 max_tilings: int | None = None) -> list[BlockSizes]:
    """The tilings of the tuned kernel ``name`` to try on ``shape`` (see ``SEARCH_SPACES``),
    at most ``max_tilings`` of them: the space's first two (the default and the space's
    first alternative) kept, the other slots spread evenly over the rest."""
    if name in SEARCH_SPACES:
        space = SEARCH_SPACES[name](shape, quick)
        if max_tilings is not None and len(space) > max_tilings:
            kept, rest = space[:min(2, max_tilings)], space[min(2, max_tilings):]
            slots = max_tilings - len(kept)
            step = len(rest) / slots if slots else 0
            space = kept + [rest[int(i * step)] for i in range(slots)]
        return space
    spec, _, _ = validate(*shape.structs(), causal=shape.causal)
    return [IMPLEMENTATIONS[name].resolve_config(spec, None)]


def tune_shape(shape: AttentionShape, *, quick: bool, seed: int, repeats: int,
               target_repeat_s: float, mosaic: bool = True,
               max_tilings: int | None = None) -> TableEntry:
    """Time cudnn and every candidate tiling of each tuned kernel of the registry
    (``kernels.registry.tuned``; pallas_mosaic_gpu left out when ``mosaic`` is False) on
    one shape; the fastest correct one wins.

    Raises:
        RuntimeError: no pallas_gpu tiling ran correctly (schema version 1 needs its
            ``pallas_config``).
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
    for name in tuned():
        if name == "pallas_mosaic_gpu" and not mosaic:
            continue
        results[name] = _tune(name, search_space(name, shape, quick, max_tilings), shape, (q, k, v),
                              baseline, **timing)
        if (name == "pallas_gpu" and not quick and shape.head_dim <= SERVING_HEAD_DIM
                and max_tilings is None):
            results[name] += _tune(name, stage_variants(results[name], shape), shape,
                                   (q, k, v), baseline, **timing)
        if good := [r for r in results[name] if r.tflops]:
            best[name] = max(good, key=lambda r: r.tflops)
            tflops[name] = best[name].tflops
    if "pallas_gpu" not in best:
        raise RuntimeError(f"no pallas_gpu tiling ran correctly for {shape.label}: "
                           + "; ".join(str(r.error) for r in results.get("pallas_gpu", [])))
    mosaic_best = best.get("pallas_mosaic_gpu")
    return TableEntry(dtype=shape.dtype, batch=shape.batch, seq=shape.q_len,
                      num_heads=shape.num_heads, head_dim=shape.head_dim,
                      causal=shape.causal, best=max(tflops, key=tflops.get), tflops=tflops,
                      pallas_config=best["pallas_gpu"].config, candidates=results["pallas_gpu"],
                      mosaic_config=mosaic_best.config if mosaic_best else None,
                      mosaic_candidates=results.get("pallas_mosaic_gpu", []),
                      configs={n: r.config for n, r in best.items() if n not in TABLE_FIELDS})


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
             mosaic: bool = True, max_tilings: int | None = None) -> SelectionTable:
    """Tune every shape; return the table (not yet written)."""
    entries = []
    for i, shape in enumerate(shapes):
        entry = tune_shape(shape, quick=quick, seed=1000 + i, repeats=repeats,
                           target_repeat_s=target_repeat_s, mosaic=mosaic,
                           max_tilings=max_tilings)
        print(f"[autotune] {shape.label}: best {entry.best} "
              + " ".join(f"{k}={v:.1f}" for k, v in entry.tflops.items())
              + f" pallas_gpu={entry.pallas_config} pallas_mosaic_gpu={entry.mosaic_config}",
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
    parser.add_argument("--no-mosaic", action="store_true",
                        help="do not tune pallas_mosaic_gpu (the table then never picks it)")
    parser.add_argument("--with-grid", action="store_true",
                        help="with --testset: also tune the benchmark grid's shapes")
    parser.add_argument("--max-tilings", type=int, default=None,
                        help="at most this many tilings per tuned kernel and shape (so per "
                             "head_dim), spread over its search space")
    parser.add_argument("--merge", action="store_true",
                        help="add to the table at --out (same device and JAX) instead of "
                             "replacing it; re-measured shapes replace their entries")
    args = parser.parse_args(argv)
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
                     tuning_data=data, mosaic=not args.no_mosaic, max_tilings=args.max_tilings)
    if (args.merge or args.serving) and (old := load_table(args.out)) is not None:
        table = merge_tables(old, table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(table.model_dump(mode="json"), indent=1))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(table.entries)} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
