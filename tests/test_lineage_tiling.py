"""A version's tiling is never `null`: the rule in words and the block sizes it resolves
to at each shape (the serving model's and the benchmark's)."""

from __future__ import annotations

from kernels.pallas_tpu import TpuConfig
from kernels.shapes import AttentionShape
from lineage.serving.tiling import resolved_tiling, shape_label, tiling_rule

SHAPES = [AttentionShape(batch=1, q_len=n, kv_len=n, num_heads=12, num_kv_heads=12,
                         head_dim=32, dtype="float32", causal=False) for n in (16, 100, 512)]


def test_a_per_call_tiling_resolves_at_every_shape_and_never_reads_null():
    resolved = resolved_tiling("pallas_tpu", None, SHAPES)
    assert list(resolved) == [shape_label(s) for s in SHAPES]
    assert all("block_q=" in v and "block_kv=" in v for v in resolved.values()), resolved
    assert "per call" in tiling_rule("pallas_tpu", None)


def test_block_sizes_asked_for_are_the_ones_resolved():
    asked = TpuConfig(block_q=32, block_kv=256)
    resolved = resolved_tiling("pallas_tpu", asked, SHAPES)
    assert all("block_q=32" in v and "block_kv=256" in v for v in resolved.values()), resolved
    rule = tiling_rule("pallas_tpu", asked)
    assert "block_q=32" in rule and "block_kv=256" in rule


def test_an_untiled_kernel_says_so():
    assert set(resolved_tiling("xla", None, SHAPES).values()) == {"untiled"}
    assert tiling_rule("xla", None).startswith("untiled")
