"""kernelgate kernels: exact attention behind one contract (see ``kernels.api``).

The package is lazy (PEP 562): ``import kernels`` imports neither JAX nor a kernel; each
name below is imported from its module the first time it is read (``kernels.attention``
loads ``kernels.api``, and with it JAX). So ``kernels.registry``, ``kernels.errors`` and
the kernel classes' base (``kernels.kernel``) can be imported by the command line before
JAX is. ``build`` is a submodule, not a name here: ``from kernels.build import build``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "kernels.api": ("ConfigLike", "IMPLEMENTATIONS", "AttentionFn", "Resolution", "attention",
                    "auto_order", "default_backend", "native_flash", "native_flash_kernel",
                    "resolve", "why_picked"),
    "kernels.config": ("KernelConfig",),
    "kernels.contract": ("AttentionSpec", "validate"),
    "kernels.dispatch": ("GuardedAttention", "ResourceLimitError", "get_attention_fn"),
    "kernels.kernel": ("Capability", "Kernel"),
    "kernels.reference": ("attention_reference", "relative_error"),
    "kernels.registry": ("register", "registered", "stored_config", "unregister"),
    "kernels.shapes": ("AttentionShape", "random_inputs"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """``kernels.<name>``: imported from its module on first use, then kept here; a
    submodule (``kernels.registry``) is imported on first use too, as an eager package's
    would already be.

    Raises:
        AttributeError: neither one of ``__all__`` nor a submodule.
    """
    module = _WHERE.get(name)
    if module is None:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
