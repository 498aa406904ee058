"""Merge a GPU stage-2 run (``tools/gpu-canary-calibration.sh stage2``) into
``reliability/canary-calibration.json``, per device, judged by the stage-2 criteria below.

Reads the stage-2 folder: ``aa-canaries.json`` and ``slowed-canaries.json``
(``tools/canary_runs.py run``), ``aa-rollout.log`` and ``slowed-rollout.log`` (what
``kernelgate rollout`` printed) and ``device.txt`` (``nvidia-smi``'s name and driver).
Writes the calibration file with ``<device key>.stage2`` set (the key: the device kind's
last word, lower case, e.g. ``h200``), everything else kept::

    {"device", "driver", "jax_version", "family", "production_version",
     "production_kernel", "slowed_kernel", "plan",
     "aa_canaries": {"runs", "rolled_back", "criterion", "met"},
     "slowed_canaries": {"runs", "rolled_back", "median_ratio", "power_at_median_ratio",
                         "ratio_criterion", "ratio_met", "criterion", "met"},
     "rollouts": [{"which", "family", "version", "result", "stage", "reason"}],
     "rollouts_criterion", "rollouts_met", "met", "merged_at"}

The criteria (H200 stage 2): at most 1 of the A/A canaries rolled back; the
slowed variant's median request ratio at least 1.25 and at least
``1 + 2 * (min_slowdown_ratio - 1)`` (twice the slowdown the plan must catch); all of its
canaries rolled back where the plan's power at that ratio is at least 0.99, else all
but one; the A/A rollout promoted and the slowed one not. Exit 0 when every criterion is
met, 1 when one is not, 2 on missing or unreadable input::

    python3 tools/merge_canary_calibration.py --stage2 OUT/stage2 \\
        --into reliability/canary-calibration.json --out reliability/canary-calibration.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

MIN_RATIO = 1.25
"""The slowed variant's smallest median request ratio."""
FULL_POWER = 0.99
"""At this power or more every slowed canary must roll back; below it all but one."""
MAX_AA_ROLLBACKS = 1

_HEADLINE = re.compile(r"^#\s*kernelgate rollout:\s*(?P<family>\S+)\s+v(?P<version>\S+)\s+\S+\s+"
                       r"\**(?P<verdict>[^*]+?)\**\s*$")
_RESULTS = ("rolled back", "timed out", "promoted", "rejected", "errored")
"""The verdict line's first words, as ``RolloutOutcome.verdict`` writes the result
("rolled back at canary-25pct; ..."; older CLIs printed the bare result)."""


def _result(verdict: str) -> str:
    words = verdict.strip().replace("_", " ")
    for result in _RESULTS:
        if words.startswith(result):
            return result.replace(" ", "_")
    raise ValueError(f"no rollout result in the verdict {verdict!r}")


def parse_rollout_log(text: str) -> dict:
    """The outcome ``kernelgate rollout`` printed (``lineage.rollout.rollout.RolloutOutcome.
    markdown``): family, version, result, stage and reason.

    Raises:
        ValueError: no outcome in ``text`` (the rollout did not finish).
    """
    out: dict = {}
    for line in text.splitlines():
        line = line.strip()
        match = _HEADLINE.match(line)
        if match:
            out = {"family": match["family"], "version": match["version"],
                   "result": _result(match["verdict"]), "stage": None, "reason": None}
        elif out and line.startswith("* decided at stage:"):
            out["stage"] = line.split(":", 1)[1].strip().strip("`")
        elif out and line.startswith("* reason:") and out.get("reason") is None:
            out["reason"] = line.split(":", 1)[1].strip()
    if not out:
        raise ValueError("no rollout outcome in the log (did the rollout finish?)")
    if out["version"] == "-":
        out["version"] = None
    return out


