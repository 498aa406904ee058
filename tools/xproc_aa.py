"""A/A of the canary's serving path across process placements: one kernel on both sides.

A fresh store's canary compares the native baseline served in the flow's own process
(``lineage.serving.version_runners.endpoint``: a ``LocalRunner``) with a candidate that
runs in a process of its own (``VersionWorker``, ``lineage/serving/model_worker.py``).
This tool asks whether that placement alone moves the paired latency test: the same
``xla`` kernel on both sides, served through the canary's own replay
(``evaluation.serving.replay_canary_step(..., fraction=1, abba=True)`` after
``evaluation.serving.warm_up``) and judged with ``gates.latency_judge``, under three
placements (candidate / production):

* ``worker_vs_local``: a ``VersionWorker`` of an ``xla`` version registered from this
  checkout, against the native baseline's endpoint of an empty production alias
  (exactly what a fresh store's canary compares with).
* ``worker_vs_worker``: two ``VersionWorker`` processes of that version.
* ``local_vs_local``: two ``LocalRunner`` endpoints of ``xla`` in this process.

The placements are run in rounds (``--round`` requests each, the placements in turn,
a fresh request stream per round), so load that comes and goes on a shared host hits
all of them alike. Per placement it reports the median ratio and the one-sided
signed-rank p over all pairs, and the share of consecutive ``--step-pairs``-pair
blocks (a canary step's sample) whose p is below ``--alpha`` (the rate at which the
judge would roll back an identical kernel at one look of that size).

The version is registered in a throwaway store signed by a throwaway key
(``KERNELGATE_KEY_DIR`` and ``KERNELGATE_HOME`` point into a temporary folder), so
nothing outside it is written but ``--out``.

On a GPU the two placements also differ in how they take device memory: this process
preallocates (JAX's default) while ``VersionWorker`` starts its process with
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` where the variable is unset; running this tool
with that variable set to ``false`` makes both allocate alike, which separates the
allocator from the process boundary.

Writes JSON::

    {"command", "date_utc", "host": {"cpus", "load_before", "load_after", "device"},
     "requests_per_placement", "round", "step_pairs", "alpha",
     "placements": {name: {"candidate", "production", "pairs", "median_ratio",
                           "p_value", "noise_sd", "blocks", "blocks_rejected",
                           "median_ms": {"candidate", "production"},
                           "slot_median_ms": {"CPPC": [c1, p1, p2, c2], "PCCP": [...]},
                           "log_ratios"}}}

Run from the repository root (``-m``, so this checkout's packages are imported)::

    python -m tools.xproc_aa --requests 300 --out reliability/xproc-aa-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

# JAX and the serving code are imported by run(): ``--help`` answers without them.

PLACEMENTS = ("worker_vs_local", "worker_vs_worker", "local_vs_local")
FAMILY = "xproc-aa"


def _register_xla(tmp: Path):
    """An ``xla`` version built and signed from this checkout in a store under ``tmp``:
    ``(tracking, version, trust)``."""
    from evaluation.model import MiniLM
    from kernels.build import build as build_kernel
    from kernels.shapes import AttentionShape
    from lineage.serving.versions import log_version_model, register_version
    from lineage.signing import keys
    from lineage.signing.attestations import Signing
    from lineage.store import tracking as tr

    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key()),
                      trust=keys.folder_trust())
    tracking = tr.local_tracking(tmp / "store")
    shape = AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2,
                           head_dim=32, dtype="float32")
    out = tmp / "build"
    build = build_kernel("xla", None, shape, platforms=(), output_dir=out)
    with tr.stage_run(tracking, FAMILY, "build") as run_id:
        logged = log_version_model(tracking, run_id, build, out, MiniLM.load())
        version = register_version(tracking, FAMILY, run_id, build, logged, signing)
    return tracking, version, signing.trust


def _endpoints(tracking, version: str, trust, model):
    """Per placement ``(candidate, production)`` endpoints, and the workers to close."""
    from evaluation.runners import LocalRunner
    from evaluation.serving import Endpoint
    from lineage.serving import version_runners as vr

    pool = vr.VersionPool(tracking, FAMILY, model, trust)
    baseline = vr.endpoint(pool, "production")  # no production: the native baseline, here
    if isinstance(baseline.runner, vr.VersionWorker):
        raise RuntimeError("the empty production alias did not give an in-process baseline")

    def worker(label: str) -> Endpoint:
        runner = vr.VersionWorker(tracking, FAMILY, version, trust=trust,
                                  attention_dtype=model.config.attention_dtype)
        return Endpoint(f"{runner.name} ({label})", runner)

    def local(label: str) -> Endpoint:
        runner = LocalRunner.for_implementation(vr.NATIVE_BASELINE, None, model)
        return Endpoint(f"{runner.name} ({label})", runner)

    w1, w2 = worker("worker 1"), worker("worker 2")
    pairs = {"worker_vs_local": (w1, baseline),
             "worker_vs_worker": (w2, w1),
             "local_vs_local": (local("in-process 2"), baseline)}
    return pairs, [w1.runner, w2.runner], pool


def _summary(candidate: str, production: str, timings, step_pairs: int, alpha: float) -> dict:
    import numpy as np

    from gates.latency_judge import abba_log_ratios, look

    c = np.array([t[0] for t in timings])  # [n, 2] seconds, in the order each side ran
    p = np.array([t[1] for t in timings])
    orders = [t[2] for t in timings]
    r = abba_log_ratios(c, p)
    whole = look("all", r, alpha)
    blocks = [look(f"block{i}", r[i:i + step_pairs], alpha)
              for i in range(0, len(r) - step_pairs + 1, step_pairs)]
    slots = {}
    for order in ("CPPC", "PCCP"):
        mask = np.array([o == order for o in orders])
        if mask.any():
            first_c, first_p = c[mask, 0], p[mask, 0]
            second_c, second_p = c[mask, 1], p[mask, 1]
            by_slot = ([first_c, first_p, second_p, second_c] if order == "CPPC"
                       else [first_p, first_c, second_c, second_p])
            slots[order] = [round(1e3 * float(np.median(x)), 4) for x in by_slot]
    return {"candidate": candidate, "production": production, "pairs": int(r.size),
            "median_ratio": round(whole.median_ratio, 5), "p_value": whole.p_value,
            "noise_sd": round(whole.noise_sd, 5), "blocks": len(blocks),
            "blocks_rejected": sum(b.slower for b in blocks),
            "block_median_ratios": [round(b.median_ratio, 4) for b in blocks],
            "median_ms": {"candidate": round(1e3 * float(np.median(c)), 4),
                          "production": round(1e3 * float(np.median(p)), 4)},
            "slot_median_ms": slots, "log_ratios": [round(float(x), 6) for x in r]}


def run(args: argparse.Namespace) -> dict:
    """Register, serve every placement in rounds, judge; the JSON document."""
    tmp = Path(tempfile.mkdtemp(prefix="xproc-aa-"))
    os.environ["KERNELGATE_KEY_DIR"] = str(tmp / "keys")
    os.environ["KERNELGATE_HOME"] = str(tmp / "home")
    import jax

    from evaluation import recorded_traffic, serving
    from evaluation.documents import assign_splits, load_documents
    from evaluation.model import MiniLM

    load_before = os.getloadavg()
    model = MiniLM.load()
    tracking, version, trust = _register_xla(tmp)
    pairs, workers, pool = _endpoints(tracking, version, trust, model)
    chosen = [p for p in PLACEMENTS if p in args.placements]
    documents = assign_splits(load_documents(None))["heldout"]
    timings: dict[str, list] = {p: [] for p in chosen}
    try:
        rounds = -(-args.requests // args.round)
        for i in range(rounds):
            traffic = recorded_traffic.record_traffic(documents, args.round, seed=1000 + i)
            for placement in chosen:
                candidate, production = pairs[placement]
                serving.warm_up(traffic.requests, [production, candidate], model)
                result = serving.replay_canary_step(traffic.requests, 1.0, production,
                                                    candidate, salt=f"xproc-{i}", abba=True)
                timings[placement] += [
                    (r.candidate_timings_s, r.production_timings_s, r.order)
                    for r in result.records
                    if len(r.candidate_timings_s) == 2 and len(r.production_timings_s) == 2
                    and r.candidate_error is None and r.production_error is None]
            print(f"round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()
        pool.close()
    return {
        "command": shlex.join(["python", "-m", "tools.xproc_aa", *sys.argv[1:]]),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load_before],
                 "load_after": [round(x, 2) for x in os.getloadavg()],
                 "device": str(jax.devices()[0])},
        "requests_per_placement": args.requests, "round": args.round,
        "step_pairs": args.step_pairs, "alpha": args.alpha,
        "placements": {p: _summary(pairs[p][0].name, pairs[p][1].name, timings[p],
                                   args.step_pairs, args.alpha) for p in chosen}}


def table(doc: dict) -> str:
    """The placements as a plain-text table."""
    lines = [f"{'placement':<18} {'pairs':>5} {'median ratio':>12} {'p (one-sided)':>13} "
             f"{'noise sd':>8} {'blocks rejected':>15} {'cand ms':>8} {'prod ms':>8}"]
    for name, s in doc["placements"].items():
        lines.append(f"{name:<18} {s['pairs']:>5} {s['median_ratio']:>12.4f} "
                     f"{s['p_value']:>13.3g} {s['noise_sd']:>8.4f} "
                     f"{s['blocks_rejected']:>7}/{s['blocks']:<7} "
                     f"{s['median_ms']['candidate']:>8.2f} {s['median_ms']['production']:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: parse, run, print the table, write the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.xproc_aa",
        description="A/A of the canary's replay and latency judge with xla on both sides, "
                    "in-process and in worker processes (see the module docstring).")
    parser.add_argument("--requests", type=int, default=300,
                        help="compared requests per placement (default 300)")
    parser.add_argument("--round", type=int, default=30,
                        help="requests per placement per round (default 30)")
    parser.add_argument("--step-pairs", type=int, default=30,
                        help="pairs per block judged like one canary look (default 30)")
    parser.add_argument("--alpha", type=float, default=0.00184,
                        help="alpha of one look (default 0.00184, the H100 canary's alpha_k)")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help=f"comma-separated subset of {','.join(PLACEMENTS)}")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    args.placements = [p for p in args.placements.split(",") if p]
    unknown = sorted(set(args.placements) - set(PLACEMENTS))
    if unknown or not args.placements:
        parser.error(f"--placements: unknown {unknown} or none given; choose from "
                     f"{','.join(PLACEMENTS)}")
    for flag, value in (("--requests", args.requests), ("--round", args.round),
                        ("--step-pairs", args.step_pairs)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must lie strictly between 0 and 1, got {args.alpha}")
    try:  # before minutes of measuring, not after
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out {args.out}: {err}")
    doc = run(args)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
