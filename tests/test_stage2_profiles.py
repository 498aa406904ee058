"""The GPU canary calibration's stage-2 profiles (``tools/gpu-canary-stage2*.yaml``) are
copies of a shipping profile with the kernel-level speed and memory criteria left
out of the gpu platform, so that a slowed candidate reaches the canary. A copy can drift
from its source; these tests hold each to exactly that derivation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.thresholds import load_thresholds

ROOT = Path(__file__).parents[1]
DERIVED = [("tools/gpu-canary-stage2.yaml", "thresholds/local-dry-run.yaml"),
           ("tools/gpu-canary-stage2-bf16.yaml", "thresholds/bf16-long.yaml")]


def _without_speed_and_memory(criteria):
    return [c for c in criteria if c.kind not in ("speed", "memory")]


@pytest.mark.parametrize(("derived", "source"), DERIVED)
def test_a_stage2_profile_is_its_source_without_the_gpu_speed_and_memory_criteria(derived,
                                                                                  source):
    d, s = load_thresholds(ROOT / derived), load_thresholds(ROOT / source)
    # the canary plan (the local profile's latency plan and sizes) and what is served
    assert d.canary == s.canary and d.serving == s.serving and d.approval == s.approval
    assert d.platforms["gpu"].value == _without_speed_and_memory(s.platforms["gpu"].value)
    assert d.platforms["gpu"].change == _without_speed_and_memory(s.platforms["gpu"].change)
    assert d.platforms["gpu"].change, "the accuracy-vs-production criterion stays"
    for other in ("tpu", "cpu"):
        assert d.platforms[other] == s.platforms[other], other
    assert d.profile != s.profile  # its own registration, never mistaken for the source


def test_the_stage2_profiles_share_the_local_latency_plan():
    plans = {load_thresholds(ROOT / d).canary.latency for d, _ in DERIVED}
    assert len(plans) == 1
