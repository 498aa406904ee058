"""One attention contract, many implementations: the registry and ``auto``.

``attention(...)`` validates the call (``kernels.contract``), resolves the
implementation and dispatches to its kernel. Swapping implementations never
changes callers (design note "Native, not forced").
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import jax
from pydantic import BaseModel, Field

from kernels.config import BlockSizes
from kernels.contract import AttentionSpec, validate

logger = logging.getLogger(__name__)

AttentionFn = Callable[..., jax.Array]
"""``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths) -> Array`` (see ARCHITECTURE.md)."""


def _runs_anywhere(spec: AttentionSpec, backend: str) -> None:
    del spec, backend


def _module_check(module: str, function: str = "check_supported"):
    def check(spec: AttentionSpec, backend: str) -> None:
        getattr(importlib.import_module(module), function)(spec, backend)
    return check


@dataclass(frozen=True)
class Implementation:
    """An entry of the registry.

    Attributes:
        name: registry key.
        module, function: where the kernel lives (imported lazily, so GPU-only
            modules cost nothing on other hosts).
        native_platforms: backends where it is compiled natively ("cpu", "gpu", "tpu");
            elsewhere it either runs interpreted or not at all (``check`` says).
        check: raises ``NotImplementedError`` with the reason when it cannot run
            a given spec on a given backend.
    """

    name: str
    module: str
    function: str
    native_platforms: tuple[str, ...]
    description: str
    check: Callable[[AttentionSpec, str], None] = _runs_anywhere

    def kernel(self) -> Callable[..., jax.Array]:
        """The kernel function ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths, config)``."""
        return getattr(importlib.import_module(self.module), self.function)

    def is_native(self, backend: str) -> bool:
        return backend in self.native_platforms


IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl
    for impl in (
        Implementation("naive", "kernels.naive", "naive_attention", ("cpu", "gpu", "tpu"),
                       "materialised logits, softmax, matmul (the baseline)"),
        Implementation("xla", "kernels.xla", "xla_attention", ("cpu", "gpu", "tpu"),
                       "jax.nn.dot_product_attention(implementation='xla')"),
        Implementation("cudnn", "kernels.xla", "cudnn_attention", ("gpu",),
                       "jax.nn.dot_product_attention(implementation='cudnn')",
                       _module_check("kernels.xla", "check_cudnn")),
        Implementation("pallas_tpu", "kernels.pallas_tpu", "pallas_tpu_attention", ("tpu",),
                       "flash attention in Pallas/Mosaic TPU (interpreted off-TPU)",
                       _module_check("kernels.pallas_tpu")),
        Implementation("pallas_gpu", "kernels.pallas_gpu", "pallas_gpu_attention", ("gpu",),
                       "flash attention in Pallas for NVIDIA GPUs",
                       _module_check("kernels.pallas_gpu")),
    )
}

AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "tpu": ("pallas_tpu", "xla", "naive"),
    "gpu": ("pallas_gpu", "cudnn", "xla", "naive"),
    "cpu": ("xla", "naive"),
}
"""Fallback order of ``auto`` per backend: the native kernel first."""


class Resolution(BaseModel):
    """Which implementation a call resolved to, and why (logged as lineage)."""

    requested: str
    name: str
    backend: str
    native: bool = Field(description="compiled natively on this backend (not interpreted)")
    reason: str
    skipped: dict[str, str] = Field(default_factory=dict, description="name -> why it was skipped")
    config: BlockSizes | None = None


def default_backend() -> str:
    """``jax.default_backend()`` normalised to cpu/gpu/tpu (ROCm and CUDA are "gpu")."""
    backend = jax.default_backend()
    return "gpu" if backend in ("cuda", "rocm") else backend


def _gpu_preference(spec: AttentionSpec | None) -> tuple[tuple[str, ...], BlockSizes | None, str]:
    """Order GPU candidates by the measured selection table when one applies."""
    order = AUTO_ORDER["gpu"]
    if spec is None:
        return order, None, "default GPU order"
    try:
        autotune = importlib.import_module("kernels.autotune")
        name, config, why = autotune.select_gpu_implementation(
            (spec.batch, spec.q_len, spec.num_heads, spec.head_dim),
            (spec.batch, spec.kv_len, spec.num_kv_heads, spec.head_dim),
            spec.dtype, spec.causal,
        )
    except (ImportError, AttributeError, FileNotFoundError) as err:
        return order, None, f"no GPU selection table ({err}); default order"
    block = BlockSizes(**config) if config else None
    return (name, *[n for n in order if n != name]), block, why


def resolve(implementation: str = "auto", spec: AttentionSpec | None = None,
            backend: str | None = None) -> Resolution:
    """Pick the implementation for ``spec`` on ``backend``.

    Args:
        implementation: a registry name or ``"auto"`` (the native kernel of the
            backend, falling back in ``AUTO_ORDER``).
        spec: the validated call; ``None`` checks nothing shape-specific.
        backend: "cpu", "gpu" or "tpu"; default ``jax.default_backend()``.

    Raises:
        ValueError: unknown implementation name.
        NotImplementedError: the named implementation cannot run this call (the
            reason says why), or ``auto`` found none.
    """
    backend = backend or default_backend()
    if implementation != "auto":
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {implementation!r}; choose one of "
                             f"{sorted(IMPLEMENTATIONS)} or 'auto'")
        impl = IMPLEMENTATIONS[implementation]
        if spec is not None:
            impl.check(spec, backend)
        return Resolution(requested=implementation, name=implementation, backend=backend,
                          native=impl.is_native(backend), reason="requested explicitly")
    order, table_config, why = ((*_gpu_preference(spec),) if backend == "gpu"
                                else (AUTO_ORDER.get(backend, AUTO_ORDER["cpu"]), None, ""))
    skipped: dict[str, str] = {}
    for name in order:
        impl = IMPLEMENTATIONS[name]
        try:
            if spec is not None:
                impl.check(spec, backend)
        except (NotImplementedError, ImportError) as err:
            skipped[name] = str(err)
            continue
        reason = f"first supported implementation for {backend} in order {list(order)}"
        if why:
            reason += f"; {why}"
        resolution = Resolution(requested="auto", name=name, backend=backend,
                                native=impl.is_native(backend), reason=reason, skipped=skipped,
                                config=table_config if name == order[0] else None)
        logger.info("attention auto -> %s (%s)", name, reason)
        return resolution
    raise NotImplementedError(f"no implementation supports this call on {backend}: {skipped}")


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              q_lengths=None, kv_lengths=None, implementation: str = "auto",
              config: BlockSizes | None = None) -> jax.Array:
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
        config: block sizes for tiled kernels (``None``: the kernel's default or
            the measured table's entry).

    Returns:
        ``[batch, q_len, num_heads, head_dim]`` in ``q.dtype``; rows that see no key are 0.

    Raises:
        ValueError: invalid input (the message names the constraint) or unknown implementation.
        NotImplementedError: the named implementation cannot run this call.
    """
    spec, q_lengths, kv_lengths = validate(q, k, v, causal=causal, scale=scale,
                                           q_lengths=q_lengths, kv_lengths=kv_lengths)
    resolution = resolve(implementation, spec)
    kernel = IMPLEMENTATIONS[resolution.name].kernel()
    return kernel(q, k, v, causal=spec.causal, scale=spec.scale, q_lengths=q_lengths,
                  kv_lengths=kv_lengths, config=config or resolution.config)


@functools.lru_cache(maxsize=64)
def get_attention_fn(implementation: str = "auto", config: BlockSizes | None = None,
                     *, jit: bool = True) -> AttentionFn:
    """An ``AttentionFn`` bound to one implementation and config (jitted by default;
    ``causal`` and ``scale`` are static).

    Cached: the same arguments return the same function object, so a model that takes
    the function as a static argument of ``jax.jit`` compiles once per kernel.
    """
    fn = functools.partial(attention, implementation=implementation, config=config)
    fn = functools.update_wrapper(fn, attention)
    return jax.jit(fn, static_argnames=("causal", "scale")) if jit else fn
