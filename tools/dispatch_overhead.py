"""A dispatch policy's cost per request where it serves the same kernel as the baseline:
MiniLM requests (batch 1) embedded by ``dispatch`` (a policy file) and by one named kernel,
in one process, interleaved in alternating order, as paired per-request latencies.

What it answers: whether routing a call through a policy (``kernels.dispatch_kernel``:
bucket lookup and resolution, done once per call signature when the model's forward is
traced) costs anything per request once compiled. Where the policy's bucket serves the
compared kernel, both sides compile the same attention, so the paired median ratio
should be 1 within the noise; a ratio away from 1 here is a cost of dispatch itself. It
says nothing about the device's kernels (the policy may be another backend's: it is
audited, not checked against this host's backend, and a bucket's kernel runs through
this host's registry).

Output: a table on stdout and, with ``--json``, the latencies (seconds) and the summary.

    python -m tools.dispatch_overhead --policy POLICY.json [--kernel xla] [--requests 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

TEXTS = tuple("The quick brown fox jumps over the lazy dog. " * n for n in (1, 3, 6, 10))
"""Four request lengths (about 10 to 100 tokens), served in turn."""


def measure(policy: Path, kernel: str, requests: int) -> dict:
    """Paired latencies of ``requests`` MiniLM requests served by ``dispatch`` (the policy
    in ``policy``) and by ``kernel``, alternating which goes first; seconds.

    Raises:
        kernels.dispatch_audit.PolicyError: the policy file fails its audit.
        ValueError: ``kernel`` is not a registered implementation.
    """
    from evaluation.model import MiniLM
    from evaluation.runners import LocalRunner
    from kernels.dispatch import get_attention_fn
    from kernels.dispatch_kernel import DispatchKernel
    from kernels.registry import register

    register(DispatchKernel.from_file(policy), replace=True)
    model = MiniLM.load()
    runners = {name: LocalRunner(name, get_attention_fn(name), model)
               for name in ("dispatch", kernel)}
    for runner in runners.values():  # compile every request length first
        for text in TEXTS:
            runner.embed([text])
    latencies: dict[str, list[float]] = {name: [] for name in runners}
    for i in range(requests):
        # each length served in both orders: which side goes first never follows a length
        order = ("dispatch", kernel) if (i // len(TEXTS)) % 2 == 0 else (kernel, "dispatch")
        for name in order:
            latencies[name].append(runners[name].embed([TEXTS[i % len(TEXTS)]])[1])
    ratios = np.asarray(latencies["dispatch"]) / np.asarray(latencies[kernel])
    from scipy.stats import wilcoxon

    log_ratios = np.log(ratios)
    return {"policy": str(policy), "kernel": kernel, "requests": requests,
            "latencies_s": latencies, "median_s": {n: float(np.median(v))
                                                  for n, v in latencies.items()},
            "median_ratio": float(np.median(ratios)),
            "ratio_quartiles": [float(np.quantile(ratios, q)) for q in (0.25, 0.75)],
            "share_dispatch_slower": float(np.mean(log_ratios > 0)),
            "signed_rank_p_two_sided": float(wilcoxon(log_ratios).pvalue)}


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); exit 0, or 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m tools.dispatch_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True,
                        help="a dispatch policy's JSON (kernels.tools.dispatch_merge writes it)")
    parser.add_argument("--kernel", default="xla",
                        help="the kernel compared with dispatch (default xla)")
    parser.add_argument("--requests", type=int, default=60,
                        help="paired requests, at least 4 (default 60)")
    parser.add_argument("--json", type=Path, help="write the latencies and summary here")
    args = parser.parse_args(argv)
    if args.requests < 4:
        parser.error(f"--requests must be at least 4, got {args.requests}")
    if not args.policy.is_file():
        parser.error(f"--policy {args.policy}: no such file")
    start = time.perf_counter()
    result = measure(args.policy, args.kernel, args.requests)
    result["wall_s"] = time.perf_counter() - start
    for name, median in result["median_s"].items():
        print(f"{name:10s} median {1e3 * median:8.3f} ms over {args.requests} requests")
    low, high = result["ratio_quartiles"]
    print(f"dispatch / {args.kernel}: paired median ratio {result['median_ratio']:.4f} "
          f"(quartiles {low:.4f}, {high:.4f})")
    print(f"dispatch slower in {100 * result['share_dispatch_slower']:.0f} % of pairs; "
          f"signed-rank p (two-sided) {result['signed_rank_p_two_sided']:.3g}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
