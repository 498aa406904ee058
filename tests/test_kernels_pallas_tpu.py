"""The Pallas TPU kernel itself: tiling rules, skipping, naming, TPU lowering,
memory, races. Numerical accuracy is in ``test_kernels_accuracy.py``."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernels
from kernels import pallas_tpu
from kernels.pallas_tpu import TpuConfig
from tests.kernels_helpers import Case, assert_accurate, random_inputs, reference_for


@pytest.mark.parametrize(("q_len", "kv_len", "head_dim", "config", "expected"), [
    # Short sequences shrink the tile to the rounded-up length instead of padding to 128.
    (1, 1, 32, None, (8, 128, 8, 128, 128)),
    (127, 129, 80, None, (128, 128, 128, 256, 128)),
    (300, 300, 256, TpuConfig(block_q=64, block_kv=256), (64, 256, 320, 512, 256)),
    (20, 1000, 64, TpuConfig(block_q=256, block_kv=512), (24, 512, 24, 1024, 128)),
])
def test_plan_tiling(q_len, kv_len, head_dim, config, expected):
    t = pallas_tpu.plan_tiling(q_len, kv_len, head_dim, config)
    assert (t.block_q, t.block_kv, t.q_len_padded, t.kv_len_padded, t.head_dim_padded) == expected
    assert t.block_q % 8 == 0 and t.block_kv % 128 == 0 and t.head_dim_padded % 128 == 0


def _fetches(q_len, kv_len, *, causal, block_q, block_kv):
    """Simulate the pipeline over one (batch, head): a DMA happens whenever the
    K/V block index differs from the previous step's."""
    n_q, n_kv = -(-q_len // block_q), -(-max(kv_len, 1) // block_kv) + 1
    fetched, prev = [], None
    for i in range(n_q):
        for j in range(n_kv):
            idx = int(pallas_tpu.kv_block_index(i, j, kv_len, causal=causal,
                                                block_q=block_q, block_kv=block_kv))
            if idx != prev:
                fetched.append((i, idx))
            prev = idx
    return fetched


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_len", [0, 1, 200, 512])
def test_skipped_blocks_issue_no_dma(causal, kv_len):
    """Exactly the K/V blocks a query block needs are fetched, each once per
    query block; skipped steps (padding, above the diagonal) fetch nothing."""
    q_len, bq, bkv = 512, 128, 128
    fetched = _fetches(q_len, kv_len, causal=causal, block_q=bq, block_kv=bkv)
    needed = [(i, j) for i in range(q_len // bq) for j in range(-(-kv_len // bkv))
              if not causal or j * bkv <= (i + 1) * bq - 1]
    # A block needed by consecutive steps (end of one query block, start of the
    # next) stays resident: one fetch.
    expected = [n for t, n in enumerate(needed) if t == 0 or n[1] != needed[t - 1][1]]
    if kv_len == 0:
        assert len(fetched) == 1  # the pipeline's mandatory first fetch only
    else:
        assert fetched == expected


def test_skipped_blocks_are_not_computed():
    """NaN-poisoned K/V in blocks that no query can see leave the output finite
    and exact: those blocks are skipped, not computed and masked (a masked
    block would still multiply 0 * NaN in the P.V product)."""
    case = Case("poison", batch=2, q_len=128, kv_len=512, head_dim=128, causal=True,
                kv_lengths=(512, 130))
    q, k, v, _, kl = random_inputs(case, seed=7)
    ref = reference_for(q, k, v, case, None, kl)
    # Causal, q_len 128: kv blocks 1..3 are above the diagonal for every query.
    # Example 1 also has kv_length 130 (blocks 2..3 are padding).
    poisoned = np.asarray(k).copy(), np.asarray(v).copy()
    for x in poisoned:
        x[:, 128:] = np.nan
    out = kernels.attention(q, jnp.asarray(poisoned[0]), jnp.asarray(poisoned[1]),
                            causal=True, kv_lengths=kl, implementation="pallas_tpu")
    assert_accurate(out, ref, "float32")


def test_padding_blocks_are_not_computed():
    case = Case("poison-padding", batch=2, q_len=136, kv_len=384, head_dim=64,
                q_lengths=(136, 8), kv_lengths=(100, 384))
    q, k, v, ql, kl = random_inputs(case, seed=8)
    ref = reference_for(q, k, v, case, ql, kl)
    k, v = np.asarray(k).copy(), np.asarray(v).copy()
    k[0, 128:] = np.nan  # example 0: kv blocks 1, 2 are past kv_length 100
    v[0, 128:] = np.nan
    q = np.asarray(q).copy()
    q[1, 128:] = np.nan  # example 1: query block 1 is past q_length 8
    out = kernels.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), q_lengths=ql,
                            kv_lengths=kl, implementation="pallas_tpu",
                            config=TpuConfig(block_q=128, block_kv=128))
    assert_accurate(out, ref, "float32")


