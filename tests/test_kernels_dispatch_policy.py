"""The dispatch policy on a CPU host, with stand-in evidence and stand-in kernels: the
median's interval, the partition of the space, the rule's choice per bucket, the
fingerprint, the audit that re-derives every choice from its evidence, the dispatch
kernel's routing (checked against float64 attention) and the evidence tool end to end.
"""

from __future__ import annotations


import pytest

from kernels.timing import median_interval


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


