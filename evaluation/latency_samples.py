"""Capture per-request ABBA latency samples through the serving path (for the canary
judge's simulation test and calibration).

Runs MiniLM with one kernel on both endpoints (an A/A: production against itself) and,
optionally, a slowed variant on the candidate side, replaying a recorded request stream
with ``replay_canary_step(..., fraction=1.0, abba=True)``: every request is timed twice
a side, CPPC/PCCP, exactly as a canary step times its compared requests. Writes JSON::

    {"device": ..., "implementation": ..., "requests": n, "slowdown_repeats": k,
     "aa": {"candidate_s": [[c1, c2], ...], "production_s": [[p1, p2], ...]},
     "slowed": {...} | null, "median_ratio": {"aa": ..., "slowed": ...}}

No Prefect or MLflow: only ``kernels``, ``evaluation`` and the MiniLM weights, so it
runs unchanged on a GPU host (``tools/gpu-canary-calibration.sh samples``)::

    python -m evaluation.latency_samples --implementation xla --requests 300 \\
        --out tests/data/latency/cpu-xla.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from evaluation import recorded_traffic, serving
from evaluation.documents import assign_splits, load_documents
from evaluation.model import MiniLM
from evaluation.runners import LocalRunner


def slowed(fn, repeats: int):
    """An attention function that computes attention ``repeats`` times and returns the
    last (the same output, about ``repeats`` x the attention time): a planted slowdown."""
    def slow(q, k, v, **kwargs):
        out = None
        for _ in range(repeats):
            # a data dependence keeps XLA from merging the repeats into one
            out = fn(q if out is None else q + 0.0 * out.astype(q.dtype), k, v, **kwargs)
        return out
    return slow


def _timings(result: serving.TrafficResult) -> dict:
    c, p = result.abba_timings()
    ratio = float(np.exp(np.median(np.log(c.sum(1) / p.sum(1))))) if len(c) else math.nan
    return {"candidate_s": c.tolist(), "production_s": p.tolist(), "median_ratio": ratio}


def capture(implementation: str, n_requests: int, slowdown_repeats: int = 0,
            seed: int = 0) -> dict:
    """A/A (and, with ``slowdown_repeats`` > 1, slowed) ABBA timings of ``n_requests``
    held-out requests; see the module docstring for the layout."""
    import jax

    model = MiniLM.load()
    documents = assign_splits(load_documents(None))["heldout"]
    traffic = recorded_traffic.record_traffic(documents, n_requests, seed=seed)
    runner = LocalRunner.for_implementation(implementation, model=model)
    production = serving.Endpoint(f"{runner.name} (production)", runner)
    twin = serving.Endpoint(f"{runner.name} (candidate, same)",
                            LocalRunner.for_implementation(implementation, model=model))
    out = {"device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
           "jax_version": jax.__version__, "implementation": runner.name,
           "requests": n_requests, "slowdown_repeats": slowdown_repeats}
    serving.warm_up(traffic.requests, [production, twin], model)
    out["aa"] = _timings(serving.replay_canary_step(traffic.requests, 1.0, production, twin,
                                                    salt="aa", abba=True))
    out["slowed"] = None
    if slowdown_repeats > 1:
        slow = serving.Endpoint(f"{runner.name} x{slowdown_repeats} (slowed)", LocalRunner(
            f"{runner.name}-slowed", slowed(runner.attention_fn, slowdown_repeats), model))
        serving.warm_up(traffic.requests, [production, slow], model)
        out["slowed"] = _timings(serving.replay_canary_step(
            traffic.requests, 1.0, production, slow, salt="slowed", abba=True))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--implementation", default="xla")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--slowdown-repeats", type=int, default=0,
                        help="also time a candidate computing attention this many times")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = capture(args.implementation, args.requests, args.slowdown_repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=None) + "\n")
    print(json.dumps({"out": str(args.out), "device": data["device"],
                      "aa_median_ratio": data["aa"]["median_ratio"],
                      "slowed_median_ratio": (data["slowed"] or {}).get("median_ratio")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
