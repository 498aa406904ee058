"""The ``ptxas`` report of a Mosaic GPU kernel: registers per thread and spills.

Mosaic GPU compiles its PTX with ``ptxas`` inside the process, at the kernel's first
compile; with ``MOSAIC_GPU_DUMP_PTXAS=1`` in the environment it prints ptxas's verbose
report (``ptxas info : Used N registers``, ``N bytes spill stores, N bytes spill loads``)
from C++ to the process's stdout/stderr, past Python's ``sys.stdout``.
:func:`captured_output` captures those file descriptors around a compile and
:func:`parse_ptxas` reads the numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from typing import Any

_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(text: str) -> dict[str, Any] | None:
    """Registers and spills from ``ptxas -v`` text (the largest over its kernels), or
    ``None`` when the text has no ptxas report."""
    used = [int(x) for x in _USED.findall(text)]
    spills = [(int(a), int(b)) for a, b in _SPILL.findall(text)]
    if not used and not spills:
        return None
    return {"registers": max(used) if used else None,
            "spill_store_bytes": max((a for a, _ in spills), default=0),
            "spill_load_bytes": max((b for _, b in spills), default=0)}


@contextlib.contextmanager
def captured_output(sink: list[str]):
    """Capture what this process writes to file descriptors 1 and 2 (C++ included:
    Mosaic GPU prints the ptxas report there), append it to ``sink`` and echo it to
    stderr afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                ctypes.CDLL(None).fflush(None)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            sink.append(text)
            sys.stderr.write(text)
