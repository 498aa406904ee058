"""``get_attention_fn``: a jitted attention bound to one implementation, which survives a
compile that runs out of a device resource.

Why. ``kernels.api.resolve`` picks an implementation at trace time from what it can
check in advance (backend, dtype, head_dim, the shared-memory model of
``kernels.gpu_limits``). A Pallas kernel can still fail to *compile* for a resource the
model did not foresee (XLA reports ``RESOURCE_EXHAUSTED``, e.g. "Shared memory size limit
exceeded: requested 458752, available: 232448"), and under ``jax.jit`` that error only
appears at the first call, after resolution is over.

How. :class:`GuardedAttention` watches the first call of every distinct call signature
(shapes, dtype, causal, scale, which lengths are given):

* called with concrete arrays: it calls the jitted function (compiling it); a
  ``RESOURCE_EXHAUSTED`` error there is caught;
* called inside another function's trace (e.g. the MiniLM forward under ``jax.jit``):
  the compile would happen later, outside its reach, so when the resolved implementation
  is a tiled kernel compiled natively (the kind that can run out of on-chip memory) it
  compiles the attention alone for the abstract shapes first (one extra compile per
  signature; never on the CPU, where Pallas runs interpreted).

On such a failure, ``auto`` re-resolves with that implementation excluded: the next one
in ``kernels.api.auto_order`` runs, and ``Resolution.skipped`` says why (the XLA message), kept in
:attr:`GuardedAttention.resolutions` for the evaluation report and lineage. An
explicitly requested implementation raises :class:`ResourceLimitError`, naming the
implementation, its tiling and the limit XLA reported. Later calls of a signature take
the fast path (one dictionary lookup, a few microseconds, then the jitted function).

Each jitted function is named after the kernel it resolves to
(``Kernel.trace_name``), so HLO dumps and profiler traces show which kernel ran
(``PjitFunction(kernelgate_flash_attention_fwd_gpu)``; ``evaluation.profiling``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp

from kernels.api import (
    IMPLEMENTATIONS,
    AttentionFn,
    Resolution,
    attention,
    auto_order,
    check_implementation_name,
    default_backend,
    resolve,
)
from kernels.config import KernelConfig
from kernels.contract import validate
from kernels.errors import KernelgateError

logger = logging.getLogger(__name__)

RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
"""The XLA status code of a compile (or allocation) that needs more of a device resource
than there is: shared memory, registers, device memory."""


class ResourceLimitError(KernelgateError, RuntimeError):
    """An explicitly requested implementation cannot be compiled for this call on this
    device: it needs more of a device resource than the device has."""


def is_resource_exhausted(err: BaseException) -> bool:
    """True for an XLA error with status ``RESOURCE_EXHAUSTED``."""
    return RESOURCE_EXHAUSTED in str(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = next((ln for ln in text.splitlines() if RESOURCE_EXHAUSTED in ln), text)
    return line.strip()[:400]


def _struct(x):
    return None if x is None else jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


class GuardedAttention:
    """An ``AttentionFn`` (``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths)``) bound
    to one implementation and config, with the compile fallback described in the module
    docstring. Hashable by identity (a static argument of ``jax.jit``).

    Attributes:
        implementation, config: what it was bound to.
        resolutions: call label (``AttentionShape.label``, plus ``+lengths``) -> the
            :class:`kernels.Resolution` its first call ran with.
    """

    def __init__(self, implementation: str, config: KernelConfig | None, *, jit: bool = True):
        self.implementation = implementation
        self.config = config
        self.jit = jit
        self.resolutions: dict[str, Resolution] = {}
        self._checked: dict[tuple, AttentionFn] = {}
        self._fns: dict[tuple, AttentionFn] = {}
        functools.update_wrapper(self, attention)

    @property
    def fallbacks(self) -> dict[str, dict[str, str]]:
        """Call label -> {implementation skipped at run time: why}, for the calls where
        ``auto`` moved on after a compile ran out of a device resource."""
        out = {}
        for label, res in self.resolutions.items():
            runtime = {n: why for n, why in res.skipped.items() if RESOURCE_EXHAUSTED in why}
            if runtime:
                out[label] = runtime
        return out

    @property
    def concurrent_first_calls(self) -> bool:
        """Whether this attention's first calls may overlap other threads' compiles and
        loads: ``Kernel.concurrent_first_call`` of its implementation (for ``auto``, of
        every kernel ``auto`` may pick on this backend; an unregistered name: ``True``,
        its call raises anyway)."""
        names = (auto_order(default_backend()) if self.implementation == "auto"
                 else (self.implementation,))
        return all(IMPLEMENTATIONS[n].concurrent_first_call for n in names
                   if n in IMPLEMENTATIONS)

    def _fn(self, exclude: tuple[tuple[str, str], ...], name: str) -> AttentionFn:
        """The jitted attention for one exclusion set, named after the kernel it resolves
        to (``Kernel.trace_name``): the name of its HLO module and of its dispatch
        event in a profiler trace (``PjitFunction(<name>)``)."""
        fn = self._fns.get((exclude, name))
        if fn is None:
            implementation, config = self.implementation, self.config

            def entry(q, k, v, *, causal=False, scale=None, q_lengths=None, kv_lengths=None):
                return attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                                 kv_lengths=kv_lengths, implementation=implementation,
                                 config=config, exclude=exclude)

            entry.__name__ = entry.__qualname__ = (IMPLEMENTATIONS[name].trace_name
                                                   or f"kernelgate_{name}_attention")
            fn = jax.jit(entry, static_argnames=("causal", "scale")) if self.jit else entry
            self._fns[(exclude, name)] = fn
        return fn

    def __call__(self, q, k, v, *, causal: bool = False, scale: float | None = None,
                 q_lengths=None, kv_lengths=None) -> jax.Array:
        key = (q.shape, k.shape, v.shape, q.dtype, causal, scale, q_lengths is None,
               kv_lengths is None)
        fn = self._checked.get(key)
        if fn is not None:  # the fast path: this call signature compiled before
            return fn(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                      kv_lengths=kv_lengths)
        return self._first_call(key, q, k, v, causal=causal, scale=scale,
                                q_lengths=q_lengths, kv_lengths=kv_lengths)

    def _first_call(self, key, q, k, v, *, causal, scale, q_lengths, kv_lengths):
        # Shapes only (the jitted call validates the lengths themselves on tracers):
        # concrete lengths would otherwise be copied to the host.
        spec, _, _ = validate(*map(_struct, (q, k, v)), causal=causal, scale=scale)
        spec = dataclasses.replace(spec, has_lengths=q_lengths is not None
                                   or kv_lengths is not None)
        label = spec.shape.label + ("+lengths" if spec.has_lengths else "")
        traced = any(isinstance(x, jax.core.Tracer) for x in (q, k, v, q_lengths, kv_lengths))
        kwargs = dict(causal=causal, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths)
        excluded: dict[str, str] = {}
        while True:
            exclude = tuple(sorted(excluded.items()))
            resolution = resolve(self.implementation, spec, config=self.config,
                                 exclude=excluded)
            fn = self._fn(exclude, resolution.name)
            try:
                if traced and self._may_exhaust(resolution):
                    self._probe(fn, q, k, v, **kwargs)
                out = fn(q, k, v, **kwargs)
            except Exception as err:
                if not is_resource_exhausted(err):
                    raise
                where = f"{resolution.name} config {self._config_text(resolution)}"
                if self.implementation != "auto":
                    raise ResourceLimitError(
                        f"{where} cannot be compiled for {label} on "
                        f"{jax.devices()[0].device_kind}: {_first_line(err)}") from err
                excluded[resolution.name] = (f"compile failed for lack of a device resource on "
                                             f"{jax.devices()[0].device_kind}: {_first_line(err)}")
                logger.warning("attention auto: %s for %s; trying the next implementation",
                               excluded[resolution.name], label)
                continue
            self._checked[key] = fn
            self.resolutions[label] = resolution
            return out

    @staticmethod
    def _config_text(resolution: Resolution) -> str:
        return "untiled" if resolution.config is None else str(resolution.config.fields_set())

    @staticmethod
    def _may_exhaust(resolution: Resolution) -> bool:
        # Tiled (Pallas) kernels compiled natively hold fixed on-chip buffers whose size
        # the compile checks; interpreted ones (CPU) and XLA's own fusions do not.
        return IMPLEMENTATIONS[resolution.name].tiled and resolution.native

    def _probe(self, fn, q, k, v, *, causal, scale, q_lengths, kv_lengths) -> None:
        jitted = fn if self.jit else jax.jit(fn, static_argnames=("causal", "scale"))
        jitted.lower(*map(_struct, (q, k, v)), causal=causal, scale=scale,
                     q_lengths=_struct(q_lengths), kv_lengths=_struct(kv_lengths)).compile()

    def __repr__(self) -> str:
        return f"GuardedAttention({self.implementation!r}, config={self.config!r})"


@functools.lru_cache(maxsize=64)
def get_attention_fn(implementation: str = "auto", config: KernelConfig | None = None,
                     *, jit: bool = True) -> GuardedAttention:
    """An ``AttentionFn`` bound to one implementation and config (jitted by default;
    ``causal`` and ``scale`` are static), with the compile fallback of this module.
    ``config`` is a kernel's config, hashable (read a mapping of fields with the
    kernel's ``config_from`` first).

    Cached: the same arguments return the same function object, so a model that takes
    the function as a static argument of ``jax.jit`` compiles once per kernel.

    Raises:
        ValueError: unknown implementation name.
    """
    check_implementation_name(implementation)
    return GuardedAttention(implementation, config, jit=jit)

