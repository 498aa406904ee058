"""``DispatchKernel``: a kernel that serves each call by the kernel a dispatch policy chose
for the call's bucket (``kernels.dispatch_policy``), behind the same contract as any kernel;
a call that kernel refuses (the bucket reaches past its capability: ``fa3`` runs head_dim
128 of the bucket's 65-128) goes to the next kernel of the bucket's recorded ranking that
accepts it.

It runs only where a policy is given explicitly: an instance is made from an audited
policy (:class:`DispatchKernel`, or :meth:`DispatchKernel.from_file` with the policy's
signed fingerprint) and registered by whoever serves it (``kernels.registry.registered``).
It is not in the registry's ``BUILTIN`` and declares no ``auto_priority``: ``auto``
serves a promoted policy only when one is configured (``kernels.dispatch_serving``, the
same routing). A rollout of ``--implementation dispatch`` registers the kernel of its
audited policy file for its session (``flows.dispatch_candidate``); a process serving a
``dispatch`` version registers it from the environment's signed policy
(:func:`register_configured`, pinned to the version's signed fingerprint).

Its config (:class:`DispatchConfig`) is the policy's fingerprint: the config a call
resolves to names the policy, so a build's record changes whenever the policy does, and a
config naming another fingerprint is refused. The bucket's kernel runs through the
registry and ``kernels.api.resolve`` on the current backend (on a GPU, a tuned kernel's
tiling from the measured table), so what runs in a bucket is exactly what naming that
kernel runs.
"""

from __future__ import annotations

from pathlib import Path

import jax
from pydantic import Field

from kernels.api import default_backend, resolve
from kernels.config import KernelConfig
from kernels.contract import AttentionSpec
from kernels.dispatch_audit import PolicyError, audit_policy, load_policy
from kernels.dispatch_policy import DispatchPolicy
from kernels.dispatch_serving import POLICY_ENV, SHA256_ENV, Route, configured_policy, route
from kernels.kernel import Kernel
from kernels.registry import IMPLEMENTATIONS, register


