"""Which kernel a rollout builds, and why (printed by the CLI, used by the flows).

``--implementation auto`` serves the store's production dispatch policy when there is
one to serve (:func:`auto_policy`): the ``dispatch`` family's production version, its
policy read back only through its signed build record and audited
(``lineage.serving.dispatch_version.version_policy``), measured on this host's backend.
The environment's policy (``KERNELGATE_DISPATCH_POLICY`` and its ``_SHA256``,
``kernels.dispatch_serving``), when set, overrides the store's. Without a policy to
serve, ``auto`` on a GPU builds what the measured selection table
(``kernels/gpu_table.json``, this device kind's entries) found fastest over the shapes
the registration's serving contract covers; elsewhere, and without a table entry inside
the contract, the host's flash kernel (``kernels.native_flash_kernel``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flows.paths import DEFAULT_THRESHOLDS, INTERPRETED_THRESHOLDS
from kernels.dispatch_policy import DispatchPolicy
from kernels.dispatch_serving import POLICY_ENV, configured_policy
from lineage.aliases import registered_model
from lineage.serving.dispatch_version import DISPATCH, version_policy
from lineage.signing.sources import StoreSource

if TYPE_CHECKING:
    from gates.serving_contract import ServingContract
    from lineage.signing.attestations import TrustPolicy
    from lineage.store.tracking import Tracking

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoPolicy:
    """The dispatch policy ``auto`` serves (audited, pinned to its signed fingerprint;
    ``None``: none, ``auto`` is the kernel it was without one), one sentence saying
    which policy, or why none, and the file it was read from (the environment's; None:
    the store's production policy, or none)."""

    policy: DispatchPolicy | None
    why: str
    path: str | None = None


def auto_policy(tracking: Tracking | None, trust: TrustPolicy, backend: str, *,
                family: str = DISPATCH, environ: Mapping[str, str] | None = None
                ) -> AutoPolicy:
    """The dispatch policy ``auto`` serves on ``backend``: the environment's
    (``kernels.dispatch_serving.configured_policy`` of ``environ``, default
    ``os.environ``) when set, else the production version of ``family`` in ``tracking``
    (``None``: no store yet), as its signed alias history names it (an MLflow alias moved
    by hand serves nothing, with a warning), whose signed build record audits under
    ``trust``; either
    only when measured on ``backend``. A production policy failing its audit is never
    served and is logged as a warning naming the version and the finding.

    Raises:
        kernels.dispatch_audit.PolicyError: the environment sets one of its two
            variables without the other, or names a policy that fails its audit.
    """
    configured = configured_policy(environ)
    if configured is not None:
        if configured.backend != backend:
            return AutoPolicy(None, f"the policy {POLICY_ENV} names was measured on "
                                    f"{configured.backend}, not {backend}")
        return AutoPolicy(configured, (
            f"auto -> dispatch (the policy {POLICY_ENV} names, sha256 "
            f"{configured.fingerprint()[:12]}…; the environment overrides the store's "
            "production dispatch policy)"),
            path=(os.environ if environ is None else environ)[POLICY_ENV].strip())
    if tracking is None:
        return AutoPolicy(None, "there is no store yet, so no policy is in production")
    version = registered_model.alias_version(tracking, family, "production")
    if version is None:
        return AutoPolicy(None, f"no policy is in production (family {family}); one is "
                                "rolled out with `--implementation dispatch`")
    source = StoreSource(tracking, family, trust)
    # the MLflow alias is not signed: serve only what the signed alias history says
    moves, history_problems = registered_model.alias_history(source)
    signed = registered_model.signed_aliases(moves).get("production")
    if history_problems or signed != version:
        finding = (f"the store's {family} production alias names v{version}, its signed alias "
                   f"history {f'v{signed}' if signed else 'no version'}"
                   + "".join(f"; {p}" for p in history_problems) + ": no policy is served")
        logger.warning("%s", finding)
        return AutoPolicy(None, f"WARNING: {finding}")
    audited = version_policy(source, version)
    if audited is None:
        return AutoPolicy(None, f"{family} v{version} in production has no signed "
                                "dispatch build")
    audit, policy = audited
    if audit.problems or policy is None:
        finding = (f"{family} v{version}, the store's production dispatch policy, fails "
                   f"its audit and is not served: {'; '.join(audit.problems)}")
        logger.warning("%s", finding)
        return AutoPolicy(None, f"WARNING: {finding}")
    if policy.backend != backend:
        return AutoPolicy(None, f"the store's production dispatch policy ({family} "
                                f"v{version}) was measured on {policy.backend}, not {backend}")
    return AutoPolicy(policy, f"auto -> dispatch v{version} (the store's production dispatch "
                              f"policy, sha256 {audit.policy_sha256[:12]}…)")


def rollout_kernel(implementation: str, backend: str, contract: ServingContract | None,
                   auto: AutoPolicy | None = None) -> tuple[str, str]:
    """``(registry name, one sentence why)`` for a rollout of ``implementation`` on
    ``backend`` under the serving ``contract`` of its thresholds (``None``: auto without a
    contract takes the host's flash kernel). ``auto`` with a policy to serve
    (:func:`auto_policy`) resolves to ``dispatch``; without one, to the kernel below, the
    sentence saying why no policy.

    Raises:
        ValueError: unknown implementation, or an unreadable selection table.
    """
    if implementation != "auto" or auto is None:
        return _without_policy(implementation, backend, contract)
    if auto.policy is not None:
        return DISPATCH, auto.why
    name, why = _without_policy(implementation, backend, contract)
    return name, f"{why} (no dispatch policy served: {auto.why})"


def _without_policy(implementation: str, backend: str, contract: ServingContract | None
                    ) -> tuple[str, str]:
    import kernels
    from kernels import selection

    name = kernels.native_flash_kernel(implementation, backend)
    why = kernels.why_picked(implementation, backend)
    if implementation != "auto" or backend != "gpu" or contract is None:
        return name, why

    def runs_all_of_it(name: str) -> bool:
        # only a kernel that can run every dtype and head_dim the contract serves: one
        # that refuses part of it is rejected by the gate's coverage criterion (the H200
        # rollout of 2026-12-01 picked cuDNN for a float32 contract: 16 cases refused)
        capability = kernels.IMPLEMENTATIONS[name].capability
        widest = contract.max_head_dim or 256
        if capability.head_dim_multiple > 1 and widest > contract.min_head_dim:
            return False  # a range of head_dims holds ones that are not multiples
        return all(capability.allows(dtype, head_dim) for dtype in contract.dtypes
                   for head_dim in {contract.min_head_dim, widest})

    pick = selection.fastest_over(
        lambda dtype, head_dim, seq: contract.serves(dtype, head_dim, seq, seq),
        eligible=lambda name: name in kernels.IMPLEMENTATIONS and runs_all_of_it(name))
    if pick is None:
        return name, f"{why}; the selection table has no entry inside the serving contract"
    return pick[0], f"auto -> {pick[0]}: {pick[1]}"


def default_thresholds(implementation: str, backend: str, auto: AutoPolicy | None = None
                       ) -> tuple[Path, str]:
    """``(thresholds file, one sentence why)`` for a rollout given no ``--thresholds``
    (``auto``: as :func:`rollout_kernel`; a ``dispatch`` kernel it resolves to is the
    registered one):
    ``thresholds/local-interpreted.yaml`` when the kernel ``implementation`` resolves to
    runs interpreted on ``backend`` (not among its native platforms), else
    ``thresholds/local-dry-run.yaml``. Both profiles have the same criteria and serving
    contract; the interpreted one judges at smaller sizes (its file says which and why).

    Raises:
        ValueError: unknown implementation.
    """
    import kernels
    from gates.thresholds import load_thresholds

    name, _ = rollout_kernel(implementation, backend,
                             load_thresholds(DEFAULT_THRESHOLDS).serving, auto)
    if kernels.IMPLEMENTATIONS[name].is_native(backend):
        return DEFAULT_THRESHOLDS, (
            f"{name} is native on {backend}: the local-dry-run profile "
            "(thresholds/local-dry-run.yaml)")
    return INTERPRETED_THRESHOLDS, (
        f"{name} runs interpreted on {backend}: the local-interpreted profile "
        "(thresholds/local-interpreted.yaml: local-dry-run's "
        "criteria; MiniLM check on 4 documents, canary of 16 candidate requests, whose latency "
        "is not assessed; the accuracy cases in TPU interpret mode, the MiniLM check, shadow "
        "and canary under the generic interpret lowering); pass --thresholds "
        "thresholds/local-dry-run.yaml for its sizes")