def test_kernel_name_in_compiled_hlo():
    """The stable name is what a profiler trace and an HLO dump show."""
    q, k, v, _, _ = random_inputs(Case("name", q_len=8, kv_len=8, head_dim=32))
    fn = kernels.get_attention_fn("pallas_tpu", jit=False)
    hlo = jax.jit(lambda q, k, v: fn(q, k, v, causal=False)).lower(q, k, v).compile().as_text()
    assert pallas_tpu.KERNEL_NAME == "kernelgate_flash_attention_tpu"
    assert pallas_tpu.KERNEL_NAME in hlo


def _export_tpu(case: Case, with_lengths: bool = False):
    fn = kernels.get_attention_fn("pallas_tpu", case.config, jit=False)
    q = jax.ShapeDtypeStruct((case.batch, case.q_len, case.num_heads, case.head_dim), case.dtype)
    kv = jax.ShapeDtypeStruct((case.batch, case.kv_len, case.num_kv_heads, case.head_dim),
                              case.dtype)
    lengths = jax.ShapeDtypeStruct((case.batch,), jnp.int32)
    if with_lengths:
        def f(q, k, v, ql, kl):
            return fn(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl)
        args = (q, kv, kv, lengths, lengths)
    else:
        def f(q, k, v):
            return fn(q, k, v, causal=case.causal)
        args = (q, kv, kv)
    with pallas_tpu.mosaic_lowering():
        return jax_export.export(jax.jit(f), platforms=["tpu"])(*args)


@pytest.mark.parametrize(("case", "with_lengths"), [
    (Case("tpu-bf16-causal-gqa3", batch=2, q_len=300, kv_len=129, num_heads=6,
          num_kv_heads=2, head_dim=128, dtype="bfloat16", causal=True), True),
    (Case("tpu-f32-d80", q_len=127, kv_len=1000, head_dim=80,
          config=TpuConfig(block_q=64, block_kv=256)), False),
    (Case("tpu-f16-d256-mqa", q_len=64, kv_len=64, num_heads=4, num_kv_heads=1,
          head_dim=256, dtype="float16", causal=True), False),
])
def test_lowers_to_mosaic_for_tpu_from_this_host(case, with_lengths):
    """jax.export for platform tpu runs the Pallas-to-Mosaic lowering on a CPU host:
    the module holds one named Mosaic custom call and no interpreter callbacks."""
    exported = _export_tpu(case, with_lengths)
    text = exported.mlir_module()
    assert exported.platforms == ("tpu",)
    assert text.count("stablehlo.custom_call @tpu_custom_call") == 1
    assert pallas_tpu.KERNEL_NAME in text
    assert "callback" not in text
    # GQA reads kv head h // group in the index map: no [batch, num_heads, kv, d] copy of K/V.
    if case.num_heads != case.num_kv_heads:
        t = pallas_tpu.plan_tiling(case.q_len, case.kv_len, case.head_dim, case.config)
        repeated = f"{case.batch}x{case.num_heads}x{t.kv_len_padded}x{t.head_dim_padded}"
        assert f"tensor<{repeated}x" not in text


def test_mosaic_lowering_is_part_of_the_jit_cache_key():
    """One jitted function, traced first for the interpreter, is traced again for
    Mosaic inside ``mosaic_lowering()`` instead of reusing the interpreter trace."""
    fn = kernels.get_attention_fn("pallas_tpu", jit=False)
    f = jax.jit(lambda q, k, v: fn(q, k, v, causal=True))
    arg = jax.ShapeDtypeStruct((1, 8, 1, 32), jnp.float32)
    assert "tpu_custom_call" not in f.lower(arg, arg, arg).as_text()
    with pallas_tpu.mosaic_lowering():
        text = jax_export.export(f, platforms=["tpu"])(arg, arg, arg).mlir_module()
    assert "tpu_custom_call" in text


