"""The variant switches of pallas_mosaic_gpu: validation, defaults that keep
the kernel as it was, lowering for CUDA from this CPU host, the lazy rescale rule of the
online softmax against float64, and the variants (among them the intra-warpgroup
pipeline) in JAX's GPU interpret mode.
``gpu`` tests run every variant of ``kernels/tools/fa3_variants.json`` natively against
float64, with the poisoned-padding and low-precision-extreme cases of the kernel contract."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import ValidationError

from kernels import mosaic_variants, pallas_mosaic_gpu
from kernels.build import source_digests
from kernels.contract import AttentionSpec
from kernels.mosaic_variants import (
    MAX_LAZY_RESCALE_LOG2,
    MosaicVariant,
    lazy_max,
    softmax_block,
    tile_registers,
)
from kernels.naive import naive_attention
from kernels.pallas_mosaic_gpu import (
    MosaicConfig,
    PallasMosaicGpuKernel,
    pallas_mosaic_gpu_attention,
)
from kernels.reference import attention_reference, relative_error
from kernels.registry import IMPLEMENTATIONS
from kernels.selection import measured_config
from kernels.shapes import AttentionShape
from kernels.timing import Timing
from kernels.tools import ptxas_report
from kernels.tools import variants as variants_tool
from tests import test_kernels_poisoned as poisoned
from tests.kernels_helpers import (
    Case,
    assert_accurate,
    mosaic_module_texts,
    random_inputs,
)

ON_GPU = jax.default_backend() in ("gpu", "cuda")


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("bad, named", [
    (dict(lazy_rescale_log2=0.0), "lazy_rescale_log2"),
    (dict(lazy_rescale_log2=MAX_LAZY_RESCALE_LOG2 + 0.5), "lazy_rescale_log2"),
    (dict(consumer_registers=236), "multiple of 8"),
    (dict(producer_registers=16), "[24, 256]"),
    (dict(consumer_registers=248, producer_registers=24), "520 exceeds the 512"),
    (dict(ping_pong=False), "ping_pong"),
    (dict(output_chunks=0), "output_chunks"),
    (dict(output_chunks=5), "output_chunks"),
])
def test_bad_variant_is_refused_naming_the_constraint(bad, named):
    with pytest.raises(ValidationError) as err:
        MosaicVariant(**bad)
    assert named in str(err.value)


def test_defaults_are_the_kernel_before_the_switches():
    default = MosaicVariant()
    assert default.is_default() and default.label() == "default"
    assert (default.consumer_registers, default.producer_registers) == (232, 40)
    # JAX's example's row-sum order: before the hand-over up to head_dim 128.
    assert [default.rowsum_early(d) for d in (64, 128, 192, 256)] == [True, True, False, False]
    on = MosaicVariant(lazy_rescale_log2=8.0)
    assert not on.is_default() and on.label() == "lazy_rescale_log2=8.0"
    assert default.intra_wg_pipeline is False
    assert MosaicVariant(intra_wg_pipeline=True).label() == "intra_wg_pipeline=True"


def test_intra_wg_pipeline_refuses_tilings_whose_tiles_exceed_the_registers():
    """The float32 logits, P and the accumulator per consumer thread (NOTES-gpu.md's
    count; the pipeline carries P, not a second logits tile): d64 64x128 128, d128 64x128
    160, d256 64x64 176, d64 64x256 224 fit 232; 128x128 at d64 (256) and at d128 (320) do
    not, and the kernel refuses them by name."""
    assert [tile_registers(64, kv, d) for kv, d in
            ((128, 64), (128, 128), (64, 256), (256, 64))] == [128, 160, 176, 224]
    assert tile_registers(128, 128, 64) == 256 and tile_registers(128, 128, 128) == 320
    on = MosaicVariant(intra_wg_pipeline=True)
    for block_q, block_kv, d in ((64, 128, 64), (64, 128, 128), (64, 64, 256), (128, 64, 64),
                                 (64, 256, 64), (64, 128, 256)):
        on.check_tiling(block_q, block_kv, d)
    MosaicVariant().check_tiling(128, 128, 64)  # off: any tiling
    for block_q, block_kv, d in ((128, 128, 64), (128, 128, 128)):
        with pytest.raises(ValueError, match="intra_wg_pipeline.*consumer_registers=232"):
            on.check_tiling(block_q, block_kv, d)
    with pytest.raises(ValueError, match="intra_wg_pipeline"):
        _lowered(on, head_dim=64, config=MosaicConfig(block_q=128, block_kv=128,
                                                      kv_ring_depth=2))


def test_the_64x192_tile_at_head_dim_128_needs_no_more_registers_with_the_pipeline():
    """S 64*192/128 = 96, P 48, the accumulator 64*128/128 = 64: 208 of the consumers'
    232 with or without the intra-warpgroup pipeline (it carries P across steps, not a
    second S); it lowers for CUDA either way."""
    assert tile_registers(64, 192, 128) == 96 + 48 + 64 == 208
    for variant in (MosaicVariant(), MosaicVariant(consumer_registers=240, producer_registers=24)):
        variant.check_tiling(64, 192, 128)
        variant.model_copy(update={"intra_wg_pipeline": True}).check_tiling(64, 192, 128)
    assert _lowered(MosaicVariant(intra_wg_pipeline=True), head_dim=128,
                    config=MosaicConfig(block_q=64, block_kv=192, kv_ring_depth=2))


def test_output_chunks_split_head_dim_into_whole_64_column_tiles():
    """A chunk of the output staging buffer is a whole number of 128-byte swizzle tiles
    (64 bf16/f16 columns): 128 into 2, 256 into 2 or 4; not 64 into 2, not 256 into 3."""
    for chunks, d in ((1, 64), (2, 128), (2, 256), (4, 256), (3, 192)):
        MosaicVariant(output_chunks=chunks).check_tiling(64, 64, d)
    for chunks, d in ((2, 64), (3, 256), (4, 128)):
        with pytest.raises(ValueError, match=f"output_chunks={chunks}.*head_dim {d}"):
            MosaicVariant(output_chunks=chunks).check_tiling(64, 64, d)


def test_half_width_output_buffers_fit_shared_memory_at_head_dim_256():
    """At head_dim 256 (64 x 64 tiles, a 2-deep ring, bf16) whole output buffers do not
    fit 227 KiB, so the output used to share the query tiles; two 128-column ones do,
    with the lazy rescale's 2 KiB reduction scratch. Bytes from the buffers' shapes:
    queries 2 x 64 x 256 x 2, K and V rings 2 x 2 x 64 x 256 x 2, output 2 x 64 x 128 x 2,
    13 barriers of 8 bytes."""
    cfg = MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)
    lazy = pallas_mosaic_gpu.variant_scratch_bytes(MosaicVariant(lazy_rescale_log2=8.0))
    queries, rings, half_output, barriers = 65536, 131072, 32768, 104
    assert not pallas_mosaic_gpu.separate_output(cfg, 256, 2, lazy)
    assert pallas_mosaic_gpu.smem_bytes(cfg, 256, 2, lazy) == queries + rings + barriers + lazy
    assert pallas_mosaic_gpu.separate_output(cfg, 256, 2, lazy, output_chunks=2)
    assert pallas_mosaic_gpu.output_staging_cols(cfg, 256, 2, lazy, output_chunks=2) == 128
    with_half = pallas_mosaic_gpu.smem_bytes(cfg, 256, 2, lazy, output_chunks=2)
    assert with_half == queries + rings + half_output + barriers + lazy
    assert with_half <= pallas_mosaic_gpu.SMEM_LIMIT_BYTES
    whole = queries + rings + 2 * half_output + barriers + lazy
    assert whole > pallas_mosaic_gpu.SMEM_LIMIT_BYTES


@pytest.mark.parametrize("head_dim, block_q, block_kv, stages, switches", [
    (64, 64, 256, 2, {}), (128, 64, 128, 3, {}), (128, 64, 128, 2, {"output_chunks": 2}),
    (256, 64, 64, 2, {"lazy_rescale_log2": 8.0}),
    (256, 64, 64, 2, {"lazy_rescale_log2": 8.0, "output_chunks": 2}),
    (256, 64, 64, 2, {"output_chunks": 4})])
def test_the_smem_count_is_what_the_kernel_allocates(head_dim, block_q, block_kv, stages,
                                                     switches):
    """``smem_bytes`` (what the refusals and the autotuner use) against the buffers the
    kernel's scratch really declares: every shared-memory ref's elements times 2 bytes,
    8 bytes per barrier, and the variant's reduction scratch."""
    variant = MosaicVariant(**switches)
    cfg = MosaicConfig(block_q=block_q, block_kv=block_kv, kv_ring_depth=stages)
    extra = pallas_mosaic_gpu.variant_scratch_bytes(variant)
    cols = pallas_mosaic_gpu.output_staging_cols(cfg, head_dim, 2, extra, variant.output_chunks)
    plan = pallas_mosaic_gpu._Plan(
        batch=1, num_heads=1, group=1, q_len=512, kv_len=512, q_pad=512, kv_pad=512,
        head_dim=head_dim, block_q=block_q, block_kv=block_kv, stages=stages, causal=False,
        qk_scale_log2=1.0, has_q_lengths=False, has_kv_lengths=False, num_ctas=1,
        dtype=jnp.bfloat16, interpret=False, output_cols=cols, variant=variant)
    allocated = extra
    for ref in pallas_mosaic_gpu._scratch(plan).values():
        if hasattr(ref, "shape"):
            allocated += math.prod(ref.shape) * jnp.dtype(ref.dtype).itemsize
        else:
            allocated += 8 * math.prod(np.atleast_1d(ref.num_barriers))
    assert allocated == pallas_mosaic_gpu.smem_bytes(cfg, head_dim, 2, extra,
                                                     variant.output_chunks)


