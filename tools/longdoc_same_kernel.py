"""``python -m tools.longdoc_same_kernel``: is ``auto`` serving a kernel the same program
as that kernel named, in the long-document encoder?

Where a dispatch policy's bucket names kernel ``K``, the long-document replay compiles the
encoder's forward (``evaluation.longdoc.encoder.encode_jit``) once with ``auto`` and once
with ``K``. This command builds both for one batch shape (``--rows`` documents padded to
``--bucket`` tokens, each filling ``--fill`` of it, as the workload's batcher does), and
reports:

* whether ``auto`` resolved to ``K`` at that shape (else exit 2: there is nothing to
  compare);
* the two optimized HLO texts' sha256 after the module's name and the ``metadata={...}``
  annotations are removed (source lines and op names differ by construction), and how many
  lines differ: 0 means the device runs one program, and a latency gap between the two
  sides lies outside the code (placement, compile-time autotuning, the device's state);
* both programs timed ABBA (``--rounds`` rounds of K, auto, auto, K), the median of the
  per-round log ratio ``auto / K`` with its sign-based interval
  (``evaluation.longdoc.effect.median_interval``).

``auto`` serves the dispatch policy that ``KERNELGATE_DISPATCH_POLICY`` and
``KERNELGATE_DISPATCH_POLICY_SHA256`` configure (``tools/gpu-dispatch.sh``'s
``policy_env``); without one it resolves by the device's fallback order.

    python -m tools.longdoc_same_kernel --kernel pallas_mosaic_gpu --rows 1 --bucket 16384 \\
        --fill 0.7 --json out/same-kernel.json
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_MODULE = re.compile(r"^HloModule \S+", re.MULTILINE)
# four tables printed after the module's first line, each a header and rows to a blank line
_STACK_FRAMES = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n(.+\n)*\n?",
                           re.MULTILINE)


def normalized_hlo(text: str) -> str:
    """An optimized HLO text without its module name, its ``metadata={...}`` annotations
    and the stack-frame tables after its first line (``FileNames`` ... ``StackFrames``):
    source files, lines, Python functions and op names differ for two
    call paths compiling one program, and an executable loaded from JAX's persistent
    compilation cache prints the frames of the call that first compiled it."""
    return _METADATA.sub("", _STACK_FRAMES.sub("", _MODULE.sub("HloModule m", text)))


def compare(kernel: str, rows: int, bucket: int, fill: float, rounds: int,
            workload: str = "longdoc-modernbert-base") -> dict:
    """Compile the encoder's forward with ``auto`` and with ``kernel`` at one batch shape,
    compare the programs and time them ABBA; times in seconds.

    Raises:
        LookupError: ``auto`` does not resolve to ``kernel`` at this shape.
        evaluation.longdoc.spec.InvalidWorkload: no such shipped workload.
    """
    import jax
    import jax.numpy as jnp

    from evaluation.longdoc.effect import median_interval
    from evaluation.longdoc.encoder import LongDocEncoder, encode_jit
    from evaluation.longdoc.spec import load_spec, shipped
    from kernels.dispatch import get_attention_fn
    from kernels.shapes import AttentionShape

    spec = load_spec(shipped(workload))
    encoder = LongDocEncoder.for_spec(spec.encoder)
    # the documents' length as the dispatch evidence passes a fill (one rounding rule)
    lengths = np.asarray(AttentionShape(
        batch=rows, q_len=bucket, kv_len=bucket, num_heads=spec.encoder.heads,
        num_kv_heads=spec.encoder.heads, head_dim=spec.encoder.head_dim,
        dtype=spec.encoder.dtype, causal=False, kv_fill=fill).kv_lengths())
    tokens = int(lengths[0])
    ids = np.zeros((rows, bucket), np.int32)
    for i in range(rows):
        ids[i, :tokens] = encoder.document_ids(i, tokens)
    args = (encoder.params, jnp.asarray(ids), jnp.asarray(lengths))
    programs, texts, resolved = {}, {}, {}
    for name in (kernel, "auto"):
        fn = get_attention_fn(name)
        compiled = encode_jit.lower(*args, attention_fn=fn, spec=encoder.spec).compile()
        jax.block_until_ready(compiled(*args))
        programs[name], texts[name] = compiled, normalized_hlo(compiled.as_text())
        resolved[name] = sorted({r.name for r in getattr(fn, "resolutions", {}).values()})
    if resolved["auto"] != [kernel]:
        raise LookupError(f"auto resolves to {resolved['auto']} at {rows}x{bucket}, not "
                          f"{kernel!r}: nothing to compare")
    diff = [line for line in difflib.unified_diff(texts[kernel].splitlines(),
                                                  texts["auto"].splitlines(), lineterm="",
                                                  n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]

    def timed(name: str) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(programs[name](*args))
        return time.perf_counter() - t0

    kernel_s, auto_s = [], []
    for _ in range(rounds):
        a, b, c, d = timed(kernel), timed("auto"), timed("auto"), timed(kernel)
        kernel_s.append(a + d)
        auto_s.append(b + c)
    logs = np.log(np.asarray(auto_s) / np.asarray(kernel_s))
    found = median_interval(logs)
    return {"workload": workload, "kernel": kernel, "rows": rows, "bucket": bucket,
            "tokens": tokens, "device": str(jax.devices()[0]),
            "auto_resolved": resolved["auto"],
            "hlo_sha256": {n: hashlib.sha256(t.encode()).hexdigest() for n, t in texts.items()},
            "hlo_lines": len(texts[kernel].splitlines()), "hlo_lines_differing": len(diff),
            "hlo_diff_head": diff[:40], "rounds": rounds,
            "kernel_s": kernel_s, "auto_s": auto_s,
            "median_ratio": float(np.exp(np.median(logs))),
            "interval": None if found is None else [float(np.exp(found[0])),
                                                    float(np.exp(found[1]))]}


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); exit 0, or 2 for bad arguments or when ``auto`` does
    not serve the kernel at that shape."""
    parser = argparse.ArgumentParser(prog="python -m tools.longdoc_same_kernel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", default="pallas_mosaic_gpu",
                        help="the kernel the policy serves at this shape")
    parser.add_argument("--workload", default="longdoc-modernbert-base")
    parser.add_argument("--rows", type=int, default=1, help="documents in the batch")
    parser.add_argument("--bucket", type=int, default=16384, help="padded tokens per row")
    parser.add_argument("--fill", type=float, default=0.7,
                        help="each document's share of the bucket, in (0, 1]")
    parser.add_argument("--rounds", type=int, default=30, help="ABBA rounds, at least 8")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.bucket < 1:
        parser.error(f"--rows and --bucket must be at least 1, got {args.rows}, {args.bucket}")
    if not 0 < args.fill <= 1:
        parser.error(f"--fill must lie in (0, 1], got {args.fill}")
    if args.rounds < 8:
        parser.error(f"--rounds must be at least 8 (an interval needs 8), got {args.rounds}")
    try:
        result = compare(args.kernel, args.rows, args.bucket, args.fill, args.rounds,
                         args.workload)
    except LookupError as err:
        print(f"longdoc_same_kernel: {err}", file=sys.stderr)
        return 2
    same = "the same program" if result["hlo_lines_differing"] == 0 else (
        f"{result['hlo_lines_differing']} of {result['hlo_lines']} lines differ")
    interval = result["interval"]
    print(f"{args.workload} {args.rows}x{args.bucket} ({result['tokens']} tokens) on "
          f"{result['device']}: auto -> {result['auto_resolved']}; optimized HLO: {same}")
    print(f"auto / {args.kernel}: median {result['median_ratio']:.4f}"
          + (f" [{interval[0]:.4f}, {interval[1]:.4f}]" if interval else "")
          + f" over {args.rounds} ABBA rounds; medians {1e3 * np.median(result['auto_s']) / 2:.3f}"
          f" / {1e3 * np.median(result['kernel_s']) / 2:.3f} ms")
    for line in result["hlo_diff_head"][:10]:
        print("  " + line[:160])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
