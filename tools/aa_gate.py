"""A/A through the gate's speed criteria: one kernel as both candidate and production.

Each run times the kernel twice over (as ``candidate`` and as ``production``) beside the
naive baseline with ``evaluation.performance.measure_performance`` — the evaluation's own
interleaved timing, at the device platform's default benchmark shapes, repeats and
warm-up unless told otherwise — and judges that one measurement with
``gates.decision.decide`` (speed criteria only) under a thresholds profile twice: as the
file registers them (``test: paired_permutation``) and with every ``test:``/``alpha:``
removed (the point estimate every registration before the paired test used). Nothing is
logged to a store; the registration is made in memory just before each run.

Writes JSON::

    {"command", "date_utc", "host": {"cpus", "load_before", "load_after", "device"},
     "kernel", "profile", "shapes", "repeats", "warmup",
     "runs": [{"run", "seconds", "tested": {verdict, criteria: {name: {status, ratio,
               p_value, confidence_bound}}}, "point_estimate": {verdict, criteria: ...}}],
     "rejected": {"tested": k, "point_estimate": k}, "runs_total": n}

Run from the repository root (``-m``, so this checkout's packages are imported)::

    python -m tools.aa_gate --runs 20 --profile thresholds/staging.yaml \\
        --out reliability/aa-gate-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

# JAX and the evaluation are imported by run(): ``--help`` answers without them.

_TESTED = re.compile(rb", test: paired_permutation, alpha: [0-9.]+")


def _registration(data: bytes, at: datetime):
    from gates.preregistration import Registration
    from gates.thresholds import parse_thresholds

    thresholds = parse_thresholds(data)
    return thresholds, Registration(
        registration_id=f"aa-{hashlib.sha256(data).hexdigest()[:8]}", family="aa-gate",
        profile=thresholds.profile, thresholds_sha256=hashlib.sha256(data).hexdigest(),
        thresholds_artifact="in-memory", registered_at=at)


def _judged(decision) -> dict:
    return {"verdict": decision.verdict, "criteria": {
        c.name: {"status": c.status,
                 "ratio": None if not c.improvement else round(1 / c.improvement, 4),
                 "p_value": c.p_value, "confidence_bound": c.confidence_bound,
                 "reason": c.reason} for c in decision.criteria}}


def run(args: argparse.Namespace) -> dict:
    """Measure and judge ``args.runs`` times; the JSON document of the module docstring."""
    import jax

    from evaluation.performance import default_shapes, measure_performance
    from evaluation.runners import LocalRunner
    from gates.decision import decide

    data = Path(args.profile).read_bytes()
    legacy = _TESTED.sub(b"", data)
    platform = jax.devices()[0].platform
    platform = "gpu" if platform in ("cuda", "rocm") else platform
    shapes = default_shapes(platform)[: args.shapes]
    runners = {"candidate": LocalRunner.for_implementation(args.kernel),
               "baseline": LocalRunner.for_implementation("naive"),
               "production": LocalRunner.for_implementation(args.kernel)}
    load_before = os.getloadavg()
    runs, rejected = [], {"tested": 0, "point_estimate": 0}
    for i in range(args.runs):
        registered = datetime.now(UTC) - timedelta(seconds=1)
        start = time.perf_counter()
        perf = measure_performance(runners, shapes, baseline="baseline",
                                   repeats=args.repeats, warmup=args.warmup, seed=i)
        report = SimpleNamespace(
            metrics=perf.metrics("candidate"), baseline_metrics=perf.metrics("baseline"),
            production_metrics=perf.metrics("production"), speed_assessed=True,
            speed_not_assessed_reason=None, target_platform=platform,
            device_platform=platform, started_at=registered + timedelta(milliseconds=500),
            performance=perf)
        row = {"run": i}
        for label, profile in (("tested", data), ("point_estimate", legacy)):
            thresholds, registration = _registration(profile, registered)
            row[label] = _judged(decide(report, thresholds, registration, kinds={"speed"}))
            rejected[label] += row[label]["verdict"] == "reject"
        row["seconds"] = round(time.perf_counter() - start, 2)
        runs.append(row)
        print(f"run {i + 1}/{args.runs}: tested {row['tested']['verdict']}, point estimate "
              f"{row['point_estimate']['verdict']} ({row['seconds']} s)", flush=True)
    return {"command": "python -m tools.aa_gate " + shlex.join(sys.argv[1:]),
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                     "load_after": [round(x, 2) for x in os.getloadavg()],
                     "device": jax.devices()[0].device_kind},
            "kernel": runners["candidate"].describe().get("implementation", args.kernel),
            "profile": args.profile, "shapes": [s.label for s in shapes],
            "repeats": perf.repeats, "warmup": perf.warmup, "runs": runs,
            "rejected": rejected, "runs_total": args.runs}


def parser() -> argparse.ArgumentParser:
    """The tool's arguments, each with a one-line help (``python -m tools.aa_gate --help``)."""
    p = argparse.ArgumentParser(prog="python -m tools.aa_gate", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--runs", type=int, default=20,
                   help="how many A/A measurements to judge (default 20)")
    p.add_argument("--kernel", default="xla",
                   help="kernel registry name timed as both candidate and production (default xla)")
    p.add_argument("--profile", default="thresholds/staging.yaml",
                   help="thresholds file whose speed criteria judge each run "
                        "(default thresholds/staging.yaml)")
    p.add_argument("--shapes", type=int, default=None,
                   help="the first N default shapes of the platform (default: all)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls per implementation and shape (default: the platform's)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed warm-up calls before them (default: the platform's)")
    p.add_argument("--out", type=Path, required=True,
                   help="where to write the JSON result (its folder is created)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the A/A measurements, write ``--out`` and print the rejections."""
    args = parser().parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"rejected by the speed criteria: tested {result['rejected']['tested']}/"
          f"{args.runs}, point estimate {result['rejected']['point_estimate']}/{args.runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
