"""One attention contract, many implementations: the registry and ``auto``.

``attention(...)`` validates the call (``kernels.contract``), resolves the
implementation and dispatches to its kernel. Swapping implementations never
changes callers (design note "Native, not forced"). Every kernel is one
``kernels.kernel.Kernel`` subclass in its own module, listed in ``kernels.registry``
(``IMPLEMENTATIONS``, re-exported here): it is callable as the kernel
``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths, config)`` and declares
``check_supported(spec, backend, config)``, ``resolve_config(spec, config)`` and its place
in ``auto``'s order (``auto_priority``; :func:`auto_order` derives the order per backend,
:func:`native_flash` the flash kernel a rollout builds). A config is the kernel's own type
or a mapping of its fields (``Kernel.config_from``), so ``auto`` can offer the same block
sizes to every kernel it tries. ``kernels.dispatch.get_attention_fn`` binds
``attention`` to one implementation under ``jax.jit`` and falls back when a compile runs
out of a device resource.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
from pydantic import BaseModel, Field, field_validator

from kernels import selection
from kernels.config import AnyConfig, KernelConfig
from kernels.contract import AttentionSpec, validate
from kernels.dispatch_serving import configured_policy, route
from kernels.registry import IMPLEMENTATIONS, stored_config

logger = logging.getLogger(__name__)

AttentionFn = Callable[..., jax.Array]
"""``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths) -> Array`` (see ARCHITECTURE.md)."""


ConfigLike = KernelConfig | Mapping[str, Any] | None
"""What a caller may pass as a config: a kernel's config, a mapping of its fields (by
name, or in the older shared block-size shape), or ``None`` (the kernel's default)."""


def auto_order(backend: str) -> tuple[str, ...]:
    """``auto``'s fallback order on ``backend``: the registered kernels that declare an
    ``auto_priority`` there, lowest first (ties: registry order). An unknown backend gets
    the CPU's order. On a GPU the measured selection table (``kernels.selection``) moves
    its pick for the call's shape to the front. Loads every registered kernel's class; an
    entry whose module fails to import (a plugin of ``KERNELGATE_KERNELS`` gone missing,
    which would declare no place in the order anyway) is left out, and naming it
    explicitly raises the ``ImportError``."""
    backend = backend if backend in ("cpu", "gpu", "tpu") else "cpu"
    ranked = []
    for position, name in enumerate(IMPLEMENTATIONS):
        try:
            priority = IMPLEMENTATIONS[name].auto_priority.get(backend)
        except ImportError:
            continue
        if priority is not None:
            ranked.append((priority, position, name))
    return tuple(name for _, _, name in sorted(ranked))


def native_flash(backend: str) -> str:
    """The flash kernel a rollout builds for ``auto`` on ``backend``: the first registered
    kernel that declares it in ``rollout_default_on`` (a CPU host has no flash kernel of
    its own: it rolls out the TPU kernel in interpret mode, accuracy judged, speed not
    assessed). An unknown backend gets the CPU's.

    Raises:
        LookupError: no registered kernel declares one for the backend.
    """
    for wanted in (backend, "cpu"):
        for name in IMPLEMENTATIONS:
            if wanted in IMPLEMENTATIONS[name].rollout_default_on:
                return name
    raise LookupError(f"no registered kernel is the rollout default on {backend}")


class Resolution(BaseModel):
    """Which implementation a call resolved to, and why (logged as lineage)."""

    requested: str
    name: str
    backend: str
    native: bool = Field(description="compiled natively on this backend (not interpreted)")
    reason: str
    skipped: dict[str, str] = Field(default_factory=dict, description="name -> why it was skipped")
    config: AnyConfig | None = Field(
        None, description="the resolved config, the kernel's own type (None: untiled)")

    @field_validator("config", mode="before")
    @classmethod
    def _kernels_config(cls, value: Any, info) -> Any:
        # A stored resolution's JSON is read back as the kernel's own config type (the
        # older shared block-size shape included).
        if value is None or isinstance(value, KernelConfig) or "name" not in info.data:
            return value
        return stored_config(info.data["name"], value)


def default_backend() -> str:
    """``jax.default_backend()`` normalised to cpu/gpu/tpu (ROCm and CUDA are "gpu")."""
    backend = jax.default_backend()
    return "gpu" if backend in ("cuda", "rocm") else backend


def check_implementation_name(implementation: str) -> str:
    """Return ``implementation`` if it is a registry name or ``auto``.

    Raises:
        ValueError: naming the choices.
    """
    if implementation not in ("auto", "native") and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; choose one of "
                         f"{sorted(IMPLEMENTATIONS)}, 'auto' or 'native'")
    return implementation


