"""The command line's first checks: bad arguments refused in well under a second, before
JAX, MLflow or Prefect is imported (``flows.cli`` calls these first; the full checks,
which need the kernels and the store, follow for arguments that pass).

* ``--implementation``: ``auto``, ``native`` or a name of the kernel registry
  (``kernels.registry``: importing it imports no JAX and loads no kernel; a bad
  ``KERNELGATE_KERNELS`` is refused here with the registry's message).
* ``--family``: a valid name, and, unless ``--new-family``, one the embedded store
  already has (read from its SQLite file, read-only) or the kernel's own name.
* ``--thresholds``: the file parses against the thresholds schema (pydantic, no JAX).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_keys import check_name

StoreDir = Annotated[Path, typer.Option(help="local store: MLflow SQLite, artifacts, test sets")]


def kernel_names() -> list[str]:
    """The kernel registry's names, sorted (``kernels.registry.IMPLEMENTATIONS``: the
    built-in kernels and those of ``KERNELGATE_KERNELS``; no kernel is loaded).

    Raises:
        typer.BadParameter: ``KERNELGATE_KERNELS`` is not a list of
            ``name=module:attribute`` (the registry's message: it refuses it).
    """
    try:
        from kernels.registry import IMPLEMENTATIONS
    except ValueError as err:  # the registry parses KERNELGATE_KERNELS when imported
        raise typer.BadParameter(str(err)) from None
    return sorted(IMPLEMENTATIONS)


def check_implementation(implementation: str) -> str:
    """``implementation`` if it is ``auto``, ``native``, ``dispatch`` (a dispatch policy,
    ``--dispatch-policy``: ``flows.dispatch_candidate``) or a registry name.

    Raises:
        typer.BadParameter: naming the choices (as ``kernels.api`` does), or a bad
            ``KERNELGATE_KERNELS`` (the registry's message; :func:`kernel_names`).
    """
    names = kernel_names()
    if implementation not in ("auto", "native", "dispatch") and implementation not in names:
        import difflib

        close = difflib.get_close_matches(implementation, [*names, "auto", "native", "dispatch"],
                                          n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise typer.BadParameter(f"unknown implementation {implementation!r}; {hint}choose one of "
                                 f"{names}, 'auto', 'native' or 'dispatch'", param_hint="--implementation")
    return implementation


def local_families(store_dir: Path) -> list[str] | None:
    """The families of the embedded store at ``store_dir`` (its SQLite file read
    read-only), ``[]`` when it has no store yet; None when it cannot be read this way
    (the full check decides then)."""
    db = Path(store_dir) / "mlflow.db"
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2) as conn:
            rows = conn.execute("SELECT name FROM experiments WHERE lifecycle_stage = 'active'")
            return sorted(n.removeprefix("kernelgate-") for (n,) in rows
                          if n.startswith("kernelgate-"))
    except sqlite3.Error:
        return None


def check_family(family: str | None, implementation: str, store_dir: Path, *,
                 new_family: bool, remote: bool) -> None:
    """Refuse an invalid family name, or (without ``--new-family``) one the embedded
    store does not have and that is no kernel's own name. ``remote``: the store is a
    tracking server (checked later, once it is reached).

    Raises:
        typer.BadParameter: naming the store's families.
    """
    if family is None:
        return
    _family_name(family)
    if new_family or remote or family == implementation or family in kernel_names():
        return
    known = local_families(store_dir)
    if known is not None and family not in known:
        raise typer.BadParameter(
            f"no family {family!r} in this store yet (families: {known or 'none'}); "
            "pass --new-family to start one", param_hint="--family")


def _family_name(family: str) -> str:
    try:
        return check_name(family)
    except typer.BadParameter as err:
        raise typer.BadParameter(err.message, param_hint="--family") from None


def check_thresholds(thresholds: Path | None) -> None:
    """The thresholds file parses against the schema (None: the default is chosen later,
    from the shipped files, once the kernel is known).

    Raises:
        typer.BadParameter: the parser's reason.
    """
    if thresholds is None:
        return
    from gates.thresholds import load_thresholds

    try:
        load_thresholds(thresholds)
    except (ValueError, OSError) as err:
        raise typer.BadParameter(str(err), param_hint="--thresholds") from None


def check_store_dir(store_dir: Path, *, writes: bool) -> None:
    """Refuse a ``--store-dir`` that is not a folder, or (``writes``: a command that
    writes to it) one this process cannot write in, or create: probed by writing, since a
    read-only mount or a folder of another user refuses only then.

    Raises:
        typer.BadParameter: naming the folder and why.
    """
    store_dir = Path(store_dir)
    if store_dir.exists() and not store_dir.is_dir():
        raise typer.BadParameter(f"{store_dir} is a file, not a store folder",
                                 param_hint="--store-dir")
    if not writes:
        return
    folder = store_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the folder the store would be created in
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        what = "the store" if folder == store_dir else f"{folder}, where it would be created"
        raise typer.BadParameter(f"cannot write to {what} ({err.strerror or err}): a rollout "
                                 "writes its record, test sets and work files there",
                                 param_hint="--store-dir") from None


def check_known_family(family: str | None, store_dir: Path) -> None:
    """For commands that read a family: refuse a store path that is not a folder, an
    invalid name, or a family the embedded store does not have, before MLflow is imported
    (a tracking server's families are checked once it is reached).

    Raises:
        typer.BadParameter: naming the store's families.
    """
    check_store_dir(store_dir, writes=False)
    if family is None:
        return
    _family_name(family)
    import os

    if os.environ.get("MLFLOW_TRACKING_URI"):
        return
    known = local_families(store_dir)
    if known is not None and family not in known:
        raise typer.BadParameter(f"no family {family!r} in this store; families: {known or 'none'}",
                                 param_hint="--family")