def test_pingpong_across_tiles_is_refused_where_the_output_shares_the_query_tiles():
    """With the output staged in the query tile, the producer's next K/V blocks wait for
    consumer 1's store, which would wait for consumer 0's next Q K^T: the kernel names
    the constraint instead of hanging. The half-width output lifts it."""
    across = MosaicVariant(pingpong_across_tiles=True, lazy_rescale_log2=8.0)
    with pytest.raises(ValueError, match="pingpong_across_tiles needs the output staged"):
        _lowered(across, head_dim=256)
    deep_ring = MosaicConfig(block_q=64, block_kv=128, kv_ring_depth=3)  # d128: no room either
    with pytest.raises(ValueError, match="pingpong_across_tiles needs the output staged"):
        _lowered(MosaicVariant(pingpong_across_tiles=True), head_dim=128, config=deep_ring)
    assert "mosaic_gpu_v2" in _lowered(across.model_copy(update={"output_chunks": 2}), 256)


def test_registered_switches_drop_what_the_tiling_cannot_hold(monkeypatch):
    """A call without ``variant`` never fails on a registered switch its tiling cannot
    hold: with a rule asking for half-width output and the offset once per kernel at
    head_dim 128, a 3-deep ring of 128-key blocks (224 KiB before any output buffer)
    runs with neither; the 2-deep ring keeps both."""
    rule = mosaic_variants.SwitchRule(
        padded_head_dim=128, switches={"output_chunks": 2, "pingpong_across_tiles": True})
    monkeypatch.setattr(mosaic_variants, "REGISTERED_SWITCHES", (rule,))
    deep = MosaicConfig(block_q=64, block_kv=128, kv_ring_depth=3)
    shallow = deep.model_copy(update={"kv_ring_depth": 2})
    got = pallas_mosaic_gpu.registered_variant(deep, 128)
    assert (got.output_chunks, got.pingpong_across_tiles) == (1, False)
    got = pallas_mosaic_gpu.registered_variant(shallow, 128)
    assert (got.output_chunks, got.pingpong_across_tiles) == (2, True)
    # the benchmark's rows run what the call runs: its default row at the deep ring too
    default_row = {"name": "default"}
    assert variants_tool.entry_variant(default_row, 128, causal=True, kv_len=512,
                                       config=deep) == pallas_mosaic_gpu.registered_variant(
        deep, 128, causal=True, kv_len=512)
    assert variants_tool.entry_variant(default_row, 128).pingpong_across_tiles  # the table's
    # chunks that do not split the padded head_dim (192 into 2 x 96) are dropped as well
    odd = mosaic_variants.SwitchRule(padded_head_dim=192, switches={"output_chunks": 2})
    monkeypatch.setattr(mosaic_variants, "REGISTERED_SWITCHES", (rule, odd))
    assert pallas_mosaic_gpu.registered_variant(shallow, 192).output_chunks == 1
    assert mosaic_variants.registered_default(192).output_chunks == 2
    # and check_supported agrees with the call: the deep ring is supported as it runs
    spec = AttentionSpec(batch=1, q_len=512, kv_len=512, num_heads=2, num_kv_heads=2,
                         head_dim=128, dtype=jnp.dtype("bfloat16"), causal=True, scale=0.1,
                         has_lengths=False)
    PallasMosaicGpuKernel().check_supported(spec, "cuda", deep)
    assert "mosaic_gpu_v2" in _lowered(None, head_dim=128, causal=True, config=deep)


def test_the_kernel_declares_its_variant_fields():
    assert IMPLEMENTATIONS["pallas_mosaic_gpu"].variant_fields == tuple(MosaicVariant.model_fields)
    assert IMPLEMENTATIONS["naive"].variant_fields == ()


def test_the_variants_module_is_part_of_the_source_digest():
    """A variant becomes a default only by editing kernels/mosaic_variants.py, which is
    one of the files the build's fingerprint hashes."""
    assert "mosaic_variants.py" in source_digests()


def test_lazy_rescale_accounts_for_its_reduction_scratch():
    cfg = PallasMosaicGpuKernel().default_config(128)
    base = pallas_mosaic_gpu.smem_bytes(cfg, 128)
    extra = pallas_mosaic_gpu.variant_scratch_bytes(MosaicVariant(lazy_rescale_log2=8.0))
    assert extra > 0 and pallas_mosaic_gpu.variant_scratch_bytes(MosaicVariant()) == 0
    assert pallas_mosaic_gpu.smem_bytes(cfg, 128, 2, extra) == base + extra


# ----------------------------------------------------------------------------- lowering


def _lowered(variant, head_dim=128, causal=False, config=None):
    q = jax.ShapeDtypeStruct((1, 512, 2, head_dim), jnp.bfloat16)
    fn = functools.partial(pallas_mosaic_gpu_attention, causal=causal, scale=0.1,
                           q_lengths=None, kv_lengths=None, variant=variant, config=config)
    return jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()


def test_each_switch_changes_the_lowered_kernel():
    base = _lowered(MosaicVariant())  # the field defaults: the kernel before the switches
    for variant in (MosaicVariant(lazy_rescale_log2=8.0),
                    MosaicVariant(rowsum_before_handover=False),
                    MosaicVariant(consumer_registers=240, producer_registers=24),
                    MosaicVariant(intra_wg_pipeline=True),
                    MosaicVariant(pingpong_across_tiles=True),
                    MosaicVariant(output_chunks=2)):
        text = _lowered(variant)
        assert text.count("mosaic_gpu_v2") == 1 and text != base, variant.label()
    # At head_dim 256 the default order is "after": switching it to "before" changes it.
    assert _lowered(MosaicVariant(rowsum_before_handover=True), 256) != \
        _lowered(MosaicVariant(), 256)


def test_calls_with_lengths_set_the_pingpong_offset_per_tile():
    """Lengths may leave a tile empty, which would deadlock the offset once per kernel:
    with lengths the switch lowers to exactly the kernel without it; without lengths it
    does not."""
    def lowered(variant, lengths):
        q = jax.ShapeDtypeStruct((2, 512, 2, 64), jnp.bfloat16)
        n = jax.ShapeDtypeStruct((2,), jnp.int32) if lengths else None
        fn = functools.partial(pallas_mosaic_gpu_attention, causal=True, scale=0.1,
                               variant=variant)
        return jax.jit(fn).trace(q, q, q, q_lengths=n, kv_lengths=n).lower(
            lowering_platforms=("cuda",)).as_text()

    on, off = MosaicVariant(pingpong_across_tiles=True), MosaicVariant()
    assert lowered(on, lengths=True) == lowered(off, lengths=True)
    assert lowered(on, lengths=False) != lowered(off, lengths=False)


@pytest.mark.parametrize("head_dim, causal", [(64, True), (256, False)])
def test_intra_wg_pipeline_lowers_with_the_registered_switches(head_dim, causal):
    """The pipelined loop lowers for CUDA beside each head_dim's registered switches
    (lazy rescale at 256, the row sum after the hand-over at 64), with lengths."""
    registered = mosaic_variants.registered_default(head_dim, causal=causal, kv_len=700)
    variant = registered.model_copy(update={"intra_wg_pipeline": True})
    q = jax.ShapeDtypeStruct((2, 500, 4, head_dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 700, 2, head_dim), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32)

    def fn(q, k, v, ql, kl):
        return pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=0.1, q_lengths=ql,
                                           kv_lengths=kl, variant=variant)

    text = jax.jit(fn).trace(q, k, k, lengths, lengths).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu_v2") == 1


# The Mosaic GPU module of the kernel (locations stripped) at commit 4e0e33f, before the
# intra-warpgroup pipeline existed, lowered by JAX 0.10.2 (the lock's): the new switch's
# default must leave it byte for byte as it was. (head_dim, causal, lengths, variant,
# config) -> sha256 of the module's text. Re-pinned here and in the two tables below when
# the softmax's exponent became (s - m) * c (the extreme-values fix, 2026-12-04,
# kernels/tools/NOTES-gpu.md): every re-pinned module holds the same lines as the one
# pinned before, SSA names stripped, counted as a multiset (only which values feed the
# exponent's subtraction and multiplication changed), except the lazy rescale's, which
# also multiplies each row's growth of the max by c for its threshold.
KERNEL_BEFORE_THE_PIPELINE_SWITCH = {
    (64, True, True, None, None):
        "c26869afefba5dc516808c02881f8c62c6cee1425b9d602b42aa2b47a10d2e16",
    (128, False, False, MosaicVariant(), None):
        "2096182fdd3998fe1f8225a725ca8d00b73a267fbb30e77c1024fd08ee74a0d3",
    (256, True, True, MosaicVariant(lazy_rescale_log2=8.0), None):
        "9c243c567826a18ea33a0c579157a85a19461e92a0e3ef0bcdabd03f26e00e9d",
    (128, True, True, MosaicVariant(rowsum_before_handover=True), None):
        "f7fd40d603c3f4f10b663b1c83e3a51b7cf045d325e598268ff02dde5597b8b8",
    (64, False, False, MosaicVariant(), MosaicConfig(block_q=64, block_kv=256, kv_ring_depth=2)):
        "88c663007ab037e3635fc020d95be4575c7ca111484daeeb6cac217866c3b57c",
}


def _kernel_module_digest(monkeypatch, head_dim, causal, lengths, variant, config,
                          kv_len=700) -> str:
    """sha256 of the Mosaic GPU module's text without locations (the serialized module
    in the lowering carries source lines, which any edit of the file moves); queries
    ``[2, 500, 4, head_dim]``, keys and values ``[2, kv_len, 2, head_dim]`` bf16."""
    q = jax.ShapeDtypeStruct((2, 500, 4, head_dim), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, kv_len, 2, head_dim), jnp.bfloat16)
    n = jax.ShapeDtypeStruct((2,), jnp.int32)

    def fn(q, k, v, ql, kl):
        return pallas_mosaic_gpu_attention(q, k, v, causal=causal, scale=0.1,
                                           q_lengths=ql if lengths else None,
                                           kv_lengths=kl if lengths else None,
                                           variant=variant, config=config)

    return _module_digest(monkeypatch, fn, q, k, k, n, n)