def native_flash_kernel(implementation: str, backend: str) -> str:
    """The registry name a rollout builds: ``implementation`` itself; for ``auto`` the
    flash kernel of ``backend`` (:func:`native_flash`: on a CPU host the TPU kernel,
    interpreted); for ``native`` the head of :func:`auto_order` (xla on a CPU host,
    pallas_tpu on a TPU, pallas_gpu on a GPU).

    On a CPU or TPU host that head is what :func:`attention`'s ``auto`` runs. On a GPU it
    is not necessarily: ``auto`` runs, per call shape, what the selection table measured
    fastest on this device kind (``kernels.selection``; entries of another device kind are
    never used) and falls back in :func:`auto_order` from there, so ``native`` on a GPU is the
    GPU's own flash kernel, a fixed choice, not a copy of ``auto``'s per-shape pick.

    Raises:
        ValueError: unknown implementation name.
    """
    check_implementation_name(implementation)
    if implementation == "native":
        return auto_order(backend)[0]
    return native_flash(backend) if implementation == "auto" else implementation


def why_picked(implementation: str, backend: str) -> str:
    """One sentence saying which kernel ``implementation`` means on ``backend`` and why
    (the CLI prints it, so ``auto`` never has to be guessed).

    Raises:
        ValueError: unknown implementation name.
    """
    name = native_flash_kernel(implementation, backend)
    if implementation == "native":
        if backend == "gpu":
            return (f"native -> {name}: the first kernel of this gpu host's fallback order; "
                    f"kernels.attention(implementation='auto') instead runs, per shape, what "
                    f"the selection table (kernels/gpu_table.json) measured fastest on this "
                    f"device kind (kernels.selection.select_gpu_implementation says which and "
                    f"why; without entries for this kind, the documented default)")
        return (f"native -> {name}: the kernel kernels.attention(implementation='auto') runs "
                f"first on this {backend} host")
    if implementation != "auto":
        return f"{name}: as asked"
    if backend in ("cpu", "gpu", "tpu") and name == auto_order(backend)[0]:
        return f"auto -> {name}: the native flash kernel of this {backend} host"
    native = native_flash_kernel("native", backend)
    return (f"auto -> {name}: a {backend} host has no flash kernel of its own, so the rollout "
            f"builds {name} and runs it interpreted (accuracy judged, speed not assessed); "
            f"--implementation native rolls out this host's native kernel ({native})")


def _gpu_order(spec: AttentionSpec | None, table: selection.SelectionTable | None
               ) -> tuple[tuple[str, ...], dict[str, KernelConfig], str]:
    """Order GPU candidates by the measured selection table when one applies; also the
    configs the table measured per tuned kernel for the nearest shape."""
    order = auto_order("gpu")
    if spec is None:
        return order, {}, "default GPU order"
    try:
        name, config, why = selection.select_gpu_implementation(spec.shape, table=table)
        configs = selection.measured_configs(spec.shape, table=table)
    except (OSError, ValueError) as err:
        return order, {}, f"no usable GPU selection table ({err}); default order"
    if config is not None:
        configs[name] = config
    return (name, *[n for n in order if n != name]), configs, why


