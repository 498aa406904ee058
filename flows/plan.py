"""One plan per session: which kernel, which thresholds, which family — resolved once.

A rollout's plan is resolved when its session opens (or by the CLI, which passes it to
the flow): the kernel (name and the sentence saying why), the thresholds file's exact
bytes parsed once, the serving contract they declare, the family and the test-set
profile. Preregistration freezes exactly those bytes; every stage after it reads the
registered copy and the bindings the registration signed (``flows.results.Preregistered``),
never the file in hand again.

A re-validation's plan is read from the signed record of the version it judges
(:func:`registered_plan`): that version's implementation, its registration's frozen
bytes and bound test-set profile. The settings the nightly job holds (its thresholds
file, perf shapes, test-set profile) change nothing about the verdict.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flows.dispatch_candidate import PolicyReference, audited_policy, serving
from flows.kernel_choice import AutoPolicy, auto_policy, rollout_kernel
from flows.settings import RolloutSettings
from gates.preregistration import PreregistrationError
from gates.serving_contract import ServingContract
from gates.thresholds import Thresholds, parse_thresholds
from kernels.dispatch_audit import PolicyError, load_policy
from kernels.dispatch_policy import DispatchPolicy
from kernels.errors import KernelgateError
from lineage.records.bindings import RolloutBindings
from lineage.records.registration import Registration
from lineage.signing import keys
from lineage.store import tracking as tr


class NothingToRollOut(KernelgateError, ValueError):
    """``auto`` resolved to the store's production dispatch policy in the very family whose
    production it is: the candidate would be production itself, built again as a new
    version. Raised by :func:`something_to_roll_out` before anything is written; the CLI
    refuses it (exit 2), a scheduled rollout ends *NothingToRollOut* (``flows.rollout``)."""


class RolloutPlan(BaseModel):
    """What one session works on, fixed before it opens its record.

    Attributes:
        family: the kernel family (MLflow experiment and registered model).
        implementation: the kernel's registry name (``auto``/``native`` resolved).
        why: one sentence: why this kernel (printed by the CLI, logged by the flow).
        thresholds_file: the thresholds file's name (registered as ``thresholds/<name>``).
        thresholds_text: the file's exact content (UTF-8), the bytes preregistration
            freezes and hashes.
        thresholds: ``thresholds_text`` parsed (once).
        testset_profile: the test-set profile the session evaluates on (``ci``, ``gpu``,
            ``minimal``).
        registration: for a plan read from the record (re-validation), the registration
            it was read from; None for a rollout's plan (its registration comes later).
        bindings: with ``registration``, the bindings it signed (None: a registration
            made before bindings existed).
        version: with ``registration``, the version the plan judges.
        build_run_id: with ``registration``, that version's signed build run.
        dispatch_policy: the audited dispatch policy a ``dispatch`` plan serves (the
            ``--dispatch-policy`` file's, or the one ``auto`` resolved to), by reference:
            the plan is a Prefect flow parameter, and :func:`plan_policy` reads the policy
            again inside the flow; None for any other kernel, and for a re-validation
            (its version serves its signed policy).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str
    implementation: str
    why: str
    thresholds_file: str
    thresholds_text: str = Field(repr=False)
    thresholds: Thresholds = Field(repr=False)
    testset_profile: Literal["ci", "gpu", "minimal"]
    registration: Registration | None = None
    bindings: RolloutBindings | None = None
    version: str | None = None
    build_run_id: str | None = None
    dispatch_policy: PolicyReference | None = None

    @property
    def thresholds_bytes(self) -> bytes:
        """The thresholds file's exact bytes."""
        return self.thresholds_text.encode()

    @property
    def thresholds_sha256(self) -> str:
        """sha256 of :attr:`thresholds_bytes` (what a registration names)."""
        return hashlib.sha256(self.thresholds_bytes).hexdigest()

    @property
    def serving(self) -> ServingContract:
        """The serving contract the thresholds declare."""
        return self.thresholds.serving


def _text(data: bytes, source: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise ValueError(f"{source}: a thresholds file is UTF-8 text ({err})") from None


def store_auto_policy(settings: RolloutSettings, backend: str) -> AutoPolicy:
    """What ``auto`` serves on ``backend`` from the store of ``settings``
    (``flows.kernel_choice.auto_policy``: the tracking server, else the embedded store in
    ``store_dir``, never created by this read), under the trust of its key folder.

    Raises:
        kernels.dispatch_audit.PolicyError: as ``auto_policy`` (the environment's policy).
    """
    exists = os.environ.get("MLFLOW_TRACKING_URI") or (
        Path(settings.store_dir) / "mlflow.db").exists()
    tracking = tr.tracking_for(settings.store_dir) if exists else None
    return auto_policy(tracking, keys.folder_trust(settings.key_dir or keys.default_key_dir()),
                       backend)


def resolve_plan(settings: RolloutSettings, backend: str,
                 auto: AutoPolicy | None = None) -> RolloutPlan:
    """The plan of a rollout of ``settings`` on ``backend`` ("cpu", "gpu", "tpu"): the
    thresholds file read and parsed once, the kernel resolved against its serving
    contract; for ``auto``, the policy ``auto`` serves (``auto``, else
    :func:`store_auto_policy`), for ``dispatch`` the ``--dispatch-policy`` file audited.

    Raises:
        FileNotFoundError: the thresholds file does not exist.
        ValueError: the thresholds file is not a valid thresholds file (names the file and
            the constraint), the implementation is unknown, or a dispatch policy is
            refused (``flows.dispatch_candidate.audited_policy``, ``store_auto_policy``).
    """
    path = Path(settings.thresholds)
    data = path.read_bytes()
    text = _text(data, str(path))
    thresholds = parse_thresholds(data, source=str(path))
    if settings.implementation == "auto":
        auto = auto or store_auto_policy(settings, backend)
        policy, policy_file = auto.policy, auto.path
    else:
        policy = audited_policy(settings.implementation, settings.dispatch_policy, backend)
        policy_file = settings.dispatch_policy
    with serving(policy):  # a dispatch kernel is named only while registered
        name, why = rollout_kernel(settings.implementation, backend, thresholds.serving, auto)
    return RolloutPlan(family=settings.family or name, implementation=name, why=why,
                       thresholds_file=path.name, thresholds_text=text,
                       thresholds=thresholds,
                       testset_profile=settings.testset_profile_for(backend),
                       dispatch_policy=PolicyReference.to(policy, policy_file))


def something_to_roll_out(implementation: str, plan: RolloutPlan) -> None:
    """Refuse a rollout of ``implementation`` ``auto`` whose ``plan`` serves the store's
    production dispatch policy (no file: read from the store) in the family whose
    production that policy is. Naming a kernel (``--implementation dispatch
    --dispatch-policy FILE`` for this policy again, on purpose) or another family is not
    refused.

    Raises:
        NothingToRollOut: the policy is that family's production already (its version and
            sha256 named, and how to roll it out again).
    """
    from lineage.serving.dispatch_version import DISPATCH

    ref = plan.dispatch_policy
    if implementation != "auto" or ref is None or ref.path is not None or plan.family != DISPATCH:
        return
    raise NothingToRollOut(
        f"nothing to roll out: {plan.why}, which is the production of family {plan.family} "
        f"already (sha256 {ref.fingerprint}). To build and roll it out again as a new version, "
        "name it: --implementation dispatch --dispatch-policy POLICY.json; to roll out "
        "another kernel, name it with --implementation")


def plan_policy(plan: RolloutPlan, settings: RolloutSettings, backend: str
                ) -> DispatchPolicy | None:
    """The dispatch policy ``plan`` names (None: none), read again and audited here: its
    file (``kernels.dispatch_audit.load_policy``, pinned to the plan's fingerprint), or
    the store's production policy as ``auto`` resolves it now (:func:`store_auto_policy`),
    served only if it is still the policy the plan was resolved with.

    Raises:
        kernels.dispatch_audit.PolicyError: the file or the store's production policy
            changed since the plan was resolved (both fingerprints named), or no longer
            reads or audits.
    """
    ref = plan.dispatch_policy
    if ref is None:
        return None
    if ref.path is not None:
        try:
            return load_policy(ref.path, ref.fingerprint)
        except PolicyError as err:
            raise PolicyError(f"the dispatch policy this rollout was planned with ({ref.path}, "
                              f"fingerprint {ref.fingerprint}) is not served: {err}") from None
    auto = store_auto_policy(settings, backend)
    found = None if auto.policy is None else auto.policy.fingerprint()
    if found != ref.fingerprint:
        raise PolicyError(f"the store's production dispatch policy was {ref.fingerprint} when "
                          f"this rollout was planned and is now {found or 'none'} ({auto.why}): "
                          "it changed since, so it is not served")
    return auto.policy


def registered_plan(family: str, version: str, *, build_run_id: str, implementation: str,
                    registration: Registration, thresholds_bytes: bytes,
                    bindings: RolloutBindings | None, backend: str) -> RolloutPlan:
    """The plan that re-judges ``version`` of ``family`` (built by ``build_run_id``): its
    signed ``implementation``, its ``registration``'s frozen ``thresholds_bytes`` (read
    back and digest-checked by the caller, ``lineage.records.registration.frozen_registration``)
    and the test-set profile its ``bindings`` name (for a registration without bindings,
    the profile of ``backend``).

    Raises:
        PreregistrationError: the bytes are not the registration's (digest).
    """
    if hashlib.sha256(thresholds_bytes).hexdigest() != registration.thresholds_sha256:
        raise PreregistrationError(
            f"registration {registration.registration_id}: the thresholds read back are not "
            "the registered bytes")
    source = f"registration {registration.registration_id}"
    profile = bindings.testset_profile if bindings else RolloutSettings().testset_profile_for(
        backend)
    return RolloutPlan(
        family=family, implementation=implementation,
        why=f"v{version} of {family} as built ({implementation}), under its registration "
            f"{registration.registration_id} ({registration.profile})",
        thresholds_file=Path(registration.thresholds_artifact).name,
        thresholds_text=_text(thresholds_bytes, source),
        thresholds=parse_thresholds(thresholds_bytes, source=source),
        testset_profile=profile, registration=registration, bindings=bindings,
        version=version, build_run_id=build_run_id)
