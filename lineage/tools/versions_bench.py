"""What versions that serve cost: ``python -m lineage.tools.versions_bench --out versions.json``.

In a throwaway store it builds one version (``xla`` by default), logs it as an MLflow
model and registers it, then measures, on this machine:

* logging: seconds and bytes/files of the logged model;
* loading: seconds from starting a version's own process to its first answer
  (``lineage.serving.version_runners.VersionWorker``: Python start, imports, ``mlflow.pyfunc.load_model``,
  the encoder's weights);
* a replayed request (one document through the encoder): the latency measured inside
  the runner and the wall time seen by the caller, for the version in its own process
  and for the same kernel called directly in this process (median of ``--requests``
  requests after one warm-up per runner).

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import jax

import kernels
from evaluation.documents import assign_splits, load_documents
from evaluation.model import MiniLM
from evaluation.recorded_traffic import record_traffic
from evaluation.runners import LocalRunner
from kernels.build import build as build_kernel
from kernels.shapes import AttentionShape
from lineage.serving.version_runners import VersionWorker
from lineage.serving.versions import log_version_model, register_version
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.store import tracking as tr

FAMILY = "versions-bench"


def _requests(n: int) -> list[str]:
    documents = assign_splits(load_documents(None))["tuning"]
    return [r.text for r in record_traffic(documents, n, seed=5).requests]


def _time_runner(runner, texts: list[str]) -> dict[str, float]:
    runner.embed(texts[:1])  # warm-up: compiles the request's length bucket
    inside, wall = [], []
    for text in texts:
        start = time.perf_counter()
        _, seconds = runner.embed([text])
        wall.append(time.perf_counter() - start)
        inside.append(seconds)
    return {"median_inside_s": statistics.median(inside), "median_wall_s": statistics.median(wall)}


def run(implementation: str, n_requests: int) -> dict:
    """Measure one version end to end (see the module docstring); returns the record."""
    encoder = MiniLM.load()
    texts = _requests(n_requests)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tracking = tr.local_tracking(tmp / "store")
        shape = AttentionShape(batch=1, q_len=256, kv_len=256, num_heads=4, num_kv_heads=2,
                               head_dim=128, dtype="bfloat16")
        build = build_kernel(implementation, None, shape, output_dir=tmp / "build")
        key = tmp / "keys" / f"{keys.PIPELINE_KEY}.pem"
        keys.create_key(key)
        signing = Signing(signer=keys.load_signer(key), trust=keys.folder_trust(key.parent))
        with tr.stage_run(tracking, FAMILY, "build") as run_id:
            logged = log_version_model(tracking, run_id, build, tmp / "build", encoder)
            version = register_version(tracking, FAMILY, run_id, build, logged, signing)
        start = time.perf_counter()
        worker = VersionWorker(tracking, FAMILY, version, trust=signing.trust)
        load_s = time.perf_counter() - start
        try:
            through_model = _time_runner(worker, texts)
        finally:
            worker.close()
    direct = _time_runner(LocalRunner.for_implementation(build.implementation, build.config, encoder),
                          texts)
    return {"created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python -m lineage.tools.versions_bench", *sys.argv[1:]]),
            "backend": kernels.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "jax_version": jax.__version__, "implementation": build.implementation,
            "log_seconds": logged.seconds, "model_bytes": logged.size_bytes,
            "model_files": logged.files, "load_seconds": load_s, "requests": n_requests,
            "loaded_model": through_model, "direct_call": direct}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lineage.tools.versions_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--implementation", default="xla")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = run(args.implementation, args.requests)
    ms = 1e3
    print(f"{'what':44s} {'value':>12s}")
    print(f"{'model logging (s)':44s} {result['log_seconds']:12.2f}")
    print(f"{'model size (MB, files)':44s} {result['model_bytes'] / 1e6:9.2f} ({result['model_files']})")
    print(f"{'load in its own process (s)':44s} {result['load_seconds']:12.2f}")
    for label, key in (("loaded model", "loaded_model"), ("direct call", "direct_call")):
        print(f"{label + ': request latency inside (ms)':44s} {result[key]['median_inside_s'] * ms:12.2f}")
        print(f"{label + ': request wall time (ms)':44s} {result[key]['median_wall_s'] * ms:12.2f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
