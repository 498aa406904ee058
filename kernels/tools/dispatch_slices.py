"""``kernels.tools.dispatch_evidence``'s command line (:func:`evidence_parser`: its flags
and their parsing, an unknown ``--kernels`` name refused) and which buckets of a dispatch
grid a run measures: its ``--slice-*`` flags as a selection of the grid, and where the
rest of a slice begins when a time budget cut it (``--budget-s``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from pydantic import ValidationError

from kernels.dispatch_pieces import EvidencePiece
from kernels.dispatch_space import Bucket, BucketGrid
from kernels.registry import IMPLEMENTATIONS
from kernels.shapes import AttentionShape
from kernels.tools.bench import EXTERNAL


def kernel_names(text: str) -> tuple[str, ...]:
    """``--kernels``: a comma-separated list of kernels this process can time (the
    registry's, built in or ``KERNELGATE_KERNELS`` plugins, and ``bench.EXTERNAL``).

    Raises:
        argparse.ArgumentTypeError: a name that is no kernel (the unknown names and the
            known ones listed): a typo is a usage error before any measurement, not a
            candidate that refuses every bucket.
    """
    given = names(text)
    known = (*IMPLEMENTATIONS, *EXTERNAL)
    unknown = [n for n in given if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown kernel{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f"; known kernels: {', '.join(known)}")
    return given


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list (``--kernels``, ``--dtypes``, ``--slice-dtypes``)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers (``--head-dims``, ``--seqs``).

    Raises:
        ValueError: an item that is not an integer.
    """
    return tuple(int(x) for x in names(text))


def span(text: str) -> tuple[int, int]:
    """``START:STOP`` as a pair of grid indices (either end may be left out: 0 and no end).

    Raises:
        argparse.ArgumentTypeError: no colon.
    """
    start, sep, stop = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected START:STOP, got {text!r}")
    return int(start or 0), int(stop) if stop else 10**9


def seconds(text: str) -> float:
    """A time budget in seconds (``--budget-s``): finite and not negative (0 measures the
    first bucket only).

    Raises:
        argparse.ArgumentTypeError: a negative, NaN or infinite budget.
    """
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def reason(err: ValueError | OSError) -> str:
    """A refused value in one line: each field and what it must be (a pydantic
    ``ValidationError``), the path that cannot be written (``OSError``), else the error's
    own text."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
    if isinstance(err, OSError):  # --out: a folder that cannot be made
        return f"cannot write {err.filename}: {err.strerror}"
    return str(err)


def select(grid: BucketGrid, args: argparse.Namespace) -> tuple[list[Bucket], str] | None:
    """The buckets of ``grid`` the ``--slice-*`` flags select and the piece's
    label, or ``None`` without a slice flag (the whole grid)."""
    if not (args.slice_dtypes or args.slice_causal or args.slice_buckets):
        return None
    start, stop = args.slice_buckets or (0, 10**9)
    chosen = [b for i, b in enumerate(grid.buckets()) if start <= i < stop
              and (not args.slice_dtypes or set(b.dtypes) <= set(args.slice_dtypes))
              and (not args.slice_causal or b.causal == (args.slice_causal == "causal",))]
    label = " ".join([",".join(args.slice_dtypes or ()), args.slice_causal or "",
                      f"buckets {start}:{'' if stop >= 10**9 else stop}"
                      if args.slice_buckets else ""]).split()
    return chosen, " ".join(label)


def remaining_start(grid: BucketGrid, args: argparse.Namespace, piece: EvidencePiece) -> int | None:
    """The grid index of the first bucket ``args``' slice selects that ``piece`` does not
    hold (a piece cut at its time budget), or ``None`` when it holds the whole slice."""
    chosen, _ = select(grid, args)
    held = {b.bucket.name for b in piece.buckets}
    index = {b.name: i for i, b in enumerate(grid.buckets())}
    missing = [index[b.name] for b in chosen if b.name not in held]
    return min(missing) if missing else None


def piece_report(grid: BucketGrid, args: argparse.Namespace, piece: EvidencePiece) -> str:
    """What a slice's run prints: the piece it wrote and, where its time budget cut it,
    the ``--slice-buckets`` that measure the rest."""
    lines = [f"wrote {args.out / 'piece.json'}: piece {piece.label!r}, {len(piece.buckets)} "
             "buckets; merge the pieces with python -m kernels.tools.dispatch_merge"]
    rest = remaining_start(grid, args, piece)
    if rest is not None:
        stop = args.slice_buckets[1] if args.slice_buckets else 10**9
        lines.append(f"not measured yet: the rest of this slice; the same command with "
                     f"--slice-buckets {rest}:{'' if stop >= 10**9 else stop} measures it")
    return "\n".join(lines)


def evidence_parser(description: str) -> argparse.ArgumentParser:
    """``kernels.tools.dispatch_evidence``'s command line (``--help``, headed by
    ``description``); flags left unset are ``None`` (the plan's values are kept)."""
    parser = argparse.ArgumentParser(prog="python -m kernels.tools.dispatch_evidence",
                                     description=description)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for evidence.json and policy.json")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny CPU plan (always the case without an accelerator)")
    parser.add_argument("--kernels", type=kernel_names, help="candidates, comma-separated")
    parser.add_argument("--priority", type=names, default=(),
                        help="tie-break order (default: the candidates' order)")
    parser.add_argument("--dtypes", type=names, help="the space's dtypes")
    parser.add_argument("--causal", choices=["full", "causal"], help="one causal flag only")
    parser.add_argument("--seq-cuts", type=ints,
                        help="the grid's cuts of q_len and kv_len (default 1024,8192): each "
                             "cut splits every bucket it crosses")
    parser.add_argument("--batch-cuts", type=ints,
                        help="the grid's cuts of batch (default none)")
    parser.add_argument("--head-dims", type=ints, help="measured head_dims")
    parser.add_argument("--seqs", type=ints, help="measured q_len and kv_len")
    parser.add_argument("--served-shapes", type=Path, default=None, metavar="FILE",
                        help="measure each bucket holding a shape of FILE at those shapes "
                             "(python -m evaluation.longdoc.served_shapes writes it)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--slice-dtypes", type=names,
                        help="a piece: only these dtypes' buckets (writes piece.json)")
    parser.add_argument("--slice-causal", choices=["full", "causal"],
                        help="a piece: only this causal flag's buckets")
    parser.add_argument("--slice-buckets", type=span, metavar="START:STOP",
                        help="a piece: only these buckets, by index in the grid's order")
    parser.add_argument("--budget-s", type=seconds, default=None, metavar="SECONDS",
                        help="a piece: start no bucket the longest so far would carry past "
                             "this; the --slice-buckets of the rest are printed")
    parser.add_argument("--list", action="store_true",
                        help="print the grid's buckets with their indices and exit (the "
                             "accelerator's grid on any host, the tiny one with --quick)")
    return parser