def _temp_bytes(implementation: str, seq: int) -> int:
    fn = kernels.get_attention_fn(implementation, jit=False)
    arg = jax.ShapeDtypeStruct((1, seq, 1, 128), jnp.float32)
    compiled = jax.jit(lambda q, k, v: fn(q, k, v, causal=False)).lower(arg, arg, arg).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_s_by_s_matrix_is_never_materialised():
    """Compiler temporary memory at a long sequence, pallas_tpu vs naive.

    What is honest here: on this CPU host pallas_tpu compiles to the TPU
    interpreter, an XLA program that computes each block_q x block_kv tile with
    XLA ops and keeps the kernel's VMEM/HBM buffers in host memory outside XLA. Its
    ``temp_size`` therefore counts every intermediate the tiled algorithm
    creates (tiles, padded copies of q/k/v) but not the simulated VMEM, which is
    bounded separately by ``Tiling.vmem_bytes`` (independent of sequence length).
    The exported TPU module is checked to hold no S x S tensor either. naive's
    temp_size is its real S x S logits and probabilities.
    """
    seq = 4096
    naive, flash = _temp_bytes("naive", seq), _temp_bytes("pallas_tpu", seq)
    s_by_s = seq * seq * 4
    assert naive >= s_by_s  # the baseline really materialises S x S
    assert flash < naive / 20 and flash < s_by_s / 8
    # Growth with S: linear (padded q/k/v copies), not quadratic.
    assert _temp_bytes("pallas_tpu", seq // 4) * 5 > flash
    tiling = pallas_tpu.plan_tiling(seq, seq, 128)
    assert tiling.vmem_bytes(4) < 2 * 2**20

    exported = _export_tpu(Case("long", q_len=seq, kv_len=seq, head_dim=128))
    shapes = re.findall(r"tensor<([0-9x]+)x[a-z]+[0-9]*>", exported.mlir_module())
    sizes = [int(np.prod([int(d) for d in s.split("x")])) for s in shapes]
    assert max(sizes) < seq * seq


def test_no_races_under_race_detection():
    """Race detection of the TPU interpreter on a causal GQA call with padding,
    split over two simulated cores; a deliberately racy kernel shows the
    detector is live in this JAX version."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret

    params = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)

    def racy(x_hbm, o_ref, scratch, sem):  # reads the DMA's target before waiting
        copy = pltpu.make_async_copy(x_hbm, scratch, sem)
        copy.start()
        o_ref[...] = scratch[...] * 2.0
        copy.wait()

    x = jnp.ones((8, 128), jnp.float32)
    with pltpu.force_tpu_interpret_mode(params):
        pl.pallas_call(racy, out_shape=x, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
                       )(x).block_until_ready()
    assert tpu_interpret.races.races_found

    case = Case("races", batch=1, q_len=136, kv_len=200, num_heads=4, num_kv_heads=2,
                head_dim=32, causal=True, q_lengths=(130,), kv_lengths=(190,))
    q, k, v, ql, kl = random_inputs(case, seed=9)
    with pltpu.force_tpu_interpret_mode(params):
        out = kernels.attention(q, k, v, causal=True, q_lengths=ql, kv_lengths=kl,
                                implementation="pallas_tpu",
                                config=TpuConfig(block_q=64, block_kv=128))
        out.block_until_ready()
    assert not tpu_interpret.races.races_found
    assert_accurate(out, reference_for(q, k, v, case, ql, kl), "float32")


def test_check_supported():
    spec, _, _ = kernels.validate(*random_inputs(Case("spec"))[:3])
    kernel = kernels.IMPLEMENTATIONS["pallas_tpu"]
    kernel.check_supported(spec, "tpu")
    kernel.check_supported(spec, "cpu")
    with pytest.raises(NotImplementedError, match="native on tpu, interpreted on cpu"):
        kernel.check_supported(spec, "gpu")
    with pytest.raises(ValueError, match="block_kv must be a multiple of 128"):
        kernel.check_supported(spec, "tpu", {"block_q": 8, "block_kv": 200})
    with pytest.raises(ValueError, match="block_kv must be a multiple of 128"):
        TpuConfig(block_q=8, block_kv=200)  # the config type checks itself
    with pytest.raises(ValueError, match=r"takes block sizes \['block_q', 'block_kv'\]"):
        kernel.check_supported(spec, "tpu", {"block_q": 8, "num_warps": 4})