def _module_digest(monkeypatch, fn, *args) -> str:
    """sha256 of the Mosaic GPU module ``fn(*args)`` lowers to (text, no locations); of
    their texts joined by newlines where it launches several (``checked_fma_exponent``:
    the FMA launch and the exact one)."""
    _, modules = mosaic_module_texts(monkeypatch, fn, *args)
    assert modules and all(len(module) > 10_000 for module in modules)
    return hashlib.sha256("\n".join(modules).encode()).hexdigest()


@pytest.mark.skipif(jax.__version__ != "0.10.2",
                    reason="the recorded modules were lowered by JAX 0.10.2")
def test_the_pipeline_switch_off_lowers_to_the_kernel_before_it(monkeypatch):
    """Registered and explicit variants, with the new field at its default, lower to the
    very module of before the switch (pinned digests); the switch on does not."""
    for (d, causal, lengths, variant, config), digest in \
            KERNEL_BEFORE_THE_PIPELINE_SWITCH.items():
        got = _kernel_module_digest(monkeypatch, d, causal, lengths, variant, config)
        assert got == digest, (d, causal, lengths, variant, config)
    on = MosaicVariant(intra_wg_pipeline=True)
    assert _kernel_module_digest(monkeypatch, 128, False, False, on, None) != \
        KERNEL_BEFORE_THE_PIPELINE_SWITCH[(128, False, False, MosaicVariant(), None)]


# The module at commit a3ed647, before K and V could reach the kernel unpadded along the
# sequence (pallas_mosaic_gpu.kv_rows), at lengths that are multiples of block_kv (768:
# of 128 and 256; 4096), lowered by JAX 0.10.2. (head_dim, causal, kv_len, variant,
# config) -> sha256 as above.
KERNEL_BEFORE_THE_UNPADDED_KV = {
    (128, False, 768, MosaicVariant(), None):
        "b93df9cff5d778805fe0a0555049a6e3553d6bd472beaa43204de830c8836a9c",
    (64, False, 768, MosaicVariant(), MosaicConfig(block_q=64, block_kv=256, kv_ring_depth=2)):
        "4c54d44ec34099e1f8da3d20d34e431a7760cad57b68f19f48f1ae527ffae6be",
    (128, True, 768, None, None):
        "ffa6dd3d79bc37b0b9940781c248883915837d66e13d51b7d66ff2671bbaee8f",
    # The switches registered when it was pinned (None then; the checked FMA exponent has
    # been registered there since, and lowers to two modules).
    (128, False, 4096, MosaicVariant(rowsum_before_handover=False), None):
        "3f9502fb3f6eeda0632d6cf253a844c886dd588e5422e4c64f250b5238dd1284",
}


@pytest.mark.skipif(jax.__version__ != "0.10.2",
                    reason="the recorded modules were lowered by JAX 0.10.2")
def test_lengths_that_are_block_multiples_lower_as_before_the_unpadded_kv(monkeypatch):
    """Where kv_len is a multiple of block_kv there was nothing to pad: the rule that
    leaves K and V unpadded changes no byte of the module there (the default tilings at
    d128, registered and explicit switches, the d64 64 x 256 tile). The pinned modules
    of the test above (kv_len 700, not a multiple of the TMA's 8-row tiles) keep their
    pad, so they are unchanged as well."""
    for (d, causal, kv_len, variant, config), digest in KERNEL_BEFORE_THE_UNPADDED_KV.items():
        got = _kernel_module_digest(monkeypatch, d, causal, False, variant, config, kv_len)
        assert got == digest, (d, causal, kv_len, variant, config)


# head_dim 128's kernels as measured on the H200 at commit 4e0e33f (BENCHMARKS.md, the
# d128 floor call): the floor call's eight d128 rows (bf16 and f16; S = 4096 x B4 and
# 16384 x B1; 16 heads; full and causal) and causal S = 131072 (B1, H16: 113.3 ms against
# cuDNN's 122.6 ms), each with the tiling the committed table selects, lowered by JAX 0.10.2
# for the H200's 132 SMs. Commit f36f0bc lowers to the same modules. The
# figures describe the shipped d128 kernel only while it lowers to these very modules; a
# change here means measuring those rows again. (dtype, batch, seq, causal) -> sha256.
# Re-pinned at the exponent change (above): the eight 4096/16384 rows were measured again
# on these modules beside the old ones (bench_results/h200-2026-12-04-extreme-values/
# perf.json: 0.919-0.992 of the old, 2-8 % slower); the 131072 row was not. Re-pinned at
# kv_len >= 16384 when bounded_fma_exponent was registered there: the four 16384 rows are
# the ``bounded-fma`` rows of the three H100 calls in bench_results/h100-2026-12-07-bounded-fma/
# (the same switches as the new registration); the 131072 row is re-pinned unmeasured (the
# rule has no upper length: the bound's read of Q and K is a smaller share of a longer
# call, but no call of that length has run with it); the 4096 rows are unchanged.
# Re-pinned when checked_fma_exponent was registered at d128: the three rows whose tuned
# tiling holds its row flags (bf16 full 4096 and 16384, f16 full 16384: a 2-deep ring)
# are the ``checked-fma`` rows of the H100 call in bench_results/h100-2026-12-07-checked-fma/
# (the same switches and tiling); the rows with a 3-deep ring keep their modules (the
# kernel runs the next rule that applies there: the bounded FMA at 16384 causal keys, the
# exact form at f16 full 4096).
D128_AS_MEASURED = {
    ("bfloat16", 1, 131072, True):
        "5a653f2e6217e7fb2695ca460134f172ff53fd828f40d2c350ca571c608fb5fe",
    ("bfloat16", 4, 4096, False):
        "7777b087a97353ba0c165603579b8bca5cd8e3d050ec5186bbb2f66882116654",
    ("bfloat16", 1, 16384, False):
        "01e91711899fadeccb46c493f5c82681f04fdbe8d306d0085ee0438def870ca7",
    ("bfloat16", 4, 4096, True):
        "6d66c3f6d4cea84b7abe95f127c99d5eb64278d71e6e18641ac92ee8f7079cc4",
    ("bfloat16", 1, 16384, True):
        "fefffa96510f56b04e61e456bbb0727c03e5ee1dc214eaab4997fbf4fd11982c",
    ("float16", 4, 4096, False):
        "1b3e43858f69e7bcba29669bb91d08541c6b7037c2d94554b73b65668a49b9e3",
    ("float16", 1, 16384, False):
        "0b709b37f17605d7a48f9458bca38691a93c251470aacb5e4fbb4a88c87c5fd3",
    ("float16", 4, 4096, True):
        "19b519bdf93357a8e4a260c76746b395f1eb4c0f31927e487b00cef4a589b3bf",
    ("float16", 1, 16384, True):
        "21276637d382631f190277eaea1502e7e81e3a034db229e910df246a56973850",
}


@pytest.mark.skipif(jax.__version__ != "0.10.2",
                    reason="the recorded modules were lowered by JAX 0.10.2")
def test_head_dim_128_lowers_to_the_modules_as_measured(monkeypatch):
    """The code added since the measurement (the ping-pong across tiles, the half-width
    output, the unpadded K/V) must leave the registered d128 kernels byte for byte as
    measured, the 131072-token causal row included; a new registration re-pins the rows it
    changes with the run that measured them."""
    for (dtype, batch, seq, causal), digest in D128_AS_MEASURED.items():
        shape = AttentionShape(dtype=dtype, batch=batch, q_len=seq, kv_len=seq, num_heads=16,
                               num_kv_heads=16, head_dim=128, causal=causal)
        config = measured_config(shape, "pallas_mosaic_gpu")
        fn = functools.partial(pallas_mosaic_gpu_attention, causal=causal, scale=128 ** -0.5,
                               q_lengths=None, kv_lengths=None, config=config, num_sms=132)
        x = jax.ShapeDtypeStruct((batch, seq, 16, 128), getattr(jnp, dtype))
        assert _module_digest(monkeypatch, fn, x, x, x) == digest, \
            (dtype, batch, seq, causal, config)


def _lowered_at(variant, head_dim, causal, seq):
    q = jax.ShapeDtypeStruct((1, seq, 2, head_dim), jnp.bfloat16)
    fn = functools.partial(pallas_mosaic_gpu_attention, causal=causal, scale=0.1,
                           q_lengths=None, kv_lengths=None, variant=variant)
    return jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()


def test_the_kernel_as_registered_lowers_to_the_measured_switches():
    """The switch choices measured on the H200, read from those
    measurements rather than from the rule table: at head_dim 256 the lazy rescale, with
    the row sum before the hand-over only without a causal mask at kv_len <= 4096; at 64
    and 128 the row sum after the hand-over; 192 < d <= 256 pads to 256. The
    switches grid (bf16, BENCHMARKS.md): at 256 the output staged through half-width
    buffers, at 64 the ping-pong's offset once per kernel. At 128 without a causal mask
    the FMA exponent checked after the blocks (an H100 call, ``h100-2026-12-07-checked-fma``;
    the default tiling's 2-deep ring holds its row flags)."""
    lazy = MosaicVariant(lazy_rescale_log2=8.0, output_chunks=2)
    lazy_before = MosaicVariant(lazy_rescale_log2=8.0, rowsum_before_handover=True,
                                output_chunks=2)
    after = MosaicVariant(rowsum_before_handover=False)
    after_across = MosaicVariant(rowsum_before_handover=False, pingpong_across_tiles=True)
    after_checked = MosaicVariant(rowsum_before_handover=False, checked_fma_exponent=True)
    # (head_dim, causal, seq, the switches measured best there). The rules depend on the
    # padded head_dim, the mask and kv_len <= 4096 or above, so one length on each side
    # (4096 and 4160, one 64-row block past it) stands for the measured 16384 as well:
    # lowering at 16384 is 4x slower and decides nothing more.
    expected = [
        (256, False, 512, lazy_before), (256, False, 4096, lazy_before),
        (200, False, 4096, lazy_before), (256, False, 4160, lazy), (200, False, 4160, lazy),
        (256, True, 4096, lazy), (256, True, 4160, lazy), (200, True, 512, lazy),
        (64, False, 512, after_across), (64, True, 4160, after_across),
        (128, False, 4160, after_checked),
        (128, True, 512, after)]
    for head_dim, causal, seq, switches in expected:
        label = (head_dim, causal, seq)
        registered = _lowered_at(None, head_dim, causal, seq)
        assert registered == _lowered_at(switches, head_dim, causal, seq), label
        assert registered != _lowered_at(MosaicVariant(), head_dim, causal, seq), label