def served_shapes(path: Path, grid: BucketGrid) -> tuple[AttentionShape, ...]:
    """The ``shapes`` of a served-shapes file (``evaluation.longdoc.served_shapes``), at
    least one of them inside ``grid``'s space.

    Raises:
        ValueError: unreadable, not JSON, no ``shapes`` list, none given, a shape the
            contract refuses (its index and the field named), or none inside the space
            (the flag would change nothing).
    """
    try:
        given = json.loads(Path(path).read_text())["shapes"]
        if not isinstance(given, list):
            raise TypeError("'shapes' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--served-shapes {path}: not a served-shapes file "
                         f"(python -m evaluation.longdoc.served_shapes): {err}") from None
    shapes = []
    for i, raw in enumerate(given):
        try:
            shapes.append(AttentionShape.model_validate(raw))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(map(str, first["loc"])) or "shape"
            raise ValueError(f"--served-shapes {path}: shape {i}: {where}: {first['msg']}") from None
    if not shapes:
        raise ValueError(f"--served-shapes {path}: no shape given")
    if not any(grid.space.contains_shape(s) for s in shapes):
        raise ValueError(f"--served-shapes {path}: none of its {len(shapes)} shapes lies in the "
                         f"policy's space ({grid.space.label}); the flag would change nothing")
    return tuple(shapes)

