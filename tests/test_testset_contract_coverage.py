"""Every shipped registration can be judged on the test set it will meet.

A criterion on ``accuracy.<category>.*`` is *inconclusive* when fewer than
``min_cases_per_category`` cases of that category lie inside the registration's serving
contract (``gates.decision``). On the H200 (2026-12-01) the first ``bf16-long`` rollout of
``pallas_mosaic_gpu`` ended *Rejected* that way: the GPU test set had no adversarial case
in bf16 at head_dim 64-256 and S >= 1024, so no kernel could ever pass that registration.
The test reads the recipes the test set is built from (every split draws every recipe)
and each thresholds file, so a new contract or a dropped recipe fails here, before any
device time is spent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.testset.recipes import PROFILES
from gates.thresholds import load_thresholds

THRESHOLDS = sorted((Path(__file__).resolve().parent.parent / "thresholds").glob("*.yaml"))
# The test-set profile each platform's rollouts draw (``--testset-profile auto``): the
# GPU profile on a GPU; the CI profile on CPU hosts (TPU interpret mode included).
PLATFORM_PROFILE = {"gpu": "gpu", "cpu": "ci", "tpu": "ci"}
CATEGORIES = ("hard", "adversarial")  # synthetic; ``ordinary`` comes from MiniLM itself


def _judged_categories(criteria) -> set[str]:
    return {c.metric.split(".")[1] for c in [*criteria.value, *criteria.change]
            if c.metric.startswith("accuracy.") and c.metric.split(".")[1] in CATEGORIES}


def _contract_is_default(serving) -> bool:
    return type(serving)() == serving


@pytest.mark.parametrize("path", THRESHOLDS, ids=lambda p: p.stem)
def test_every_judged_category_has_enough_cases_inside_the_contract(path: Path) -> None:
    thresholds = load_thresholds(path)
    contract = thresholds.serving
    for platform, criteria in thresholds.platforms.items():
        # A narrowed contract (bf16-long) is a GPU registration: the CPU's small test set
        # cannot hold its long sequences, and says so by being inconclusive there.
        if not _contract_is_default(contract) and platform != "gpu":
            continue
        spec = PROFILES[PLATFORM_PROFILE[platform]]
        for category in sorted(_judged_categories(criteria)):
            inside = [r.name for r in (*spec.hard, *spec.adversarial)
                      if r.category == category
                      and contract.serves(r.dtype, r.head_dim, r.q_len, r.kv_len, r.causal)]
            assert len(inside) >= thresholds.min_cases_per_category, (
                f"{path.name} on {platform}: {len(inside)} {category} case(s) inside the "
                f"serving contract ({contract.describe()}), fewer than "
                f"min_cases_per_category={thresholds.min_cases_per_category}: every rollout of "
                "this registration would be inconclusive there")


def test_the_check_sees_a_contract_that_leaves_a_category_empty() -> None:
    """The check above can fail: a contract no adversarial recipe lies in (head_dim 512)."""
    thresholds = load_thresholds(THRESHOLDS[0])
    narrowed = thresholds.serving.model_copy(update={"min_head_dim": 512, "max_head_dim": 512})
    spec = PROFILES["gpu"]
    inside = [r for r in spec.adversarial
              if narrowed.serves(r.dtype, r.head_dim, r.q_len, r.kv_len)]
    assert inside == []


def test_a_causal_case_is_not_drawn_where_the_contract_serves_full_masks_only() -> None:
    import numpy as np

    from evaluation.cases import make_case
    from evaluation.coverage import split_by_contract
    from gates.serving_contract import ServingContract

    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 16, 2, 128)).astype(np.float32) for _ in range(3))
    cases = [make_case(case_id=f"c-{causal}", category="hard", tags=(), q=q, k=k, v=v,
                       causal=causal, source="test") for causal in (False, True)]
    encoder = ServingContract(masks=["full"])
    served, left = split_by_contract(cases, encoder)
    assert [c.spec.case_id for c in served] == ["c-False"]
    assert left == {"c-True": "causal mask not served ['full']"}
    assert len(split_by_contract(cases, ServingContract())[0]) == 2  # both masks: both drawn