def test_every_registered_rule_is_a_valid_variant_that_fits_the_smem_check():
    """Each rule's switches are a valid ``MosaicVariant``, and every rule of a head_dim
    needs the shared memory of the unconditional one, so a rule's conditions never decide
    a refusal; a rule with the checked FMA exponent may need more, since
    ``registered_variant`` passes it over for the next rule that applies where its row
    flags do not fit."""
    for rule in mosaic_variants.REGISTERED_SWITCHES:
        variant = MosaicVariant(**rule.switches)
        unconditional = mosaic_variants.registered_default(rule.padded_head_dim)
        if variant.checked_fma_exponent:
            variant = variant.model_copy(update={"checked_fma_exponent": False})
        assert pallas_mosaic_gpu.variant_scratch_bytes(variant) == \
            pallas_mosaic_gpu.variant_scratch_bytes(unconditional), rule
    with pytest.raises(ValueError):
        mosaic_variants.SwitchRule(padded_head_dim=100, switches={})


@pytest.mark.parametrize("depth, checked", [(2, True), (3, False)])
def test_the_checked_fma_is_registered_where_its_row_flags_fit_and_the_next_rule_elsewhere(
        depth, checked):
    """d128, causal, 16384 keys: with a 2-deep ring (199784 bytes with the row flags) the
    checked FMA runs; the tuned 3-deep ring leaves no room for them (232584 bytes, over
    the 232448 of an sm_90 CTA, the count Mosaic GPU itself refuses), so the bounded FMA,
    the next rule, runs there."""
    cfg = MosaicConfig(block_q=64, block_kv=128, kv_ring_depth=depth)
    variant = pallas_mosaic_gpu.registered_variant(cfg, 128, 2, causal=True, kv_len=16384)
    assert variant.checked_fma_exponent is checked
    assert variant.bounded_fma_exponent is not checked
    flags = MosaicVariant(rowsum_before_handover=False, checked_fma_exponent=True)
    need = pallas_mosaic_gpu.smem_bytes(cfg, 128, 2, pallas_mosaic_gpu.variant_scratch_bytes(
        flags, cfg.block_q))
    assert need == {2: 199784, 3: 232584}[depth]


def test_the_checked_fma_is_not_registered_where_its_flags_would_move_the_output():
    """d128, 128 x 64 tiles, a 3-deep ring, no mask: the row flags fit only with the
    output moved into the query tiles (a layout nobody measured with them), so the exact
    form with its own output buffers runs."""
    cfg = MosaicConfig(block_q=128, block_kv=64, kv_ring_depth=3)
    variant = pallas_mosaic_gpu.registered_variant(cfg, 128, 2, causal=False, kv_len=4096)
    assert not variant.checked_fma_exponent
    assert pallas_mosaic_gpu.separate_output(cfg, 128, 2, pallas_mosaic_gpu.variant_scratch_bytes(
        variant, cfg.block_q))
    flags = pallas_mosaic_gpu.variant_scratch_bytes(
        variant.model_copy(update={"checked_fma_exponent": True}), cfg.block_q)
    assert not pallas_mosaic_gpu.separate_output(cfg, 128, 2, flags)


@pytest.mark.parametrize("head_dim, depth, switches", [
    (128, 2, {"checked_fma_exponent": True}), (64, 2, {"checked_fma_exponent": True}),
    (128, 2, {"checked_fma_exponent": True, "lazy_rescale_log2": 8.0}),
    (256, 2, {"lazy_rescale_log2": 8.0, "output_chunks": 2})])
def test_the_smem_count_of_the_checked_fma_is_mosaic_gpus_own(head_dim, depth, switches,
                                                              monkeypatch):
    """Where the count decides a fit it is Mosaic GPU's: its allocation of the first
    launch (captured from its own size function, on this CPU host) equals ``smem_bytes``
    with the variant's scratch, row flags, their alignment and the reduction reserve."""
    import jax.experimental.mosaic.gpu.core as mgpu_core

    sizes = []
    size_of = mgpu_core._smem_tree_size
    monkeypatch.setattr(mgpu_core, "_smem_tree_size", lambda t: sizes.append(size_of(t))
                        or sizes[-1])
    variant = MosaicVariant(**switches)
    cfg = MosaicConfig(block_q=64, block_kv=64 if head_dim == 256 else 128,
                       kv_ring_depth=depth)
    x = jax.ShapeDtypeStruct((1, 512, 2, head_dim), jnp.bfloat16)
    fn = functools.partial(pallas_mosaic_gpu_attention, causal=False, scale=0.1,
                           q_lengths=None, kv_lengths=None, config=cfg, variant=variant)
    jax.jit(fn).trace(x, x, x).lower(lowering_platforms=("cuda",))
    assert sizes[0] == pallas_mosaic_gpu.smem_bytes(
        cfg, head_dim, 2, pallas_mosaic_gpu.variant_scratch_bytes(variant, cfg.block_q),
        variant.output_chunks)


def _fit_decision(cfg, head_dim, scratch, chunks):
    return (pallas_mosaic_gpu.output_staging_cols(cfg, head_dim, 2, scratch, chunks),
            pallas_mosaic_gpu.smem_bytes(cfg, head_dim, 2, scratch, chunks)
            <= pallas_mosaic_gpu.SMEM_LIMIT_BYTES)


def test_the_reduction_reserve_left_out_of_the_base_count_decides_no_tiling():
    """The base count leaves out the 2 KiB Mosaic GPU reserves in every kernel (counted
    only where a switch needs it): adding it changes no fit and no output staging over
    the tiling space, so leaving it out decides nothing."""
    reserve = pallas_mosaic_gpu.REDUCTION_SCRATCH_BYTES
    for d in (64, 128, 192, 256):
        for block_q, block_kv, depth in itertools.product(
                pallas_mosaic_gpu.BLOCK_Q_CHOICES, pallas_mosaic_gpu.BLOCK_KV_CHOICES,
                range(pallas_mosaic_gpu.STAGE_RANGE[0], pallas_mosaic_gpu.STAGE_RANGE[1] + 1)):
            cfg = MosaicConfig(block_q=block_q, block_kv=block_kv, kv_ring_depth=depth)
            for chunks in (c for c in (1, 2, 4) if d % (c * 64) == 0):
                for extra in (0, 16):
                    assert _fit_decision(cfg, d, extra, chunks) == \
                        _fit_decision(cfg, d, extra + reserve, chunks), (d, cfg, chunks)


def test_every_variant_of_the_benchmark_file_lowers_for_cuda():
    for entry in variants_tool.load_variant_sets()["variants"]:
        for head_dim in entry.get("head_dims", (64, 128, 256)):
            variant = variants_tool.entry_variant(entry, head_dim, causal=True, kv_len=512)
            q = jax.ShapeDtypeStruct((1, 512, 2, head_dim), jnp.bfloat16)
            config = variants_tool.block_sizes(entry, head_dim)
            fn = functools.partial(pallas_mosaic_gpu_attention, causal=True, scale=0.1,
                                   q_lengths=None, kv_lengths=None, variant=variant,
                                   config=config)
            text = jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
            assert "mosaic_gpu_v2" in text, entry["name"]


def test_every_variant_of_the_benchmark_file_is_valid_on_every_grid_row():
    """Each entry's switches (the registered ones where it says ``registered_plus``) make a
    valid variant with or without a causal mask, at 4096 and 16384 keys: an entry that
    sets one FMA switch over a registration holding the other must unset it."""
    for entry in variants_tool.load_variant_sets()["variants"]:
        for head_dim in entry.get("head_dims", (64, 128, 256)):
            for causal in (False, True):
                for kv_len in (4096, 16384):
                    variants_tool.entry_variant(entry, head_dim, causal=causal, kv_len=kv_len)


# ----------------------------------------------------------------------------- the rule


def _online_softmax(logits, v, block, threshold, scale_log2=1.0):
    """Pure-JAX model of the kernel's float32 online softmax over key blocks, with the
    kernel's own block step (:func:`softmax_block`: ``m`` in the logits' units,
    ``scale_log2`` takes them to log2 units; 1: ``logits`` are log2 units already).
    Returns the output and how many (row, block) rescales the accumulator needed."""
    rows, n = logits.shape
    m = jnp.full((rows,), -jnp.inf, jnp.float32)
    l_sum = jnp.zeros((rows,), jnp.float32)
    acc = jnp.zeros((rows, v.shape[1]), jnp.float32)
    rescales, p_max = 0, 0.0
    step = jax.jit(functools.partial(softmax_block, scale_log2=scale_log2, threshold=threshold))
    for start in range(0, n, block):
        s = logits[:, start:start + block]
        m_new, moved, alpha, p = step(m, s)
        acc = acc * alpha[:, None] + p @ v[start:start + block]
        l_sum = l_sum * alpha + p.sum(axis=1)
        m = m_new
        rescales += int(np.sum(np.asarray(moved)[...])) if start else 0
        p_max = max(p_max, float(p.max()))
    return acc / l_sum[:, None], rescales, p_max


