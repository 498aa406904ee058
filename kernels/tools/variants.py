"""Time pallas_mosaic_gpu's variant switches side by side in one process.

For every shape of the chosen set (``kernels/tools/fa3_variants.json``: ``priority``,
bf16 head_dim 64 and 256 non-causal S=16384, where the kernel loses most; or ``grid``,
head_dim 64/128/256, causal and not, S=16384 at B=1 and S=4096 at B=4,
heads = 2048 / head_dim) it times cuDNN (``jax.nn.dot_product_attention``,
``implementation="cudnn"``), FlashAttention-3 at head_dim 128 (``kernels.fa3``, where its
wheel is installed; :data:`PEERS`) and each variant, in three passes interleaved over the
kernels (the median of each pass's median; ratios within this process), against the
matmul ceiling measured in the same process (the best of a few large bf16 GEMMs). The
registered kernel is timed twice, as ``default`` and, last in each pass, as
``call_aa.AA_VARIANT``: their ratio is the call's A/A, the spread a difference between two
kernels of the call must exceed to be read (``--no-aa`` leaves it out). Every
variant is checked against float64 twice: on sampled rows of the timed inputs, and on a
small shape of its own (causal, lengths that are no tile multiples, GQA) where its error
must stay within ``bench.ERROR_RATIO_LIMIT`` of naive's; the peers' sampled rows are
checked the same way. The compiled kernel's ``ptxas`` report
(``MOSAIC_GPU_DUMP_PTXAS=1``: registers, spill stores and loads) is captured from the
process's stdout/stderr at its first compile and parsed into the row.

Needs JAX, numpy and pydantic (``kernels.config`` imports it); no other package.

Usage (on a Hopper GPU):
    python3 -m kernels.tools.variants --shapes priority --variants default lazy-rescale-8 \\
        --out variants.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import fa3
from kernels.contract import validate
from kernels.mosaic_variants import MosaicVariant, registered_default
from kernels.pallas_mosaic_gpu import (
    MosaicConfig,
    PallasMosaicGpuKernel,
    padded_head_dim,
    pallas_mosaic_gpu_attention,
    registered_variant,
)
from kernels.reference import relative_error, rounding_floor
from kernels.selection import measured_config
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import compile_and_warm, time_call
from kernels.tools import bench, call_aa, grid_summary
from kernels.tools.grid_summary import format_table
from kernels.tools.ptxas_report import captured_output, parse_ptxas
from kernels.tools.variant_check import small_check

KERNEL = PallasMosaicGpuKernel()
VARIANTS_FILE = Path(__file__).with_name("fa3_variants.json")
PASSES = 3
PEERS = ("cudnn", "fa3")
"""Timed beside the variants: cuDNN, and FlashAttention-3 (``kernels.fa3``, head_dim 128
only; where its wheel cannot run, a row with the reason: the FA3 floor is not assessed)."""
CEILING_SIZES = (4096, 8192, 12288)
SCHEMA_VERSION = 1


def load_variant_sets(path: Path | str = VARIANTS_FILE) -> dict[str, Any]:
    """The variant file: ``variants`` (name, optional ``variant`` fields or
    ``registered_plus`` fields, ``config`` per head_dim, ``head_dims``) and the shape sets
    ``priority_shapes``/``grid_shapes``.

    Raises:
        ValueError: bad switches or tiling, repeated names, the A/A twin's name.
    """
    data = json.loads(Path(path).read_text())
    names = [e["name"] for e in data["variants"]]
    if len(names) != len(set(names)):
        raise ValueError(f"{path}: variant names repeat: {names}")
    if call_aa.AA_VARIANT in names:
        raise ValueError(f"{path}: {call_aa.AA_VARIANT!r} is the A/A twin's reserved name")
    for entry in data["variants"]:
        if "variant" in entry and "registered_plus" in entry:
            raise ValueError(f"{path}: {entry['name']}: 'variant' and 'registered_plus' "
                             f"exclude each other")
        MosaicVariant(**entry.get("variant", {}))  # raises on a bad switch
        MosaicVariant(**entry.get("registered_plus", {}))
        for d, cfg in entry.get("config", {}).items():
            KERNEL.config_from(cfg)  # raises on a bad tiling
            if not str(d).isdigit():
                raise ValueError(f"{path}: {entry['name']}: config keys are head_dims, got {d!r}")
    return data


def entry_variant(entry: dict[str, Any], head_dim: int, *, causal: bool | None = None,
                  kv_len: int | None = None, config: MosaicConfig | None = None) -> MosaicVariant:
    """The entry's switches at ``head_dim``: its ``variant`` (unset fields off), or, with no
    ``variant`` (``default``, a tiling entry), the switches the kernel is registered with at
    this head_dim, mask and ``kv_len`` (``mosaic_variants.registered_default`` at
    ``pallas_mosaic_gpu.padded_head_dim``): what ``variant=None`` runs; with
    ``registered_plus``, those registered switches with its fields set on top (a
    technique timed against the registered kernel with everything else as registered).
    With the row's resolved tiling ``config`` the registered switches are those the
    tiling can hold (``pallas_mosaic_gpu.registered_variant``, exactly what the call
    without a variant runs); without it, the rule table's."""
    if "variant" in entry:
        return MosaicVariant(**entry["variant"])
    if config is None:
        registered = registered_default(padded_head_dim(head_dim), causal=causal,
                                        kv_len=kv_len)
    else:
        registered = registered_variant(config, head_dim, causal=causal, kv_len=kv_len)
    if "registered_plus" in entry:
        return MosaicVariant(**{**registered.model_dump(), **entry["registered_plus"]})
    return registered


