"""``python3 -m kernels.tools.fp8_attention_run [--out DIR] [--seed N] [--head-dim D] [--quick]``: the e4m3
attention kernel (``kernels.fp8_attention``) on a GPU, on fresh random inputs, against
float64 and against its own arithmetic emulated in float64, then timed beside the bf16
peers in one process.

Accuracy, per case (bf16 inputs, ``--head-dim``: the kernel's 128 or 256):

- ``vs_emulation_rms``: the RMS error against a float64 emulation of the kernel's data
  path (the same per-head e4m3 quantisation of q, k, v, the online softmax over key
  blocks with ``P · 256`` rounded to e4m3, float64 everywhere else), relative to the
  emulation's RMS. What is left is the kernel's own arithmetic (the e4m3 ``wgmma``'s
  reduced accumulation, float32 softmax, rounding ties of ``P``): small against
  quantisation, bounded by :data:`EMULATION_BOUND`. ``vs_emulation``: the largest error
  relative to the largest output (reported, not bounded: one tie of ``P`` rounded the
  other way moves an output by up to 2⁻⁴ of one weight).
- ``vs_float64_rms`` and ``vs_float64``: against exact attention of the bf16 inputs, the
  same two ways: what FP8 costs (reported; the gate's registration judges it).
- ``bf16_vs_float64``: ``pallas_mosaic_gpu``'s largest error on the same inputs relative
  to the largest output, for scale.

Rate: TFLOP/s (``4 · B · H · Lq · Lk · D``, halved with ``causal``) of ``fp8`` (the whole
call: quantisation, V's transpose and the kernel), ``pallas_mosaic_gpu``, ``cudnn`` and
``fa3`` where installed, median of timed calls (``kernels.timing``). Writes
``fp8_attention.json`` under ``--out`` (default ``$OUT``, else the current folder), prints a
table last; exit 1 when a case exceeds its emulation bound or is not finite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from kernels import fp8_attention as fp8
from kernels.contract import visibility_mask
from kernels.reference import attention_reference
from kernels.tools.fp8_probe_run import rounded

EMULATION_BOUND = 2.0 ** -6
"""RMS error against the float64 emulation, relative to the emulation's RMS: the
kernel's float32 softmax, its ``P`` rounded from float32 (a tie may round the other way:
one e4m3 step, 2⁻⁴ of one ``p``, on a handful of entries) and its e4m3 accumulator
(about 14 bits, ``kernels.fp8_probe``)."""
ACCURACY_CASES = (  # (batch, q_len, kv_len, heads, kv_heads, causal, kv_length)
    (1, 512, 512, 4, 4, False, None),
    (2, 1024, 1024, 8, 2, False, None),
    (1, 1024, 1024, 4, 4, True, None),
    (2, 512, 1024, 4, 4, False, 700),
)
RATE_SHAPES = ((1, 4096, 16, False), (1, 16384, 16, False), (1, 4096, 16, True),
               (1, 16384, 16, True))


def _e4m3(x: np.ndarray) -> np.ndarray:
    return rounded(x).astype(np.float64)


def _e4m3_values(x8: jax.Array) -> np.ndarray:
    """An e4m3 array's values, float64."""
    return np.asarray(x8.astype(jnp.float32), np.float64)