@pytest.mark.parametrize("threshold", [None, 1.0, 4.0, MAX_LAZY_RESCALE_LOG2])
def test_lazy_rescale_rule_is_exact_against_float64(threshold):
    """Logits that grow along the keys (so the running max keeps moving) plus noise:
    the lazy rule gives the float64 softmax within float32 rounding, p stays within
    2**threshold, and it needs fewer rescales than the eager rule."""
    rng = np.random.default_rng()
    rows, n, d, block = 32, 1024, 64, 64
    logits = (np.linspace(0.0, 40.0, n)[None, :] + 3.0 * rng.standard_normal((rows, n)))
    v = rng.standard_normal((n, d))
    w = np.exp2(logits - logits.max(axis=1, keepdims=True))
    ref = (w / w.sum(axis=1, keepdims=True)) @ v
    out, rescales, p_max = _online_softmax(jnp.asarray(logits, jnp.float32),
                                           jnp.asarray(v, jnp.float32), block, threshold)
    assert relative_error(np.asarray(out, np.float64), ref) < 1e-5
    assert p_max <= 2.0 ** (threshold or 0.0) * (1 + 1e-6)
    _, eager, _ = _online_softmax(jnp.asarray(logits, jnp.float32),
                                  jnp.asarray(v, jnp.float32), block, None)
    if threshold is not None:
        assert rescales < eager, (rescales, eager)


def test_lazy_max_moves_a_row_from_minus_infinity():
    m_new, moved = lazy_max(jnp.array([-jnp.inf, 1.0]), jnp.array([3.0, 1.5]), 8.0)
    assert np.asarray(moved).tolist() == [True, False]
    assert np.asarray(m_new).tolist() == [3.0, 1.0]


def test_lazy_max_compares_raw_units_in_log2_units():
    """With the max in raw-logit units the threshold still counts log2 units: a row moves
    when its growth times ``scale`` exceeds it (10 raw units x 0.5 = 5 > 4; 6 x 0.5 = 3)."""
    m_new, moved = lazy_max(jnp.array([0.0, 0.0]), jnp.array([10.0, 6.0]), 4.0, scale=0.5)
    assert np.asarray(moved).tolist() == [True, False]
    assert np.asarray(m_new).tolist() == [10.0, 0.0]


# Raw logits q.k of equal q and k (one value x in every element) at head_dim d, as the
# kernel's float32 accumulator holds them, and c = log2(e) / sqrt(d): the bug report's
# 1.3e5 in bf16 (130048) at d64 is s = 64 x^2 = 1.08e12, s c = 1.95e11 (an ulp of 16384).
EXTREME_LOGITS = [(64, 130048.0), (64, 1e4), (128, 1e6), (256, 3e3), (64, 1e18), (256, 1e18)]


def _scale_log2(head_dim: int) -> float:
    return float(np.float32(math.log2(math.e) / math.sqrt(head_dim)))


@pytest.mark.parametrize("threshold", [None, MAX_LAZY_RESCALE_LOG2])
@pytest.mark.parametrize("head_dim, x", EXTREME_LOGITS)
def test_softmax_block_gives_the_largest_logit_p_1_at_any_magnitude(head_dim, x, threshold):
    """The kernel's block step, jitted on this CPU (XLA's CPU backend contracts a
    multiplication feeding a subtraction into one FMA, as Mosaic GPU's ``contract`` flags
    let LLVM do on the GPU: ``jax.jit(lambda s, c, m: s * c - m)`` returns the fused
    result), on rows of large equal logits, of one logit and of a dominant one: every
    row's largest logit gets ``p = 1`` exactly, the others their float64 weight, from
    ``-inf`` (first block) and from a running max already at the row's max (second
    block: ``alpha = 1``). With the exponent folded as ``s * c - m * c`` the first row
    got ``p = 2**-4293`` = 0 at 130048 (d64) and ``inf`` at others (130560)."""
    c = _scale_log2(head_dim)
    s_max = float(np.float32(head_dim * x * x))
    assert math.isfinite(s_max)
    s = np.full((4, 8), -np.inf, np.float32)
    s[0] = s_max                                   # eight equal keys
    s[1, 0] = s_max                                # one key, the others masked
    s[2] = np.float32(s_max) * np.float32(0.5)     # a dominant key among smaller ones
    s[2, 3] = s_max
    s[3] = -s_max                                  # large negative logits, equal
    step = jax.jit(functools.partial(softmax_block, scale_log2=c, threshold=threshold))
    m0 = jnp.full((4,), -jnp.inf, jnp.float32)
    m, moved, alpha, p = (np.asarray(a) for a in step(m0, jnp.asarray(s)))
    assert moved.all() and np.all(alpha == 0.0)
    row_max = s.max(axis=1)
    np.testing.assert_array_equal(m, row_max)
    np.testing.assert_array_equal(p[s == row_max[:, None]], 1.0)
    exact = np.exp2((s.astype(np.float64) - row_max[:, None]) * c)  # 0 below the max here
    np.testing.assert_allclose(p, exact, rtol=1e-6, atol=0.0)
    # The next block, no larger logit: the max stays, the accumulator's factor is 1.
    m2, _, alpha2, p2 = (np.asarray(a) for a in step(jnp.asarray(m), jnp.asarray(s)))
    np.testing.assert_array_equal(m2, m)
    np.testing.assert_array_equal(alpha2, 1.0)
    np.testing.assert_array_equal(p2, p)


def test_the_folded_exponent_loses_the_largest_logit_under_an_fma():
    """Why the exponent is ``(s - m) * c``: the folded ``s * c - m * c`` that the kernel
    ran, evaluated as the GPU evaluates it once contracted (one FMA: ``s * c`` exact, one
    rounding after the subtraction; emulated exactly in float64, where the product of
    two float32 is exact). At the bug report's q = k = 130048 (bf16), head_dim 64, the
    largest logit's exponent is -4293 instead of 0 (p = 0: the one-key row came out as
    zeros, the empty-row rule), and at 130560 it is +3342.75 (p = inf: NaN); below
    ``|m * c| = 2**31`` the error stays within +-128 and exp2 neither overflows nor
    flushes to zero."""
    c = np.float32(_scale_log2(64))

    def folded_exponent(x: float) -> float:
        s = np.float32(64.0 * x * x)
        m_scaled = np.float32(s * c)                      # m * c, rounded to float32
        return float(np.float32(float(s) * float(c) - float(m_scaled)))  # fma, one rounding

    assert folded_exponent(130048.0) == -4293.0
    assert folded_exponent(130560.0) == 3342.75
    with np.errstate(over="ignore"):
        assert np.exp2(np.float32(folded_exponent(130560.0))) == np.inf
    for x in (1e2, 1e3, 1e4, 13000.0):  # |m * c| < 2**31
        assert abs(folded_exponent(x)) <= 128.0, x


# ----------------------------------------------------------------------------- interpret


@pytest.mark.parametrize("variant", [MosaicVariant(lazy_rescale_log2=MAX_LAZY_RESCALE_LOG2),
                                     MosaicVariant(rowsum_before_handover=False),
                                     MosaicVariant(lazy_rescale_log2=8.0,
                                                   rowsum_before_handover=True)],
                         ids=lambda v: v.label())
def test_variant_in_interpret_mode_against_float64(variant):
    """The real kernel (barriers, masking, lengths) with the switch on, ``wgmma``
    replaced by ``lax.dot_general``: causal, lengths that are no tile multiples, and
    growing logits (``q_scale``) so the lazy rule keeps stale maxima."""
    case = Case("variant", batch=2, q_len=200, kv_len=330, num_heads=2, num_kv_heads=1,
                head_dim=64, dtype="bfloat16", causal=True, q_lengths=(200, 77),
                kv_lengths=(330, 129))
    q, k, v, ql, kl = random_inputs(case, seed=int(np.random.default_rng().integers(1 << 31)),
                                    q_scale=3.0)
    scale = 1.0 / math.sqrt(case.head_dim)
    out = pallas_mosaic_gpu_attention(q, k, v, causal=True, scale=scale, q_lengths=ql,
                                      kv_lengths=kl, interpret=True, variant=variant)
    ref = attention_reference(q, k, v, causal=True, scale=scale, q_lengths=ql, kv_lengths=kl)
    naive = naive_attention(q, k, v, causal=True, scale=scale, q_lengths=ql, kv_lengths=kl)
    naive_err = relative_error(np.asarray(naive, np.float64), ref)
    assert_accurate(jnp.asarray(out, jnp.float32), ref, "bfloat16", naive_err)
    rows = np.arange(case.q_len)[None, :] >= np.asarray(ql)[:, None]
    assert np.all(np.asarray(out, np.float32)[rows] == 0.0)


