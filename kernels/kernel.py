"""The kernel contract as a type: one ``Kernel`` subclass per implementation.

Every implementation (naive, xla, cudnn, pallas_tpu, pallas_gpu, pallas_mosaic_gpu)
declares one subclass of :class:`Kernel` in its own module, next to its code; the
registry (``kernels.registry``) lists them, and selection, build, the tools and the CLI
read what the class declares (capability, config fields, precision, trace name, whether
the GPU table tunes it, whether the benchmark counts it as ours) instead of a list of
names. The attributes are class-level declarations (``ClassVar``); a kernel is used
through one instance, which is callable as the kernel itself.

A kernel module may import heavy, platform-only libraries inside its call (as
``pallas_mosaic_gpu`` does): declaring the class costs a CPU host nothing.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from kernels.config import BlockSizes, refuse_block_sizes
from kernels.contract import AttentionSpec

BLOCK_SIZE_FIELDS = tuple(BlockSizes.model_fields)
"""Every field of ``BlockSizes`` (block_q, block_kv, num_warps, num_stages)."""


def round_up(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple`` (both positive ints)."""
    return -(-x // multiple) * multiple


@dataclass(frozen=True)
class Capability:
    """The calls a kernel can run, whatever the backend.

    Attributes:
        dtypes: input dtype names it runs ("float32", "bfloat16", "float16").
        max_head_dim: largest head_dim (``None``: no limit).
        head_dim_multiple: head_dim must be a multiple of this (1: any).
    """

    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    max_head_dim: int | None = None
    head_dim_multiple: int = 1

    def refusal(self, dtype: Any, head_dim: int) -> str | None:
        """Why a call of ``dtype`` and ``head_dim`` is outside this capability, or None."""
        name = jnp.dtype(dtype).name
        if name not in self.dtypes:
            return f"supports dtypes {self.dtypes}, got {name}"
        if self.max_head_dim is not None and head_dim > self.max_head_dim:
            return f"supports head_dim <= {self.max_head_dim}, got {head_dim}"
        if head_dim % self.head_dim_multiple:
            return f"needs head_dim a multiple of {self.head_dim_multiple}, got {head_dim}"
        return None

    def allows(self, dtype: Any, head_dim: int) -> bool:
        """Whether a call of ``dtype`` (a dtype or its name) and ``head_dim`` is inside."""
        return self.refusal(dtype, head_dim) is None


class Kernel(abc.ABC):
    """One attention implementation behind the contract of ``kernels.attention``.

    Class attributes (declared by each subclass):
        name: registry key.
        description: one line for people.
        native_platforms: backends ("cpu", "gpu", "tpu") where it is compiled natively;
            elsewhere it runs interpreted or not at all (``check_supported`` says).
        capability: the dtypes and head_dims it can run (:class:`Capability`).
        config_fields: the ``BlockSizes`` fields it takes (empty: untiled, it refuses
            any block size rather than ignore it).
        float32_matmul_precision: the ``jax.lax.Precision`` of its float32 matrix
            products on every backend (``"highest"``: full float32), or ``None`` when it
            runs no float32 call.
        trace_name: the name its kernel carries in HLO and profiler traces, or ``None``.
        tuned: its tilings come from the measured GPU table (``kernels.selection``).
        ours: one of our flash kernels, summarised against cuDNN by the benchmark.
        lowers_at_trace_time: it picks native vs interpreted lowering when traced, so
            exporting for another platform needs :meth:`export_context`.
        export_needs_local_device: its lowering queries the target device (so it
            exports only from a host that has one).
        variant_fields: the names of its variant switches (techniques a benchmark
            switches on one at a time, e.g. ``kernels.mosaic_variants.MosaicVariant``);
            the registered kernel always runs their defaults.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    native_platforms: ClassVar[tuple[str, ...]]
    capability: ClassVar[Capability] = Capability()
    config_fields: ClassVar[tuple[str, ...]] = ()
    float32_matmul_precision: ClassVar[str | None] = None
    trace_name: ClassVar[str | None] = None
    tuned: ClassVar[bool] = False
    ours: ClassVar[bool] = False
    lowers_at_trace_time: ClassVar[bool] = False
    export_needs_local_device: ClassVar[bool] = False
    variant_fields: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                 scale: float, q_lengths: jax.Array | None, kv_lengths: jax.Array | None,
                 config: BlockSizes | None = None) -> jax.Array:
        """The kernel on validated inputs: q ``[batch, q_len, num_heads, head_dim]``,
        k/v ``[batch, kv_len, num_kv_heads, head_dim]`` (same dtype), int32 ``[batch]``
        lengths or None; returns ``[batch, q_len, num_heads, head_dim]`` in q's dtype
        (rows that see no key are 0). ``config`` is resolved (untiled kernels: None)."""

    @property
    def tiled(self) -> bool:
        """Whether it takes block sizes (``config_fields`` is not empty)."""
        return bool(self.config_fields)

    def is_native(self, backend: str) -> bool:
        """Whether it compiles natively on ``backend`` ("cpu", "gpu", "tpu")."""
        return backend in self.native_platforms

    def check_block_sizes(self, config: BlockSizes) -> None:
        """Raise ``ValueError`` naming the constraint ``config`` breaks whatever the call.
        The default: an untiled kernel refuses any block size; a tiled one refuses a
        field outside ``config_fields``. Subclasses add their own constraints."""
        if not self.tiled:
            refuse_block_sizes(self.name, config)
            return
        extra = [f for f, v in config.model_dump().items()
                 if v is not None and f not in self.config_fields]
        if extra:
            raise ValueError(f"{self.name} takes block sizes {list(self.config_fields)}, "
                             f"not {extra}")

    def check_config(self, config: BlockSizes | None) -> None:
        """:meth:`check_block_sizes` when block sizes were given (``ValueError``)."""
        if config is not None:
            self.check_block_sizes(config)

    def check_supported(self, spec: AttentionSpec, backend: str,
                        config: BlockSizes | None = None) -> None:
        """Raise when it cannot run ``spec`` on ``backend`` with ``config``. The default
        checks the capability and the block sizes.

        Raises:
            NotImplementedError: the call is outside ``capability`` (the reason says why).
            ValueError: ``config`` is illegal for this kernel.
        """
        del backend
        why = self.capability.refusal(spec.dtype, spec.head_dim)
        if why is not None:
            raise NotImplementedError(f"{self.name} {why}")
        self.check_config(config)

    def check(self, spec: AttentionSpec, backend: str, config: BlockSizes | None = None) -> None:
        """Alias of :meth:`check_supported` (the registry's historical name)."""
        self.check_supported(spec, backend, config)

    def resolve_config(self, spec: AttentionSpec, config: BlockSizes | None) -> BlockSizes | None:
        """The concrete block sizes a call runs with (``None`` for untiled kernels).
        Tiled kernels override it to fill in their defaults."""
        del spec
        if self.tiled:
            raise NotImplementedError(f"{self.name} is tiled but declares no resolve_config")
        return None

    def export_context(self, platform: str) -> contextlib.AbstractContextManager:
        """The context ``kernels.build`` exports under for a ``jax.export`` platform."""
        del platform
        return contextlib.nullcontext()

    def export_disabled_checks(self, platform: str) -> list:
        """``jax.export`` safety checks its export for ``platform`` must waive."""
        del platform
        return []

    def kernel(self) -> Kernel:
        """The callable ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths, config)``."""
        return self

    def __repr__(self) -> str:
        return f"<kernel {self.name}: {type(self).__module__}.{type(self).__qualname__}>"
