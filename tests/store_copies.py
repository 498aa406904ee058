"""Copies of an embedded MLflow store (SQLite) that are really copies.

MLflow writes absolute paths into ``mlflow.db`` (each run's ``artifact_uri``, each
experiment's ``artifact_location``, dataset sources). A store copied or extracted
elsewhere still reads and writes the *original* folder until those are rewritten; a
rewrite that matches nothing leaves every copy sharing one artifact folder, silently.
So :func:`relocate` checks its own work: afterwards no text column names the old root.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path


def _text_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    out = []
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        for column in conn.execute(f"PRAGMA table_info('{table}')").fetchall():
            kind = column[2].upper()
            if kind in ("TEXT", "CLOB", "JSON") or kind.startswith(("VARCHAR", "CHAR", "TEXT")):
                out.append((table, column[1]))
    return out


def naming(db: Path, root: str) -> dict[str, int]:
    """``table.column`` -> rows whose text names ``root`` (as a path: ``root`` itself or
    a path under it), for every text column of the database."""
    found = {}
    with sqlite3.connect(db) as conn:
        for table, column in _text_columns(conn):
            (n,) = conn.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}" = ? OR instr("{column}", ?) > 0',
                (root, root + "/")).fetchone()
            if n:
                found[f"{table}.{column}"] = n
    return found


def recorded_root(db: Path) -> str:
    """The store folder the runs' artifact URIs name (the part before ``/mlartifacts/``).

    Raises:
        ValueError: the store has no run, or its runs name different folders.
    """
    with sqlite3.connect(db) as conn:
        uris = [u for (u,) in conn.execute("SELECT artifact_uri FROM runs").fetchall()]
    roots = {u.removeprefix("file://").partition("/mlartifacts/")[0] for u in uris}
    if len(roots) != 1:
        raise ValueError(f"{db}: the runs' artifact URIs name {sorted(roots) or 'no'} store folder(s)")
    return roots.pop()


def relocate(db: Path, old: str, new: str) -> int:
    """Rewrite every path under ``old`` in the database's text columns to lie under
    ``new``; returns how many values changed.

    Raises:
        AssertionError: a value still names ``old`` afterwards, or nothing named it (a
            relocation that matches nothing leaves the copy reading the original).
    """
    old, new = old.rstrip("/"), new.rstrip("/")
    changed = 0
    with sqlite3.connect(db) as conn:
        for table, column in _text_columns(conn):
            changed += conn.execute(
                f'UPDATE "{table}" SET "{column}" = CASE WHEN "{column}" = ? THEN ? '
                f'ELSE replace("{column}", ?, ?) END '
                f'WHERE "{column}" = ? OR instr("{column}", ?) > 0',
                (old, new, old + "/", new + "/", old, old + "/")).rowcount
    left = naming(db, old)
    assert changed and not left, (f"relocating {db} from {old} to {new}: {changed} values "
                                  f"changed, still naming {old}: {left}")
    return changed


def copy_store(src: Path, dst: Path) -> Path:
    """Copy the store folder ``src`` (``mlflow.db``, ``mlartifacts/``, ...) to ``dst`` and
    point the copy at itself, wherever ``src``'s runs say it was made. Returns ``dst``."""
    shutil.copytree(src, dst)
    relocate(dst / "mlflow.db", recorded_root(dst / "mlflow.db"), str(Path(dst).resolve()))
    forget_artifact_locations()
    return dst


def forget_artifact_locations() -> None:
    """Drop MLflow's in-process cache of artifact repositories, which is keyed by run id
    alone (``mlflow.tracking._tracking_service.utils._artifact_repos_cache``): a copy's
    runs keep their ids, so a write to a copied run in a process that wrote that run
    before (the attack fixture's rollouts) would land in the *original* folder."""
    from mlflow.tracking._tracking_service import utils

    utils._artifact_repos_cache.clear()


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder`` (to show it untouched)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}
