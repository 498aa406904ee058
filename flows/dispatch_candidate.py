"""A rollout of a dispatch policy: ``--implementation dispatch --dispatch-policy FILE``.

The policy file is audited before anything is registered (``kernels.dispatch_audit.
load_policy``: a valid policy whose every bucket is what its evidence derives); a bad
file is refused naming the constraint. The rollout's plan names the audited policy by
reference (:class:`PolicyReference`: its file, or the store's production policy ``auto``
resolved to, and its fingerprint), not by value, so the plan stays a small Prefect flow
parameter; inside the flow the policy is read again and served only if it is still the
one the plan names (``flows.plan.plan_policy``). For the rollout's session the
``dispatch`` kernel of that policy is registered in this process (:func:`serving`,
``flows.tasks.rollout_session``), so the plan, the build and its record see one policy. It is not one of the registry's
``BUILTIN`` entries: a built-in entry is loaded by every test and tool that walks the
registry (poisoned padding, precision, the registry's own), and a ``dispatch`` kernel
exists only with a policy. The build compiles it with its config the policy's
fingerprint and logs the policy in the build run before the build is signed
(:func:`build_inputs`, ``lineage.records.dispatch_record.log_policy``); the version's runners
serve the signed policy (``lineage.serving.dispatch_version``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kernels.dispatch_audit import load_policy
from kernels.dispatch_kernel import DispatchKernel
from kernels.dispatch_policy import DispatchPolicy
from kernels.registry import IMPLEMENTATIONS, registered
from lineage.records.dispatch_record import log_policy
from lineage.serving.dispatch_version import DISPATCH
from lineage.store.tracking import Tracking


class PolicyReference(BaseModel):
    """A dispatch policy as a rollout's plan names it: where it is read from and the
    fingerprint it had when the plan was resolved (a few hundred bytes, where the policy
    with its evidence is about 0.5 MB on a GPU).

    Attributes:
        fingerprint: the policy's fingerprint (``DispatchPolicy.fingerprint``, sha256).
        path: the policy file (``--dispatch-policy``, or the file the environment's
            ``KERNELGATE_DISPATCH_POLICY`` names for ``auto``), absolute; None: the
            store's production dispatch policy ``auto`` resolved to.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")
    path: str | None = None

    @classmethod
    def to(cls, policy: DispatchPolicy | None, path: Path | str | None
           ) -> PolicyReference | None:
        """The reference to ``policy`` read from ``path`` (None: the store's); None for
        no policy."""
        if policy is None:
            return None
        return cls(fingerprint=policy.fingerprint(),
                   path=None if path is None else str(Path(path).resolve()))


def audited_policy(implementation: str, path: Path | None, backend: str
                   ) -> DispatchPolicy | None:
    """The audited policy of a rollout of ``implementation`` on ``backend`` (``None`` for
    any other kernel than ``dispatch``).

    Raises:
        ValueError: ``dispatch`` without a policy file, a policy file for another
            kernel, or a file the audit refuses (``kernels.dispatch_audit.PolicyError``:
            missing, invalid, or a bucket its evidence does not derive, named); a
            policy measured on another backend than ``backend`` (its choices say
            nothing here: ``auto`` never serves one either).
    """
    if implementation != DISPATCH:
        if path is not None:
            raise ValueError(f"--dispatch-policy is for --implementation dispatch, not "
                             f"{implementation!r}")
        return None
    if path is None:
        raise ValueError("--implementation dispatch serves a dispatch policy: pass "
                         "--dispatch-policy POLICY.json (kernels.tools.dispatch_evidence or "
                         "dispatch_merge write one)")
    policy = load_policy(path)
    if policy.backend != backend:
        raise ValueError(f"{path}: a dispatch policy measured on {policy.backend} "
                         f"({policy.device}); this host's backend is {backend}, where its "
                         "choices were never measured: measure one here (python -m "
                         "kernels.tools.dispatch_evidence) or roll it out on a "
                         f"{policy.backend} host")
    return policy


@contextlib.contextmanager
def serving(policy: DispatchPolicy | None) -> Iterator[None]:
    """The ``dispatch`` kernel of ``policy`` registered for the block (replacing any, and
    restored after); nothing for ``None``."""
    if policy is None:
        yield
        return
    with registered(DispatchKernel(policy), replace=True):
        yield


def build_inputs(implementation: str, config: dict | None, tracking: Tracking
                 ) -> tuple[dict | None, Callable[[str], object] | None]:
    """``(config, before_signing)`` of a build of ``implementation``: for ``dispatch``
    the registered policy's fingerprint as its config and the call logging the policy in
    the build run (before the build is signed); for another kernel ``config`` and None.

    Raises:
        ValueError: block sizes asked of a ``dispatch`` build (it has none).
    """
    if implementation != DISPATCH:
        return config, None
    if config:
        raise ValueError(f"a dispatch build takes no block sizes (asked: {config})")
    policy = IMPLEMENTATIONS[DISPATCH].policy
    return ({"policy_sha256": policy.fingerprint()},
            lambda run_id: log_policy(tracking, run_id, policy))