def reference(q, k, v, causal: bool, kv_length: int | None, *, emulate: bool,
              scale: float | None = None) -> np.ndarray:
    """float64 attention ``(B, Lq, H, D)``: without ``emulate`` exact
    (``kernels.reference.attention_reference``); with it through the kernel's e4m3 data
    path (per-head quantisation of q, k, v; the online softmax over key blocks of
    ``BLOCK_KV`` with ``P · 256`` rounded to e4m3 relative to the running max; the output
    clipped to V's range). ``kv_length``: every batch row's, or None. ``scale``: the logit
    scale, default ``1 / sqrt(head_dim)``."""
    lengths = None if kv_length is None else np.full(q.shape[0], kv_length, np.int32)
    if not emulate:
        return attention_reference(q, k, v, causal=causal, scale=scale, kv_lengths=lengths)
    d, group = q.shape[-1], q.shape[2] // k.shape[2]

    def quant(x):
        # the kernel's own quantiser (tested by itself against exact rounding): an input
        # at an e4m3 rounding tie goes either way with the float32 steps taken, and a
        # few hundred such flips in q and k moved this emulation 2 % off the kernel
        b, seq, h, _ = x.shape
        x8, amax = fp8.quantize_per_head(x)
        amax = np.asarray(amax, np.float64).reshape(b, h, 1, 1)
        head_major = _e4m3_values(x8).reshape(b, h, seq, d) * amax / fp8.E4M3_MAX
        return np.transpose(head_major, (0, 2, 1, 3)), amax

    (q, _), (k, _), (v, v_amax) = quant(q), quant(k), quant(v)
    v_amax = np.repeat(v_amax, group, axis=1)
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (1 / math.sqrt(d) if scale is None else scale)
    lq, lk = s.shape[-2:]
    visible = np.asarray(visibility_mask(lq, lk, causal=causal, kv_lengths=lengths))
    s = np.where(visible, s, -np.inf)
    # the kernel's online softmax, block by block: P is rounded relative to the running
    # max of the blocks seen so far, as the kernel rounds it
    m = np.full(s.shape[:-1] + (1,), -np.inf)
    row_sum = np.zeros_like(m)
    acc = np.zeros(s.shape[:-1] + (v.shape[-1],))
    for j in range(0, lk, fp8.BLOCK_KV):
        sj = s[..., j:j + fp8.BLOCK_KV]
        m_new = np.maximum(m, sj.max(-1, keepdims=True))
        m_use = np.where(np.isinf(m_new), 0.0, m_new)
        alpha = np.exp(m - m_use)
        p = np.exp(sj - m_use)
        row_sum = row_sum * alpha + p.sum(-1, keepdims=True)
        p8 = _e4m3(p * fp8.P_SCALE) / fp8.P_SCALE
        acc = acc * alpha + np.einsum("bhqk,bkhd->bhqd", p8, v[:, j:j + fp8.BLOCK_KV])
        m = m_new
    out = np.where(row_sum > 0, acc / np.where(row_sum > 0, row_sum, 1.0), 0.0)
    out = np.clip(out, -v_amax, v_amax)
    return np.transpose(out, (0, 2, 1, 3))


def accuracy(case, rng, interpret: bool, head_dim: int = 128) -> dict:
    """One accuracy case's figures at ``head_dim`` (see the module docstring)."""
    b, lq, lk, h, hk, causal, kvl = case
    shape_q, shape_kv = (b, lq, h, head_dim), (b, lk, hk, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
               for s in (shape_q, shape_kv, shape_kv))
    lengths = None if kvl is None else jnp.full((b,), kvl, jnp.int32)
    out = np.asarray(fp8.fp8_attention(q, k, v, causal=causal, kv_lengths=lengths,
                                       interpret=interpret), np.float64)
    exact = reference(q, k, v, causal, kvl, emulate=False)
    emulated = reference(q, k, v, causal, kvl, emulate=True)
    top = np.abs(exact).max()

    def rms(x):
        return float(np.sqrt(np.mean(x ** 2)))

    row = {"case": f"B{b} Lq{lq} Lk{lk} H{h}/{hk} d{head_dim}{' causal' if causal else ''}"
                   f"{'' if kvl is None else f' kv_len {kvl}'}",
           "finite": bool(np.isfinite(out).all()),
           "vs_emulation": float(np.abs(out - emulated).max() / top),
           "vs_emulation_rms": rms(out - emulated) / rms(emulated),
           "vs_float64_rms": rms(out - exact) / rms(exact),
           "vs_float64": float(np.abs(out - exact).max() / top),
           "emulation_vs_float64": float(np.abs(emulated - exact).max() / top)}
    if not interpret:
        from kernels.pallas_mosaic_gpu import pallas_mosaic_gpu_attention

        ours = np.asarray(pallas_mosaic_gpu_attention(
            q, k, v, causal=causal, scale=head_dim ** -0.5, q_lengths=None, kv_lengths=lengths),
            np.float64)
        row["bf16_vs_float64"] = float(np.abs(ours - exact).max() / top)
    row["ok"] = row["finite"] and row["vs_emulation_rms"] <= EMULATION_BOUND
    return row


