"""The Mosaic GPU kernel's performance floor and goal, read off one
``kernels.tools.variants`` report, and the report's per-row table (:func:`format_table`,
which the benchmark prints).

The floor (every group at >= 1.0x cuDNN, the geomean over all rows at >= 1.05x) and the
goal (at S = 16384 without a mask, >= 0.90 of the matmul ceiling at head_dim 128 and 256,
>= 0.75 at head_dim 64) are judged per variant from the rows of ONE call: each ratio is
TFLOP/s of the variant over cuDNN's on the same shape in the same process, the ceiling is
the same call's best large GEMM (``matmul_ceiling_tflops.ceiling``). A group is head_dim x
mask (causal or full) over both dtypes and both lengths, the grouping the floor was set
with; the per-(dtype, head_dim, mask) ratios are reported beside it.

A row that failed, or was not correct against float64, is not a speed: the variant's
summary then says ``floor_met: false`` and names the row, and a group with no row is
"not assessed", never counted as passing. Against FlashAttention-3 the rows are also
sorted by the call's A/A (``kernels.tools.call_aa``): ahead, behind, within its noise.

Usage:
    python3 -m kernels.tools.grid_summary REPORT.json [--write]   # print; --write adds
                                                                  # "summary" and "a_a"

Needs only the standard library (it runs on the CPU host over a committed report).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kernels.tools.call_aa import AA_VARIANT, a_a, format_a_a, resolved

FLOOR_GROUP_RATIO = 1.0
FLOOR_GEOMEAN_RATIO = 1.05
FA3_HEAD_DIM = 128
"""FlashAttention-3's rows: the wheel runs head_dim 128 only (``kernels.fa3``)."""
FA3_FLOOR_ROW_RATIO = 1.0
FA3_FLOOR_GEOMEAN_RATIO = 1.03
FA3_GOAL_GEOMEAN_RATIO = 1.05
"""Against FA3 (one call's rows): every head_dim-128 row >= 1.0x and their geomean >=
1.03x, with every row of the call >= 1.0x cuDNN (the floor); geomean >= 1.05x (the goal)."""
PEERS = ("cudnn", "fa3")
GOAL_SEQ = 16384
GOAL_OF_CEILING = {64: 0.75, 128: 0.90, 256: 0.90}
"""The goal: fraction of the same call's matmul ceiling, non-causal, S = 16384."""


def parse_shape(label: str) -> dict[str, Any]:
    """``'bfloat16 d64 full B1 S16384x16384 H32/32'`` -> dtype, head_dim, causal, batch,
    q_len, kv_len (the label ``kernels.shapes.AttentionShape.label`` prints).

    Raises:
        ValueError: the label does not have that form.
    """
    parts = label.split()
    try:
        dtype, d, mask, b, s = parts[:5]
        q_len, kv_len = s[1:].split("x")
        if not (d.startswith("d") and b.startswith("B") and s.startswith("S")
                and mask in ("full", "causal")):
            raise ValueError
        return {"dtype": dtype, "head_dim": int(d[1:]), "causal": mask == "causal",
                "batch": int(b[1:]), "q_len": int(q_len), "kv_len": int(kv_len)}
    except ValueError:
        raise ValueError(f"not a benchmark shape label (dtype dD full|causal BN SQxK ...): "
                         f"{label!r}") from None


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive ``values``.

    Raises:
        ValueError: no values, or one is not positive.
    """
    xs = list(values)
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geomean needs positive values, got {xs}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The floor and goal per variant of a ``kernels.tools.variants`` report.

    Returns ``{variant: {...}}`` with ``geomean_ratio_to_cudnn``, ``groups`` (``"d64
    full"`` -> geomean ratio), ``rows_by_dtype`` (``"bfloat16 d64 full"`` -> geomean),
    ``min_row`` (shape, ratio), ``of_ceiling_at_goal`` (head_dim -> fractions at S=16384
    non-causal, one per dtype), ``spills`` (shapes whose ptxas report shows spill bytes),
    ``floor_met``, ``goal_met``, and ``not_assessed`` (why a verdict could not be reached:
    failed or incorrect rows, a missing cuDNN row, a group without rows).

    Raises:
        ValueError: the report has no ``rows`` or no matmul ceiling.
    """
    rows = report.get("rows")
    ceiling = (report.get("matmul_ceiling_tflops") or {}).get("ceiling")
    if not rows or not ceiling:
        raise ValueError("a variants report needs 'rows' and 'matmul_ceiling_tflops.ceiling'")
    cudnn = {r["shape"]: r for r in rows if r["variant"] == "cudnn" and "error" not in r}
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["variant"] not in PEERS and r["variant"] != AA_VARIANT:
            by_variant[r["variant"]].append(r)
    expected_groups = sorted({(parse_shape(s)["head_dim"], parse_shape(s)["causal"])
                              for s in {r["shape"] for r in rows}})
    summary = {name: _summarize_variant(vrows, cudnn, ceiling, expected_groups)
               for name, vrows in by_variant.items()}
    fa3_shapes = sorted({r["shape"] for r in rows
                         if parse_shape(r["shape"])["head_dim"] == FA3_HEAD_DIM})
    if fa3_shapes:
        fa3 = {r["shape"]: r for r in rows if r["variant"] == "fa3"}
        # The band of the rows it sorts: the FA3 shapes' pairs only (noise differs by shape).
        aa = a_a([r for r in rows if r["shape"] in fa3_shapes])
        for name, vrows in by_variant.items():
            summary[name]["against_fa3"] = _against_fa3(vrows, fa3, fa3_shapes,
                                                        summary[name], aa)
    return summary