def device_key(device_kind: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"``: the calibration file's key for a device kind."""
    words = re.findall(r"[A-Za-z0-9]+", device_kind)
    if not words:
        raise ValueError(f"no device kind in {device_kind!r}")
    return words[-1].lower()


def judge(aa: dict, slowed: dict, rollouts: list[dict]) -> dict:
    """The stage-2 record (see the module docstring) from the two canary-run JSONs and
    the two rollouts' outcomes (``which`` = ``aa`` / ``slowed``)."""
    plan = slowed["plan"]
    needed_ratio = max(MIN_RATIO, 1.0 + 2.0 * (plan["min_slowdown_ratio"] - 1.0))
    power = slowed.get("power_at_median_ratio")
    n = len(slowed["runs"])
    needed_rollbacks = n if power is not None and power >= FULL_POWER else n - 1
    ratio_met = slowed["median_ratio"] >= needed_ratio
    aa_met = aa["rolled_back"] <= MAX_AA_ROLLBACKS
    slowed_met = ratio_met and slowed["rolled_back"] >= needed_rollbacks
    by = {r["which"]: r for r in rollouts}
    rollouts_met = (set(by) == {"aa", "slowed"} and by["aa"]["result"] == "promoted"
                    and by["slowed"]["result"] != "promoted")
    return {
        "device": aa["device"], "jax_version": aa.get("jax_version"), "family": aa["family"],
        "production_version": aa["production_version"],
        "production_kernel": aa["production_kernel"], "slowed_kernel": slowed["candidate"],
        "plan": plan,
        "aa_canaries": {"runs": aa["runs"], "rolled_back": aa["rolled_back"],
                        "median_ratio": aa["median_ratio"],
                        "robust_noise_sd": aa.get("robust_noise_sd"),
                        "criterion": f"at most {MAX_AA_ROLLBACKS} of {len(aa['runs'])} rolled back",
                        "met": aa_met},
        "slowed_canaries": {
            "runs": slowed["runs"], "rolled_back": slowed["rolled_back"],
            "median_ratio": slowed["median_ratio"], "power_at_median_ratio": power,
            "ratio_criterion": f"median request ratio >= {needed_ratio:.3g} (1.25 and twice "
                               f"the plan's slowdown {plan['min_slowdown_ratio']:g})",
            "ratio_met": ratio_met,
            "criterion": f"at least {needed_rollbacks} of {n} rolled back (plan's power "
                         f"{'n/a' if power is None else f'{power:.3f}'} at the measured ratio)",
            "met": slowed_met},
        "rollouts": rollouts,
        "rollouts_criterion": "the A/A rollout promoted, the slowed one not",
        "rollouts_met": rollouts_met,
        "met": aa_met and slowed_met and rollouts_met,
    }


def merge(stage2: Path, into: dict) -> tuple[dict, dict]:
    """``(merged calibration file, the stage-2 record)`` from the folder ``stage2``.

    Raises:
        FileNotFoundError: a canary-run JSON is missing.
        ValueError: a rollout log without an outcome.
    """
    aa = json.loads((stage2 / "aa-canaries.json").read_text())
    slowed = json.loads((stage2 / "slowed-canaries.json").read_text())
    rollouts = []
    for which in ("aa", "slowed"):
        log = stage2 / f"{which}-rollout.log"
        if log.is_file():
            rollouts.append({"which": which, **parse_rollout_log(log.read_text())})
    record = judge(aa, slowed, rollouts)
    device_txt = stage2 / "device.txt"
    if device_txt.is_file():
        parts = [p.strip() for p in device_txt.read_text().strip().split(",")]
        record["driver"] = parts[1] if len(parts) > 1 else None
    record["merged_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    key = device_key(record["device"])
    merged = dict(into)
    entry = merged.get(key) if isinstance(merged.get(key), dict) else {}
    merged[key] = {**entry, "stage2": record}
    return merged, record


def stage1(calibration: Path, device_kind: str, into: dict) -> tuple[dict, dict]:
    """``(merged calibration file, the stage-1 summary)`` from a ``kernelgate calibrate``
    record (``calibration.json``, the signed artifact of the calibration run): the A/A
    canaries' false-rollback count and rate against alpha's 95 % margin, as the record
    states them, with its device facts. The per-run verdicts and log ratios stay in the
    record itself (committed beside it)."""
    record = json.loads(calibration.read_text())
    keep = ("family", "production_version", "registration_id", "created_at", "alpha", "runs",
            "false_rollbacks", "false_rollback_rate", "rate_95", "within_alpha",
            "inconclusive", "noise_sd")
    summary = {k: record[k] for k in keep}
    summary["facts"] = record.get("facts")
    summary["record"] = calibration.as_posix()
    summary["met"] = bool(record["within_alpha"]) and record["runs"] >= 200
    summary["criterion"] = ">= 200 A/A canaries through the exact canary path, false rollbacks "
    summary["criterion"] += "within alpha's 95 % margin"
    key = device_key(device_kind)
    merged = dict(into)
    entry = merged.get(key) if isinstance(merged.get(key), dict) else {}
    merged[key] = {**entry, "stage1": summary}
    return merged, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage1", type=Path, default=None,
                        help="a calibration record (calibration.json) to merge as stage 1 "
                             "(with --device-kind) instead of a stage-2 folder")
    parser.add_argument("--device-kind", default="NVIDIA H200")
    parser.add_argument("--stage2", type=Path, default=None, help="the stage-2 folder")
    parser.add_argument("--into", type=Path, required=True, help="the calibration file read")
    parser.add_argument("--out", type=Path, required=True, help="where the merged file goes")
    args = parser.parse_args(argv)
    if (args.stage1 is None) == (args.stage2 is None):
        parser.error("give exactly one of --stage1 CALIBRATION_JSON and --stage2 FOLDER")
    if args.stage1 is not None:
        into = json.loads(args.into.read_text()) if args.into.is_file() else {}
        merged, summary = stage1(args.stage1, args.device_kind, into)
        args.out.write_text(json.dumps(merged, indent=2) + "\n")
        print(f"stage 1: {summary['false_rollbacks']}/{summary['runs']} A/A canaries rolled "
              f"back ({summary['false_rollback_rate']:.3f}, 95 % {summary['rate_95']}, alpha "
              f"{summary['alpha']}): {'met' if summary['met'] else 'NOT met'}")
        return 0 if summary["met"] else 1
    try:
        into = json.loads(args.into.read_text()) if args.into.is_file() else {}
        merged, record = merge(args.stage2, into)
    except (OSError, ValueError, KeyError) as err:
        print(f"merge: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    for name in ("aa_canaries", "slowed_canaries"):
        part = record[name]
        print(f"{name}: {part['rolled_back']}/{len(part['runs'])} rolled back; "
              f"{part['criterion']}: {'met' if part['met'] else 'NOT met'}")
        for run in part["runs"]:
            print(f"  seed {run['seed']}: {run['verdict']} - {run['reason']}")
    s = record["slowed_canaries"]
    print(f"slowed median ratio {s['median_ratio']:.3f}: {s['ratio_criterion']}: "
          f"{'met' if s['ratio_met'] else 'NOT met'}")
    for r in record["rollouts"]:
        print(f"rollout {r['which']}: {r['result']} at {r['stage']} - {r['reason']}")
    print(f"{record['rollouts_criterion']}: {'met' if record['rollouts_met'] else 'NOT met'}")
    print(f"written {args.out} ({device_key(record['device'])}.stage2)")
    return 0 if record["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
