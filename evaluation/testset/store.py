"""Arrays of a split on disk: one ``.npz`` per split, keys ``<case_id>/<array>``, written
atomically (temp file + rename, so a reader never sees half a file)."""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from evaluation.cases import CaseSpec, TestCase
from evaluation.testset.recipes import DTYPES


def _to_storage(a: np.ndarray) -> np.ndarray:
    # .npz has no bfloat16; store its bits as uint16 (no q/k/v is ever uint16).
    return a.view(np.uint16) if a.dtype == DTYPES["bfloat16"] else a


def _from_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.view(DTYPES["bfloat16"]) if dtype == "bfloat16" and a.dtype == np.uint16 else a


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp creates 0600; give the artifact the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_split_arrays(path: str | Path, cases: list[TestCase]) -> None:
    """Write the cases' arrays to ``path`` (``.npz``, keys ``<case_id>/<array>``), atomically."""
    arrays = {f"{c.spec.case_id}/{n}": _to_storage(a) for c in cases for n, a in c.arrays().items()}

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.savez(f, **arrays)

    atomic_write(Path(path), write)


def read_cases(path: str | Path, specs: list[CaseSpec], *,
               skip_missing: bool = False) -> list[TestCase]:
    """The cases ``specs`` with their arrays from the ``.npz`` at ``path``, in order.

    Arrays are returned as stored (bf16 restored from its uint16 bits); nothing is
    checked against the specs here: run ``evaluation.validation.validate_testset``
    before evaluating.

    Args:
        skip_missing: leave out cases whose q/k/v are not in the file (validation
            reports them) instead of raising.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a readable ``.npz`` (truncated, corrupt), or a
            case's q/k/v are missing from it (unless ``skip_missing``); the message
            names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"test-set arrays file missing: {path}")
    cases = []
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            for spec in specs:
                def get(name: str, spec=spec) -> np.ndarray | None:
                    key = f"{spec.case_id}/{name}"
                    return _from_storage(npz[key], spec.dtype) if key in keys else None

                q, k, v = get("q"), get("k"), get("v")
                if q is None or k is None or v is None:
                    if skip_missing:
                        continue
                    raise ValueError(f"case {spec.case_id}: q/k/v missing from {path}")
                cases.append(TestCase(spec=spec, q=q, k=k, v=v, q_lengths=get("q_lengths"),
                                      kv_lengths=get("kv_lengths")))
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise ValueError(f"test-set arrays file {path} is unreadable (truncated or corrupt: "
                         f"{type(err).__name__}: {err}); rebuild the test set") from err
    return cases
