"""Which buckets of a dispatch grid a ``kernels.tools.dispatch_evidence`` run measures:
its ``--slice-*`` flags (and the list flags' parsing) as a selection of the grid, and where
the rest of a slice begins when a time budget cut it (``--budget-s``)."""

from __future__ import annotations

import argparse
import math

from pydantic import ValidationError

from kernels.dispatch_pieces import EvidencePiece
from kernels.dispatch_space import Bucket, BucketGrid


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
