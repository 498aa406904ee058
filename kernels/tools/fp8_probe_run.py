"""``python3 -m kernels.tools.fp8_probe_run [--out DIR] [--seed N]``: the e4m3 ``wgmma``
probe (``kernels.fp8_probe``) on a GPU, on fresh random inputs, against float64.

For each shape: the largest absolute error of ``e4m3_matmul`` against the float64
product of the *e4m3-rounded* inputs (the kernel's own error), the two bounds of that
error (per element, relative to ``Σ|a·b|``: float32 accumulation ``K · 2⁻²⁴``, and the
``K · 2⁻¹³`` of an accumulator that keeps about 14 bits, see ``kernels.fp8_probe``), the
largest error against the float64 product of the unrounded inputs (what quantisation
costs; reported, not bounded), and the same for the score tile ``e4m3_scores``. Then a
rough rate: the e4m3 kernel, XLA's own float8 dot and a bfloat16 ``jnp.dot`` of one
large shape, in TFLOP/s (median of timed calls, wall clock around a device sync).

Writes ``fp8_probe.json`` under ``--out`` (default ``$OUT``, else the current folder)
and prints a table last. Exit status 1 when an error exceeds its asserted bound.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from kernels import fp8_probe

FP32_UNIT = 2.0 ** -24
"""Unit roundoff of float32 accumulation."""
REDUCED_UNIT = 2.0 ** -13
"""Unit roundoff of an accumulator keeping about 14 significant bits (Hopper FP8 wgmma,
as reported); the asserted bound."""
SCALE_ROUNDING = 2.0 ** -22
"""Relative error of the float32 scaling ``acc · (scale_q · scale_k · sm_scale)``: three
float32 roundings, each at most 2⁻²⁴, bounded by 2⁻²²."""
MATMUL_SHAPES = ((128, 128, 128), (256, 384, 1024), (512, 512, 4096))
SCORE_SHAPES = ((128, 256, 128), (256, 512, 256))
RATE_SHAPE = (8192, 8192, 8192)


def rounded(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest e4m3 value (a NumPy array of dtype ``float8_e4m3fn``,
    same shape). ``|x|`` must stay under 448, e4m3's largest finite value: this does not
    saturate."""
    return np.asarray(jnp.asarray(x, jnp.float32).astype(fp8_probe.E4M3))