def _against_fa3(rows: Sequence[dict[str, Any]], fa3: dict[str, dict[str, Any]],
                 shapes: Sequence[str], summary: dict[str, Any],
                 aa: dict[str, Any]) -> dict[str, Any]:
    """The variant against FlashAttention-3 on the call's head_dim-128 ``shapes``: each
    row's ratio (TFLOP/s over FA3's on the same shape), their geomean, the floor (every
    row >= ``FA3_FLOOR_ROW_RATIO``, geomean >= ``FA3_FLOOR_GEOMEAN_RATIO``, and every row
    of the call >= 1.0x cuDNN, read from ``summary``: the issue's floor reads a call of the
    whole 24-row grid, ``rows_in_call`` says how many it held) and the goal. A shape
    without a correct variant row, or whose FA3 row is missing, failed or not correct
    against float64, is named in ``not_assessed``; then neither verdict is met. With the
    call's A/A on these shapes (``aa``, :func:`call_aa.a_a`), ``resolved`` sorts the rows
    into ahead of FA3, behind it and within the noise (:func:`call_aa.resolved`), and
    ``a_a_band``/``a_a_pairs`` say what that rests on; the verdicts themselves are the
    issue's thresholds, read as measured."""
    mine = {r["shape"]: r for r in rows}
    ratios: dict[str, float] = {}
    not_assessed: list[str] = []
    for shape in shapes:
        r, peer = mine.get(shape), fa3.get(shape)
        if r is None or "error" in r or not r.get("correct"):
            not_assessed.append(f"{shape}: no correct row of the variant")
        elif peer is None or "tflops" not in peer:
            why = ((peer or {}).get("error", "no FA3 row in the same call").strip()
                   or "no reason given")
            not_assessed.append(f"{shape}: FA3 not timed ({why.splitlines()[-1][:120]})")
        elif not peer.get("correct", True):
            not_assessed.append(f"{shape}: FA3's output not correct against float64")
        else:
            ratios[shape] = r["tflops"] / peer["tflops"]
    overall = geomean(ratios.values()) if ratios else None
    every_row_vs_cudnn = summary["every_row_vs_cudnn"]
    assessed = not not_assessed and overall is not None
    worst = min(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    return {
        "ratios": ratios,
        "geomean": overall,
        "min_row": {"shape": worst[0], "ratio_to_fa3": worst[1]} if worst else None,
        "every_row_vs_cudnn": every_row_vs_cudnn,
        "rows_in_call": summary["rows"],
        "floor_met": bool(assessed and every_row_vs_cudnn
                          and overall >= FA3_FLOOR_GEOMEAN_RATIO
                          and min(ratios.values()) >= FA3_FLOOR_ROW_RATIO),
        "goal_met": bool(assessed and overall >= FA3_GOAL_GEOMEAN_RATIO),
        "a_a_band": aa["band"],
        "a_a_pairs": aa["pairs"],
        "resolved": resolved(ratios, aa["band"]),
        "not_assessed": not_assessed,
    }


def _group_name(head_dim: int, causal: bool) -> str:
    return f"d{head_dim} {'causal' if causal else 'full'}"


def _summarize_variant(rows: Sequence[dict[str, Any]], cudnn: dict[str, dict[str, Any]],
                       ceiling: float, expected_groups: Sequence[tuple[int, bool]]
                       ) -> dict[str, Any]:
    not_assessed: list[str] = []
    ratios: dict[str, float] = {}
    groups: dict[str, list[float]] = defaultdict(list)
    by_dtype: dict[str, list[float]] = defaultdict(list)
    goal: dict[str, list[float]] = defaultdict(list)
    spills: list[str] = []
    for r in rows:
        shape = parse_shape(r["shape"])
        if "error" in r or not r.get("correct"):
            not_assessed.append(f"{r['shape']}: " + ("failed" if "error" in r
                                                     else "not correct against float64"))
            continue
        base = cudnn.get(r["shape"])
        if base is None:
            not_assessed.append(f"{r['shape']}: no cuDNN row in the same call")
            continue
        ratio = r["tflops"] / base["tflops"]
        ratios[r["shape"]] = ratio
        groups[_group_name(shape["head_dim"], shape["causal"])].append(ratio)
        by_dtype[f"{shape['dtype']} {_group_name(shape['head_dim'], shape['causal'])}"].append(ratio)
        if not shape["causal"] and shape["kv_len"] == GOAL_SEQ:
            goal[str(shape["head_dim"])].append(r["tflops"] / ceiling)
        ptx = r.get("ptxas")
        if isinstance(ptx, dict) and (ptx.get("spill_store_bytes") or ptx.get("spill_load_bytes")):
            spills.append(f"{r['shape']}: {ptx['spill_store_bytes']}/{ptx['spill_load_bytes']} B")
    for head_dim, causal in expected_groups:
        if _group_name(head_dim, causal) not in groups:
            not_assessed.append(f"group {_group_name(head_dim, causal)}: no row")
    group_means = {g: geomean(v) for g, v in sorted(groups.items())}
    overall = geomean(ratios.values()) if ratios else None
    floor_met = (not not_assessed and overall is not None
                 and overall >= FLOOR_GEOMEAN_RATIO
                 and all(v >= FLOOR_GROUP_RATIO for v in group_means.values()))
    goal_missing = [d for d in map(str, GOAL_OF_CEILING) if d not in goal]
    goal_met = (not goal_missing and not not_assessed
                and all(min(goal[d]) >= GOAL_OF_CEILING[int(d)] for d in goal))
    worst = min(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    return {
        "rows": len(rows),
        # every row of this call assessed against cuDNN and at >= 1.0x (the goal's
        # missing head_dims are no row of the call, so they do not enter here)
        "every_row_vs_cudnn": bool(not not_assessed and ratios
                                   and min(ratios.values()) >= FLOOR_GROUP_RATIO),
        "geomean_ratio_to_cudnn": overall,
        "groups": group_means,
        "rows_by_dtype": {k: geomean(v) for k, v in sorted(by_dtype.items())},
        "min_row": {"shape": worst[0], "ratio_to_cudnn": worst[1]} if worst else None,
        "of_ceiling_at_goal": {d: sorted(v) for d, v in sorted(goal.items(), key=lambda kv: int(kv[0]))},
        "goal_of_ceiling": {str(d): f for d, f in GOAL_OF_CEILING.items()},
        "spills": spills,
        "floor_met": floor_met,
        "goal_met": goal_met,
        "not_assessed": not_assessed + [f"goal at head_dim {d}: no non-causal S={GOAL_SEQ} row"
                                        for d in goal_missing],
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A few lines per variant: geomean and floor, each group, the goal fractions."""
    lines = []
    for name, s in summary.items():
        gm = s["geomean_ratio_to_cudnn"]
        lines.append(f"{name}: geomean {gm:.3f}x cuDNN over {s['rows']} rows "
                     f"(floor >= {FLOOR_GEOMEAN_RATIO}, every group >= {FLOOR_GROUP_RATIO}): "
                     f"{'met' if s['floor_met'] else 'NOT met'}" if gm is not None
                     else f"{name}: no assessable row")
        for g, v in s["groups"].items():
            lines.append(f"  {g:<12} {v:.3f}")
        for d, fracs in s["of_ceiling_at_goal"].items():
            lines.append(f"  of ceiling, d{d} full S={GOAL_SEQ}: "
                         + ", ".join(f"{f:.3f}" for f in fracs)
                         + f" (goal {GOAL_OF_CEILING[int(d)]})")
        lines.append(f"  goal: {'met' if s['goal_met'] else 'NOT met'}")
        if s["spills"]:
            lines.append("  spills: " + "; ".join(s["spills"]))
        for reason in s["not_assessed"]:
            lines.append(f"  not assessed: {reason}")
        fa3 = s.get("against_fa3")
        if fa3:
            gm = fa3["geomean"]
            lines.append(
                f"  against FA3 (d{FA3_HEAD_DIM}): "
                + (f"geomean {gm:.3f}x over {len(fa3['ratios'])} rows, lowest "
                   f"{fa3['min_row']['ratio_to_fa3']:.3f} ({fa3['min_row']['shape']})"
                   if gm is not None else "no assessable row")
                + f"; floor (every row >= {FA3_FLOOR_ROW_RATIO}, geomean >= "
                  f"{FA3_FLOOR_GEOMEAN_RATIO}, each of the call's {fa3['rows_in_call']} rows "
                  f">= 1.0x cuDNN: {'yes' if fa3['every_row_vs_cudnn'] else 'no'}): "
                + ("met" if fa3["floor_met"] else "NOT met")
                + f"; goal (geomean >= {FA3_GOAL_GEOMEAN_RATIO}): "
                + ("met" if fa3["goal_met"] else "NOT met"))
            res = fa3.get("resolved")
            lines.append(
                "  against FA3, beside the call's A/A: no A/A timed, no row resolved"
                if res is None else
                f"  against FA3, beside the call's A/A on these rows ({fa3['a_a_pairs']} pairs, "
                f"band [{math.exp(-fa3['a_a_band']):.3f}, {math.exp(fa3['a_a_band']):.3f}]): "
                f"{len(res['ahead'])} rows ahead, {len(res['behind'])} behind, "
                f"{len(res['within'])} within")
            for reason in fa3["not_assessed"]:
                lines.append(f"  not assessed against FA3: {reason}")
    return "\n".join(lines)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")


def _headline(text: str) -> str:
    """The traceback's last ``SomeError: message`` line (JAX appends notes after it)."""
    lines = text.strip().splitlines()
    return next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1])


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per (shape, variant): ms, TFLOP/s, ratios, ceiling fraction, errors,
    registers and spills."""
    head = (f"{'shape':<38} {'variant':<24} {'ms':>8} {'TF/s':>6} {'/cudnn':>7} "
            f"{'/fa3':>6} {'/default':>8} {'/ceil':>6} {'err/cud':>7} {'ok':>3} {'regs':>5} "
            f"{'spill':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['shape']:<38} {r['variant']:<24} FAILED: "
                         f"{_headline(r['error'])[:120]}")
            continue
        ptx = r.get("ptxas")
        regs = ptx.get("registers") if isinstance(ptx, dict) else None
        spill = (f"{ptx['spill_store_bytes']}/{ptx['spill_load_bytes']}"
                 if isinstance(ptx, dict) else "-")

        def f(key, fmt, r=r):
            return format(r[key], fmt) if r.get(key) is not None else "-"

        lines.append(f"{r['shape']:<38} {r['variant']:<24} {r['median_s'] * 1e3:>8.3f} "
                     f"{r['tflops']:>6.1f} {f('ratio_to_cudnn', '7.3f'):>7} "
                     f"{f('ratio_to_fa3', '6.3f'):>6} "
                     f"{f('ratio_to_default', '8.3f'):>8} {f('of_ceiling', '6.3f'):>6} "
                     f"{f('sampled_error_ratio_to_cudnn', '7.3f'):>7} "
                     f"{'yes' if r.get('correct', r['variant'] in PEERS) else 'NO':>3} "
                     f"{regs if regs is not None else '-':>5} {spill:>7}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the summary of a report and its A/A (exit 0); ``--write`` stores them under
    "summary" and "a_a".
    Exit 2 when the file is not a variants report."""
    p = argparse.ArgumentParser(prog="python3 -m kernels.tools.grid_summary",
                                description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path)
    p.add_argument("--write", action="store_true", help="add the summary to the report file")
    args = p.parse_args(argv)
    try:
        report = json.loads(args.report.read_text())
        summary = summarize(report)
    except (OSError, ValueError, KeyError) as err:
        print(f"{args.report}: {err}", file=sys.stderr)
        return 2
    aa = a_a(report["rows"])
    print(format_summary(summary) + "\n" + format_a_a(aa))
    if args.write:
        report["summary"], report["a_a"] = summary, aa
        args.report.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
