"""Merge dispatch evidence measured in pieces into one evidence and derive its policy.

``python -m kernels.tools.dispatch_merge --out DIR PIECE.json...`` reads the pieces
``kernels.tools.dispatch_evidence --slice-*`` wrote, joins them
(``kernels.dispatch_pieces.merge_pieces``: one device, backend, method, software stack and
space; no bucket twice; no gap), writes ``evidence.json`` and ``policy.json`` (both or
neither: :func:`write_together`; derived for ``--kernels``, default every kernel the
pieces measured, in their order; ties broken by ``--priority``, default that order) and
prints the per-bucket table, as a whole run does.
Exit status: 0; 2 when some bucket has no kernel; 3 when the pieces do not merge (the
reason printed).

``--partial`` (no ``--out``) prints the same table for the buckets the pieces measured
when they do not yet make the whole space (one measurement still: the same device,
software and method, no bucket twice), headed by how many of the space's buckets are
missing; it derives and writes no policy, since part of the space would have no kernel.
Exit status 0, or 3 as above.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kernels.dispatch_pieces import (
    EvidencePiece,
    PieceError,
    measured_buckets,
    merge_pieces,
)
from kernels.dispatch_policy import (
    BucketChoice,
    BucketEvidence,
    DispatchPolicy,
    Evidence,
    Rule,
    choose_buckets,
    derive_policy,
)
from kernels.dispatch_space import CoverageError, check_partition
from kernels.tools.piece_files import read_pieces


def format_table(policy: DispatchPolicy) -> str:
    """Per bucket: each candidate's median and interval (microseconds, geometric means
    over the bucket's shapes) and its ratio to the bucket's fastest; ``*`` marks the
    choice."""
    return "\n".join([f"dispatch policy {policy.fingerprint()[:16]} on {policy.device} "
                      f"({policy.backend}); rule {policy.rule.name}, priority "
                      f"{list(policy.rule.priority)}", format_choices(policy.buckets)])


def format_choices(choices: Sequence[BucketChoice]) -> str:
    """:func:`format_table`'s lines for ``choices``, one block per bucket."""
    lines = []
    for choice in choices:
        then = f" (then {', '.join(choice.ranking[1:])})" if choice.ranking[1:] else ""
        lines.append(f"{choice.bucket.name}  ({len(choice.evidence.shapes)} shapes) -> "
                     f"{choice.kernel or 'NONE'}{then}")
        for s in choice.summaries:
            mark = "*" if s.kernel == choice.kernel else " "
            if s.refused is not None:
                lines.append(f"   {mark} {s.kernel:18s} cannot serve: {s.refused[:110]}")
            else:
                lines.append(f"   {mark} {s.kernel:18s} {s.median_s * 1e6:10.1f} us "
                             f"[{s.low_s * 1e6:.1f}, {s.high_s * 1e6:.1f}]  "
                             f"x{s.ratio_to_best:.3f} of best")
    return "\n".join(lines)


def write_policy(evidence: Evidence, candidates: Sequence[str], priority: Sequence[str],
                 out: Path) -> DispatchPolicy:
    """The policy derived from ``evidence`` for ``candidates`` (ties broken by
    ``priority``, default the candidates' order), written with the evidence as
    ``out/evidence.json`` and ``out/policy.json``.

    Raises:
        ValueError: as ``derive_policy``.
    """
    policy = derive_policy(evidence, candidates, Rule(priority=tuple(priority) or
                                                      tuple(candidates)))
    write_together(out, {"evidence.json": evidence.model_dump_json(indent=1),
                         "policy.json": policy.model_dump_json(indent=1)})
    return policy


