"""A store's identity: which store a family's signed log belongs to.

A family's log is named by the store it lives in and the family, never by its first
entry: a log of the same family with another first entry (the family's experiment and
registered model renamed away, then a "new" family of the old name; another store signed
by the same key folder put in this one's place) is then compared with what was seen of the
family before, and fails as a restarted log.

* **The store id** is a random id, created once by the pipeline the first time it starts a
  log in a store, and signed into entry 1 of every family's log there
  (``predicate["log"]["store"]``). Whoever can write the store but holds no key cannot
  change it: the id a log belongs to is the one its signed first entry names.
* **Where a store is** (its tracking URI) is remembered with the id outside the store:
  the pipeline's key folder (``<key dir>/stores.json``, written by writers) and the
  auditor's kernelgate home (``<home>/witnessed/stores.json``, written by audits). A log
  found where another store was seen is "another store in its place"; a store found in a
  new place (moved, or restored from a backup elsewhere) is said, not failed.
* Logs whose first entry names no store were made before logs carried a store identity:
  still verified, and said.
* A store made afresh at a place the key folder knows (``make clean``, then a rollout:
  no experiment of any family, renamed or deleted ones included) is a new store: it gets
  a new id on its first entry. The auditors who saw the old store there fail it, naming
  both; a store that still holds a family's experiment under any name keeps its id, so a
  family renamed away cannot start again unseen.

The checkpoints beside the key and the auditor's remembered heads are kept per
``(store id, family)`` (``lineage.log.checkpoints``).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from lineage.store.store import Tracking

STORES_FILE = "stores.json"


def location(tracking: Tracking) -> str:
    """Where a store is, as the pipeline and the auditor name it: its tracking URI."""
    return tracking.tracking_uri


def known(folder: Path | None) -> dict[str, str]:
    """location -> store id, as remembered in ``folder`` (a key folder, or an auditor's
    ``witnessed`` folder); empty when none is remembered there."""
    if folder is None:
        return {}
    path = Path(folder) / STORES_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    places = data.get("locations", {}) if isinstance(data, dict) else {}
    return {str(k): str(v) for k, v in places.items()}


def remember(folder: Path, where: str, store_id: str) -> None:
    """Remember that the store ``store_id`` is at ``where`` (a move adds a location; the
    locations a store was seen at before are kept, so a store found there later is
    compared with it)."""
    places = known(folder)
    if places.get(where) == store_id:
        return
    places[where] = store_id
    path = Path(folder) / STORES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"locations": places}, indent=1, sort_keys=True))
    tmp.replace(path)


def forget(folder: Path, where: str) -> None:
    """Forget which store was at ``where`` (a new store was made there)."""
    places = known(folder)
    if places.pop(where, None) is None:
        return
    path = Path(folder) / STORES_FILE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"locations": places}, indent=1, sort_keys=True))
    tmp.replace(path)


def is_fresh(tracking: Tracking, family: str) -> bool:
    """Whether the store holds nothing of any family but ``family``'s own experiment
    (just created, holding no log yet): no other experiment of the pipeline's, by name or
    by family tag, deleted ones included."""
    from mlflow.entities import ViewType

    from lineage.store import tags

    own = f"kernelgate-{family}"
    for experiment in tracking.client().search_experiments(view_type=ViewType.ALL,
                                                           max_results=1000):
        ours = experiment.name.startswith("kernelgate-") or tags.FAMILY in experiment.tags
        if ours and (experiment.name != own or experiment.lifecycle_stage != "active"):
            return False
    return True


def new_store_id() -> str:
    """A new store id (random, 32 hex digits)."""
    return uuid.uuid4().hex


def store_for(folder: Path | None, where: str) -> str | None:
    """The store id remembered at ``where`` in ``folder`` (None: none)."""
    return known(folder).get(where)


def check(store_id: str | None, where: str | None, folder: Path | None, whose: str
          ) -> tuple[list[str], list[str]]:
    """Problems and warnings of a log whose first entry names ``store_id``, found at
    ``where``, against the stores ``folder`` remembers (``whose``: who remembers them, for
    messages). Another store remembered at ``where`` is a problem (a store put in this
    one's place); ``store_id`` remembered only elsewhere is a warning (a moved store)."""
    if store_id is None or where is None or folder is None:
        return [], []
    places = known(folder)
    here = places.get(where)
    if here is not None and here != store_id:
        return [f"store identity: {whose} knows {where} as store {here[:12]}, but this log's "
                f"signed first entry belongs to store {store_id[:12]}: another store was put "
                "in its place"], []
    if here is None:
        elsewhere = sorted(k for k, v in places.items() if v == store_id)
        if elsewhere:
            return [], [f"store identity: store {store_id[:12]} was seen by {whose} at "
                        f"{', '.join(elsewhere)}; it is now at {where} (moved or restored)"]
    return [], []


__all__ = ["STORES_FILE", "check", "forget", "is_fresh", "known", "location", "new_store_id", "remember",
           "store_for"]
