"""The dispatch policy on a CPU host, with stand-in evidence and stand-in kernels: the
median's interval, the partition of the space, the rule's choice per bucket, the
fingerprint, the audit that re-derives every choice from its evidence, the dispatch
kernel's routing (checked against float64 attention) and the evidence tool end to end.
"""

from __future__ import annotations

import pytest

from kernels.dispatch_space import (
    DEFAULT_GRID,
    Bucket,
    BucketGrid,
    CoverageError,
    IntRange,
    Region,
    check_partition,
)
from kernels.timing import median_interval

SPACE = Region(dtypes=("float32",), causal=(False,))
"""A small space for hand-made buckets: float32, non-causal, every size."""


def test_the_median_interval_is_the_order_statistics_its_coverage_allows():
    samples = [float(x) for x in (9, 1, 8, 2, 7, 3, 6, 4, 5, 10, 11)]  # 1..11, shuffled
    low, high, coverage = median_interval(samples, 0.95)
    # n = 11: P(B(11, 1/2) < 2) = 12/2048 <= 0.025 < P(B < 3) = 67/2048, so k = 2
    assert (low, high) == (2.0, 10.0)
    assert coverage == pytest.approx(1 - 2 * 12 / 2048)
    low, high, coverage = median_interval([3.0, 1.0, 2.0], 0.95)  # too few: [min, max]
    assert (low, high) == (1.0, 3.0)
    assert coverage == pytest.approx(1 - 2 ** (1 - 3))
    assert median_interval(samples, 0.5)[0] > 2.0  # a lower confidence, a narrower interval


@pytest.mark.parametrize("samples, confidence, match", [
    ([], 0.95, "at least one sample"), ([1.0], 1.0, r"confidence must lie in \(0, 1\)")])
def test_the_median_interval_refuses_what_it_cannot_bound(samples, confidence, match):
    with pytest.raises(ValueError, match=match):
        median_interval(samples, confidence)




def _split(name: str, q_len: IntRange) -> Bucket:
    return Bucket(name=name, dtypes=("float32",), causal=(False,), q_len=q_len)


def test_buckets_that_split_the_space_exactly_once_are_accepted():
    check_partition(SPACE, [_split("short", IntRange(hi=64)), _split("long", IntRange(lo=64))])


@pytest.mark.parametrize("buckets, match", [
    ([_split("short", IntRange(hi=65)), _split("long", IntRange(lo=64))],
     r"'short' and 'long' overlap: both cover float32 full head_dim \[1, inf\) "
     r"q_len \[64, 65\)"),
    ([_split("short", IntRange(hi=64)), _split("long", IntRange(lo=65))],
     r"no bucket covers float32 full head_dim \[1, inf\) q_len \[64, 65\)"),
    ([_split("short", IntRange(hi=64)), _split("long", IntRange(lo=64)),
      Bucket(name="causal", dtypes=("float32",), causal=(True,))],
     r"'causal' .* reaches outside the policy's space"),
    ([_split("all", IntRange()), _split("all", IntRange(lo=2))], r"\['all'\] appear twice"),
])
def test_buckets_that_overlap_leave_a_gap_or_reach_outside_are_refused(buckets, match):
    with pytest.raises(CoverageError, match=match):
        check_partition(SPACE, buckets)


def test_the_default_grid_splits_by_dtype_causal_head_dim_and_at_1024_and_8192_tokens():
    buckets = DEFAULT_GRID.buckets()
    check_partition(DEFAULT_GRID.space, buckets)
    assert len(buckets) == 3 * 2 * 3 * 3 * 3  # dtypes, causal, head_dim, q_len, kv_len
    ranges = DEFAULT_GRID.axis_ranges()
    assert [r.lo for r in ranges["q_len"]] == [1, 1024, 8192]
    assert [r.lo for r in ranges["kv_len"]] == [1, 1024, 8192]
    assert [(r.lo, r.hi) for r in ranges["head_dim"]] == [(1, 65), (65, 129), (129, None)]

    def bucket_of(**call):
        (found,) = [b for b in buckets if b.contains(**call)]
        return found.name

    call = {"dtype": "bfloat16", "causal": False, "head_dim": 64, "kv_len": 512, "batch": 1}
    assert bucket_of(**call, q_len=1023) != bucket_of(**call, q_len=1024)
    assert bucket_of(**call, q_len=8191) != bucket_of(**call, q_len=8192)
    assert bucket_of(**call, q_len=1024) == bucket_of(**call, q_len=8191)
    assert bucket_of(**{**call, "head_dim": 128}, q_len=64) != bucket_of(**call, q_len=64)


@pytest.mark.parametrize("fields, match", [
    ({"seq_cuts": (8192, 1024)}, "seq_cuts must be strictly increasing"),
    ({"head_dim_cuts": (1,)}, r"head_dim_cuts \[1\] lie outside the space's head_dim"),
    ({"space": Region(q_len=IntRange(hi=2048))},
     r"seq_cuts \[8192\] lie outside the space's q_len \[1, 2048\)"),
])
def test_a_grid_with_cuts_that_split_nothing_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        BucketGrid(**fields)
