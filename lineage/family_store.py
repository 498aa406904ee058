"""One family of one store, as one object: its records, its log, its aliases and the
audit's reads.

Most of ``lineage`` is functions taking ``(tracking, family, ...)`` first, and the ones
that write also ``signing``. :class:`FamilyStore` holds the three once and exposes those
functions as thin methods (the shape of MLflow's ``MlflowClient``): a caller names the
family once instead of at every call. Every method is one call of the function it is
named after; the functions stay the one place the rules live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gates.preregistration import Registration
from lineage.aliases import registered_model, registry
from lineage.aliases.registered_model import Alias
from lineage.aliases.registry import AliasChange
from lineage.log import family_log, log_writer
from lineage.log.family_log import FamilyLog
from lineage.records import records, registration
from lineage.signing.attestations import Attestation, Signing, TrustPolicy
from lineage.signing.sources import StoreSource
from lineage.store.tracking import Tracking


@dataclass(frozen=True)
class FamilyStore:
    """A family's record in a store, and who signs what is written to it.

    Args:
        tracking: the MLflow store.
        family: the family (its experiment and registered model).
        signing: the pipeline's key and trust; the reads need only its trust.
    """

    tracking: Tracking
    family: str
    signing: Signing

    @classmethod
    def of(cls, record: Any) -> FamilyStore:
        """The family store of a rollout's record (``lineage.rollout.rollout.rollout.RolloutRecord``)."""
        return cls(record.tracking, record.family, record.signing)

    @property
    def trust(self) -> TrustPolicy:
        return self.signing.trust

    # ------------------------------------------------------------------ the audit's reads

    def source(self, *, stages: tuple[str, ...] | None = None) -> StoreSource:
        """The family's signed evidence in the store (``lineage.signing.sources.StoreSource``)."""
        return StoreSource(self.tracking, self.family, self.trust, stages=stages)

    def log(self) -> FamilyLog:
        """The family's signed log read back and checked (``lineage.log.family_log.read``)."""
        return family_log.read(self.source())

    def alias_history(self) -> tuple[list[Attestation], list[str]]:
        """The signed alias moves and their problems (``store_alias_history``)."""
        return registered_model.store_alias_history(self.tracking, self.family, self.trust)

    def production_history(self) -> list[str]:
        return registered_model.production_history(self.tracking, self.family, self.trust)

    # ----------------------------------------------------------------------------- the log

    def append(self, run_id: str, kind: str, predicate: Mapping[str, Any],
               **kwargs: Any) -> Attestation:
        """Sign ``predicate`` into the family's log on ``run_id`` (``log_writer.append``)."""
        return log_writer.append(self.tracking, run_id, kind, predicate, self.signing,
                                 family=self.family, **kwargs)

    def require_intact(self) -> FamilyLog:
        return log_writer.require_intact(self.tracking, self.family, self.signing)

    # ------------------------------------------------------------------------- the records

    def preregister(self, thresholds_bytes: bytes, thresholds_file: str,
                    **kwargs: Any) -> Registration:
        """Freeze and sign thresholds bytes (``registration.preregister_bytes``)."""
        return registration.preregister_bytes(thresholds_bytes, thresholds_file,
                                              tracking=self.tracking, family=self.family,
                                              signing=self.signing, **kwargs)

    def log_decision(self, decision: Any, **kwargs: Any) -> str:
        return records.log_decision(self.tracking, self.family, decision,
                                    signing=self.signing, **kwargs)

    def log_approval(self, approval: records.ApprovalRecord, **kwargs: Any) -> str:
        return records.log_approval(self.tracking, approval, signing=self.signing, **kwargs)

    def log_shadow(self, version: str, traffic: Any, result: Any, **kwargs: Any) -> str:
        return records.log_shadow(self.tracking, self.family, version, traffic, result,
                                  signing=self.signing, **kwargs)

    def log_canary_step(self, result: Any, **kwargs: Any) -> str:
        return records.log_canary_step(self.tracking, self.family, result,
                                       signing=self.signing, **kwargs)

    # ---------------------------------------------------- the registered model and aliases

    def aliases(self) -> dict[str, str]:
        return registered_model.aliases(self.tracking, self.family)

    def alias_version(self, alias: Alias) -> str | None:
        return registered_model.alias_version(self.tracking, self.family, alias)

    def production_version(self) -> str | None:
        """The version behind ``production``, or None."""
        return self.alias_version("production")

    def version_exists(self, version: str) -> bool:
        return registered_model.version_exists(self.tracking, self.family, version)

    def version_tags(self, version: str) -> dict[str, str]:
        return registered_model.version_tags(self.tracking, self.family, version)

    def approvers(self, version: str) -> dict[str, str]:
        return registered_model.approvers(self.tracking, self.family, version)

    def link_gate(self, version: str, **kwargs: Any) -> None:
        registered_model.link_gate(self.tracking, self.family, version, **kwargs)

    def link_confirmation(self, version: str, decision_run_id: str) -> None:
        registered_model.link_confirmation(self.tracking, self.family, version, decision_run_id)

    def link_approval(self, version: str, transition: str, approval_run_id: str) -> None:
        registered_model.link_approval(self.tracking, self.family, version, transition,
                                       approval_run_id)

    def link_traffic_run(self, version: str, stage: Literal["shadow", "canary"],
                         run_id: str) -> None:
        registered_model.link_traffic_run(self.tracking, self.family, version, stage, run_id)

    def reconcile(self) -> list[str]:
        return registry.reconcile(self.tracking, self.family, self.signing)

    def assign_shadow(self, version: str, **kwargs: Any) -> AliasChange:
        return registry.assign_shadow(self.tracking, self.family, version,
                                      signing=self.signing, **kwargs)

    def assign_canary(self, version: str, **kwargs: Any) -> AliasChange:
        return registry.assign_canary(self.tracking, self.family, version,
                                      signing=self.signing, **kwargs)

    def promote(self, version: str, **kwargs: Any) -> AliasChange:
        return registry.promote(self.tracking, self.family, version, signing=self.signing,
                                **kwargs)

    def rollback(self, **kwargs: Any) -> AliasChange:
        return registry.rollback(self.tracking, self.family, signing=self.signing, **kwargs)

    def reject(self, version: str, reason: str, **kwargs: Any) -> list[AliasChange]:
        return registry.reject(self.tracking, self.family, version, reason,
                               signing=self.signing, **kwargs)

    def decline(self, version: str, reason: str, **kwargs: Any) -> list[AliasChange]:
        return registry.decline(self.tracking, self.family, version, reason,
                                signing=self.signing, **kwargs)

    def clear_stale_aliases(self, **kwargs: Any) -> list[str]:
        return registry.clear_stale_aliases(self.tracking, self.family, signing=self.signing,
                                            **kwargs)
