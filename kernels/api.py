"""One attention contract, many implementations: the registry and ``auto``.

``attention(...)`` validates the call (``kernels.contract``), resolves the
implementation and dispatches to its kernel. Swapping implementations never
changes callers (design note "Native, not forced"). Every kernel is one
``kernels.kernel.Kernel`` subclass in its own module, listed in ``kernels.registry``
(``IMPLEMENTATIONS``, re-exported here): it is callable as the kernel
``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths, config)`` and declares
``check_supported(spec, backend, config)`` and ``resolve_config(spec, config)``.
``kernels.dispatch.get_attention_fn`` binds
``attention`` to one implementation under ``jax.jit`` and falls back when a compile runs
out of a device resource.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import jax
from pydantic import BaseModel, Field

from kernels import selection
from kernels.config import BlockSizes
from kernels.contract import AttentionSpec, validate
from kernels.registry import IMPLEMENTATIONS

logger = logging.getLogger(__name__)

AttentionFn = Callable[..., jax.Array]
"""``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths) -> Array`` (see ARCHITECTURE.md)."""


AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas_tpu", "xla", "naive"),
    "gpu": ("pallas_gpu", "cudnn", "pallas_mosaic_gpu", "xla", "naive"),
    "cpu": ("xla", "naive"),
}
"""Fallback order of ``auto`` per backend: the native kernel first. On a GPU the measured
selection table (``kernels.selection``) moves its pick for the call's shape to the
front; pallas_mosaic_gpu comes first only where that table measured it fastest."""

NATIVE_FLASH: dict[str, str] = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cpu": "pallas_tpu"}
"""The flash kernel a rollout builds by default per backend. A CPU host has no flash
kernel of its own: it rolls out the TPU kernel in interpret mode (accuracy judged,
speed not assessed)."""


class Resolution(BaseModel):
    """Which implementation a call resolved to, and why (logged as lineage)."""

    requested: str
    name: str
    backend: str
    native: bool = Field(description="compiled natively on this backend (not interpreted)")
    reason: str
    skipped: dict[str, str] = Field(default_factory=dict, description="name -> why it was skipped")
    config: BlockSizes | None = Field(None, description="the resolved block sizes (None: untiled)")


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
    flash kernel of ``backend`` (``NATIVE_FLASH``: on a CPU host the TPU kernel,
    interpreted); for ``native`` the head of ``AUTO_ORDER[backend]`` (xla on a CPU host,
    pallas_tpu on a TPU, pallas_gpu on a GPU).

    On a CPU or TPU host that head is what :func:`attention`'s ``auto`` runs. On a GPU it
    is not necessarily: ``auto`` runs, per call shape, what the selection table measured
    fastest on this device kind (``kernels.selection``; entries of another device kind are
    never used) and falls back in ``AUTO_ORDER`` from there, so ``native`` on a GPU is the
    GPU's own flash kernel, a fixed choice, not a copy of ``auto``'s per-shape pick.

    Raises:
        ValueError: unknown implementation name.
    """
    check_implementation_name(implementation)
    if implementation == "native":
        return AUTO_ORDER.get(backend, AUTO_ORDER["cpu"])[0]
    return NATIVE_FLASH.get(backend, "pallas_tpu") if implementation == "auto" else implementation


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
    if name == AUTO_ORDER.get(backend, ("",))[0]:
        return f"auto -> {name}: the native flash kernel of this {backend} host"
    native = native_flash_kernel("native", backend)
    return (f"auto -> {name}: a {backend} host has no flash kernel of its own, so the rollout "
            f"builds {name} and runs it interpreted (accuracy judged, speed not assessed); "
            f"--implementation native rolls out this host's native kernel ({native})")


def _gpu_order(spec: AttentionSpec | None
               ) -> tuple[tuple[str, ...], dict[str, BlockSizes], str]:
    """Order GPU candidates by the measured selection table when one applies; also the
    tilings the table measured per implementation for the nearest shape."""
    order = AUTO_ORDER["gpu"]
    if spec is None:
        return order, {}, "default GPU order"
    try:
        name, config, why = selection.select_gpu_implementation(spec.shape)
        configs = selection.measured_configs(spec.shape)
    except (OSError, ValueError) as err:
        return order, {}, f"no usable GPU selection table ({err}); default order"
    if config is not None:
        configs[name] = config
    return (name, *[n for n in order if n != name]), configs, why


