"""The registry of kernels: name -> :class:`kernels.kernel.Kernel`, loaded lazily.

The built-in entries are ``"module:Class"`` paths, imported the first time a name is
looked up (``IMPLEMENTATIONS[name]``) or the registry is iterated: ``import kernels``
loads no kernel module, and a kernel module that imports platform-only libraries keeps
them inside its call, so a CPU host pays for neither. Adding a kernel is its module,
one line in ``BUILTIN`` and its tests; a test or plugin calls :func:`register` (and
:func:`unregister`, or the :func:`registered` context manager) instead.

A process can also be given kernels that live outside ``kernels/`` without editing
code: ``KERNELGATE_KERNELS="name=module:attribute,..."`` adds each entry, loaded lazily
like a built-in one (``attribute`` is a ``Kernel`` subclass or a function returning a
``Kernel``; its ``name`` must be the entry's). The GPU calibration's slowed variant is
one (``tests/slowed_kernel.py``: ``kernelgate rollout --implementation
slowed_pallas_gpu_x16`` on the device). Such a kernel's code is not part of ``kernels/``,
so it is outside a version's code snapshot and source digest: a test and tool
mechanism, not a way to ship a kernel (that is a module here and a line in ``BUILTIN``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from kernels import plugin_names
from kernels.config import KernelConfig, StoredConfig
from kernels.kernel import Kernel

BUILTIN: dict[str, str] = {
    "naive": "kernels.naive:NaiveKernel",
    "xla": "kernels.xla:XlaKernel",
    "cudnn": "kernels.xla:CudnnKernel",
    "pallas_tpu": "kernels.pallas_tpu:PallasTpuKernel",
    "pallas_gpu": "kernels.pallas_gpu:PallasGpuKernel",
    "pallas_mosaic_gpu": "kernels.pallas_mosaic_gpu:PallasMosaicGpuKernel",
    "fa3": "kernels.fa3:Fa3Kernel",
    "pallas_mosaic_gpu_fp8": "kernels.pallas_mosaic_gpu_fp8:PallasMosaicGpuFp8Kernel",
}
"""The built-in kernels, in registry order: name -> ``module:Class``."""

PLUGINS_ENV = plugin_names.PLUGINS_ENV
"""The environment variable of the kernels added from outside ``kernels/``."""


def plugins_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The entries of ``KERNELGATE_KERNELS`` in ``environ`` (default ``os.environ``):
    a comma-separated list of ``name=module:attribute``; name -> ``module:attribute``
    (the grammar: :mod:`kernels.plugin_names`, shared with the command line's check).

    Raises:
        ValueError: an entry not of that form, a name given twice, a built-in name or a
            selection mode (``auto``, ``native``); the message names the variable.
    """
    return plugin_names.plugins_from_env(BUILTIN, environ)


def _load(name: str, path: str) -> Kernel:
    module, _, cls = path.partition(":")
    kernel = getattr(importlib.import_module(module), cls)()
    if not isinstance(kernel, Kernel):
        raise TypeError(f"registry entry {name!r} ({path}) gives a {type(kernel).__name__}, "
                        "not a kernels.kernel.Kernel")
    if kernel.name != name:
        raise ValueError(f"registry entry {name!r} ({path}) declares the name {kernel.name!r}")
    return kernel


class Registry(MutableMapping[str, Kernel]):
    """name -> ``Kernel``; an entry given as a ``"module:Class"`` string is imported on
    first access. Setting a name to a ``Kernel`` instance (or a path) registers it;
    ``del`` unregisters it (so ``monkeypatch.setitem`` works as for a dict)."""

    def __init__(self, entries: dict[str, str | Kernel]):
        self._entries: dict[str, str | Kernel] = dict(entries)

    def __getitem__(self, name: str) -> Kernel:
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = _load(name, entry)
        return entry

    def __setitem__(self, name: str, kernel: str | Kernel) -> None:
        if not isinstance(kernel, str | Kernel):
            raise TypeError(f"registry entries are Kernel instances or 'module:Class' paths, "
                            f"got {type(kernel).__name__}")
        self._entries[name] = kernel

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({list(self._entries)})"


IMPLEMENTATIONS = Registry({**BUILTIN, **plugins_from_env()})
"""The one registry (also ``kernels.IMPLEMENTATIONS``): the built-in kernels, then those
of ``KERNELGATE_KERNELS``."""


def register(kernel: Kernel | type[Kernel], *, replace: bool = False) -> Kernel:
    """Add ``kernel`` (an instance, or a subclass taking no arguments) under its name.

    Returns:
        the registered instance.

    Raises:
        TypeError: not a ``Kernel``.
        ValueError: the name is ``auto``/``native`` or taken (unless ``replace``).
    """
    if isinstance(kernel, type):
        kernel = kernel()
    if not isinstance(kernel, Kernel):
        raise TypeError(f"register takes a kernels.kernel.Kernel, got {type(kernel).__name__}")
    if kernel.name in ("auto", "native"):
        raise ValueError(f"{kernel.name!r} is a selection mode, not a kernel name")
    if kernel.name in IMPLEMENTATIONS and not replace:
        raise ValueError(f"a kernel named {kernel.name!r} is registered already")
    IMPLEMENTATIONS[kernel.name] = kernel
    return kernel


def unregister(name: str) -> None:
    """Remove the kernel ``name`` (``KeyError`` when none is registered)."""
    del IMPLEMENTATIONS[name]


@contextlib.contextmanager
def registered(kernel: Kernel | type[Kernel], *, replace: bool = False) -> Iterator[Kernel]:
    """Register ``kernel`` for the ``with`` block, then restore what was there."""
    name = kernel.name
    previous = IMPLEMENTATIONS._entries.get(name)  # noqa: SLF001 - keep a lazy entry lazy
    instance = register(kernel, replace=replace)
    try:
        yield instance
    finally:
        if previous is None:
            IMPLEMENTATIONS.pop(name, None)
        else:
            IMPLEMENTATIONS[name] = previous


def stored_config(implementation: str, data: KernelConfig | Mapping[str, Any] | None
                  ) -> KernelConfig | None:
    """The config a stored record (a version's ``kernel.json`` or signed build, a build
    record, a GPU table entry) holds for ``implementation``, as that kernel's config type
    (``Kernel.config_from``: its own shape, or the older shared block-size shape). A
    kernel this process does not register (an older record of a plugin) keeps its
    fields as stored (``kernels.config.StoredConfig``), so the record still reads.

    Raises:
        ValueError: the fields are illegal for the registered kernel.
    """
    if data is None:
        return None
    if implementation in IMPLEMENTATIONS:
        try:
            kernel = IMPLEMENTATIONS[implementation]
        except ImportError:
            kernel = None  # a plugin entry whose module is gone: keep the record readable
        if kernel is not None:
            return kernel.config_from(data)
    fields = data.fields_set() if isinstance(data, KernelConfig) else dict(data)
    return StoredConfig(**{k: v for k, v in fields.items() if v is not None})


def tuned() -> tuple[str, ...]:
    """Names of the kernels whose tilings the measured GPU table records, registry order."""
    return tuple(n for n, k in IMPLEMENTATIONS.items() if k.tuned)


def ours() -> tuple[str, ...]:
    """Names of our flash kernels (the benchmark summarises them against cuDNN)."""
    return tuple(n for n, k in IMPLEMENTATIONS.items() if k.ours)
