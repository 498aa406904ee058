"""What the stages of a rollout hand each other: one immutable context for the session,
and one frozen result type per stage, returned by the stage's task and passed by the
flow into the parameters of the stages that need it (Prefect's way: task return values;
a result passed on also shows as the later task run's input in the Prefect UI).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from evaluation.model import MiniLM
from evaluation.report import EvaluationReport
from flows.plan import RolloutPlan
from flows.settings import RolloutSettings
from gates.decision import GateDecision
from gates.preregistration import Registration
from gates.serving_contract import ServingContract
from gates.thresholds import Thresholds
from kernels.shapes import AttentionShape
from lineage.family_store import FamilyStore
from lineage.records.bindings import RolloutBindings
from lineage.records.registration import FrozenRegistration
from lineage.rollout.rollout import RolloutRecord
from lineage.serving.version_runners import VersionPool


class ServingModel:
    """The serving model, loaded on first use (a rollout stopped at preregistration
    never loads it), and the pool of versions that run with it. Closed by the session.
    Its attention dtype is the plan's serving contract's ``model_dtype``: the bytes a
    rollout registers, or the registration a re-validation re-judges by. (The Pallas
    interpreter of each stage comes from the registered thresholds:
    ``flows.judge.registered_interpreters``, ``flows.traffic``.)"""

    def __init__(self, record: RolloutRecord, contract: ServingContract):
        self._record = record
        self.contract = contract
        self._model: MiniLM | None = None
        self._pool: VersionPool | None = None

    @property
    def model(self) -> MiniLM:
        """MiniLM, its attention in the serving contract's ``model_dtype``."""
        if self._model is None:
            self._model = MiniLM.load().with_attention_dtype(self.contract.model_dtype)
            record = self._record
            self._pool = VersionPool(record.tracking, record.family, self._model,
                                     record.signing.trust)
        return self._model

    @property
    def versions(self) -> VersionPool:
        """The versions' runners (each version by its own logged code)."""
        self.model  # noqa: B018 - loads the model and opens the pool
        return self._pool

    def close(self) -> None:
        """Stop the versions' worker processes (the model stays loaded)."""
        if self._pool is not None:
            self._pool.close()


@dataclass(frozen=True)
class RolloutContext:
    """What is true for the whole session before any stage runs, and never changes: the
    settings, the plan (kernel, thresholds bytes, family: ``flows.plan``), the record
    (store, family, parent run, signer), and the serving model with its pool of versions
    (loaded once, on first use; a resource, not a finding).

    One object because every stage needs the same few of these, and they are set once
    when the session opens. Nothing a stage establishes goes here: that is returned as
    the stage's result. Stage tasks receive it ``quote``-d (``flows.tasks.stage_task``),
    so Prefect neither walks nor copies it as a task input (it holds a signer, a
    tracking client and, once loaded, the model's weights)."""

    settings: RolloutSettings
    plan: RolloutPlan
    record: RolloutRecord
    serving: ServingModel = field(repr=False)

    @property
    def store(self) -> FamilyStore:
        """The record's family in its store, signed by its signer."""
        return FamilyStore.of(self.record)

    @property
    def model(self) -> MiniLM:
        return self.serving.model

    @property
    def versions(self) -> VersionPool:
        return self.serving.versions


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class Preregistered(_Result):
    """``preregister``: the thresholds frozen, signed, before anything is evaluated, as
    every later stage reads them: the registered bytes parsed, and the bindings (perf
    shapes and repeats, shadow size, model check, test set) the registration signed."""

    registration: Registration
    thresholds: Thresholds = Field(description="the registered thresholds (frozen bytes)")
    bindings: RolloutBindings | None = Field(
        description="the settings the registration bound (None: a registration made "
        "before bindings existed; the session's settings then stand in)")

    @classmethod
    def read_back(cls, frozen: FrozenRegistration) -> Preregistered:
        """The stage result of a registration read back from its signed record."""
        return cls(registration=frozen.registration, thresholds=frozen.thresholds,
                   bindings=frozen.bindings)

    def perf_shapes(self, settings: RolloutSettings) -> list[AttentionShape] | None:
        """The benchmark shapes the registration bound (``None``: the platform's)."""
        if self.bindings is None:
            return settings.perf_shapes
        return self.bindings.attention_shapes()

    def perf_repeats(self, settings: RolloutSettings) -> int | None:
        """The timed repeats the registration bound (``None``: the evaluator's default)."""
        return settings.perf_repeats if self.bindings is None else self.bindings.perf_repeats

    def model_check(self, settings: RolloutSettings) -> bool:
        """Whether the MiniLM check runs: the registration bound it and its serving
        contract serves MiniLM (``serving.model_check``)."""
        bound = settings.model_check if self.bindings is None else self.bindings.model_check
        return bound and self.thresholds.serving.model_check

    def shadow_requests(self, settings: RolloutSettings) -> int:
        """The shadow traffic size the registration bound."""
        return (settings.shadow_requests if self.bindings is None
                else self.bindings.shadow_requests)


class Built(_Result):
    """``build``: the candidate compiled, exported, logged and registered."""

    build_run_id: str
    version: str = Field(description="the registered model version")


class Prepared(_Result):
    """``prepare_testset``: the test set on disk (built when it was missing)."""

    testset_dir: Path


class Evaluated(_Result):
    """``evaluate``: one split's report and the run its evidence is logged to."""

    report: EvaluationReport
    run_id: str
    split: str
    judged_against: str | None = Field(
        None, description="the production version the candidate was evaluated against (the "
        "promotion's compare-and-swap refuses if production moved since)")


class Gated(_Result):
    """``gate``: the decision on the held-out report, under the registered thresholds."""

    version: str = Field(description="the version judged")
    decision: GateDecision
    run_id: str = Field(description="the decision run (every later stage links to it)")
    thresholds: Thresholds = Field(description="the registered thresholds judged by (their "
                                   "canary plan and approval policy drive the later stages)")

    @property
    def passed(self) -> bool:
        return self.decision.passed


class Confirmed(_Result):
    """``confirm``: the accuracy-only decision on an unspent confirmation split."""

    decision: GateDecision
    run_id: str = Field(description="the confirmation's decision run")
    evaluation: Evaluated

    @property
    def passed(self) -> bool:
        return self.decision.passed


class Promoted(_Result):
    """``promote``: production moved to the candidate."""

    version: str
    previous_version: str | None
