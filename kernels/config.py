"""The base of every kernel's config type, and the reader of the block sizes older
records hold.

Each tiled kernel declares its own config type next to its code (``Kernel.config_type``:
``kernels.pallas_gpu.TritonConfig``, ``kernels.pallas_mosaic_gpu.MosaicConfig``,
``kernels.pallas_tpu.TpuConfig``); untiled kernels (naive, xla, cudnn) declare none and
refuse any block size rather than silently ignore it. A config type is a frozen pydantic
model that checks itself when it is made (``ValueError`` naming the constraint: TPU tiles
are multiples of 8 x 128, Triton tiles powers of two, ...). Every field may be ``None``,
meaning "the kernel's default for this call": the kernel fills the defaults in with its
``resolve_config(spec, config)``, so lineage always records concrete numbers.

Older records (a version's ``kernelgate.config`` tag, its signed build, ``kernel.json``,
GPU tables of schema 1 and 2) hold the one block-size shape every kernel shared before:
``{"block_q", "block_kv", "num_warps", "num_stages"}`` (unset fields ``null``). They stay
readable: :meth:`KernelConfig.from_fields` maps that shape onto a kernel's own type
(``legacy_names``: a field that is named otherwise now, e.g. Mosaic's K/V ring depth was
``num_stages``; ``legacy_fixed``: a field that only ever recorded a constant, e.g. Mosaic's
12 warps). Importing this module imports neither JAX nor any kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, SerializeAsAny

LEGACY_FIELDS = ("block_q", "block_kv", "num_warps", "num_stages")
"""The fields of the block-size shape every kernel shared before it had its own type."""


class KernelConfig(BaseModel):
    """Base of a kernel's config type: frozen (hashable, so a config can key a cache and
    be a static argument of ``jax.jit``), unknown fields refused.

    Class attributes (declared by each subclass):
        legacy_names: a field of the older shared shape (:data:`LEGACY_FIELDS`) -> the
            field of this type that holds its meaning now.
        legacy_fixed: a field of the older shared shape that only recorded a constant of
            this kernel -> that constant (accepted when it matches, refused otherwise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    legacy_names: ClassVar[Mapping[str, str]] = {}
    legacy_fixed: ClassVar[Mapping[str, Any]] = {}

    def fields_set(self) -> dict[str, Any]:
        """The fields that are set (not ``None``), in declaration order."""
        return self.model_dump(exclude_none=True)

    def is_empty(self) -> bool:
        """True when no field is set (the kernel's defaults apply to everything)."""
        return not self.fields_set()

    def is_complete(self) -> bool:
        """True when every field is set (a resolved config)."""
        return all(v is not None for v in self.model_dump().values())

    def merged_over(self, defaults: Self) -> Self:
        """These values where set, ``defaults`` elsewhere."""
        return defaults.model_copy(update=self.fields_set())

    @classmethod
    def unknown_fields(cls, data: Mapping[str, Any]) -> list[str]:
        """The keys of ``data`` with a value that this type can neither hold nor read as
        an older shape's field."""
        known = {*cls.model_fields, *cls.legacy_names, *cls.legacy_fixed}
        return [k for k, v in data.items() if v is not None and k not in known]

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> Self:
        """The config ``data`` describes: a mapping in this type's own shape, or in the
        older shared block-size shape (``null`` fields are unset; see the module
        docstring). A field given under both its own and its older name keeps its own.

        Raises:
            ValueError: a field this type does not take, a constant of the older shape
                that differs from this kernel's, or a value the type refuses (pydantic's
                ``ValidationError`` is a ``ValueError``).
        """
        values: dict[str, Any] = {}
        legacy: dict[str, Any] = {}
        for key, value in data.items():
            if value is None:
                continue
            if key in cls.model_fields:
                values[key] = value
            elif key in cls.legacy_names:
                legacy[cls.legacy_names[key]] = value
            elif key in cls.legacy_fixed:
                if value != cls.legacy_fixed[key]:
                    raise ValueError(f"{key} is fixed at {cls.legacy_fixed[key]} for this "
                                     f"kernel, got {value}")
            else:
                values[key] = value  # refused by the model (extra="forbid")
        return cls.model_validate({**legacy, **values})


class StoredConfig(KernelConfig):
    """The config of a kernel this process does not register (an older record of a
    kernel added through ``KERNELGATE_KERNELS``, say), kept field by field as it was
    stored, so that the record still reads and prints."""

    model_config = ConfigDict(frozen=True, extra="allow")


AnyConfig = Annotated[KernelConfig, SerializeAsAny()]
"""A field holding some kernel's config: serialised with its own type's fields (pydantic
would otherwise write only the base's, which has none)."""
