"""pallas_mosaic_gpu at extreme values on a GPU, before and after the exponent fix, beside
cuDNN, XLA and pallas_gpu, against float64; and the fix's cost in time.

    python3 tools/gpu_extreme_values.py OUT [--before PATH] [--parts P,...] [--budgets S,S,S,S]

``--before``: a copy of ``kernels/pallas_mosaic_gpu.py`` as it was before the fix (its
``pallas_mosaic_gpu_attention`` runs as ``mosaic_before``; the working tree's as
``mosaic``). Parts, in this order, each while its budget lasts (``--budgets``: seconds
for each from its start, default 220, 130, 50, 40; a started case finishes):

- ``grid``: the cases of ``tests/test_kernels_pallas_mosaic_gpu.py`` (``EXTREME_*``:
  patterns, magnitudes per dtype, one key / seven / 128 masked to 1, 2, 3, 7, every
  head_dim bucket, causal and not) plus ``random`` (normal inputs) and, in bf16, 3e38
  (logits past float32), for ``mosaic_before`` and ``mosaic`` with their registered
  switches; one JSON line per case in ``OUT/grid.jsonl``.
- ``perf``: both kernels with the committed table's tiling on the benchmark rows
  (d128 bf16/f16, d64 and d256 bf16; S 4096 x B4 and 16384 x B1; H16; full and
  causal), two interleaved passes, median of 7 repeats each: ``OUT/perf.json``.
- ``others``: cudnn, xla, naive and pallas_gpu on the grid's cases at one key and at 128 masked
  (non-causal): ``OUT/grid.jsonl`` as well.
- ``switches``: each registered switch by itself and all off at its head_dim
  (``extreme_variants``), both kernels, bf16 and f16, one key: ``OUT/grid.jsonl``.

``OUT/summary.json``: per implementation, dtype and head_dim, the cases, the failures
(non-finite or over ``poisoned.TOLERANCE``), non-finite outputs and the largest relative
error (finite-logit magnitudes only). Needs JAX with CUDA, numpy, pydantic, pytest.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import api  # noqa: E402
from kernels import pallas_mosaic_gpu as mosaic  # noqa: E402
from kernels.reference import attention_reference, relative_error  # noqa: E402
from kernels.selection import measured_config  # noqa: E402
from kernels.shapes import AttentionShape  # noqa: E402
from kernels.shapes import random_inputs as shape_inputs  # noqa: E402
from kernels.timing import time_call  # noqa: E402
from tests import test_kernels_pallas_mosaic_gpu as mt  # noqa: E402
from tests.test_kernels_poisoned import TOLERANCE  # noqa: E402

BEYOND_FLOAT32_LOGITS = {"bfloat16": (3e38,), "float16": ()}
"""Magnitudes whose logits overflow float32 (the contract's accumulator): recorded, not
counted as failures of a kernel."""


def _kernels(before_path: str | None) -> dict:
    out = {"mosaic": mosaic.pallas_mosaic_gpu_attention}
    if before_path:
        spec = importlib.util.spec_from_file_location("kg_mosaic_before", before_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        out = {"mosaic_before": module.pallas_mosaic_gpu_attention, **out}
    return out


def _call(impl: str, kernels: dict, causal: bool, scale: float, variant=None):
    if impl in kernels:
        return functools.partial(kernels[impl], causal=causal, scale=scale, q_lengths=None,
                                 variant=variant)
    return functools.partial(api.attention, causal=causal, scale=scale, implementation=impl)


def _cases(dtype: str, head_dim: int, kv_len: int):
    for pattern in (*mt.EXTREME_PATTERNS, "random"):
        if pattern == "random":
            rng = np.random.default_rng(head_dim + kv_len)
            shapes = ((4, 128, 2, head_dim), (4, kv_len, 1, head_dim), (4, kv_len, 1, head_dim))
            yield pattern, 1.0, tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)
            continue
        for x in (*mt.EXTREME_MAGNITUDES[dtype], *BEYOND_FLOAT32_LOGITS[dtype]):
            yield pattern, x, mt.extreme_inputs(pattern, x, dtype, head_dim, kv_len)


def run_config(write, impl, kernels, dtype, head_dim, causal, kv_len, kv_lengths,
               variant=None, label="registered"):
    scale = head_dim ** -0.5
    kl = None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32)
    base = dict(impl=impl, dtype=dtype, head_dim=head_dim, causal=causal, kv_len=kv_len,
                kv_lengths=kv_lengths, variant=label)
    try:
        fn = jax.jit(functools.partial(_call(impl, kernels, causal, scale, variant),
                                       kv_lengths=kl))
        t0 = time.perf_counter()
        for pattern, x, (q, k, v) in _cases(dtype, head_dim, kv_len):
            out = np.asarray(fn(q, k, v).astype(jnp.float32), np.float64)
            ref = attention_reference(q, k, v, causal=causal, scale=scale,
                                      kv_lengths=kv_lengths)
            bad = int(np.sum(~np.isfinite(out)))
            err = None if bad else float(relative_error(out, ref))
            zero_rows = int(np.sum(np.all(out == 0.0, axis=-1) & np.any(ref != 0.0, axis=-1)))
            write(dict(base, pattern=pattern, x=x, nonfinite=bad, size=int(out.size),
                       rel_err=err, zero_rows=zero_rows,
                       ref_finite=bool(np.all(np.isfinite(ref))),
                       beyond_float32=x in BEYOND_FLOAT32_LOGITS[dtype],
                       ok=bool(not bad and err is not None and err < TOLERANCE[dtype])))
        write(dict(base, pattern="_config", seconds=round(time.perf_counter() - t0, 2)))
    except Exception as err:  # noqa: BLE001 - recorded, the grid goes on
        write(dict(base, pattern="_error", error=f"{type(err).__name__}: {err}"[:600],
                   trace=traceback.format_exc()[-1500:]))


def perf(out_dir: Path, kernels: dict, deadline: float) -> None:
    rows = []
    shapes = [(dt, 128, b, s, c) for dt in ("bfloat16", "float16")
              for b, s in ((4, 4096), (1, 16384)) for c in (False, True)]
    shapes += [("bfloat16", d, b, s, c) for d in (64, 256)
                for b, s in ((4, 4096), (1, 16384)) for c in (False, True)]
    for dtype, d, batch, seq, causal in shapes:
        if time.time() > deadline:
            rows.append(dict(dtype=dtype, head_dim=d, batch=batch, seq=seq, causal=causal,
                             skipped="budget"))
            continue
        shape = AttentionShape(dtype=dtype, batch=batch, q_len=seq, kv_len=seq, num_heads=16,
                               num_kv_heads=16, head_dim=d, causal=causal)
        config = measured_config(shape, "pallas_mosaic_gpu")
        q, k, v = shape_inputs(shape, seed=11)
        flops = 4.0 * batch * 16 * seq * seq * d * (0.5 if causal else 1.0)
        row = dict(dtype=dtype, head_dim=d, batch=batch, seq=seq, causal=causal,
                   config=config.model_dump() if config else None, passes={})
        fns = {name: jax.jit(functools.partial(kernels[name], causal=causal, scale=d ** -0.5,
                                               q_lengths=None, kv_lengths=None, config=config))
               for name in kernels}
        outs = {name: fn(q, k, v) for name, fn in fns.items()}  # compile
        if len(outs) == 2:
            a, b = (np.asarray(o.astype(jnp.float32)) for o in outs.values())
            row["max_abs_diff_before_after"] = float(np.max(np.abs(a - b)))
        order = list(fns)
        for p in range(2):
            for name in (order if p == 0 else order[::-1]):
                t = time_call(fns[name], (q, k, v), repeats=7)
                row["passes"].setdefault(name, []).append(t.median_s)
        for name, meds in row["passes"].items():
            row[f"{name}_tflops"] = round(flops / min(meds) / 1e12, 1)
        if "mosaic_before" in row["passes"]:
            row["after_over_before"] = round(row["mosaic_tflops"] / row["mosaic_before_tflops"], 4)
        rows.append(row)
        print("perf", json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
        (out_dir / "perf.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "perf.json").write_text(json.dumps(rows, indent=1))


def summarise(out_dir: Path) -> dict:
    summary: dict = {}
    for line in (out_dir / "grid.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = f"{r['impl']} {r['dtype']} d{r['head_dim']} {r['variant']}"
        s = summary.setdefault(key, dict(cases=0, failed=0, nonfinite=0, zero_rows=0,
                                         max_rel_err=0.0, random_max_rel_err=0.0,
                                         beyond_float32_nonfinite=0, errors=[]))
        if r["pattern"] == "_error":
            s["errors"].append(r["error"][:200])
        if r["pattern"].startswith("_"):
            continue
        if r["beyond_float32"]:
            s["beyond_float32_nonfinite"] += r["nonfinite"]
            continue
        if r["pattern"] == "random":
            s["random_max_rel_err"] = max(s["random_max_rel_err"],
                                          math.inf if r["rel_err"] is None else r["rel_err"])
            continue
        s["cases"] += 1
        s["failed"] += not r["ok"]
        s["nonfinite"] += r["nonfinite"]
        s["zero_rows"] += r["zero_rows"]
        s["max_rel_err"] = max(s["max_rel_err"],
                               r["rel_err"] if r["rel_err"] is not None else math.inf)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--before")
    parser.add_argument("--parts", default="grid,perf,others,switches")
    parser.add_argument("--budgets", default="220,130,50,40",
                        help="seconds for grid, perf, others, switches (each from its start)")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    budgets = dict(zip(("grid", "perf", "others", "switches"),
                       (float(b) for b in args.budgets.split(",")), strict=True))

    def part_deadline(name):
        return time.time() + budgets[name]
    kernels = _kernels(args.before)
    grid = (out_dir / "grid.jsonl").open("a")

    def write(record):
        grid.write(json.dumps(record) + "\n")
        grid.flush()
        if not record["pattern"].startswith("_") and not record["ok"] \
                and not record["beyond_float32"]:
            print("FAIL", json.dumps(record), flush=True)
        if record["pattern"] == "_error":
            print("ERROR", json.dumps(record)[:800], flush=True)

    print("device", jax.devices(), jax.__version__, flush=True)
    parts = args.parts.split(",")
    # The reported case first: bf16, head_dim 64, one key.
    order = [("bfloat16", 64, False, 0)]
    # Then one key, 128 masked to 1-7, seven keys; each over both dtypes and every bucket.
    order += [(dt, d, c, i) for i in (0, 2, 1) for dt in ("bfloat16", "float16")
              for d in mt.EXTREME_HEAD_DIMS for c in (False, True)
              if (dt, d, c, i) != ("bfloat16", 64, False, 0)]
    if "grid" in parts:
        deadline = part_deadline("grid")
        for dtype, d, causal, i in order:
            if time.time() > deadline:
                print("grid: budget spent", flush=True)
                break
            kv_len, kv_lengths = mt.EXTREME_KEYS[i]
            for impl in kernels:
                run_config(write, impl, kernels, dtype, d, causal, kv_len, kv_lengths)
        summarise(out_dir)
    if "perf" in parts and "mosaic_before" in kernels:
        perf(out_dir, kernels, part_deadline("perf"))
    if "others" in parts:
        deadline = part_deadline("others")
        for dtype, d, causal, i in order:
            if causal or i == 1:
                continue
            if time.time() > deadline:
                print("others: budget spent", flush=True)
                break
            kv_len, kv_lengths = mt.EXTREME_KEYS[i]
            for impl in ("cudnn", "xla", "naive", "pallas_gpu"):
                run_config(write, impl, kernels, dtype, d, causal, kv_len, kv_lengths)
        summarise(out_dir)
    if "switches" in parts:
        deadline = part_deadline("switches")
        for dtype in ("bfloat16", "float16"):
            for variant, d in mt.extreme_variants():
                if time.time() > deadline:
                    break
                for impl in kernels:
                    run_config(write, impl, kernels, dtype, d, False, *mt.EXTREME_KEYS[0],
                               variant=variant, label=variant.label())
        summarise(out_dir)
    grid.close()
    for key, s in summarise(out_dir).items():
        print(f"{key:52s} cases {s['cases']:3d} failed {s['failed']:3d} "
              f"nonfinite {s['nonfinite']:7d} zero_rows {s['zero_rows']:5d} "
              f"max_rel_err {s['max_rel_err']:.3g} random {s['random_max_rel_err']:.3g} "
              f"beyond_f32_nonfinite {s['beyond_float32_nonfinite']} "
              f"errors {len(s['errors'])}", flush=True)


if __name__ == "__main__":
    main()
