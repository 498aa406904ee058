"""Reading ``piece.json`` files (``kernels.tools.dispatch_evidence --slice-*`` writes them)
for the tools that merge or compare pieces.

It lives beside the tools, outside the kernels package's fingerprinted sources
(``kernels.build.source_digests``): reading files is not part of what a piece measures,
so changing it leaves the evidence of earlier calls mergeable with new pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from kernels.dispatch_pieces import EvidencePiece, PieceError


def read_pieces(paths: Sequence[Path]) -> list[EvidencePiece]:
    """The pieces in ``paths`` (``piece.json`` files), in order.

    Raises:
        kernels.dispatch_pieces.PieceError: a file that is not a piece (a policy.json, an
            evidence.json, not JSON), named with the first field that failed.
        OSError: a file that cannot be read.
    """
    pieces = []
    for path in paths:
        raw = Path(path).read_bytes()
        try:
            pieces.append(EvidencePiece.model_validate_json(raw))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "the file"
            raise PieceError(f"{path}: not a dispatch evidence piece (the piece.json a "
                             f"dispatch_evidence --slice-* run writes): {where}: "
                             f"{first['msg']}") from None
    return pieces
