"""A release manager's manual rollback of ``production`` (``kernelgate rollback`` and the
``manual-rollback`` deployment's *Run* form in the Prefect UI).

The same path as every rollback (``lineage.aliases.registry.rollback``): a signed alias-change
intent logged as a ``rollback`` run, then the move; the version rolled away from is
tagged with the reason. The registry refuses a target that was never promoted, was
rolled back since, no longer exists or whose chain is incomplete.

It takes the family's place in line like a rollout: its lock on an embedded store, its
slot in the family's Prefect concurrency limit on a tracking server
(``flows.tasks.family_slot``), so a rollback asked for during a rollout waits for that
rollout to end and then rolls back what it left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from prefect import flow
from pydantic import Field

import kernels
from flows.settings import RolloutSettings
from flows.tasks import end_state, family_slot, run_logger, signing_for
from lineage.aliases.registry import AliasChange
from lineage.family_store import FamilyStore
from lineage.rollout import rollout
from lineage.store import tracking as tr


def _settings(store_dir: str, key_dir: str | None) -> RolloutSettings:
    return RolloutSettings(store_dir=Path(store_dir),
                           key_dir=None if key_dir is None else Path(key_dir))


def check_manual_rollback(to_version: int | None, family: str, store_dir: str,
                          key_dir: str | None = None) -> None:
    """What :func:`manual_rollback` would refuse, asked before its flow starts (nothing is
    written; the flow checks again under the family's lock).

    Raises:
        ValueError, lineage.aliases.registry.PromotionRefused: as :func:`manual_rollback`.
    """
    from lineage.aliases.registry import check_rollback

    settings = _settings(store_dir, key_dir)
    check_rollback(tr.tracking_for(settings.store_dir), family, signing=signing_for(settings),
                   to=to_version)


@flow(name="kernelgate-manual-rollback")
def manual_rollback(
    reason: Annotated[str, Field(min_length=3, description="why; recorded and signed")],
    requested_by: Annotated[str, Field(min_length=1, description="who asks (name or e-mail)")],
    to_version: Annotated[int | None, Field(ge=1, description=(
        "the earlier production version to restore; empty: the newest earlier usable one"))] = None,
    family: Annotated[str, Field(description="kernel family; auto: this host's flash kernel")] = "auto",
    store_dir: Annotated[str, Field(description="the local store (when MLFLOW_TRACKING_URI is unset)")] = ".kernelgate",
    key_dir: Annotated[str | None, Field(description=(
        "the pipeline's key folder (default ~/.kernelgate/keys or KERNELGATE_KEY_DIR)"))] = None,
) -> AliasChange:
    """Roll ``production`` of ``family`` back to ``to_version`` (or the newest earlier
    usable version), after waiting for the family's lock or slot (a rollout of the family
    in progress ends first), signed with the pipeline's key in ``key_dir``; the run ends in
    the state *RolledBack* and returns the alias change.

    Raises:
        ValueError: nothing in production, or ``to_version`` is what it serves.
        lineage.aliases.registry.PromotionRefused: ``to_version`` may not serve.
    """
    if family == "auto":
        family = kernels.native_flash_kernel("auto", kernels.default_backend())
    settings = _settings(store_dir, key_dir)
    store = FamilyStore(tr.tracking_for(settings.store_dir), family, signing_for(settings))
    with rollout.family_lock(settings.store_dir, family), family_slot(family):
        store.reconcile()
        change = store.rollback(reason=f"manual rollback requested by {requested_by}: {reason}",
                                to=None if to_version is None else str(to_version))
    now = f"v{change.version}" if change.version else "nothing (the native baseline serves)"
    message = f"production of {family}: v{change.previous_version} -> {now}"
    run_logger().warning("%s (%s)", message, change.reason)
    return end_state("rolled_back", message, change)