def block_sizes(entry: dict[str, Any], head_dim: int) -> MosaicConfig | None:
    """The entry's tiling at ``head_dim`` (``None``: the table's or the default); the file
    writes the ring depth as ``num_stages``, which ``MosaicConfig`` reads."""
    cfg = entry.get("config", {}).get(str(head_dim))
    return KERNEL.config_from(cfg) if cfg else None


def shapes(spec: dict[str, Any]) -> list[AttentionShape]:
    """The benchmark shapes of a shape set (``batch * seq = 16384``, heads 2048/d), for
    each of its ``dtypes`` (or its one ``dtype``)."""
    dtypes = spec.get("dtypes") or [spec["dtype"]]
    return [AttentionShape(dtype=dtype, batch=max(1, bench.TOKENS // seq), q_len=seq,
                           kv_len=seq, num_heads=bench.MODEL_WIDTH // d,
                           num_kv_heads=bench.MODEL_WIDTH // d, head_dim=d, causal=causal)
            for dtype in dtypes for d in spec["head_dims"] for causal in spec["causal"]
            for seq in spec["seqs"]]


def matmul_ceiling(sizes: Sequence[int] = CEILING_SIZES) -> dict[str, float]:
    """TFLOP/s of bf16 ``n^3`` products for each size, and their best (``ceiling``)."""
    rates = {str(n): bench.matmul_ceiling(n, jnp.bfloat16) for n in sizes}
    return {**rates, "ceiling": max(rates.values())}


def _timed(fns: Sequence[Any], args) -> list[dict[str, Any]]:
    """Each compiled call of ``fns`` timed in ``PASSES`` interleaved passes (pass 1 of every
    call, then pass 2, ...), so a drift of the device's clocks within the process reaches
    every kernel alike: per call its passes' medians and their median (seconds), or
    ``error`` for a call that raised while timed (not timed again; the others go on)."""
    passes: list[list[float]] = [[] for _ in fns]
    failed: dict[int, str] = {}
    for _ in range(PASSES):
        for i, fn in enumerate(fns):
            if i in failed:
                continue
            try:
                passes[i].append(time_call(fn, args, repeats=7, target_repeat_s=0.03).median_s)
            except Exception as e:  # noqa: BLE001 - a kernel failing while timed is its row's
                failed[i] = _full(e)
    return [{"error": failed[i]} if i in failed else
            {"median_s": statistics.median(p), "pass_median_s": p} for i, p in enumerate(passes)]


def _variant_fn(shape, variant, config, interpret=False):
    def fn(q, k, v):
        return pallas_mosaic_gpu_attention(q, k, v, causal=shape.causal,
                                           scale=1.0 / math.sqrt(shape.head_dim),
                                           q_lengths=None, kv_lengths=None, config=config,
                                           variant=variant, interpret=interpret)
    return fn


def run_shape(shape: AttentionShape, entries: Sequence[dict[str, Any]], ceiling: float,
              seed: int, *, interpret: bool = False,
              small_seqs: tuple[int, int] = (1000, 1100)) -> list[dict[str, Any]]:
    """cuDNN and every applicable variant on one shape: timing, sampled float64 check,
    small-shape check, ptxas report. A failing variant is a row with its error.
    ``interpret``/``small_seqs``: JAX's GPU interpret mode and a smaller check (CPU tests)."""
    q, k, v = random_inputs(shape, seed)
    rng = np.random.default_rng(seed)
    pairs = [(int(rng.integers(shape.batch)), int(rng.integers(shape.num_heads)))
             for _ in range(2)]
    rows_idx = np.sort(rng.choice(shape.q_len, size=min(128, shape.q_len), replace=False))
    host = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref = bench.sampled_reference(*host, causal=shape.causal,
                                  scale=1.0 / math.sqrt(shape.head_dim), pairs=pairs,
                                  rows=rows_idx)
    del host
    rows: list[dict[str, Any]] = []
    timed: list[tuple[dict[str, Any], Any]] = []  # (row, compiled call): timed together below
    for peer in PEERS:
        row = {"shape": shape.label, "variant": peer}
        try:
            compiled, *_ = compile_and_warm(bench.attention_fn(peer, shape, None), (q, k, v))
            row["rel_error"] = relative_error(bench._sampled(compiled(q, k, v), pairs,
                                                             rows_idx), ref)
            rows.append(row)
            timed.append((row, compiled))
        except (NotImplementedError, ImportError) as e:  # the peer cannot run this here
            if peer != "fa3" or shape.head_dim == fa3.HEAD_DIM:  # FA3: its head_dim only
                rows.append({**row, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - a failing baseline is a row, not a crash
            rows.append({**row, "error": _full(e)})
    for entry in entries:
        if shape.head_dim not in entry.get("head_dims", (shape.head_dim,)):
            continue
        config = block_sizes(entry, shape.head_dim) or measured_config(
            shape, "pallas_mosaic_gpu")
        spec = validate(*shape.structs(), causal=shape.causal)[0]
        resolved = KERNEL.resolve_config(spec, config)
        variant = entry_variant(entry, shape.head_dim, causal=shape.causal,
                                kv_len=shape.kv_len, config=resolved)
        row: dict[str, Any] = {"shape": shape.label, "variant": entry["name"],
                               "switches": variant.model_dump(),
                               "config": resolved.model_dump()}
        try:
            output: list[str] = []
            with captured_output(output):
                compiled, row["compile_s"], *_ = compile_and_warm(
                    _variant_fn(shape, variant, config, interpret), (q, k, v))
            row["ptxas"] = parse_ptxas("".join(output)) or "no ptxas report captured"
            out = compiled(q, k, v)
            row["rel_error"] = relative_error(bench._sampled(out, pairs, rows_idx), ref)
            del out
            row["small_check"] = small_check(variant, config, shape.head_dim, shape.dtype,
                                             seed, seqs=small_seqs, interpret=interpret)
            timed.append((row, compiled))
        except Exception as e:  # noqa: BLE001 - a failing variant is a result
            row["error"] = _full(e)
            print(f"--- {entry['name']} on {shape.label} failed:\n{row['error']}",
                  file=sys.stderr, flush=True)
        rows.append(row)
    for (row, _), timing in zip(timed, _timed([fn for _, fn in timed], (q, k, v)),
                                strict=True):
        row.update(timing)
        if "median_s" in timing:
            row["tflops"] = shape.flops() / timing["median_s"] / 1e12
    peer_s = {r["variant"]: r["median_s"] for r in rows if "median_s" in r}
    default = next((r for r in rows if r["variant"] == "default" and "median_s" in r), None)
    for row in rows:
        if "median_s" in row and row["variant"] not in PEERS:
            row["of_ceiling"] = row["tflops"] / ceiling
            for peer in PEERS:
                if peer in peer_s:
                    row[f"ratio_to_{peer}"] = peer_s[peer] / row["median_s"]
            if default is not None:
                row["ratio_to_default"] = default["median_s"] / row["median_s"]
        if "rel_error" in row:
            # The benchmark's rule: cuDNN's own error on these rows (floor ERROR_FLOOR);
            # without cuDNN, the dtype's rounding floor (kernels.reference).
            floor = bench.ERROR_FLOOR[shape.dtype]
            cudnn_err = next((r.get("rel_error") for r in rows if r["variant"] == "cudnn"), None)
            base = (max(cudnn_err, floor) if cudnn_err is not None
                    else max(floor, rounding_floor(shape.dtype, shape.kv_len)))
            row["sampled_error_ratio_to_cudnn"] = row["rel_error"] / base
            row["correct"] = bool(
                "error" not in row and math.isfinite(row["rel_error"])
                and row["rel_error"] / base <= bench.ERROR_RATIO_LIMIT
                and row.get("small_check", {"correct": True})["correct"])
    return rows


def _full(err: BaseException) -> str:
    return "".join(traceback.format_exception(err))[-6000:]


def build_parser() -> argparse.ArgumentParser:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python3 -m kernels.tools.variants",
                                description=__doc__.splitlines()[0])
    p.add_argument("--shapes", choices=("priority", "grid"), default="priority")
    p.add_argument("--variants", nargs="+", default=None,
                   help="names from the variant file (default: all); 'default' is always run")
    p.add_argument("--head-dims", nargs="+", type=int, default=None,
                   help="restrict the shape set to these head_dims")
    p.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float16"), default=None,
                   help="run the shape set in these dtypes (default: the set's own)")
    p.add_argument("--file", default=str(VARIANTS_FILE))
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ceiling-sizes", nargs="+", type=int, default=list(CEILING_SIZES),
                   help="square bf16 GEMM sizes whose best rate is the matmul ceiling")
    p.add_argument("--no-aa", action="store_true", help=f"do not time the registered kernel "
                   f"again ('{call_aa.AA_VARIANT}', last in each pass: the call's A/A)")
    p.add_argument("--out", default=None, help="write the JSON report here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the variant sets; print the table; write JSON. Exit 1 when a variant row (the
    A/A twin's too: it is the registered kernel) is incorrect or failed, 2 on bad input."""
    args = build_parser().parse_args(argv)
    data = load_variant_sets(args.file)
    by_name = {e["name"]: e for e in data["variants"]}
    wanted = ["default"] + [n for n in (args.variants or by_name) if n != "default"]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        print(f"unknown variants {unknown}; the file has {sorted(by_name)}", file=sys.stderr)
        return 2
    os.environ.setdefault("MOSAIC_GPU_DUMP_PTXAS", "1")
    spec = dict(data[f"{args.shapes}_shapes"])
    if args.dtypes:
        spec["dtypes"] = list(args.dtypes)
    if args.head_dims:
        spec["head_dims"] = [d for d in spec["head_dims"] if d in args.head_dims] or args.head_dims
    # The A/A twin: the file's default entry (its tiling and switches) under its own name.
    aa = [] if args.no_aa else [{**by_name["default"], "name": call_aa.AA_VARIANT}]
    others = [by_name[n] for n in wanted if n != "default"]
    if others and all("head_dims" in e for e in others):
        # Only where the chosen variants run (the default is timed beside them there).
        mine = {d for e in others for d in e["head_dims"]}
        spec["head_dims"] = [d for d in spec["head_dims"] if d in mine] or sorted(mine)
    seed = args.seed if args.seed is not None else int(np.random.default_rng().integers(1 << 31))
    device = jax.devices()[0]
    print(f"device {device.device_kind}, jax {jax.__version__}, seed {seed}", flush=True)
    ceiling = matmul_ceiling(args.ceiling_sizes)
    print(f"matmul ceiling (bf16, best of {args.ceiling_sizes}): {ceiling['ceiling']:.1f} TFLOP/s",
          flush=True)
    rows: list[dict[str, Any]] = []
    for shape in shapes(spec):
        rows += run_shape(shape, [by_name[n] for n in wanted] + aa, ceiling["ceiling"], seed)
        print(format_table([r for r in rows if r["shape"] == shape.label]), flush=True)
    report = {"schema_version": SCHEMA_VERSION, "created": dt.datetime.now(dt.UTC).isoformat(),
              "device": device.device_kind, "jax_version": jax.__version__, "seed": seed,
              "passes": PASSES, "matmul_ceiling_tflops": ceiling, "shape_set": args.shapes,
              "variants": {**{n: by_name[n] for n in wanted}, **{e["name"]: e for e in aa}},
              "rows": rows}
    print("\n" + format_table(rows))
    if args.out:  # the rows first: a summary that raised would lose no measurement
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.shapes == "grid":  # the floor and goal, from this call's rows alone
        report["summary"] = grid_summary.summarize(report)
        print("\n" + grid_summary.format_summary(report["summary"]))
    report["a_a"] = call_aa.a_a(rows)
    print("\n" + call_aa.format_a_a(report["a_a"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    bad = [r for r in rows if r["variant"] not in PEERS and not r.get("correct")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
