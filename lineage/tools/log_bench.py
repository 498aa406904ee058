"""What a family's signed log costs as it grows: ``python -m lineage.tools.log_bench --out log.json``.

In a throwaway embedded store it builds a synthetic but real family log through the one
writer (``lineage.log.log_writer.append``: each entry a signed DSSE envelope of its own run,
numbered and chained, the pipeline's checkpoint moved after it): ``--rollouts`` rollouts
of ``--entries`` entries each (default 100 x 8: registration, build, evaluation, gate
decision, shadow, a canary step, an alias move, the outcome; one run per entry, as a
rollout's stages are). After every ``--every`` rollouts it measures, on this machine:

* append: the mean seconds of the last rollout's appends (each reads the family's log
  back from the store to learn the next position and check it);
* audit (log part): ``StoreSource`` loading every verified envelope of the family,
  ``lineage.log.family_log.read`` and ``lineage.log.checkpoints.witness`` against the pipeline's
  checkpoint and a remembered head: the part of ``kernelgate audit`` that grows with the
  log (the chain, decision and artifact checks follow one version's chain).

Prints a table and writes JSON. No Prefect, no kernels: only the lineage package.
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

from lineage.log import checkpoints, family_log
from lineage.log.log_writer import append
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr

FAMILY = "bench"
ROLLOUT_KINDS = ("registration", "build", "evaluation", "decision", "shadow", "canary",
                 "alias", "outcome")
"""The kinds of one synthetic rollout's entries, in order (cycled for ``--entries``)."""


def _append_rollout(tracking, signing: Signing, index: int, entries: int) -> list[float]:
    seconds = []
    for j in range(entries):
        kind = ROLLOUT_KINDS[j % len(ROLLOUT_KINDS)]
        stage = {"registration": "preregistration", "decision": "gate", "alias": "promotion",
                 "outcome": "rollout"}.get(kind, kind)
        with tr.stage_run(tracking, FAMILY, stage, run_name=f"r{index}-{kind}") as run_id:
            tr.log_bytes(tracking, run_id, json.dumps({"rollout": index, "step": j}).encode(),
                         f"bench/{kind}.json")  # the entry's subject
            start = time.perf_counter()
            append(tracking, run_id, kind, {"family": FAMILY, "rollout": index, "step": j},
                   signing)
            seconds.append(time.perf_counter() - start)
    return seconds


def _audit_log(tracking, signing: Signing, home: Path) -> tuple[float, int, list[str]]:
    start = time.perf_counter()
    source = StoreSource(tracking, FAMILY, signing.trust)
    log = family_log.read(source)
    found, _ = checkpoints.witness(log, signing.trust, key_dir=signing.key_dir, home=home)
    problems = log.problems + found
    if not problems:
        checkpoints.remember(log, home)
    return time.perf_counter() - start, log.length, problems


def run(rollouts: int, entries: int, every: int, root: Path) -> dict:
    """Build the family and measure; see the module docstring for the rows."""
    tracking = tr.local_tracking(root / "store")
    key_dir = root / "keys"
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(key_dir)),
                      trust=keys.folder_trust(key_dir), key_dir=key_dir)
    rows, total_start = [], time.perf_counter()
    for i in range(1, rollouts + 1):
        appends = _append_rollout(tracking, signing, i, entries)
        if i % every == 0 or i == rollouts:
            audit_s, length, problems = _audit_log(tracking, signing, root / "home")
            rows.append({"rollouts": i, "entries": length,
                         "append_mean_s": statistics.fmean(appends),
                         "append_max_s": max(appends), "audit_log_s": audit_s,
                         "problems": problems,
                         "elapsed_s": time.perf_counter() - total_start})
            print(_row(rows[-1]), flush=True)
    return {"rollouts": rollouts, "entries_per_rollout": entries, "rows": rows,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": f"python -m lineage.tools.log_bench --rollouts {rollouts} --entries {entries} "
                       f"--every {every}"}


HEADER = ("| rollouts | log entries | append, mean (ms) | append, max (ms) | audit of the log (s) "
          "| built so far (s) |\n|---|---|---|---|---|---|")


def _row(r: dict) -> str:
    return (f"| {r['rollouts']} | {r['entries']} | {1000 * r['append_mean_s']:.0f} | "
            f"{1000 * r['append_max_s']:.0f} | {r['audit_log_s']:.2f} | {r['elapsed_s']:.0f} |"
            + (f" PROBLEMS: {r['problems']}" if r["problems"] else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--entries", type=int, default=len(ROLLOUT_KINDS))
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if min(args.rollouts, args.entries, args.every) < 1:
        parser.error("--rollouts, --entries and --every must be at least 1")
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="kernelgate-log-bench-") as tmp:
        result = run(args.rollouts, args.entries, args.every, Path(tmp))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"written {args.out}")
    return 1 if any(r["problems"] for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
