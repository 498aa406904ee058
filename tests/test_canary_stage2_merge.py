"""The GPU stage-2 merge (``tools/merge_canary_calibration.py``): the canary
calibration's stage-2 criteria judged from the canary runs and the two rollouts, merged
per device."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lineage.rollout.rollout import RolloutOutcome

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "merge_canary_calibration", ROOT / "tools" / "merge_canary_calibration.py")
merge_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(merge_tool)

PLAN = {"alpha": 0.05, "min_slowdown_ratio": 1.1, "power": 0.9, "noise_sd": 0.2,
        "tolerated_slowdown_ratio": 1.0, "pairs": 80, "last_look_alpha": 0.03}


def _runs(verdicts):
    return [{"seed": 1000 + i, "verdict": v, "reason": f"reason {i}", "pairs": 80,
             "median_ratio": 1.0} for i, v in enumerate(verdicts)]


def _canaries(candidate, verdicts, ratio, power=None):
    return {"device": "NVIDIA H200", "jax_version": "0.11.2", "family": "pallas_gpu",
            "production_version": "1", "production_kernel": "pallas_gpu",
            "candidate": candidate, "plan": PLAN, "runs": _runs(verdicts),
            "rolled_back": sum(v != "pass" for v in verdicts), "median_ratio": ratio,
            "power_at_median_ratio": power, "robust_noise_sd": 0.05}


def _outcome_log(result, stage, reason, version="2"):
    outcome = RolloutOutcome.model_construct(
        family="pallas_gpu", version=version, result=result, stage=stage, reason=reason,
        decision_summary=None, not_assessed_note=None, aliases={"production": "1"},
        rollout_run_id="abc", tracking_uri="sqlite:///x", ui_command="mlflow ui")
    return "12:00 INFO prefect\n\n" + outcome.markdown().replace("**", "")


def _folder(tmp_path, aa, slowed, aa_result="promoted", slowed_result="rolled_back"):
    folder = tmp_path / "stage2"
    folder.mkdir()
    (folder / "aa-canaries.json").write_text(json.dumps(aa))
    (folder / "slowed-canaries.json").write_text(json.dumps(slowed))
    (folder / "aa-rollout.log").write_text(_outcome_log(aa_result, "promotion", "passed"))
    (folder / "slowed-rollout.log").write_text(
        _outcome_log(slowed_result, "canary-5pct", "candidate slower: look 1 p = 0.001"))
    (folder / "device.txt").write_text("NVIDIA H200, 580.159.04\n")
    return folder


def test_the_rollout_outcome_is_read_back_from_what_the_cli_printed():
    got = merge_tool.parse_rollout_log(_outcome_log("rolled_back", "canary-25pct", "slower: x"))
    assert got == {"family": "pallas_gpu", "version": "2", "result": "rolled_back",
                   "stage": "canary-25pct", "reason": "slower: x"}
    with pytest.raises(ValueError, match="no rollout outcome"):
        merge_tool.parse_rollout_log("Traceback ...\n")


def test_a_passing_stage2_is_merged_under_its_device(tmp_path):
    folder = _folder(tmp_path, _canaries("production", ["pass"] * 4 + ["fail"], 1.0),
                     _canaries("slowed_pallas_gpu_x16", ["fail"] * 5, 1.6, power=0.999))
    into = {"simulation": {"cpu-xla.json": {}}, "h200": None, "note": "kept"}
    merged, record = merge_tool.merge(folder, into)
    assert merged["simulation"] == into["simulation"] and merged["note"] == "kept"
    assert merged["h200"]["stage2"] is record and record["driver"] == "580.159.04"
    assert record["met"] and record["aa_canaries"]["met"] and record["rollouts_met"]
    assert [r["which"] for r in record["rollouts"]] == ["aa", "slowed"]
    out = tmp_path / "merged.json"
    code = merge_tool.main(["--stage2", str(folder), "--into", str(tmp_path / "none.json"),
                            "--out", str(out)])
    assert code == 0 and json.loads(out.read_text())["h200"]["stage2"]["met"]


@pytest.mark.parametrize("aa, slowed, aa_result, broken", [
    (["pass", "fail", "fail", "pass", "pass"], ["fail"] * 5, "promoted", "aa_canaries"),
    (["pass"] * 5, ["fail"] * 4 + ["pass"], "promoted", "slowed_canaries"),  # power >= 0.99
    (["pass"] * 5, ["fail"] * 5, "rolled_back", "rollouts"),
])
def test_each_stage2_criterion_can_fail(tmp_path, aa, slowed, aa_result, broken):
    folder = _folder(tmp_path, _canaries("production", aa, 1.0),
                     _canaries("slowed_pallas_gpu_x16", slowed, 1.6, power=0.995),
                     aa_result=aa_result)
    _, record = merge_tool.merge(folder, {})
    assert not record["met"]
    met = {"aa_canaries": record["aa_canaries"]["met"],
           "slowed_canaries": record["slowed_canaries"]["met"],
           "rollouts": record["rollouts_met"]}
    assert [k for k, v in met.items() if not v] == [broken]


def test_below_full_power_one_slowed_pass_is_allowed_but_a_small_ratio_is_not(tmp_path):
    slowed = _canaries("slowed_pallas_gpu_x16", ["fail"] * 4 + ["pass"], 1.3, power=0.95)
    record = merge_tool.judge(_canaries("production", ["pass"] * 5, 1.0), slowed, [])
    assert record["slowed_canaries"]["met"]
    slowed = _canaries("slowed_pallas_gpu_x16", ["fail"] * 5, 1.22, power=0.95)
    record = merge_tool.judge(_canaries("production", ["pass"] * 5, 1.0), slowed, [])
    assert not record["slowed_canaries"]["ratio_met"] and not record["slowed_canaries"]["met"]
    # twice a larger planned slowdown binds above 1.25
    plan = {**PLAN, "min_slowdown_ratio": 1.2}
    slowed = {**_canaries("slowed_pallas_gpu_x16", ["fail"] * 5, 1.35, power=0.999),
              "plan": plan}
    record = merge_tool.judge(_canaries("production", ["pass"] * 5, 1.0), slowed, [])
    assert not record["slowed_canaries"]["ratio_met"]
    assert merge_tool.device_key("NVIDIA H200") == "h200"


def _calibration(tmp_path: Path, runs: int, false_rollbacks: int, within: bool) -> Path:
    record = {"family": "pallas_gpu", "production_version": "1", "registration_id": "r",
              "created_at": "2026-12-01T12:15:19+00:00", "alpha": 0.05, "runs": runs,
              "false_rollbacks": false_rollbacks,
              "false_rollback_rate": false_rollbacks / runs, "rate_95": [0.0, 1.0],
              "within_alpha": within, "inconclusive": 0, "noise_sd": 0.06,
              "facts": {"device_kind": "NVIDIA H200"}, "verdicts": [], "log_ratios": []}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(("runs", "rolled_back", "within", "met"), [
    (200, 9, True, True),     # the H200's stage 1 (2026-12-01)
    (200, 20, False, False),  # over alpha's margin
    (100, 4, True, False),    # too few A/A canaries for the stage-1 criterion
])
def test_stage1_is_met_only_with_200_runs_within_alpha(tmp_path, runs, rolled_back, within,
                                                        met) -> None:
    into = {"simulation": {"kept": True}, "h200": {"stage2": {"kept": True}}}
    merged, summary = merge_tool.stage1(_calibration(tmp_path, runs, rolled_back, within),
                                        "NVIDIA H200", into)
    assert summary["met"] is met
    assert merged["h200"]["stage1"]["false_rollbacks"] == rolled_back
    assert merged["h200"]["stage2"] == {"kept": True} and merged["simulation"] == {"kept": True}