def _interpreted_against_float64(case: Case, variant: MosaicVariant, races: bool) -> None:
    """Run ``case`` with ``variant`` in JAX's GPU interpreter on fresh random inputs
    (growing logits, ``q_scale`` 2) and hold it to the issue's bound of naive's error
    against float64; padded query rows exactly zero; with ``races``, no race found."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    q, k, v, ql, kl = random_inputs(case, seed=int(np.random.default_rng().integers(1 << 31)),
                                    q_scale=2.0)
    scale = 1.0 / math.sqrt(case.head_dim)
    try:
        out = pallas_mosaic_gpu_attention(
            q, k, v, causal=case.causal, scale=scale, q_lengths=ql, kv_lengths=kl,
            config=case.config, interpret=InterpretGPUParams(detect_races=races),
            variant=variant)
        if races:
            assert not interpret_pallas_call.get_races().races_found
    finally:
        interpret_pallas_call.reset_gpu_interpret_mode_state()
    ref = attention_reference(q, k, v, causal=case.causal, scale=scale, q_lengths=ql,
                              kv_lengths=kl)
    naive = naive_attention(q, k, v, causal=case.causal, scale=scale, q_lengths=ql,
                            kv_lengths=kl)
    naive_err = relative_error(np.asarray(jnp.asarray(naive, jnp.float32), np.float64), ref)
    assert_accurate(jnp.asarray(out, jnp.float32), ref, case.dtype, naive_err)
    if ql is not None:
        rows = np.arange(case.q_len)[None, :] >= np.asarray(ql)[:, None]
        assert np.all(np.asarray(jnp.asarray(out, jnp.float32))[rows] == 0.0)


PIPELINE_CASES = [
    # causal GQA with lengths, 64 x 64 tiles: example 1's second query pair lies past
    # its length (ub = 0), example 2 sees 40 keys (ub = 1: prologue and epilogue only),
    # and the consumers' unmasked/masked split falls inside the tile (the carried
    # logits cross it); race detection on.
    (Case("pipe_causal_gqa_lengths", batch=3, q_len=200, kv_len=330, num_heads=2,
          num_kv_heads=1, head_dim=64, dtype="bfloat16", causal=True,
          q_lengths=(200, 77, 150), kv_lengths=(330, 129, 40),
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)), {}, True),
    # full mask at head_dim 128 (padded from 96), a 3-deep ring: kv length 128 ends on
    # a block (the last block unmasked, n_full = ub), 40 gives ub = 1, q length 60
    # leaves the second pair empty (ub = 0).
    (Case("pipe_full_d96_lengths", batch=3, q_len=200, kv_len=330, num_heads=4,
          num_kv_heads=2, head_dim=96, dtype="float16", causal=False,
          q_lengths=(200, 60, 131), kv_lengths=(330, 128, 40),
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=3)), {}, False),
    # head_dim 256 with the lazy rescale (its registered switch there), static bounds:
    # 3 blocks, none masked (n_full = ub known at trace time).
    (Case("pipe_d256_static_lazy", batch=1, q_len=128, kv_len=192, num_heads=2,
          num_kv_heads=2, head_dim=256, dtype="bfloat16", causal=False,
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)),
     {"lazy_rescale_log2": 8.0}, False),
    # static ub = 1 (40 keys, 64-key blocks): only the prologue and a masked epilogue.
    (Case("pipe_d128_one_block", batch=1, q_len=100, kv_len=40, num_heads=2,
          num_kv_heads=1, head_dim=128, dtype="bfloat16", causal=False,
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)), {}, False),
]


@pytest.mark.parametrize("case, switches, races", PIPELINE_CASES,
                         ids=[c.name for c, _, _ in PIPELINE_CASES])
def test_intra_wg_pipeline_in_interpret_mode_against_float64(case, switches, races):
    """The pipelined consumer loop in JAX's GPU interpreter (the same prologue, steps
    that take Q K^T of the next block before this block's softmax, and epilogue, with
    every barrier) on fresh random inputs against float64: within the issue's bound of
    naive's error, padded query rows exactly zero, and no race on the ring slots (a
    K slot freed before its next-block Q K^T read it would be one)."""
    _interpreted_against_float64(case, MosaicVariant(intra_wg_pipeline=True, **switches),
                                 races)


TILE_BOUNDARY_CASES = [
    # the offset once per kernel at d64: causal GQA, 3 query pairs x 2 heads x 2 examples
    # = 12 tiles in the interpreter's one CTA, every boundary crossed by the ping-pong;
    # race detection on (a slot or query tile reused before both consumers let go of it)
    (Case("across_d64_causal_gqa", batch=2, q_len=384, kv_len=384, num_heads=4,
          num_kv_heads=2, head_dim=64, dtype="bfloat16", causal=True,
          config=MosaicConfig(block_q=64, block_kv=128, kv_ring_depth=2)),
     {"pingpong_across_tiles": True, "rowsum_before_handover": False}, True),
    # with the intra-warpgroup pipeline at d128 (head_dim 96 padded), full mask
    (Case("across_pipelined_d96_full", batch=1, q_len=256, kv_len=320, num_heads=2,
          num_kv_heads=1, head_dim=96, dtype="float16", causal=False,
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)),
     {"pingpong_across_tiles": True, "intra_wg_pipeline": True}, False),
    # d256: four 64-column output stores per tile, across tiles, the lazy rescale, causal
    (Case("chunks4_across_d256_causal", batch=1, q_len=256, kv_len=256, num_heads=2,
          num_kv_heads=2, head_dim=256, dtype="bfloat16", causal=True,
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)),
     {"output_chunks": 4, "pingpong_across_tiles": True, "lazy_rescale_log2": 8.0}, False),
    # d256 with lengths (the offset per tile) and two output stores; query pairs past a
    # length are empty tiles and their rows exact zeros
    (Case("chunks2_d256_lengths", batch=2, q_len=300, kv_len=330, num_heads=2,
          num_kv_heads=1, head_dim=256, dtype="bfloat16", causal=False,
          q_lengths=(300, 77), kv_lengths=(330, 129),
          config=MosaicConfig(block_q=64, block_kv=64, kv_ring_depth=2)),
     {"output_chunks": 2, "pingpong_across_tiles": True}, False),
]


@pytest.mark.parametrize("case, switches, races", TILE_BOUNDARY_CASES,
                         ids=[c.name for c, _, _ in TILE_BOUNDARY_CASES])
def test_tile_boundary_switches_in_interpret_mode_against_float64(case, switches, races):
    """The tile-boundary switches in JAX's GPU interpreter on fresh random inputs against
    float64: the ping-pong's offset set once per kernel (consumer 0 starts a tile while
    consumer 1 finishes the last one; every barrier phase still waited once, in order)
    and the output staged through head_dim / n-column buffers (n TMA stores per tile,
    each fill after the previous store's read). Within the issue's bound of naive's
    error; padded query rows exactly zero."""
    _interpreted_against_float64(case, MosaicVariant(**switches), races)


# ----------------------------------------------------------------------------- GPU


def _gpu_variants():
    """(switches, head_dim) of every entry of the benchmark file that sets switches:
    a ``variant`` at head_dim 64, a ``registered_plus`` at each of its head_dims (on the
    switches registered there without a mask or length)."""
    out = []
    for entry in variants_tool.load_variant_sets()["variants"]:
        if entry.get("variant"):
            out.append((MosaicVariant(**entry["variant"]), 64))
        elif entry.get("registered_plus") and "config" not in entry:
            out += [(variants_tool.entry_variant(entry, d), d)
                    for d in entry.get("head_dims", (64, 128, 256))]
    return out


def check_variant_kinds(variant: MosaicVariant, head_dim: int, dtype: str, *, seq: int,
                        interpret: bool = False) -> None:
    """The contract's extreme kinds for one variant against float64: poison in the padding never
    reaches the output (padded query rows exactly 0), and large equal logits with one or
    two visible keys stay finite and equal to float64; then, without lengths (the only
    calls that set the ping-pong's offset once per kernel), causal and full inputs of
    ``seq`` tokens (several tiles per CTA) within the issue's bound of naive's error."""
    seed = int(np.random.default_rng().integers(1 << 31))
    run = functools.partial(pallas_mosaic_gpu_attention, scale=0.125, variant=variant,
                            interpret=interpret)
    for causal in (False, True):
        case = Case("no_lengths", batch=2, q_len=seq, kv_len=seq, num_heads=4,
                    num_kv_heads=2, head_dim=head_dim, dtype=dtype, causal=causal)
        q, k, v, _, _ = random_inputs(case, seed=seed, q_scale=2.0)
        out = run(q, k, v, causal=causal, q_lengths=None, kv_lengths=None,
                  num_sms=None if interpret else 8)
        ref = attention_reference(q, k, v, causal=causal, scale=0.125)
        naive = naive_attention(q, k, v, causal=causal, scale=0.125, q_lengths=None,
                                kv_lengths=None)
        naive_err = relative_error(np.asarray(jnp.asarray(naive, jnp.float32), np.float64), ref)
        assert_accurate(jnp.asarray(out, jnp.float32), ref, dtype, naive_err)
    for poison in poisoned.POISONS:
        for causal in (False, True):
            (q, k, v), (qc, kc, vc), ql, kl, q_pad = poisoned._padded_inputs(
                dtype, poison, seed, head_dim=head_dim, causal=causal)
            out = run(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
            out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
            ref = attention_reference(qc, kc, vc, causal=causal, scale=0.125,
                                      q_lengths=ql, kv_lengths=kl)
            assert np.all(np.isfinite(out)), (poison, causal)
            assert np.all(out[q_pad] == 0.0), (poison, causal)
            assert relative_error(out, ref) < poisoned.TOLERANCE[dtype], (poison, causal)
    for visible in (1, 2):
        (q, k, v), kl = poisoned._extreme_inputs(dtype, seed, visible, head_dim)
        out = run(q, k, v, causal=False, q_lengths=None, kv_lengths=kl)
        out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
        ref = attention_reference(q, k, v, scale=0.125, kv_lengths=kl)
        assert np.all(np.isfinite(out)), visible
        assert relative_error(out, ref) < poisoned.TOLERANCE[dtype], visible


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
@pytest.mark.parametrize("variant, head_dim", _gpu_variants(),
                         ids=lambda x: x.label() if isinstance(x, MosaicVariant) else f"d{x}")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_variant_poisoned_padding_and_extremes(variant, head_dim, dtype):
    """:func:`check_variant_kinds` natively, 1024 tokens on 8 CTAs."""
    check_variant_kinds(variant, head_dim, dtype, seq=1024)


def test_the_gpu_checks_run_in_interpret_mode_on_the_registered_d256_switches():
    """The `gpu` test's body in JAX's GPU interpreter (128 tokens: 8 tiles in one CTA),
    on the switches registered at head_dim 256 (the lazy rescale and the half-width
    output, stored in two copies): the first H200 run of the body failed on a
    call of the naive baseline without its lengths before any kernel check, so the body
    runs here first."""
    variant = mosaic_variants.registered_default(256)
    assert variant.output_chunks == 2
    check_variant_kinds(variant, 256, "bfloat16", seq=128, interpret=True)


def test_variant_file_is_valid_json_with_unique_names():
    sets = variants_tool.load_variant_sets()
    names = [e["name"] for e in sets["variants"]]
    assert len(names) == len(set(names)) and "default" in names
    json.dumps(sets)


# ----------------------------------------------------------------------------- the tool

PTXAS_SAMPLE = """ptxas info    : Compiling entry function 'kernelgate_flash_fwd_mosaic_gpu' for 'sm_90a'
ptxas info    : Function properties for kernelgate_flash_fwd_mosaic_gpu
    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 168 registers
"""


def test_ptxas_report_is_parsed_and_absence_is_reported():
    assert ptxas_report.parse_ptxas(PTXAS_SAMPLE) == {
        "registers": 168, "spill_store_bytes": 24, "spill_load_bytes": 16}
    assert ptxas_report.parse_ptxas("no compiler output here") is None


def test_output_written_at_the_file_descriptor_level_is_captured():
    """Mosaic GPU's C++ prints the ptxas report to fd 1/2, past Python's sys.stdout."""
    import os

    sink: list[str] = []
    with ptxas_report.captured_output(sink):
        os.write(1, b"ptxas info    : Used 200 registers\n")
        os.write(2, b"0 bytes spill stores, 0 bytes spill loads\n")
    assert ptxas_report.parse_ptxas("".join(sink)) == {
        "registers": 200, "spill_store_bytes": 0, "spill_load_bytes": 0}


def test_shape_sets_follow_the_fa3_paper_grid():
    sets = variants_tool.load_variant_sets()
    grid = variants_tool.shapes(sets["grid_shapes"])
    assert len(grid) == 12
    for shape in grid:
        assert shape.batch * shape.q_len == 16384 and shape.num_heads * shape.head_dim == 2048
    both = variants_tool.shapes({**sets["grid_shapes"], "dtypes": ["bfloat16", "float16"]})
    assert sorted({s.dtype for s in both}) == ["bfloat16", "float16"] and len(both) == 24
    priority = variants_tool.shapes(sets["priority_shapes"])
    assert {(s.head_dim, s.causal, s.q_len) for s in priority} == {(64, False, 16384),
                                                                     (256, False, 16384)}


def test_the_default_row_runs_the_switches_the_kernel_is_registered_with():
    sets = {e["name"]: e for e in variants_tool.load_variant_sets()["variants"]}
    for head_dim in (64, 128, 256):
        for causal, kv_len in ((False, 4096), (True, 4096), (False, 16384)):
            registered = mosaic_variants.registered_default(head_dim, causal=causal,
                                                            kv_len=kv_len)
            for name in ("default", "d64-tile-q64-kv256"):
                assert variants_tool.entry_variant(sets[name], head_dim, causal=causal,
                                                   kv_len=kv_len) == registered
    # at 256 without a mask the registered switches depend on the length
    assert variants_tool.entry_variant(sets["default"], 256, causal=False, kv_len=4096) != \
        variants_tool.entry_variant(sets["default"], 256, causal=False, kv_len=16384)
    # at 256 the registered kernel has the lazy rescale; an explicit variant is exact
    assert variants_tool.entry_variant(sets["default"], 256).lazy_rescale_log2 is not None
    explicit = variants_tool.entry_variant(sets["rowsum-before-handover"], 256)
    assert explicit.lazy_rescale_log2 is None and explicit.rowsum_before_handover is True
    # registered_plus: the registered switches of the shape with the pipeline on top
    plus = sets["registered-intra-wg-pipeline"]
    for head_dim in (64, 128, 256):
        for causal, kv_len in ((False, 4096), (True, 4096), (False, 16384)):
            registered = mosaic_variants.registered_default(head_dim, causal=causal,
                                                            kv_len=kv_len)
            got = variants_tool.entry_variant(plus, head_dim, causal=causal, kv_len=kv_len)
            assert got.intra_wg_pipeline and got == registered.model_copy(
                update={"intra_wg_pipeline": True}), (head_dim, causal, kv_len)
    assert variants_tool.entry_variant(plus, 256, causal=False, kv_len=4096) == MosaicVariant(
        lazy_rescale_log2=8.0, rowsum_before_handover=True, output_chunks=2,
        intra_wg_pipeline=True)
    # the pipelined entries run 64 x 128 at head_dim 64 (the table's 64 x 256 is refused)
    for name in ("intra-wg-pipeline", "registered-intra-wg-pipeline", "d64-tile-q64-kv128"):
        assert variants_tool.block_sizes(sets[name], 64).block_kv == 128, name
    # the registered switches are those of the padded head_dim: 193..256 pad to 256
    assert variants_tool.entry_variant(sets["default"], 193).lazy_rescale_log2 is not None
    assert variants_tool.entry_variant(sets["default"], 192).lazy_rescale_log2 is None


def test_the_64x192_entries_run_at_d128_with_the_registered_switches():
    """``d128-tile-q64-kv192`` is the kernel as registered at each d128 shape with the
    64 x 192 tile; ``...-regs-240`` the same with FA3's 240/24 register split on top
    (``registered_plus``, so the row-sum order registered at d128 stays on). Both run
    only at head_dim 128: on the grid its four rows (full and causal, S = 16384 at B1 and
    4096 at B4, per dtype), where 4096 and 16384 are no multiples of 192 (the unpadded
    K/V path); the priority set has no d128 shape, so the tool narrows it to d128."""
    sets = variants_tool.load_variant_sets()
    by_name = {e["name"]: e for e in sets["variants"]}
    tile, regs = by_name["d128-tile-q64-kv192"], by_name["d128-tile-q64-kv192-regs-240"]
    for entry in (tile, regs):
        assert entry["head_dims"] == [128]
        assert variants_tool.block_sizes(entry, 128) == MosaicConfig(block_q=64, block_kv=192,
                                                                   kv_ring_depth=2)
    for causal in (False, True):
        for kv_len in (4096, 16384):
            registered = mosaic_variants.registered_default(128, causal=causal, kv_len=kv_len)
            assert variants_tool.entry_variant(tile, 128, causal=causal,
                                               kv_len=kv_len) == registered
            got = variants_tool.entry_variant(regs, 128, causal=causal, kv_len=kv_len)
            assert got == registered.model_copy(
                update={"consumer_registers": 240, "producer_registers": 24})
            assert got.rowsum_before_handover is False  # registered at d128 (measured on the H200)
            # The tile cannot hold the checked FMA's row flags: the kernel runs the next
            # rule (what the tool records for the row).
            ran = pallas_mosaic_gpu.registered_variant(
                variants_tool.block_sizes(tile, 128), 128, 2, causal=causal, kv_len=kv_len)
            assert not ran.checked_fma_exponent
            assert ran.bounded_fma_exponent is (kv_len >= 16384)
            assert kv_len % 192 and pallas_mosaic_gpu.kv_rows(
                kv_len, 128, 192, interpret=False, has_kv_lengths=False) == kv_len
    grid = [s for s in variants_tool.shapes({**sets["grid_shapes"],
                                             "dtypes": ["bfloat16", "float16"]})
            if s.head_dim in tile["head_dims"]]
    assert sorted((s.dtype, s.causal, s.batch, s.q_len) for s in grid) == sorted(
        (dtype, causal, batch, seq) for dtype in ("bfloat16", "float16")
        for causal in (False, True) for batch, seq in ((1, 16384), (4, 4096)))
    assert all(s.num_heads == 16 for s in grid)
    assert 128 not in sets["priority_shapes"]["head_dims"]


def test_a_bad_variant_file_is_refused(tmp_path):
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps({"variants": [{"name": "x", "variant": {"lazy_rescale_log2": 99}}]}))
    with pytest.raises(ValidationError, match="lazy_rescale_log2"):
        variants_tool.load_variant_sets(bad)
    bad.write_text(json.dumps({"variants": [{"name": "x"}, {"name": "x"}]}))
    with pytest.raises(ValueError, match="repeat"):
        variants_tool.load_variant_sets(bad)
    bad.write_text(json.dumps({"variants": [{"name": "x", "registered_plus": {"pipe": 1}}]}))
    with pytest.raises(ValidationError, match="pipe"):
        variants_tool.load_variant_sets(bad)
    bad.write_text(json.dumps({"variants": [{"name": "x", "variant": {},
                                             "registered_plus": {"intra_wg_pipeline": True}}]}))
    with pytest.raises(ValueError, match="exclude each other"):
        variants_tool.load_variant_sets(bad)


def test_table_shows_failures_and_spills():
    rows = [{"shape": "s", "variant": "cudnn", "median_s": 1e-3, "tflops": 500.0},
            {"shape": "s", "variant": "lazy", "median_s": 0.9e-3, "tflops": 555.0,
             "ratio_to_cudnn": 1.11, "ratio_to_default": 1.05, "of_ceiling": 0.8,
             "sampled_error_ratio_to_cudnn": 1.0, "correct": True,
             "ptxas": {"registers": 232, "spill_store_bytes": 8, "spill_load_bytes": 8}},
            {"shape": "s", "variant": "broken", "error": "Traceback...\nValueError: ptxas failed"}]
    text = variants_tool.format_table(rows)
    assert "8/8" in text and "232" in text and "FAILED: ValueError: ptxas failed" in text


def test_the_kernels_of_a_shape_are_timed_in_interleaved_passes(monkeypatch):
    """Pass 1 of every kernel, then pass 2, ...: a clock drift within the process reaches
    every kernel alike (timed back to back, the kernel timed last would meet it alone).
    Each kernel's figure is the median of its own passes' medians."""
    calls = []

    def fake_time_call(fn, args, **kwargs):
        calls.append(fn)
        s = fn(len(calls))
        return Timing(median_s=s, min_s=s, max_s=s, repeats=1, calls_per_repeat=1)

    monkeypatch.setattr(variants_tool, "time_call", fake_time_call)
    a, b = (lambda n: 1.0 + n), (lambda n: 100.0 - n)
    timed = variants_tool._timed([a, b], ())
    assert calls == [a, b] * variants_tool.PASSES
    assert timed[0]["pass_median_s"] == [2.0, 4.0, 6.0] and timed[0]["median_s"] == 4.0
    assert timed[1]["pass_median_s"] == [98.0, 96.0, 94.0] and timed[1]["median_s"] == 96.0


def _fake_shape_run(monkeypatch, errors: dict, seconds: dict, raise_when_timed=()):
    """run_shape with stand-in kernels: each compiled call returns its name, whose sampled
    error is ``errors[name]`` and whose time is ``seconds[name]`` (raising while timed for
    the names in ``raise_when_timed``); default and one variant at d128, peers cuDNN, FA3."""
    class Named:
        def __init__(self, name):
            self.name = name

        def __call__(self, q, k, v):
            return self.name

    current = {}
    entry_variant = variants_tool.entry_variant

    def named_entry(entry, *args, **kwargs):
        current["name"] = entry["name"]
        return entry_variant(entry, *args, **kwargs)

    def time_call(fn, args, **kwargs):
        if fn.name in raise_when_timed:
            raise RuntimeError(f"{fn.name} failed while timed")
        s = seconds[fn.name]
        return Timing(median_s=s, min_s=s, max_s=s, repeats=1, calls_per_repeat=1)

    monkeypatch.setattr(variants_tool.bench, "attention_fn", lambda peer, shape, cfg: Named(peer))
    monkeypatch.setattr(variants_tool, "entry_variant", named_entry)
    monkeypatch.setattr(variants_tool, "_variant_fn",
                        lambda *a, **k: Named(current["name"]))
    monkeypatch.setattr(variants_tool, "compile_and_warm", lambda fn, args: (fn, 0.1, None))
    monkeypatch.setattr(variants_tool.bench, "_sampled", lambda out, pairs, rows: out)
    monkeypatch.setattr(variants_tool, "relative_error", lambda out, ref: errors[out])
    monkeypatch.setattr(variants_tool, "small_check", lambda *a, **k: {"correct": True})
    monkeypatch.setattr(variants_tool, "time_call", time_call)
    shape = AttentionShape(dtype="bfloat16", batch=1, q_len=128, kv_len=128, num_heads=1,
                           num_kv_heads=1, head_dim=128, causal=False)
    rows = variants_tool.run_shape(shape, [{"name": "default"}, {
        "name": "lazy", "variant": {"lazy_rescale_log2": 8.0}}], ceiling=10.0, seed=1)
    return {r["variant"]: r for r in rows}


def test_peer_rows_are_checked_against_float64_like_the_variants(monkeypatch):
    """A peer whose output is wrong (FA3 at 500x cuDNN's error) is marked incorrect, so
    the FA3 floor is not judged on it; every variant row still gets its ratios."""
    by = _fake_shape_run(monkeypatch, {"cudnn": 1e-3, "fa3": 0.5, "default": 1e-3,
                                       "lazy": 1e-3},
                         {"cudnn": 1.0, "fa3": 0.5, "default": 1.25, "lazy": 1.0})
    assert by["fa3"]["correct"] is False and by["fa3"]["sampled_error_ratio_to_cudnn"] == 500
    assert by["cudnn"]["correct"] is True
    lazy = by["lazy"]
    assert lazy["correct"] and lazy["ratio_to_cudnn"] == 1.0 and lazy["ratio_to_fa3"] == 0.5
    assert lazy["ratio_to_default"] == 1.25 and lazy["of_ceiling"] == lazy["tflops"] / 10.0


def test_a_kernel_failing_while_timed_is_its_own_row_and_the_others_are_timed(monkeypatch):
    by = _fake_shape_run(monkeypatch, {"cudnn": 1e-3, "fa3": 1e-3, "default": 1e-3,
                                       "lazy": 1e-3},
                         {"cudnn": 1.0, "fa3": 0.5, "default": 1.25, "lazy": 1.0},
                         raise_when_timed=("lazy",))
    assert "lazy failed while timed" in by["lazy"]["error"] and not by["lazy"]["correct"]
    assert "median_s" not in by["lazy"] and "ratio_to_default" not in by["lazy"]
    assert by["default"]["median_s"] == 1.25 and by["default"]["ratio_to_fa3"] == 0.4
    assert by["default"]["correct"]


@pytest.mark.slow
def test_a_variant_row_is_timed_checked_and_compared_with_the_default(monkeypatch):
    """run_shape end to end on this CPU host: the kernel in interpret mode, one timing
    call instead of three passes, cuDNN absent (its row names why). About 60 s on two
    CPU cores (interpret mode), hence ``slow``."""
    monkeypatch.setattr(variants_tool, "_timed", lambda fns, args: [{
        "median_s": variants_tool.time_call(fn, args, repeats=1, max_calls=1,
                                            warmup_s=0.0).median_s, "pass_median_s": []}
        for fn in fns])
    shape = AttentionShape(dtype="bfloat16", batch=1, q_len=256, kv_len=256, num_heads=1,
                           num_kv_heads=1, head_dim=64, causal=False)
    entries = [{"name": "default"}, {"name": "lazy", "variant": {"lazy_rescale_log2": 8.0}},
               {"name": "wide", "variant": {}, "head_dims": [256]}]
    rows = variants_tool.run_shape(shape, entries, ceiling=1.0, seed=3, interpret=True,
                                   small_seqs=(100, 150))
    by = {r["variant"]: r for r in rows}
    assert set(by) == {"cudnn", "default", "lazy"}  # "wide" is not for head_dim 64
    assert "error" in by["cudnn"]
    for name in ("default", "lazy"):
        row = by[name]
        assert row["correct"] and row["small_check"]["correct"], row
        assert row["ptxas"] == "no ptxas report captured"  # no ptxas off-GPU
    assert by["default"]["ratio_to_default"] == 1.0
    assert by["lazy"]["switches"]["lazy_rescale_log2"] == 8.0


def test_fa3_is_a_peer_row_at_head_dim_128_only_and_names_why_it_did_not_run():
    """run_shape times FlashAttention-3 beside cuDNN where the wheel's one head_dim is
    asked: on this CPU host (no wheel, no GPU) a d128 shape gets an ``fa3`` row with the
    refusal, a d64 shape none (nothing to compare there)."""
    rows = {}
    for d in (64, 128):
        shape = AttentionShape(dtype="bfloat16", batch=1, q_len=128, kv_len=128,
                               num_heads=1, num_kv_heads=1, head_dim=d, causal=False)
        rows[d] = {r["variant"]: r for r in variants_tool.run_shape(shape, [], ceiling=1.0,
                                                                    seed=5)}
    assert set(rows[64]) == {"cudnn"} and set(rows[128]) == {"cudnn", "fa3"}
    assert "fa3" in rows[128]["fa3"]["error"] and "tflops" not in rows[128]["fa3"]


def test_every_call_times_the_registered_kernel_twice_unless_told_not_to(monkeypatch, tmp_path):
    """The benchmark's A/A: the registered kernel again (``call_aa.AA_VARIANT``),
    last on every shape, resolved exactly as ``default`` is; ``--no-aa`` leaves it out."""
    seen: list[list[dict]] = []

    def fake_run_shape(shape, entries, ceiling, seed):
        seen.append(entries)
        return [{"shape": shape.label, "variant": e["name"], "tflops": 100.0,
                 "median_s": 1e-3, "correct": True} for e in entries]

    monkeypatch.setattr(variants_tool, "run_shape", fake_run_shape)
    monkeypatch.setattr(variants_tool, "matmul_ceiling", lambda sizes: {"ceiling": 700.0})
    twin = variants_tool.call_aa.AA_VARIANT
    out = tmp_path / "report.json"
    args = ["--shapes", "grid", "--head-dims", "128", "--dtypes", "bfloat16",
            "--variants", "checked-fma", "--out", str(out)]
    assert variants_tool.main(args) == 0
    assert seen and all([e["name"] for e in entries] == ["default", "checked-fma", twin]
                        for entries in seen)
    default = seen[0][0]
    assert {k: v for k, v in seen[0][-1].items() if k != "name"} == {
        k: v for k, v in default.items() if k != "name"}  # the file's default, renamed
    for causal, kv_len in ((False, 16384), (True, 4096)):
        assert (variants_tool.entry_variant(seen[0][-1], 128, causal=causal, kv_len=kv_len)
                == variants_tool.entry_variant(default, 128, causal=causal, kv_len=kv_len))
    assert variants_tool.block_sizes(seen[0][-1], 128) == variants_tool.block_sizes(default, 128)
    report = json.loads(out.read_text())
    assert report["a_a"]["geomean"] == 1.0 and len(report["a_a"]["ratios"]) == len(seen)
    assert twin not in report["summary"]
    seen.clear()
    assert variants_tool.main([*args, "--no-aa"]) == 0
    assert all(twin not in [e["name"] for e in entries] for entries in seen)
    assert json.loads(out.read_text())["a_a"]["ratios"] == {}


def test_the_a_a_twin_s_name_is_reserved_in_the_variant_file(tmp_path):
    data = json.loads(variants_tool.VARIANTS_FILE.read_text())
    data["variants"].append({"name": variants_tool.call_aa.AA_VARIANT,
                             "variant": {"lazy_rescale_log2": 8.0}})
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="reserved"):
        variants_tool.load_variant_sets(path)
