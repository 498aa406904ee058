"""Canary runs against production through the canary's own replay and judge, for the
GPU calibration's stage 2 (``tools/gpu-canary-calibration.sh stage2``).

``run``: ``--runs`` canaries of a candidate against the store's production version, each
on a fresh request stream (seed = the run's number plus ``--seed-offset``) cut into the
registered plan's steps, each step replayed ABBA and judged by
``flows.calibrate.canary_run`` (the function ``kernelgate calibrate`` repeats), printing
each run's decision and reason and writing JSON::

    {"device": ..., "family": ..., "production_version": ..., "production_kernel": ...,
     "candidate": "production" | <registry name>, "plan": {alpha, min_slowdown_ratio, power,
     noise_sd, tolerated_slowdown_ratio, pairs, last_look_alpha},
     "runs": [{"seed", "verdict", "reason", "pairs", "median_ratio"}],
     "rolled_back": k (runs not passed), "median_ratio": <over every compared request of
     every run>, "power_at_median_ratio": <the plan's power there, or null>,
     "robust_noise_sd": ..., "seconds": ...}

Without ``--candidate`` production serves both sides (an A/A run); with a registry name
(e.g. the slowed variant ``slowed_<kernel>_x<N>`` of ``tests/slowed_kernel.py``,
registered through ``KERNELGATE_KERNELS``) that kernel serves the candidate side in this
process. Nothing is logged to the store: the runs are evidence for
``reliability/canary-calibration.json`` (``tools/merge_canary_calibration.py``).

``slowed-name --repeats N``: print ``slowed_<production's kernel>_x<N>``.

Run from the repository root with kernelgate importable::

    python3 tools/canary_runs.py run --store-dir /tmp/kg-store --runs 5 --out aa.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def _open(store_dir: Path, family: str | None):
    from flows.cli_store import families, open_store

    tracking = open_store(store_dir, must_exist=True)
    if family is None:
        found = families(tracking)
        if len(found) != 1:
            raise SystemExit(f"the store has families {found}: pass --family")
        family = found[0]
    return tracking, family


def _production(tracking, family: str, trust) -> tuple[str, dict]:
    from lineage.aliases import registered_model
    from lineage.serving.versions import recorded_kernel
    from lineage.signing.sources import StoreSource

    version = registered_model.alias_version(tracking, family, "production")
    if version is None:
        raise SystemExit(f"{family} has no production version: run a rollout first")
    return version, recorded_kernel(StoreSource(tracking, family, trust, stages=("build",)),
                                    version)


def _signing(store_dir: Path, key_dir: Path | None):
    from flows.settings import RolloutSettings
    from flows.tasks import signing_for

    return signing_for(RolloutSettings(store_dir=store_dir, key_dir=key_dir))


def slowed_name(args) -> int:
    """Print the slowed variant's registry name for the store's production kernel."""
    tracking, family = _open(args.store_dir, args.family)
    _, kernel = _production(tracking, family, _signing(args.store_dir, args.key_dir).trust)
    print(f"slowed_{kernel['implementation']}_x{args.repeats}")
    return 0


def run(args) -> int:
    """``args.runs`` canaries of the candidate against production; JSON to ``args.out``."""
    import jax

    from evaluation import serving
    from evaluation.documents import assign_splits, load_documents
    from evaluation.runners import LocalRunner
    from flows.calibrate import canary_run, registered_plan, serving_model
    from gates.latency_judge import robust_sd, signed_rank_power
    from lineage.serving import version_runners

    start = time.perf_counter()
    tracking, family = _open(args.store_dir, args.family)
    trust = _signing(args.store_dir, args.key_dir).trust
    version, kernel = _production(tracking, family, trust)
    plan, registration_id, contract = registered_plan(tracking, family, version, trust, None)
    if not plan.paired:
        raise SystemExit("the registered plan is not the paired test: nothing to run")
    model = serving_model(contract)  # the registration's model_dtype, as the rollout serves
    documents = assign_splits(load_documents(None))["heldout"]
    pool = version_runners.VersionPool(tracking, family, model, trust)
    runs, ratios = [], []
    label = args.candidate or "production"
    try:
        production = version_runners.endpoint(pool, "production", expect_version=version)
        candidate = production if args.candidate is None else serving.Endpoint(
            f"{args.candidate} (candidate)",
            LocalRunner.for_implementation(args.candidate, model=model))
        for i in range(args.runs):
            seed = args.seed_offset + i
            verdict, reason, r = canary_run(plan, production, candidate, model, documents, seed)
            ratio = float(np.exp(np.median(r))) if r else math.nan
            runs.append({"seed": seed, "verdict": verdict, "reason": reason, "pairs": len(r),
                         "median_ratio": ratio})
            ratios.extend(r)
            print(f"{label} run {i + 1}/{args.runs} (seed {seed}): {verdict} - {reason} "
                  f"(median ratio {ratio:.3f}, {len(r)} pairs)", flush=True)
    finally:
        pool.close()
    median = float(np.exp(np.median(ratios))) if ratios else math.nan
    out = {"device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
           "jax_version": jax.__version__, "family": family, "production_version": version,
           "production_kernel": kernel["implementation"], "registration_id": registration_id,
           "candidate": label,
           "plan": {"alpha": plan.latency.alpha, "min_slowdown_ratio":
                    plan.latency.min_slowdown_ratio, "power": plan.latency.power,
                    "noise_sd": plan.latency.noise_sd,
                    "tolerated_slowdown_ratio": plan.latency.tolerated_slowdown_ratio,
                    "pairs": sum(plan.pairs_per_step()),
                    "last_look_alpha": plan.step_alphas()[-1]},
           "runs": runs, "rolled_back": sum(r["verdict"] != "pass" for r in runs),
           "median_ratio": median,
           # the plan's power (its noise_sd, every step's pairs) at the measured ratio
           "power_at_median_ratio": signed_rank_power(
               sum(plan.pairs_per_step()), plan.step_alphas()[-1],
               median / plan.latency.tolerated_slowdown_ratio, plan.latency.noise_sd)
           if median / plan.latency.tolerated_slowdown_ratio > 1 else None,
           "robust_noise_sd": robust_sd(ratios),
           "seconds": round(time.perf_counter() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"{label}: {out['rolled_back']}/{len(runs)} rolled back, median request ratio "
          f"{out['median_ratio']:.3f} over {len(ratios)} pairs; written {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "slowed-name"):
        p = sub.add_parser(name)
        p.add_argument("--store-dir", type=Path, required=True)
        p.add_argument("--family", default=None, help="default: the store's only family")
        p.add_argument("--key-dir", type=Path, default=None)
        if name == "run":
            p.add_argument("--runs", type=int, default=5)
            p.add_argument("--candidate", default=None,
                           help="registry name of the candidate (default: production, A/A)")
            p.add_argument("--seed-offset", type=int, default=1000,
                           help="first stream seed (kernelgate calibrate uses 0, 1, ...)")
            p.add_argument("--out", type=Path, required=True)
        else:
            p.add_argument("--repeats", type=int, default=16)
    args = parser.parse_args(argv)
    if getattr(args, "runs", 1) < 1:
        parser.error("--runs must be at least 1")
    return run(args) if args.command == "run" else slowed_name(args)


if __name__ == "__main__":
    sys.exit(main())
