"""A planted slowdown as a registered kernel (the GPU canary calibration's
stage 2).

``slowed_<base>_x<N>`` is the built-in kernel ``<base>`` whose attention runs ``N``
times per call, each repeat reading the previous output through a data dependence
(``q + 0 * out``) so that XLA cannot merge them; the call returns the last output, which
is ``<base>``'s own. It is a real kernel of its own: its own registry name, capability
and native platforms of its base, a lowered module with ``N`` times the base's
attention, so its build fingerprint and exported artifacts differ from the base's, and
a rollout of it through the serving path is slower by a measurable ratio (about
``1 + (N - 1) * attention share`` of a request's time).

It lives in ``tests/``, not ``kernels/``: nothing ships it. A process gets it through
the registry's plugin variable (``kernels.registry.PLUGINS_ENV``), e.g. on the GPU host::

    KERNELGATE_KERNELS=slowed_pallas_gpu_x16=tests.slowed_kernel:slowed_pallas_gpu_x16 \\
        kernelgate rollout --implementation slowed_pallas_gpu_x16 --family pallas_gpu

The attribute ``slowed_<base>_x<N>`` of this module is made on first access
(PEP 562 module ``__getattr__``) for any built-in ``<base>`` and ``N >= 2``. Its code is
outside ``kernels/``, so a version of it carries its base's snapshot only and runs in
the process that has this module on its path (the rollout's own, where the code digest
is the checkout's).
"""

from __future__ import annotations

import functools
import re

from kernels import registry, selection
from kernels.kernel import Kernel

_NAME = re.compile(r"^slowed_(?P<base>\w+?)_x(?P<repeats>\d+)$")


class SlowedKernel(Kernel):
    """Base class of ``slowed_<base>_x<N>``: ``base``'s attention repeated ``repeats``
    times (class attributes set by :func:`slowed_class`). Inputs, outputs and errors are
    the base kernel's (``kernels.kernel.Kernel``)."""

    base: str
    repeats: int

    @property
    def _base(self) -> Kernel:
        return registry.IMPLEMENTATIONS[self.base]

    def __call__(self, q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
        base = self._base.kernel()
        out = None
        for _ in range(self.repeats):
            # a data dependence keeps XLA from merging the repeats into one
            out = base(q if out is None else q + 0.0 * out.astype(q.dtype), k, v,
                       causal=causal, scale=scale, q_lengths=q_lengths,
                       kv_lengths=kv_lengths, config=config)
        return out

    def check_supported(self, spec, backend, config=None):
        try:
            self._base.check_supported(spec, backend, config)
        except NotImplementedError as err:
            raise NotImplementedError(f"{self.name}: {err}") from None

    def resolve_config(self, spec, config):
        base = self._base
        config = base.config_from(config)
        if base.tuned and (config is None or config.is_empty()) and spec is not None:
            # the tiling its base runs with on this device (the measured table's), so the
            # slowdown is the repeats and nothing else
            from kernels.api import default_backend
            if default_backend() == "gpu":
                config = selection.measured_config(spec.shape, self.base)
        return base.resolve_config(spec, config)

    def export_context(self, platform):
        return self._base.export_context(platform)

    def export_disabled_checks(self, platform):
        return self._base.export_disabled_checks(platform)


@functools.cache
def slowed_class(base: str, repeats: int) -> type[SlowedKernel]:
    """The ``Kernel`` subclass ``slowed_<base>_x<repeats>``.

    Raises:
        ValueError: ``base`` is not a built-in kernel, or ``repeats`` < 2.
    """
    if base not in registry.BUILTIN:
        raise ValueError(f"no kernel {base!r} to slow down (built-in: {list(registry.BUILTIN)})")
    if repeats < 2:
        raise ValueError(f"a slowed kernel repeats its base at least twice, got {repeats} repeats")
    kernel = registry.IMPLEMENTATIONS[base]
    name = f"slowed_{base}_x{repeats}"
    return type(name, (SlowedKernel,), {
        "__doc__": f"{base}'s attention computed {repeats} times per call (a planted slowdown).",
        "__module__": __name__,
        "name": name, "base": base, "repeats": repeats,
        "description": f"{base} repeated {repeats} times (tests/slowed_kernel.py: a planted "
                       "slowdown for the canary's calibration)",
        "native_platforms": kernel.native_platforms, "capability": kernel.capability,
        "config_type": kernel.config_type,
        "float32_matmul_precision": kernel.float32_matmul_precision,
        "trace_name": f"kernelgate_{name}_attention", "tuned": False, "ours": False,
        "lowers_at_trace_time": kernel.lowers_at_trace_time,
        "export_needs_local_device": kernel.export_needs_local_device,
    })


def __getattr__(attribute: str) -> type[SlowedKernel]:
    match = _NAME.match(attribute)
    if match is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    try:
        return slowed_class(match["base"], int(match["repeats"]))
    except ValueError as err:
        raise AttributeError(f"{attribute}: {err}") from None
