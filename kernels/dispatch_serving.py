"""Which dispatch policy ``auto`` serves, and which kernel of a bucket serves a call.

``auto`` (``kernels.api.resolve``) serves a promoted dispatch policy when one is
configured: the environment variable ``KERNELGATE_DISPATCH_POLICY`` names the policy's
JSON file and ``KERNELGATE_DISPATCH_POLICY_SHA256`` its signed fingerprint
(``DispatchPolicy.fingerprint``); both or neither, since a policy is served only pinned
to the fingerprint that was signed (``lineage.records.dispatch_record`` audits a dispatch build's
signed policy and gives these two values). The file is read and audited once per path and
fingerprint (``kernels.dispatch_audit.load_policy``: every bucket re-derived from its
evidence). With neither set, :func:`configured_policy` is ``None`` and ``auto`` is
exactly what it was: the auto order, on a GPU the measured table's pick first. (A
rollout of ``--implementation auto`` needs neither: it reads the store's production
dispatch policy through its signed record, ``flows.kernel_choice.auto_policy``, and these
variables, when set, override that.)

:func:`route` is the one rule both ``auto`` and ``kernels.dispatch_kernel.DispatchKernel``
follow: the call's bucket, then the first kernel of the bucket's ranking (its choice,
then the rule's next) that is not excluded and whose own support check accepts the call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernels.contract import AttentionSpec
from kernels.dispatch_audit import PolicyError, load_policy
from kernels.dispatch_policy import DispatchPolicy
from kernels.registry import IMPLEMENTATIONS

POLICY_ENV = "KERNELGATE_DISPATCH_POLICY"
"""The environment variable naming the dispatch policy file ``auto`` serves."""
SHA256_ENV = "KERNELGATE_DISPATCH_POLICY_SHA256"
"""The environment variable holding that policy's signed fingerprint (64 hex digits)."""


@functools.lru_cache(maxsize=8)
def _audited(path: str, sha256: str) -> DispatchPolicy:
    return load_policy(path, sha256)


def configured_policy(environ: Mapping[str, str] | None = None) -> DispatchPolicy | None:
    """The policy ``auto`` serves (audited, pinned to its fingerprint), or ``None`` when
    ``environ`` (default ``os.environ``) configures none.

    Raises:
        kernels.dispatch_audit.PolicyError: one of the two variables set without the
            other; the file missing, invalid, of another fingerprint, or not what its
            evidence derives.
    """
    env = os.environ if environ is None else environ
    path, sha256 = env.get(POLICY_ENV, "").strip(), env.get(SHA256_ENV, "").strip()
    if not path and not sha256:
        return None
    if not (path and sha256):
        raise PolicyError(f"{POLICY_ENV} and {SHA256_ENV} are set together or not at all "
                          f"(got {POLICY_ENV}={path!r}, {SHA256_ENV}={sha256!r}): a dispatch "
                          "policy is served only pinned to its signed fingerprint")
    return _audited(str(Path(path).resolve()), sha256)


@dataclass(frozen=True)
class Route:
    """Where a call goes under a policy: ``kernel`` (``None``: nowhere, ``why`` says
    why), its bucket's name (``None``: outside the policy's space) and the kernels of the
    ranking passed over, each with its reason."""

    kernel: str | None
    bucket: str | None
    why: str
    skipped: dict[str, str] = field(default_factory=dict)


def route(policy: DispatchPolicy, spec: AttentionSpec, backend: str, config=None,
          exclude: Mapping[str, str] | None = None) -> Route:
    """The kernel of ``policy`` serving ``spec`` on ``backend``: the first of its bucket's
    ranking not in ``exclude`` (name -> why) whose ``check_supported(spec, backend,
    config)`` accepts it (a ``NotImplementedError``, ``ValueError`` or ``ImportError``
    passes it over, as ``auto`` does)."""
    head = f"dispatch policy {policy.fingerprint()[:16]}"
    try:
        choice = policy.choice_for(spec.shape)
    except NotImplementedError as err:
        return Route(None, None, f"{head}: {err}")
    bucket = choice.bucket.name
    if choice.kernel is None:
        return Route(None, bucket, f"{head}: bucket {bucket!r} has no kernel: {choice.why}")
    skipped: dict[str, str] = {}
    for name in choice.ranking:
        if exclude and name in exclude:
            skipped[name] = exclude[name]
            continue
        try:
            IMPLEMENTATIONS[name].check_supported(spec, backend, config)
        except (NotImplementedError, ValueError, ImportError, KeyError) as err:
            skipped[name] = str(err)
            continue
        place = "its choice" if name == choice.kernel else f"next after {list(skipped)}"
        return Route(name, bucket, f"{head}: bucket {bucket!r} -> {name} ({place})", skipped)
    refusals = "; ".join(f"{n}: {why}" for n, why in skipped.items())
    return Route(None, bucket, f"{head}: bucket {bucket!r}: every kernel of its ranking "
                               f"refuses the call: {refusals}", skipped)
