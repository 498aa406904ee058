"""No summary a person reads says "every criterion passed" while any criterion was not
assessed: the CLI's result and the Prefect artifact (``RolloutOutcome.markdown``), the
flow run's state message and the version's description (``RolloutOutcome.summary``),
the rollout run's name (``run_title``) and the approval form (``approval_markdown``).
Each states, in the verdict's own line, what was not assessed."""

from __future__ import annotations

import pytest

from gates.approval_view import approval_markdown
from gates.headline import ALL_PASSED, caveat, promotion_reason
from lineage.rollout.rollout import RolloutOutcome, run_title
from tests.test_gates_headline import _decision, _step


def _outcome(decision, traffic, result="promoted", stage="promotion"):
    reason = promotion_reason(decision, traffic) if result == "promoted" else "gate rejected"
    return RolloutOutcome(family="f", version="3", result=result, stage=stage, reason=reason,
                          decided_by="the gate", not_assessed=caveat(decision, traffic),
                          decision_summary=decision.summary,
                          not_assessed_note=decision.not_assessed_note, rollout_run_id="r",
                          tracking_uri="sqlite:///x", ui_command="kernelgate ui")


def _summaries(decision, traffic, result="promoted", stage="promotion") -> dict[str, str]:
    outcome = _outcome(decision, traffic, result, stage)
    return {"verdict line": outcome.verdict(), "state message": outcome.summary(),
            "CLI / artifact heading": outcome.markdown().splitlines()[0],
            "run name": run_title("pallas_tpu", "3", result, stage, outcome.not_assessed),
            "form heading": next(
                line for line in approval_markdown("shadow->canary", "3", decision).splitlines()
                if line.startswith("### Held-out gate"))}


INTERPRETED = dict(speed_assessed=False,
                   speed_not_assessed_reason="pallas_tpu ran in TPU interpret mode on a cpu host")


@pytest.mark.parametrize("result,stage", [("promoted", "promotion"), ("rejected", "gate")])
@pytest.mark.parametrize("case", ["gate", "canary latency"])
def test_no_summary_says_all_passed_while_something_was_not_assessed(case, result, stage):
    decision = _decision(**INTERPRETED) if case == "gate" else _decision()
    traffic = [_step("candidate runs interpreted")]
    assert any(c.status == "not_assessed" for c in decision.criteria) or case != "gate"
    for where, text in _summaries(decision, traffic, result, stage).items():
        if where == "form heading" and case != "gate":
            continue  # the form's gate heading is about the gate only
        assert "every" not in text and ALL_PASSED not in text, (where, text)
        assert "not assessed" in text, (where, text)


def test_a_fully_assessed_promotion_says_so_and_nothing_else():
    decision, traffic = _decision(), [_step()]
    assert caveat(decision, traffic) is None
    summaries = _summaries(decision, traffic)
    assert ALL_PASSED in summaries["state message"]
    assert all("not assessed" not in text for text in summaries.values()), summaries


def test_the_heading_names_a_kernel_that_is_not_the_familys_namesake():
    # a family holds versions of other kernels (pallas_mosaic_gpu against cuDNN in
    # family cudnn): its heading must not read as a cuDNN version
    common = dict(version="2", result="not_adopted", stage="adoption", reason="r",
                  rollout_run_id="r", tracking_uri="sqlite:///x", ui_command="kernelgate ui")
    other = RolloutOutcome(family="cudnn", implementation="pallas_mosaic_gpu", **common)
    assert other.markdown().splitlines()[0].startswith(
        "# kernelgate rollout: cudnn v2 (pallas_mosaic_gpu) — ")
    namesake = RolloutOutcome(family="cudnn", implementation="cudnn", **common)
    assert namesake.markdown().splitlines()[0].startswith("# kernelgate rollout: cudnn v2 — ")
