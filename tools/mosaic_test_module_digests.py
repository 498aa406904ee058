"""Which Mosaic GPU modules the `gpu` tests of ``pallas_mosaic_gpu`` would run, checked on
the CPU host: every ``pallas_mosaic_gpu`` call those tests make, lowered for CUDA with the
H200's 132 SMs, printed as its name and the first 16 hex digits of the sha256 of the
module's text (no locations).

The calls are those of the tests of ``tests/test_kernels_pallas_mosaic_gpu.py`` that a GPU
call once did not reach (the contract sweep, causal 131072, the benchmark shapes, the
64 x 192 tile, every candidate tiling at 132 and 5 SMs, the padded and widest head_dims).
Run at two commits and compared, it says which of those tests would run a module that has
not run in that test on a GPU. The same module text under the CPU host's JAX is evidence,
not proof, of the same program under the device's JAX.

Run from a checkout's root (the checkout whose kernels are lowered)::

    JAX_PLATFORMS=cpu PYTHONPATH=. python tools/mosaic_test_module_digests.py > A.txt
    JAX_PLATFORMS=cpu PYTHONPATH=. python tools/mosaic_test_module_digests.py compare A.txt B.txt

``compare`` prints ``same`` or ``DIFFERENT`` and the call's name, one line per call, sorted.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from kernels.pallas_mosaic_gpu import (
    MosaicConfig,
    PallasMosaicGpuKernel,
    pallas_mosaic_gpu_attention,
)
from kernels.selection import measured_config
from kernels.shapes import AttentionShape
from tests.kernels_helpers import mosaic_module_texts


def digest(name, batch, q_len, kv_len, heads, kv_heads, d, dtype, causal, *, lengths=False,
           config=None, num_sms=132):
    """Print ``name`` and the first 16 hex digits of the module's sha256."""
    dt = getattr(jnp, dtype)
    q = jax.ShapeDtypeStruct((batch, q_len, heads, d), dt)
    k = jax.ShapeDtypeStruct((batch, kv_len, kv_heads, d), dt)
    n = jax.ShapeDtypeStruct((batch,), jnp.int32)

    def fn(q, k, v, ql, kl):
        return pallas_mosaic_gpu_attention(
            q, k, v, causal=causal, scale=d ** -0.5, q_lengths=ql if lengths else None,
            kv_lengths=kl if lengths else None, config=config, num_sms=num_sms)

    with pytest.MonkeyPatch.context() as monkeypatch:
        _, modules = mosaic_module_texts(monkeypatch, fn, q, k, k, n, n)
    # Several modules where the call launches several kernels (checked_fma_exponent).
    print(name, hashlib.sha256("\n".join(modules).encode()).hexdigest()[:16], flush=True)


def digests() -> None:
    """Print the digest of every call, in the tests' order."""
    # test_gpu_contract_sweep_matches_float64_within_twice_naive
    for dtype in ("bfloat16", "float16"):
        for d in (64, 128):
            for causal in (False, True):
                for kvh in (8, 2):
                    for padded in (False, True):
                        digest(f"sweep-{dtype}-d{d}-{'causal' if causal else 'full'}-kv{kvh}-"
                               f"{'padded' if padded else 'dense'}",
                               2, 700 if padded else 1024, 900 if padded else 1024, 8, kvh, d,
                               dtype, causal, lengths=padded)
    # test_gpu_long_causal_context_131072_on_sampled_rows
    digest("long-131072", 1, 131072, 131072, 16, 16, 128, "bfloat16", True)
    # test_gpu_benchmark_shapes_are_correct (the tiling the committed table selects)
    for dtype in ("bfloat16", "float16"):
        for causal in (False, True):
            shape = AttentionShape(dtype=dtype, batch=4, q_len=4096, kv_len=4096, num_heads=16,
                                   num_kv_heads=16, head_dim=128, causal=causal)
            digest(f"bench-{dtype}-{causal}", 4, 4096, 4096, 16, 16, 128, dtype, causal,
                   config=measured_config(shape, "pallas_mosaic_gpu"))
    # test_gpu_the_64x192_tile_reads_k_and_v_unpadded
    for dtype in ("bfloat16", "float16"):
        for causal in (False, True):
            for seq in (4096, 1000):
                digest(f"kv192-{dtype}-{causal}-{seq}", 2, seq, seq, 4, 2, 128, dtype, causal,
                       config=MosaicConfig(block_q=64, block_kv=192, kv_ring_depth=2))
    # test_gpu_every_candidate_tiling_and_a_small_persistent_grid_are_correct
    shape = AttentionShape(dtype="bfloat16", batch=1, q_len=4096, kv_len=4096, num_heads=16,
                           num_kv_heads=16, head_dim=128, causal=False)
    for config in PallasMosaicGpuKernel().candidate_configs(shape):
        for sms in (132, 5):
            digest(f"tiling-{config}-sms{sms}".replace(" ", "_"), 1, 1536, 1536, 4, 2, 128,
                   "bfloat16", True, config=config, num_sms=sms)
    # test_gpu_padded_and_widest_head_dims
    for d in (96, 256):
        digest(f"widest-d{d}", 1, 777, 777, 4, 4, d, "float16", True)


def compare(a: Path, b: Path) -> str:
    """``same`` or ``DIFFERENT`` per call of two digest listings, sorted."""
    first = dict(line.split() for line in a.read_text().splitlines())
    second = dict(line.split() for line in b.read_text().splitlines())
    if first.keys() != second.keys():
        raise SystemExit(f"the two listings name different calls: "
                         f"{sorted(first.keys() ^ second.keys())}")
    return "".join(sorted(f"{'same' if first[n] == second[n] else 'DIFFERENT':9s} {n}\n"
                          for n in first))


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        print(compare(Path(sys.argv[2]), Path(sys.argv[3])), end="")
    elif len(sys.argv) == 1:
        digests()
    else:
        raise SystemExit(__doc__)
