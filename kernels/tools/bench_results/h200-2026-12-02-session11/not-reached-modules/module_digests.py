"""Module digests (Mosaic GPU text, no locations) of every pallas_mosaic_gpu call that the
gpu tests not reached in session 11 make, lowered for CUDA with the H200's 132 SMs."""
import functools, hashlib, sys
import jax, jax.numpy as jnp
import jax.experimental.mosaic.gpu.core as mgpu_core
from kernels.config import BlockSizes
from kernels.shapes import AttentionShape
from kernels.tools import autotune
from kernels.tools.bench import select_pallas_config
from kernels.pallas_mosaic_gpu import pallas_mosaic_gpu_attention
sys.path.insert(0, ".")
texts = []
serde = mgpu_core._run_serde_pass
def capture(module, *a, **kw):
    if kw.get("serialize"):
        texts.append(module.operation.get_asm(enable_debug_info=False))
    return serde(module, *a, **kw)
mgpu_core._run_serde_pass = capture

def digest(name, batch, q_len, kv_len, heads, kv_heads, d, dtype, causal, lengths=False, config=None, num_sms=132):
    dt = getattr(jnp, dtype)
    q = jax.ShapeDtypeStruct((batch, q_len, heads, d), dt)
    k = jax.ShapeDtypeStruct((batch, kv_len, kv_heads, d), dt)
    n = jax.ShapeDtypeStruct((batch,), jnp.int32)
    def fn(q, k, v, ql, kl):
        return pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=d ** -0.5,
            q_lengths=ql if lengths else None, kv_lengths=kl if lengths else None,
            config=config, num_sms=num_sms)
    texts.clear()
    jax.jit(fn).trace(q, k, k, n, n).lower(lowering_platforms=("cuda",))
    assert len(texts) == 1
    print(name, hashlib.sha256(texts[0].encode()).hexdigest()[:16], flush=True)

for dtype in ("bfloat16", "float16"):
    for d in (64, 128):
        for causal in (False, True):
            for kvh in (8, 2):
                for padded in (False, True):
                    digest(f"sweep-{dtype}-d{d}-{'causal' if causal else 'full'}-kv{kvh}-{'padded' if padded else 'dense'}",
                           2, 700 if padded else 1024, 900 if padded else 1024, 8, kvh, d, dtype, causal, lengths=padded)
digest("long-131072", 1, 131072, 131072, 16, 16, 128, "bfloat16", True)
for dtype in ("bfloat16", "float16"):
    for causal in (False, True):
        shape = AttentionShape(dtype=dtype, batch=4, q_len=4096, kv_len=4096, num_heads=16, num_kv_heads=16, head_dim=128, causal=causal)
        digest(f"bench-{dtype}-{causal}", 4, 4096, 4096, 16, 16, 128, dtype, causal,
               config=select_pallas_config(shape, implementation="pallas_mosaic_gpu"))
for dtype in ("bfloat16", "float16"):
    for causal in (False, True):
        for seq in (4096, 1000):
            digest(f"kv192-{dtype}-{causal}-{seq}", 2, seq, seq, 4, 2, 128, dtype, causal,
                   config=BlockSizes(block_q=64, block_kv=192, num_stages=2))
for config in autotune.mosaic_candidate_configs(128):
    for sms in (132, 5):
        digest(f"tiling-{config}-sms{sms}".replace(" ", "_"), 1, 1536, 1536, 4, 2, 128, "bfloat16", True, config=config, num_sms=sms)
for d in (96, 256):
    digest(f"widest-d{d}", 1, 777, 777, 4, 4, d, "float16", True)
