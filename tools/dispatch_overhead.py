"""A dispatch policy's cost per request where it serves the same kernel as the baseline:
MiniLM requests (batch 1) served by ``dispatch`` (a policy file) as the candidate and by one
named kernel as production, both in this process, through the canary's own paired replay
(``evaluation.serving.replay_canary_step`` with ABBA timing, after ``warm_up``) and judged
by the canary's latency test (``gates.latency_judge``: the ABBA log ratios, their median
ratio and the one-sided signed-rank p of "candidate slower").

What it answers: whether routing a call through a policy (``kernels.dispatch_kernel``:
bucket lookup and resolution, done once per call signature when the model's forward is
traced) costs anything per request once compiled. Where the policy's bucket serves the
compared kernel, both sides compile the same attention, so the median ratio should be 1
within the noise; a ratio away from 1 here is a cost of dispatch itself. It says nothing
about the device's kernels (the policy may be another backend's: it is audited, not
checked against this host's backend, and a bucket's kernel runs through this host's
registry).

Output: a table on stdout and, with ``--json``, the per-request ABBA timings (seconds) and
the summary.

    python -m tools.dispatch_overhead --policy POLICY.json [--kernel xla] [--requests 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def measure(policy: Path, kernel: str, requests: int) -> dict:
    """``requests`` recorded MiniLM requests (held-out documents, seed 0) replayed with
    ``dispatch`` (the policy in ``policy``) as the candidate and ``kernel`` as production,
    every request timed ABBA; timings in seconds.

    Raises:
        kernels.dispatch_audit.PolicyError: the policy file fails its audit.
        ValueError: ``kernel`` is not a registered implementation.
    """
    from evaluation import recorded_traffic, serving
    from evaluation.documents import assign_splits, load_documents
    from evaluation.model import MiniLM
    from evaluation.runners import LocalRunner
    from gates.latency_judge import abba_log_ratios, look
    from kernels.dispatch import get_attention_fn
    from kernels.dispatch_kernel import DispatchKernel
    from kernels.registry import register

    register(DispatchKernel.from_file(policy), replace=True)
    model = MiniLM.load()
    candidate, production = (serving.Endpoint(name, LocalRunner(name, get_attention_fn(name),
                                                                model))
                             for name in ("dispatch", kernel))
    documents = assign_splits(load_documents(None))["heldout"]
    traffic = recorded_traffic.record_traffic(documents, requests, seed=0)
    serving.warm_up(traffic.requests, [production, candidate], model)
    result = serving.replay_canary_step(traffic.requests, 1.0, production, candidate,
                                        salt="dispatch-overhead", abba=True)
    cand_s, prod_s = result.abba_timings()
    judged = look("all", abba_log_ratios(cand_s, prod_s), alpha=0.05)
    return {"policy": str(policy), "kernel": kernel, "requests": requests,
            "pairs": judged.n_pairs, "candidate_s": cand_s.tolist(),
            "production_s": prod_s.tolist(),
            "median_s": {"dispatch": float(np.median(cand_s)), kernel: float(np.median(prod_s))},
            "median_ratio": judged.median_ratio, "noise_sd": judged.noise_sd,
            "signed_rank_p_slower": judged.p_value}


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); exit 0, or 2 for bad arguments or a policy file that
    fails its audit."""
    from kernels.dispatch_audit import PolicyError

    parser = argparse.ArgumentParser(prog="python -m tools.dispatch_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True,
                        help="a dispatch policy's JSON (kernels.tools.dispatch_merge writes it)")
    parser.add_argument("--kernel", default="xla",
                        help="the kernel compared with dispatch (default xla)")
    parser.add_argument("--requests", type=int, default=400,
                        help="compared requests, at least 4 (default 400)")
    parser.add_argument("--json", type=Path, help="write the timings and summary here")
    args = parser.parse_args(argv)
    if args.requests < 4:
        parser.error(f"--requests must be at least 4, got {args.requests}")
    if not args.policy.is_file():
        parser.error(f"--policy {args.policy}: no such file")
    start = time.perf_counter()
    try:
        result = measure(args.policy, args.kernel, args.requests)
    except PolicyError as err:
        parser.error(f"--policy {args.policy}: {err}")
    result["wall_s"] = time.perf_counter() - start
    for name, median in result["median_s"].items():
        print(f"{name:10s} median {1e3 * median:8.3f} ms a timing")
    print(f"dispatch / {args.kernel}: median ratio {result['median_ratio']:.4f} over "
          f"{result['pairs']} ABBA pairs, noise sd {result['noise_sd']:.3g}, signed-rank p "
          f"(dispatch slower, one-sided) {result['signed_rank_p_slower']:.3g}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