def write_together(out: Path, files: dict[str, str]) -> None:
    """Write ``files`` (name: text) into ``out`` all or nothing: each to a temporary file
    in ``out`` first, then renamed over its name; when a rename fails, the files already
    renamed are put back as they were (restored, or removed where there was none), so
    ``out`` holds either every new file or what it held before, never a mix.

    Raises:
        OSError: ``out`` cannot be made, or a file cannot be written or renamed (the
            temporary files are removed first).
    """
    out.mkdir(parents=True, exist_ok=True)
    temps: dict[str, str] = {}
    backups: dict[str, str | None] = {}
    try:
        for name, text in files.items():
            fd, temps[name] = tempfile.mkstemp(dir=out, prefix=f".{name}.")
            with os.fdopen(fd, "w") as f:
                f.write(text)
        for name in files:  # keep what each name held, to put back if a later rename fails
            backups[name] = None
            if (out / name).is_file():
                fd, backups[name] = tempfile.mkstemp(dir=out, prefix=f".{name}.old.")
                os.close(fd)
                shutil.copyfile(out / name, backups[name])
        renamed: list[str] = []
        try:
            for name in files:
                os.replace(temps[name], out / name)
                renamed.append(name)
        except BaseException:
            for name in renamed:
                if backups[name] is None:
                    (out / name).unlink()
                else:
                    os.replace(backups[name], out / name)
            raise
    finally:
        for leftover in [*temps.values(), *(b for b in backups.values() if b)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def report(policy: DispatchPolicy, out: Path) -> int:
    """Print the policy's table and where it was written; 0, or 2 when some bucket has
    no kernel."""
    print(format_table(policy))
    print(f"wrote {out / 'evidence.json'} and {out / 'policy.json'} "
          f"(fingerprint {policy.fingerprint()})")
    return 0 if all(b.kernel is not None for b in policy.buckets) else 2


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring for the exit status)."""
    parser = argparse.ArgumentParser(prog="python -m kernels.tools.dispatch_merge",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("pieces", nargs="+", type=Path, help="piece.json files")
    parser.add_argument("--out", type=Path,
                        help="folder for evidence.json and policy.json (required unless --partial)")
    parser.add_argument("--partial", action="store_true",
                        help="print the measured buckets' table when the pieces do not yet "
                             "make the whole space; no policy")
    parser.add_argument("--kernels", type=_names, help="candidates, comma-separated")
    parser.add_argument("--priority", type=_names, default=(), help="tie-break order")
    args = parser.parse_args(argv)
    if args.partial == (args.out is not None):
        parser.error("give --out (a whole space: evidence and policy written) or --partial "
                     "(a table of the measured buckets, nothing written), not both or neither")
    try:
        pieces = read_pieces(args.pieces)
        buckets = measured_buckets(pieces)  # one measurement, with or without gaps
        evidence = None if args.partial else merge_pieces(pieces)
    except (OSError, PieceError) as err:
        print(f"dispatch_merge: the pieces do not merge: {err}", file=sys.stderr)
        return 3
    candidates = tuple(args.kernels or dict.fromkeys(k.kernel for b in buckets for k in b.kernels))
    try:
        if evidence is None:
            return _partial(pieces, buckets, candidates, args.priority)
        policy = write_policy(evidence, candidates, args.priority, args.out)
    except ValueError as err:  # --kernels or --priority naming what cannot be
        parser.error(str(err))
    except OSError as err:  # --out: a folder that cannot be made or written
        parser.error(f"--out: cannot write {err.filename}: {err.strerror}")
    return report(policy, args.out)


def _partial(pieces: Sequence[EvidencePiece], buckets: Sequence[BucketEvidence],
             candidates: tuple[str, ...], priority: Sequence[str]) -> int:
    """Print the measured buckets' table, headed by what of the space they leave."""
    first = pieces[0]
    try:
        check_partition(first.space, [b.bucket for b in buckets])
        gap = "they cover the whole space: merge them with --out for a policy"
    except CoverageError as err:
        gap = f"not the whole space, so no policy is derived or written: {err}"
    choices = choose_buckets(buckets, candidates, Rule(priority=tuple(priority) or candidates))
    print(f"PARTIAL: {len(buckets)} buckets measured by pieces {[p.label for p in pieces]} on "
          f"{first.device} ({first.backend}); {gap}")
    print(format_choices(choices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