def matmul_accuracy(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> dict:
    """Errors of ``out ≈ a bᵀ`` (``a`` ``(M, K)``, ``b`` ``(N, K)``, float64 values of the
    e4m3 inputs the kernel saw): the largest absolute error, the largest ratio of each
    element's error to its float32 and reduced-precision bounds (≤ 1 is within), and the
    largest error relative to ``Σ|a·b|`` in bits (``-log2``)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    k = a.shape[1]
    ref = a64 @ b64.T
    mass = np.abs(a64) @ np.abs(b64).T
    err = np.abs(out.astype(np.float64) - ref)
    floor = np.finfo(np.float64).tiny
    return {
        "max_abs_error": float(err.max()),
        "max_abs_ref": float(np.abs(ref).max()),
        "fp32_bound_ratio": float((err / np.maximum(k * FP32_UNIT * mass, floor)).max()),
        "reduced_bound_ratio": float((err / np.maximum(k * REDUCED_UNIT * mass, floor)).max()),
        "error_bits_below_mass": float(-np.log2(max((err / np.maximum(mass, floor)).max(),
                                                    2.0 ** -60))),
        "finite": bool(np.isfinite(out).all()),
    }


def run_matmul(m: int, n: int, k: int, rng: np.random.Generator) -> dict:
    """One shape: standard normal inputs, rounded to e4m3, through ``e4m3_matmul``."""
    a_true, b_true = rng.standard_normal((m, k)), rng.standard_normal((n, k))
    a8, b8 = rounded(a_true), rounded(b_true)
    out = np.asarray(fp8_probe.e4m3_matmul(jnp.asarray(a8), jnp.asarray(b8)))
    row = {"kind": "matmul", "shape": [m, n, k], **matmul_accuracy(a8, b8, out)}
    row["max_abs_error_vs_unrounded"] = float(np.abs(out - a_true @ b_true.T).max())
    return row


def run_scores(lq: int, lk: int, d: int, rng: np.random.Generator) -> dict:
    """One score tile: queries and keys of standard deviation 3 (outside e4m3's unit
    range, so the scales matter), quantised per tensor, through ``e4m3_scores``."""
    q_true, k_true = 3 * rng.standard_normal((lq, d)), 3 * rng.standard_normal((lk, d))
    q8, sq = fp8_probe.quantize_e4m3(jnp.asarray(q_true, jnp.float32))
    k8, sk = fp8_probe.quantize_e4m3(jnp.asarray(k_true, jnp.float32))
    sm = d ** -0.5
    out = np.asarray(fp8_probe.e4m3_scores(q8, k8, sq, sk, sm_scale=sm), np.float64)
    alpha = float(sq) * float(sk) * sm
    q64, k64 = np.asarray(q8).astype(np.float64), np.asarray(k8).astype(np.float64)
    ref = (q64 @ k64.T) * alpha
    mass = alpha * d * (np.abs(q64) @ np.abs(k64).T)
    err, scaling = np.abs(out - ref), SCALE_ROUNDING * np.abs(ref)
    bound = mass * REDUCED_UNIT + scaling
    bound32 = mass * FP32_UNIT + scaling
    return {"kind": "scores", "shape": [lq, lk, d], "max_abs_error": float(err.max()),
            "max_abs_ref": float(np.abs(ref).max()),
            "fp32_bound_ratio": float((err / bound32).max()),
            "reduced_bound_ratio": float((err / bound).max()),
            "max_abs_error_vs_unrounded": float(np.abs(out - (q_true @ k_true.T) * sm).max()),
            "finite": bool(np.isfinite(out).all())}


def median_seconds(fn, *args, repeats: int = 20) -> float:
    """Median wall-clock seconds of one call, after two warm-up calls; each sample is
    one call between device syncs."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rates(m: int, n: int, k: int, rng: np.random.Generator) -> dict:
    """TFLOP/s (``2 M N K`` over the median time) of the e4m3 kernel, XLA's float8 dot
    (float32 out) and a bfloat16 dot, all ``A Bᵀ`` on the same random values."""
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    a8, b8 = a.astype(fp8_probe.E4M3), b.astype(fp8_probe.E4M3)
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    del a, b
    dims = (((1,), (1,)), ((), ()))
    candidates = {
        "e4m3_wgmma_probe": (jax.jit(fp8_probe.e4m3_matmul), a8, b8),
        "xla_e4m3_dot": (jax.jit(lambda x, y: jax.lax.dot_general(
            x, y, dims, preferred_element_type=jnp.float32)), a8, b8),
        "xla_bf16_dot": (jax.jit(lambda x, y: jax.lax.dot_general(x, y, dims)), a16, b16),
    }
    flop = 2.0 * m * n * k
    out = {"shape": [m, n, k]}
    for name, (fn, x, y) in candidates.items():
        try:
            seconds = median_seconds(fn, x, y)
            out[name] = {"median_ms": seconds * 1e3, "tflops": flop / seconds / 1e12}
        except Exception as exc:  # a comparator that does not compile is reported, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the probe; print the table; write ``fp8_probe.json``. Returns the exit status:
    0 when every error is within its asserted (reduced-precision) bound, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-rates", action="store_true")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    print(f"seed {seed}; jax {jax.__version__}; devices {jax.devices()}", flush=True)
    rng = np.random.default_rng(seed)
    rows = [run_matmul(*s, rng) for s in MATMUL_SHAPES]
    rows += [run_scores(*s, rng) for s in SCORE_SHAPES]
    result = {"seed": seed, "jax": jax.__version__, "device": str(jax.devices()[0]),
              "accuracy": rows}
    if not args.no_rates:
        result["rates"] = rates(*RATE_SHAPE, rng)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fp8_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| kind | M, N, K | max abs err (vs float64 of e4m3 inputs) | / fp32 bound "
          "| / 14-bit bound | bits below Σ|ab| | max abs err vs unrounded | max |ref| |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['shape']} | {r['max_abs_error']:.3e} "
              f"| {r.get('fp32_bound_ratio', float('nan')):.3g} | {r['reduced_bound_ratio']:.3g} "
              f"| {r.get('error_bits_below_mass', float('nan')):.1f} "
              f"| {r['max_abs_error_vs_unrounded']:.3e} | {r['max_abs_ref']:.3g} |")
    for name, value in result.get("rates", {}).items():
        print(f"rate {name}: {value}")
    ok = all(r["finite"] and r["reduced_bound_ratio"] <= 1.0 for r in rows)
    print("within the asserted bound" if ok else "AN ERROR EXCEEDS ITS BOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