class DispatchConfig(KernelConfig):
    """Which policy a call is served by: its fingerprint (``DispatchPolicy.fingerprint``,
    64 hex digits); unset: the kernel's own policy."""

    policy_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class DispatchKernel(Kernel[DispatchConfig]):
    """Each call served by the first kernel of its bucket's ranking that accepts it (the
    bucket's choice, else the next). A call is refused outside the policy's space, where
    its bucket has no kernel (the policy says why) or where every kernel of the bucket's
    ranking refuses it.
    Exported only for the local platform: a bucket's kernel may query the device or
    choose its lowering when traced (cuDNN, the Pallas kernels).

    Raises (on construction):
        kernels.dispatch_audit.PolicyError: the policy is not the one ``sha256`` names, or
            not what its own evidence derives.
    """

    name = "dispatch"
    description = "per-bucket choice of a measured, fingerprinted dispatch policy"
    native_platforms = ("cpu", "gpu", "tpu")  # per backend: is_native asks its kernels
    float32_matmul_precision = "highest"  # every registered kernel running float32 does
    export_needs_local_device = True
    concurrent_first_call = False  # a bucket may name cuDNN

    def __init__(self, policy: DispatchPolicy, sha256: str | None = None):
        audit_policy(policy, sha256)
        self.policy = policy
        self.fingerprint = policy.fingerprint()

    @classmethod
    def from_file(cls, path: str | Path, sha256: str | None = None) -> DispatchKernel:
        """The kernel serving the policy in the JSON file ``path`` (audited; with
        ``sha256``, only if that is its fingerprint).

        Raises:
            kernels.dispatch_audit.PolicyError: missing, invalid, another fingerprint, or
                not what its evidence derives.
        """
        return cls(load_policy(path, sha256))

    def is_native(self, backend: str) -> bool:
        """Whether every kernel its buckets may serve by compiles natively on ``backend``."""
        return all(IMPLEMENTATIONS[k].is_native(backend) for k in self.policy.kernels())

    def default_config(self, head_dim: int) -> DispatchConfig:
        """Its own policy's fingerprint (any ``head_dim``)."""
        del head_dim
        return DispatchConfig(policy_sha256=self.fingerprint)

    def resolve_config(self, spec: AttentionSpec, config=None) -> DispatchConfig:
        """The config a call runs with: its policy's fingerprint.

        Raises:
            ValueError: a field it does not take, or a fingerprint other than its policy's
                (both named).
        """
        wanted = self.config_from(config)
        if wanted is not None and wanted.policy_sha256 not in (None, self.fingerprint):
            raise ValueError(f"dispatch serves the policy {self.fingerprint}; the config "
                             f"names {wanted.policy_sha256}")
        return self.default_config(spec.head_dim)

    def route(self, spec: AttentionSpec, backend: str) -> Route:
        """Where ``spec`` goes on ``backend``: its bucket and the first kernel of the
        bucket's ranking whose own support check accepts the call
        (``kernels.dispatch_serving.route``).

        Raises:
            NotImplementedError: the call is outside the policy's space, its bucket has
                no kernel (the policy's reasons given), or every kernel of the ranking
                refuses it (each one's reason, with the bucket).
        """
        found = route(self.policy, spec, backend)
        if found.kernel is None:
            raise NotImplementedError(f"dispatch: {found.why}")
        return found

    def check_supported(self, spec: AttentionSpec, backend: str, config=None) -> None:
        """Raise unless some kernel of the bucket's ranking runs ``spec`` on ``backend``.

        Raises:
            NotImplementedError: as :meth:`route`.
            ValueError: an illegal config (:meth:`resolve_config`).
        """
        self.resolve_config(spec, config)
        self.route(spec, backend)

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                 scale: float, q_lengths: jax.Array | None, kv_lengths: jax.Array | None,
                 config: DispatchConfig | None = None) -> jax.Array:
        """The bucket's kernel on validated inputs (shapes and dtypes as
        ``Kernel.__call__``), resolved through ``kernels.api.resolve`` on this backend.

        Raises:
            NotImplementedError: as :meth:`check_supported`.
            ValueError: a config naming another policy.
        """
        spec = AttentionSpec(batch=q.shape[0], q_len=q.shape[1], kv_len=k.shape[1],
                             num_heads=q.shape[2], num_kv_heads=k.shape[2],
                             head_dim=q.shape[3], dtype=q.dtype, causal=causal, scale=scale,
                             has_lengths=q_lengths is not None or kv_lengths is not None)
        self.resolve_config(spec, config)
        backend = default_backend()
        resolution = resolve(self.route(spec, backend).kernel, spec, backend)
        return IMPLEMENTATIONS[resolution.name].kernel()(
            q, k, v, causal=causal, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
            config=resolution.config)


def register_configured(policy_sha256: str | None) -> DispatchKernel:
    """Register (replacing any) the ``dispatch`` kernel of the policy this process is
    configured with (``kernels.dispatch_serving.configured_policy``: the file and signed
    fingerprint in the environment, audited), for a version whose signed config names
    ``policy_sha256``; returns it.

    Raises:
        kernels.dispatch_audit.PolicyError: no policy configured, the configured one is
            not what its evidence derives, or its fingerprint is not ``policy_sha256``.
    """
    policy = configured_policy()
    if policy is None:
        raise PolicyError(f"a dispatch version is served only with its signed policy: "
                          f"{POLICY_ENV} and {SHA256_ENV} are not set "
                          "(lineage.records.dispatch_record.serving_environment gives them)")
    if policy.fingerprint() != policy_sha256:
        raise PolicyError(f"the configured dispatch policy is {policy.fingerprint()}; this "
                          f"version's signed config names {policy_sha256}")
    return register(DispatchKernel(policy), replace=True)