def resolve(implementation: str = "auto", spec: AttentionSpec | None = None,
            backend: str | None = None, config: ConfigLike = None,
            exclude: Mapping[str, str] | None = None,
            table: selection.SelectionTable | None = None) -> Resolution:
    """Pick the implementation for ``spec`` on ``backend`` and resolve its config.

    Args:
        implementation: a registry name or ``"auto"``: the kernel a configured dispatch
            policy measured on this backend serves the call's bucket by
            (``kernels.dispatch_serving``); with none configured, or none serving the
            call, the native kernel of the backend, falling back in :func:`auto_order`.
        spec: the validated call; ``None`` checks nothing shape-specific.
        backend: "cpu", "gpu" or "tpu"; default ``jax.default_backend()``.
        config: the config asked for (:data:`ConfigLike`; unset fields: the table's or
            the kernel's default). Under ``auto`` each kernel tried reads it as its own
            (``Kernel.config_from``) or is skipped, saying why.
        exclude: for ``auto``, implementations not to pick, name -> why (e.g. its compile
            ran out of a device resource for this call: ``kernels.dispatch``); they
            appear in ``Resolution.skipped`` with that reason. Ignored for a named
            implementation.
        table: the measured GPU table to read on a GPU (default:
            ``kernels/gpu_table.json``, :func:`kernels.selection.load_table`).

    Raises:
        ValueError: unknown implementation name, or ``config`` illegal for it.
        NotImplementedError: the named implementation cannot run this call (the
            reason says why), or ``auto`` found none.
        kernels.dispatch_audit.PolicyError: ``auto`` with a configured dispatch policy
            that is not the one pinned or not what its evidence derives.
    """
    backend = backend or default_backend()
    check_implementation_name(implementation)
    if implementation != "auto":
        impl = IMPLEMENTATIONS[implementation]
        reason = "requested explicitly"
        if spec is None:
            resolved = impl.config_from(config)
        else:
            impl.check_supported(spec, backend, config)
            wanted = impl.config_from(config)
            if impl.tuned and backend == "gpu" and (wanted is None or wanted.is_empty()):
                # No tiling given: the measured table's, as for auto (fitted to the device).
                wanted = selection.measured_config(spec.shape, implementation, table=table)
                if wanted is not None:
                    reason += "; tiling of the nearest measured shape (kernels/gpu_table.json)"
            resolved = impl.resolve_config(spec, wanted)
        return Resolution(requested=implementation, name=implementation, backend=backend,
                          native=impl.is_native(backend), reason=reason, config=resolved)
    policy = configured_policy() if spec is not None else None
    note = ""
    if policy is not None and policy.backend != backend:
        note = f"the dispatch policy was measured on {policy.backend}, not {backend}; "
    elif policy is not None:
        routed = route(policy, spec, backend, config, exclude)
        if routed.kernel is not None:
            served = resolve(routed.kernel, spec, backend, config, table=table)
            logger.info("attention auto -> %s (%s)", routed.kernel, routed.why)
            return served.model_copy(update={"requested": "auto", "reason": routed.why,
                                             "skipped": routed.skipped})
        note = f"{routed.why}; "
    order, table_configs, why = (_gpu_order(spec, table) if backend == "gpu"
                                 else (auto_order(backend), {}, ""))
    skipped: dict[str, str] = {}
    for name in order:
        if exclude and name in exclude:
            skipped[name] = exclude[name]
            continue
        # A caller's config wins; else the tiling the table measured for this
        # implementation at the nearest shape (fitted to the device); else the default.
        wanted = config if config is not None else table_configs.get(name)
        try:
            impl = IMPLEMENTATIONS[name]
            if spec is not None:
                impl.check_supported(spec, backend, wanted)
            else:
                resolved = impl.config_from(wanted)
        except (NotImplementedError, ImportError, ValueError) as err:
            skipped[name] = str(err)
            continue
        reason = f"{note}first supported implementation for {backend} in order {list(order)}"
        if why:
            reason += f"; {why}"
        if spec is not None:
            resolved = impl.resolve_config(spec, wanted)
        logger.info("attention auto -> %s (%s)", name, reason)
        return Resolution(requested="auto", name=name, backend=backend,
                          native=impl.is_native(backend), reason=reason, skipped=skipped,
                          config=resolved)
    raise NotImplementedError(f"no implementation supports this call on {backend}: {skipped}")


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              q_lengths=None, kv_lengths=None, implementation: str = "auto",
              config: ConfigLike = None,
              exclude: tuple[tuple[str, str], ...] = ()) -> jax.Array:
    """Exact scaled dot-product attention behind one contract.

    Args:
        q: ``[batch, q_len, num_heads, head_dim]``, float32, bfloat16 or float16.
        k, v: ``[batch, kv_len, num_kv_heads, head_dim]``, same dtype;
            ``num_heads % num_kv_heads == 0`` (GQA: query head ``h`` reads kv head
            ``h // (num_heads // num_kv_heads)``).
        causal: mask key ``j > i`` for query ``i`` (top-left, as ``jax.nn.dot_product_attention``).
        scale: logit scale, default ``1/sqrt(head_dim)``.
        q_lengths, kv_lengths: optional int ``[batch]`` valid lengths (padding masked).
        implementation: registry name or ``"auto"``.
        config: the config of a tiled kernel (:data:`ConfigLike`: its own type, or a
            mapping of fields that each kernel tried reads as its own; ``None``: the
            measured table's entry or the kernel's default).
        exclude: ``(name, reason)`` pairs ``auto`` must skip (see :func:`resolve`); a
            tuple so that it can be a static argument of ``jax.jit``.

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in ``q.dtype``; rows that see no key are 0.

    Raises:
        ValueError: invalid input (the message names the constraint), unknown
            implementation, or a config the implementation does not accept.
        NotImplementedError: the named implementation cannot run this call.
    """
    spec, q_lengths, kv_lengths = validate(q, k, v, causal=causal, scale=scale,
                                           q_lengths=q_lengths, kv_lengths=kv_lengths)
    resolution = resolve(implementation, spec, config=config, exclude=dict(exclude))
    kernel = IMPLEMENTATIONS[resolution.name].kernel()
    return kernel(q, k, v, causal=spec.causal, scale=spec.scale, q_lengths=q_lengths,
                  kv_lengths=kv_lengths, config=resolution.config)