def rates(rng, head_dim: int = 128) -> list[dict]:
    """TFLOP/s of each peer at :data:`RATE_SHAPES` and ``head_dim`` (GPU only; a peer that
    cannot serve it, FA3 past 128, gets its refusal as the row's entry)."""
    scale = head_dim ** -0.5
    from kernels.timing import time_call

    peers = {"fp8": lambda q, k, v, c: fp8.fp8_attention(q, k, v, causal=c)}
    from kernels.pallas_mosaic_gpu import pallas_mosaic_gpu_attention

    peers["pallas_mosaic_gpu"] = lambda q, k, v, c: pallas_mosaic_gpu_attention(
        q, k, v, causal=c, scale=scale, q_lengths=None, kv_lengths=None)
    peers["cudnn"] = lambda q, k, v, c: jax.nn.dot_product_attention(
        q, k, v, is_causal=c, implementation="cudnn")
    try:
        from kernels.fa3 import fa3_attention  # noqa: F401 (the optional extra)

        peers["fa3"] = lambda q, k, v, c: fa3_attention(
            q, k, v, causal=c, scale=scale, q_lengths=None, kv_lengths=None)
    except Exception as err:  # noqa: BLE001 (reported, the rest still timed)
        print(f"fa3 not timed: {err}")
    rows = []
    for b, s, h, causal in RATE_SHAPES:
        q, k, v = (jnp.asarray(rng.standard_normal((b, s, h, head_dim)), jnp.bfloat16)
                   for _ in range(3))
        flops = 4 * b * h * s * s * head_dim / (2 if causal else 1)
        row = {"shape": f"B{b} S{s} H{h} d{head_dim}{' causal' if causal else ''}"}
        for name, fn in peers.items():
            try:
                seconds = time_call(jax.jit(fn, static_argnums=3), (q, k, v, causal)).median_s
                row[name] = flops / seconds / 1e12
            except Exception as err:  # noqa: BLE001 (a peer's failure is a row's entry)
                row[name] = f"failed: {type(err).__name__}: {str(err)[:120]}"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kernels.tools.fp8_attention_run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--head-dim", type=int, choices=fp8.HEAD_DIMS, default=128,
                        help="the kernel's head_dim for every case and rate (default 128)")
    parser.add_argument("--quick", action="store_true",
                        help="the first accuracy case only, in interpret mode on a CPU")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() in ("gpu", "cuda")
    seed = secrets.randbits(32) if args.seed is None else args.seed
    rng = np.random.default_rng(seed)
    cases = ACCURACY_CASES if on_gpu and not args.quick else ACCURACY_CASES[:1]
    result = {"seed": seed, "device": str(jax.devices()[0]), "jax": jax.__version__,
              "head_dim": args.head_dim,
              "accuracy": [accuracy(c, rng, interpret=not on_gpu, head_dim=args.head_dim)
                           for c in cases]}
    if on_gpu and not args.quick:
        result["rates_tflops"] = rates(rng, args.head_dim)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_attention.json").write_text(json.dumps(result, indent=1))
    for row in result["accuracy"]:
        print(f"{row['case']:<34} finite {row['finite']!s:<5} vs emulation rms "
              f"{row['vs_emulation_rms']:.2e} max {row['vs_emulation']:.2e}  vs float64 rms "
              f"{row['vs_float64_rms']:.2e} max {row['vs_float64']:.2e}  (emulation "
              f"{row['emulation_vs_float64']:.2e}, bf16 kernel "
              f"{row.get('bf16_vs_float64', float('nan')):.2e})")
    for row in result.get("rates_tflops", []):
        print("  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in row.items()))
    print(f"seed {seed}")
    return 0 if all(r["ok"] for r in result["accuracy"]) else 1


if __name__ == "__main__":
    sys.exit(main())
