"""Nightly re-validation of what ``production`` points at (scheduled in prefect.yaml).

``nightly_revalidation`` re-judges every family of the store that has a production
version, each in a subflow of its own (``revalidate_production``), each under the
registration its version was promoted with: the plan is read from the version's signed
record (``flows.plan.registered_plan``: its implementation, its registration's frozen
thresholds bytes, the bindings it signed — perf shapes and repeats, MiniLM check, test
set), never from the settings or the thresholds file the job holds. A version registered
under a bf16-only contract is re-judged under that contract, not the default float32 one.

On failure — a failed criterion, or a kernel that no longer runs at all — the family is
rolled back to the previous production version, or to the platform's native baseline
when there is none (or the previous one is no longer usable), and the outcome says
which. Catches library drift: a jax/jaxlib upgrade that breaks a kernel that once
passed. A version that cannot be re-judged (its registration unreadable, the bound test
set missing) is an error, never a rollback: nothing about the kernel was found.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed
from pydantic import BaseModel, Field

import kernels
from flows.judge import evaluate, gate
from flows.plan import RolloutPlan, registered_plan
from flows.results import Built, Preregistered, RolloutContext
from flows.settings import RolloutSettings
from flows.tasks import end_state, prepare_testset, rollout_session, run_logger, signing_for
from kernels.errors import KernelgateError
from lineage.aliases import registered_model
from lineage.records import chain, registration
from lineage.serving import version_runners
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr


class RevalidationOutcome(BaseModel):
    """What the nightly run found and did for one family."""

    family: str
    version: str | None
    result: Literal["passed", "rolled_back", "nothing_in_production", "error"]
    reason: str
    loaded: str | None = Field(None, description=(
        "how the version ran: in this process (its code is this checkout's, by digest) or "
        "in its own process from its logged code snapshot; and any JAX drift"))
    now_serving: str
    revalidation_run_id: str | None = Field(
        None, description="the revalidation's MLflow run (None: nothing was judged)")


class NightlyOutcome(BaseModel):
    """Every family's re-validation of one nightly run, and the families that could not
    be re-judged (family -> why)."""

    outcomes: list[RevalidationOutcome]
    errors: dict[str, str] = Field(default_factory=dict)

    @property
    def result(self) -> str:
        """``error`` when any family could not be re-judged, else ``rolled_back`` when
        any was rolled back, else ``passed`` (``nothing_in_production``: no family has
        a production version)."""
        results = {o.result for o in self.outcomes}
        if self.errors or "error" in results:
            return "error"
        if "rolled_back" in results:
            return "rolled_back"
        return "passed" if results else "nothing_in_production"

    def summary(self) -> str:
        """One line per family."""
        lines = [f"{o.family}: {o.result} ({o.reason})" for o in self.outcomes]
        lines += [f"{family}: error ({why})" for family, why in self.errors.items()]
        return "\n".join(lines) or "no family has a production version"


class NotJudgeable(KernelgateError, RuntimeError):
    """A production version whose signed record does not say how to re-judge it."""


@flow(name="kernelgate-nightly-revalidation")
def nightly_revalidation(settings: RolloutSettings | None = None,
                         families: list[str] | None = None) -> NightlyOutcome:
    """Re-judge every family of the store that has a production version (``families``:
    only those of them), each under its own registration (a subflow per family). Ends
    *Failed* when any family could not be re-judged (its reason named; the others are
    still re-judged), else in a state named for the result (*RolledBack* when any family
    was rolled back, else *Passed*)."""
    settings = settings or RolloutSettings()
    tracking = tr.tracking_for(settings.store_dir)
    nightly = NightlyOutcome(outcomes=[])
    in_production = registered_model.families_in_production(tracking)
    for family in in_production if families is None else [f for f in in_production
                                                          if f in families]:
        state = revalidate_production(family, settings, return_state=True)
        if state.is_completed():
            nightly.outcomes.append(state.result())
        else:
            nightly.errors[family] = state.message or state.type.value
    run_logger().info("nightly re-validation: %s\n%s", nightly.result, nightly.summary())
    if nightly.result == "error":
        return Failed(message=nightly.summary()[:500], data=nightly)
    return end_state(nightly.result, nightly.summary(), nightly)


@flow(name="kernelgate-revalidate-production")
def revalidate_production(family: str, settings: RolloutSettings | None = None
                          ) -> RevalidationOutcome:
    """Re-evaluate ``production`` of ``family`` under the registration it was promoted
    with (the settings give only the store, the keys and where the test set lies); roll
    back on failure.

    Raises:
        NotJudgeable: the version's signed record names no readable registration or
            build (nothing is opened or written).
        lineage.records.bindings.BindingsRefused: the bound test set is not on disk (signed as an
            error outcome; production untouched).
    """
    settings = settings or RolloutSettings()
    tracking = tr.tracking_for(settings.store_dir)
    version = version_runners.production_version(tracking, family)
    if version is None:
        outcome = RevalidationOutcome(
            family=family, version=None, result="nothing_in_production",
            reason="no production alias; the native baseline serves",
            now_serving=f"{version_runners.NATIVE_BASELINE} (native baseline)")
        return end_state(outcome.result, outcome.reason, outcome)
    plan = plan_of(tracking, family, version, signing_for(settings).trust)
    with rollout_session(settings, plan, stage="revalidation",
                         clear_stale_aliases=False) as ctx:
        try:
            outcome = _revalidate(ctx)
        except Exception as err:
            _finish(ctx, version, "error",
                    f"re-validation could not finish: {type(err).__name__}: {err}")
            raise
    return end_state(outcome.result, outcome.reason, outcome)


def plan_of(tracking: tr.Tracking, family: str, version: str, trust) -> RolloutPlan:
    """The plan that re-judges ``version``: read from its signed build and registration.

    Raises:
        NotJudgeable: no signed build or no readable registration for ``version``.
    """
    evidence = chain.collect(StoreSource(tracking, family, trust), version)
    if evidence.registration is None or evidence.build is None:
        raise NotJudgeable(f"v{version} of {family} has no usable registration to re-judge it "
                           f"by: {'; '.join(evidence.read_problems) or 'none signed'}")
    try:
        frozen = registration.frozen_registration(
            StoreSource(tracking, family, trust, stages=("preregistration",)),
            evidence.registration.registration_id)
    except registration.PreregistrationError as err:
        raise NotJudgeable(f"v{version} of {family}: {err}") from err
    return registered_plan(family, version, build_run_id=evidence.build_run_id,
                           implementation=evidence.build.predicate["implementation"],
                           registration=frozen.registration,
                           thresholds_bytes=frozen.thresholds_bytes, bindings=frozen.bindings,
                           backend=kernels.default_backend())


def _finish(ctx: RolloutContext, version: str | None, result: str, reason: str,
            loaded: str | None = None) -> RevalidationOutcome:
    record = ctx.record
    ctx.serving.close()
    now = ctx.store.production_version()
    serving = (f"{record.family} v{now}" if now
               else f"{version_runners.NATIVE_BASELINE} (native baseline)")
    outcome = RevalidationOutcome(family=record.family, version=version, result=result,
                                  reason=reason, loaded=loaded, now_serving=serving,
                                  revalidation_run_id=record.rollout_run_id)
    tr.log_model_json(record.tracking, record.rollout_run_id, outcome, tags.REVALIDATION_ARTIFACT)
    run_tags = {tags.RESULT: result, tags.NOTE: reason}
    tr.set_tags(record.tracking, record.rollout_run_id, run_tags)
    ctx.store.append(record.rollout_run_id, "outcome",
                     {"family": record.family, "version": version, "result": result,
                      "reason": reason, "tags": run_tags})
    tr.end_run(record.tracking, record.rollout_run_id, "FAILED" if result == "error" else "FINISHED")
    try:
        create_markdown_artifact(
            f"# nightly re-validation of {record.family}: **{result}**\n\n* version: "
            f"v{version}\n* reason: {reason}\n* now serving: {serving}\n",
            key=f"revalidation-{record.family.replace('_', '-').lower()}")
    except Exception as err:  # noqa: BLE001 - the MLflow record above is the record
        run_logger().warning("could not write the Prefect summary artifact: %s", err)
    run_logger().info("revalidation %s: %s (%s); now serving %s", record.family, result,
                      reason, serving)
    return outcome


def _revalidate(ctx: RolloutContext) -> RevalidationOutcome:
    record, plan = ctx.record, ctx.plan
    version = plan.version
    now = ctx.store.production_version()
    if now != version:
        raise NotJudgeable(f"production of {record.family} moved from v{version} to v{now} "
                           "while this re-validation waited for the family; the next run "
                           "judges what serves then")
    # What the version's rollout established, read back from its signed record.
    preregistered = Preregistered(registration=plan.registration, thresholds=plan.thresholds,
                                  bindings=plan.bindings)
    built = Built(build_run_id=plan.build_run_id, version=version)
    testset = prepare_testset(ctx)  # the bound test set, or refused (an error, not a verdict)
    loaded = None
    try:
        runner = ctx.versions.runner(version)
        loaded = _how_loaded(runner)
        evaluated = evaluate(ctx, preregistered, built, testset, split="heldout",
                             compare_production=False)
        gated = gate(ctx, preregistered, built, evaluated)
        passed, why = gated.passed, gated.decision.summary
    except Exception as err:  # noqa: BLE001 - a kernel that no longer runs fails re-validation
        passed, why = False, f"evaluation failed: {type(err).__name__}: {err}"
    if passed:
        return _finish(ctx, version, "passed",
                       f"v{version} still meets its preregistered thresholds "
                       f"({plan.registration.profile}, registration "
                       f"{plan.registration.registration_id})", loaded)
    change = ctx.store.rollback(reason=f"nightly re-validation failed: {why}",
                                parent_run_id=record.rollout_run_id)
    target = (f"previous production v{change.version}" if change.version else
              f"the native baseline ({version_runners.NATIVE_BASELINE}); no earlier usable production")
    return _finish(ctx, version, "rolled_back",
                   f"v{version} failed re-validation ({why}); rolled back to {target}", loaded)


def _how_loaded(runner) -> str:
    if isinstance(runner, version_runners.VersionWorker):
        drift = runner.info.get("jax_drift")
        return (f"in its own process from its logged code (sha256 {runner.info['code_sha256'][:12]})"
                + (f"; {drift}" if drift else ""))
    return "in this process: its logged code is this checkout's code (same sha256)"