def resolve(implementation: str = "auto", spec: AttentionSpec | None = None,
            backend: str | None = None, config: BlockSizes | None = None,
            exclude: Mapping[str, str] | None = None) -> Resolution:
    """Pick the implementation for ``spec`` on ``backend`` and resolve its block sizes.

    Args:
        implementation: a registry name or ``"auto"`` (the native kernel of the
            backend, falling back in ``AUTO_ORDER``).
        spec: the validated call; ``None`` checks nothing shape-specific.
        backend: "cpu", "gpu" or "tpu"; default ``jax.default_backend()``.
        config: requested block sizes (unset fields: the table's or the kernel's default).
        exclude: for ``auto``, implementations not to pick, name -> why (e.g. its compile
            ran out of a device resource for this call: ``kernels.dispatch``); they
            appear in ``Resolution.skipped`` with that reason. Ignored for a named
            implementation.

    Raises:
        ValueError: unknown implementation name, or ``config`` illegal for it.
        NotImplementedError: the named implementation cannot run this call (the
            reason says why), or ``auto`` found none.
    """
    backend = backend or default_backend()
    check_implementation_name(implementation)
    if implementation != "auto":
        impl = IMPLEMENTATIONS[implementation]
        resolved, reason = config, "requested explicitly"
        if spec is not None:
            impl.check(spec, backend, config)
            wanted = config
            if impl.tuned and backend == "gpu" and (
                    config is None or config.is_empty()):
                # No tiling given: the measured table's, as for auto (fitted to the device).
                wanted = selection.select_pallas_config(spec.shape, implementation=implementation)
                if wanted is not None:
                    reason += "; tiling of the nearest measured shape (kernels/gpu_table.json)"
            resolved = impl.resolve_config(spec, wanted)
        return Resolution(requested=implementation, name=implementation, backend=backend,
                          native=impl.is_native(backend), reason=reason, config=resolved)
    order, table_configs, why = (_gpu_order(spec) if backend == "gpu"
                                 else (AUTO_ORDER.get(backend, AUTO_ORDER["cpu"]), {}, ""))
    skipped: dict[str, str] = {}
    for name in order:
        impl = IMPLEMENTATIONS[name]
        if exclude and name in exclude:
            skipped[name] = exclude[name]
            continue
        # A caller's block sizes win; else the tiling the table measured for this
        # implementation at the nearest shape (fitted to the device); else the default.
        wanted = config if config is not None else table_configs.get(name)
        try:
            if spec is not None:
                impl.check(spec, backend, wanted)
        except (NotImplementedError, ImportError, ValueError) as err:
            skipped[name] = str(err)
            continue
        reason = f"first supported implementation for {backend} in order {list(order)}"
        if why:
            reason += f"; {why}"
        resolved = impl.resolve_config(spec, wanted) if spec is not None else wanted
        logger.info("attention auto -> %s (%s)", name, reason)
        return Resolution(requested="auto", name=name, backend=backend,
                          native=impl.is_native(backend), reason=reason, skipped=skipped,
                          config=resolved)
    raise NotImplementedError(f"no implementation supports this call on {backend}: {skipped}")


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              q_lengths=None, kv_lengths=None, implementation: str = "auto",
              config: BlockSizes | None = None,
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
        config: block sizes for tiled kernels (``None``: the measured table's entry or
            the kernel's default).
        exclude: ``(name, reason)`` pairs ``auto`` must skip (see :func:`resolve`); a
            tuple so that it can be a static argument of ``jax.jit``.

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in ``q.dtype``; rows that see no key are 0.

    Raises:
        ValueError: invalid input (the message names the constraint), unknown
            implementation, or block sizes the implementation does not accept.
        NotImplementedError: the named implementation cannot run this call.
    """
    spec, q_lengths, kv_lengths = validate(q, k, v, causal=causal, scale=scale,
                                           q_lengths=q_lengths, kv_lengths=kv_lengths)
    resolution = resolve(implementation, spec, config=config, exclude=dict(exclude))
    kernel = IMPLEMENTATIONS[resolution.name].kernel()
    return kernel(q, k, v, causal=spec.causal, scale=spec.scale, q_lengths=q_lengths,
                  kv_lengths=kv_lengths, config=resolution.config)
