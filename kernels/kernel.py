"""The kernel contract as a type: one ``Kernel`` subclass per implementation.

Every implementation (naive, xla, cudnn, pallas_tpu, pallas_gpu, pallas_mosaic_gpu)
declares one subclass of :class:`Kernel` in its own module, next to its code, and that
class is all there is to know about it: its config type (``Kernel[ConfigT]``), its default
config for a call, its autotuning candidates, its support check, its place in ``auto``'s
order, its export hooks. The registry (``kernels.registry``) lists the classes; selection,
build, the tools and the CLI read what a class declares instead of lists of names. The
attributes are class-level declarations (``ClassVar``); a kernel is used through one
instance, which is callable as the kernel itself.

Importing this module imports neither JAX nor a kernel (the CLI reads the registry before
JAX is loaded); a method that needs JAX imports it when it runs. A kernel module may
import heavy, platform-only libraries inside its call (as ``pallas_mosaic_gpu`` does):
declaring the class costs a CPU host nothing. Kept whole (over 350 lines): a kernel's
declarations (:class:`Capability` and :class:`Kernel`) are read in one place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import ValidationError

from kernels.config import KernelConfig

if TYPE_CHECKING:
    import jax

    from kernels.contract import AttentionSpec
    from kernels.shapes import AttentionShape

ConfigT = TypeVar("ConfigT", bound=KernelConfig)
BACKENDS = ("cpu", "gpu", "tpu")


def round_up(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple`` (both positive ints)."""
    return -(-x // multiple) * multiple


def dtype_name(dtype: Any) -> str:
    """The name of ``dtype`` (a name, a NumPy/JAX dtype or scalar type): "bfloat16"."""
    if isinstance(dtype, str):
        return dtype
    import jax.numpy as jnp

    return jnp.dtype(dtype).name


@dataclass(frozen=True)
class Capability:
    """The calls a kernel can run, whatever the backend.

    Attributes:
        dtypes: input dtype names it runs ("float32", "bfloat16", "float16").
        max_head_dim: largest head_dim (``None``: no limit).
        head_dim_multiple: head_dim must be a multiple of this (1: any).
        causal_needs_square: causal calls only with ``q_len == kv_len``.
        causal_with_lengths: causal calls with ``q_lengths``/``kv_lengths`` too.
    """

    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    max_head_dim: int | None = None
    head_dim_multiple: int = 1
    causal_needs_square: bool = False
    causal_with_lengths: bool = True

    def refusal(self, dtype: Any, head_dim: int) -> str | None:
        """Why a call of ``dtype`` and ``head_dim`` is outside this capability, or None."""
        name = dtype_name(dtype)
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


def distribution_record(name: str) -> dict[str, str] | None:
    """The installed distribution ``name`` as a build records it: ``{"distribution",
    "version", "sha256"}``, the sha256 over its installed files' own sha256 (sorted ``path
    digest`` lines, bar ``.dist-info`` and bytecode, which an installer writes itself),
    or ``None`` when it is not installed. Reads every file (~115 MB for flash-attn3-jax)."""
    import hashlib
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    lines = [f"{f.as_posix()} {hashlib.sha256(Path(str(f.locate())).read_bytes()).hexdigest()}"
             for f in sorted(dist.files or (), key=str) if ".dist-info" not in str(f)
             and f.suffix != ".pyc" and Path(str(f.locate())).is_file()]
    return {"distribution": dist.metadata["Name"], "version": dist.version,
            "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}


def _validation_message(err: ValidationError) -> str:
    """pydantic's errors as one line: the constraint each field broke."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        cause = e.get("ctx", {}).get("error")
        text = str(cause) if cause is not None else e["msg"]
        parts.append(text if where and where in text else f"{where}: {text}" if where else text)
    return "; ".join(parts)


class Kernel(Generic[ConfigT]):
    """One attention implementation behind the contract of ``kernels.attention``.

    ``Kernel[ConfigT]`` is generic over its config type: ``class K(Kernel[MyConfig])``
    declares ``config_type = MyConfig`` (a :class:`kernels.config.KernelConfig`); an
    untiled kernel subclasses plain ``Kernel`` and takes no config.

    Class attributes (declared by each subclass):
        name: registry key.
        description: one line for people.
        native_platforms: backends ("cpu", "gpu", "tpu") where it is compiled natively;
            elsewhere it runs interpreted or not at all (``check_supported`` says).
        capability: the dtypes and head_dims it can run (:class:`Capability`).
        config_type: its config type (``None``: untiled; it refuses any block size
            rather than ignore it).
        forward: the kernel function, ``fn(q, k, v, *, causal, scale, q_lengths,
            kv_lengths, config)`` (a ``staticmethod``), which calling the kernel runs; a
            kernel may override ``__call__`` instead.
        auto_priority: backend -> its rank in ``auto``'s fallback order there (lower is
            tried first; ties keep registry order); a backend it does not name never
            runs it under ``auto`` (``kernels.api.auto_order``).
        rollout_default_on: the backends whose rollouts build it for ``auto`` (the flash
            kernel of that backend, ``kernels.api.native_flash``).
        float32_matmul_precision: the ``jax.lax.Precision`` of its float32 matrix
            products on every backend (``"highest"``: full float32), or ``None`` when it
            runs no float32 call.
        operand_dtype: the dtype its matrix products take their operands in where that
            is narrower than the call's (``"float8_e4m3fn"``: q, k, v and the softmax's
            weights quantised before each product), or ``None``: the call's dtype. What
            the narrower operands cost in accuracy is a registration's to judge; the
            kernel tests bound its error by this dtype, not the call's.
        trace_name: the name its kernel carries in HLO and profiler traces, or ``None``.
        tuned: its tilings come from the measured GPU table (``kernels.selection``) and
            the autotuner searches its :meth:`candidate_configs`.
        ours: one of our flash kernels, summarised against cuDNN by the benchmark.
        lowers_at_trace_time: it picks native vs interpreted lowering when traced, so
            exporting for another platform needs :meth:`export_context`.
        export_needs_local_device: its lowering queries the target device (so it
            exports only from a host that has one).
        variant_fields: the names of its variant switches (techniques a benchmark
            switches on one at a time, e.g. ``kernels.mosaic_variants.MosaicVariant``);
            the registered kernel always runs their defaults.
        third_party: the installed distributions whose code it runs and the code digest
            does not cover (a wheel's compiled library): a build records each
            (:meth:`third_party_code`), a version's runner refuses other bytes
            (:meth:`check_third_party`).
        concurrent_first_call: its first calls (compile, or load from the persistent
            compilation cache, then run) may overlap other threads' compiles and loads.
            ``False`` (cuDNN): whoever warms many shapes at once warms them one at a time
            (``evaluation.accuracy.precompile``). On an H100 (JAX 0.11.2), eight threads
            loading cached cuDNN attention programs crashed the process or failed cuDNN's
            graph deserialization in 6 of 6 processes, one thread in 0 of 9; a lock around
            cuDNN's own first calls alone still failed 4 of 5
            (``tools.cache_load_race``).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    native_platforms: ClassVar[tuple[str, ...]]
    capability: ClassVar[Capability] = Capability()
    config_type: ClassVar[type[KernelConfig] | None] = None
    forward: ClassVar[Callable[..., Any] | None] = None
    auto_priority: ClassVar[Mapping[str, int]] = {}
    rollout_default_on: ClassVar[tuple[str, ...]] = ()
    float32_matmul_precision: ClassVar[str | None] = None
    operand_dtype: ClassVar[str | None] = None
    trace_name: ClassVar[str | None] = None
    tuned: ClassVar[bool] = False
    ours: ClassVar[bool] = False
    lowers_at_trace_time: ClassVar[bool] = False
    export_needs_local_device: ClassVar[bool] = False
    variant_fields: ClassVar[tuple[str, ...]] = ()
    third_party: ClassVar[tuple[str, ...]] = ()
    concurrent_first_call: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_type" not in cls.__dict__:
            for base in getattr(cls, "__orig_bases__", ()):
                args = get_args(base) if get_origin(base) is Kernel else ()
                if args and isinstance(args[0], type) and issubclass(args[0], KernelConfig):
                    cls.config_type = args[0]
        unknown = set(cls.auto_priority) - set(BACKENDS)
        if unknown:
            raise TypeError(f"{cls.__qualname__}.auto_priority names unknown backends "
                            f"{sorted(unknown)}; choose from {BACKENDS}")

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                 scale: float, q_lengths: jax.Array | None, kv_lengths: jax.Array | None,
                 config: ConfigT | None = None) -> jax.Array:
        """The kernel on validated inputs: q ``[batch, q_len, num_heads, head_dim]``,
        k/v ``[batch, kv_len, num_kv_heads, head_dim]`` (same dtype), int32 ``[batch]``
        lengths or None; returns ``[batch, q_len, num_heads, head_dim]`` in q's dtype
        (rows that see no key are 0). ``config`` is resolved (untiled kernels: None).

        Raises:
            NotImplementedError: the class declares no ``forward``.
        """
        forward = type(self).forward
        if forward is None:
            raise NotImplementedError(f"{self.name} declares no forward and no __call__")
        return forward(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                       kv_lengths=kv_lengths, config=config)

    @property
    def tiled(self) -> bool:
        """Whether it takes a config (it declares a ``config_type``)."""
        return self.config_type is not None

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The fields of its config type (empty: untiled)."""
        return tuple(self.config_type.model_fields) if self.config_type is not None else ()

    def is_native(self, backend: str) -> bool:
        """Whether it compiles natively on ``backend`` ("cpu", "gpu", "tpu")."""
        return backend in self.native_platforms

    def config_from(self, data: KernelConfig | Mapping[str, Any] | None) -> ConfigT | None:
        """Its config from ``data``: ``None``; an instance of its config type (returned
        as is); another kernel's config or a mapping, read field by field (its own
        field names, or the older shared block-size shape stored records hold:
        :meth:`kernels.config.KernelConfig.from_fields`). Unset fields stay unset.

        Raises:
            ValueError: an untiled kernel given any block size; a field its config type
                does not take; a value its config type refuses (the message names the
                constraint).
        """
        if data is None:
            return None
        if self.config_type is not None and isinstance(data, self.config_type):
            return data
        fields = (data.fields_set() if isinstance(data, KernelConfig)
                  else {k: v for k, v in dict(data).items() if v is not None})
        if self.config_type is None:
            if fields:
                raise ValueError(f"{self.name} has no block sizes (it does not tile); "
                                 f"got {fields}")
            return None
        extra = self.config_type.unknown_fields(fields)
        if extra:
            raise ValueError(f"{self.name} takes block sizes {list(self.config_fields)}, "
                             f"not {extra}")
        try:
            return self.config_type.from_fields(fields)
        except ValueError as err:  # pydantic's ValidationError included
            why = _validation_message(err) if isinstance(err, ValidationError) else str(err)
            raise ValueError(why if why.startswith(self.name) else f"{self.name}: {why}") from None

    def check_supported(self, spec: AttentionSpec, backend: str,
                        config: KernelConfig | Mapping[str, Any] | None = None) -> None:
        """Raise when it cannot run ``spec`` on ``backend`` with ``config``. The default
        checks the capability and reads the config (:meth:`config_from`).

        Raises:
            NotImplementedError: the call is outside ``capability`` (the reason says why).
            ValueError: ``config`` is illegal for this kernel.
        """
        del backend
        why = self.capability.refusal(spec.dtype, spec.head_dim)
        if why is not None:
            raise NotImplementedError(f"{self.name} {why}")
        self.config_from(config)

    def default_config(self, head_dim: int) -> ConfigT | None:
        """Its documented default config at ``head_dim`` before any fitting to a call
        (``None``: untiled). Tiled kernels declare it.

        Raises:
            NotImplementedError: a tiled kernel that declares none.
        """
        if self.tiled:
            raise NotImplementedError(f"{self.name} is tiled but declares no default_config")
        return None

    def resolve_config(self, spec: AttentionSpec,
                       config: KernelConfig | Mapping[str, Any] | None = None
                       ) -> ConfigT | None:
        """The complete config a call of ``spec`` runs with: ``config``'s fields where
        set, :meth:`default_config` elsewhere (``None`` for untiled kernels).

        Raises:
            ValueError: ``config`` is illegal for this kernel (:meth:`config_from`).
        """
        config = self.config_from(config)
        if not self.tiled:
            return None
        return (config or self.config_type()).merged_over(self.default_config(spec.head_dim))

    def candidate_configs(self, shape: AttentionShape, quick: bool = False) -> list[ConfigT]:
        """The configs the autotuner tries on ``shape`` (``quick``: a few small ones for
        a CPU run), the default first. The default: its resolved default only."""
        from kernels.contract import validate

        spec, _, _ = validate(*shape.structs(), causal=shape.causal)
        return [self.resolve_config(spec, None)]

    def refined_candidates(self, tried: Sequence[tuple[ConfigT, float | None]],
                           shape: AttentionShape, quick: bool = False) -> list[ConfigT]:
        """A second autotuning pass around the first's results (``tried``: each config
        with its TFLOP/s, ``None`` where it failed); the default: none."""
        del tried, shape, quick
        return []

    def fit_to_device(self, config: ConfigT, shape: AttentionShape
                      ) -> tuple[ConfigT | None, str]:
        """A measured config (the GPU table's, for the nearest measured shape) adapted
        to a call of ``shape`` on this device: the config to run (``None``: none fits)
        and a note saying what was changed and why ("" when nothing was). The default
        runs it unchanged."""
        del shape
        return config, ""

    def export_context(self, platform: str) -> contextlib.AbstractContextManager:
        """The context ``kernels.build`` exports under for a ``jax.export`` platform."""
        del platform
        return contextlib.nullcontext()

    def export_disabled_checks(self, platform: str) -> list:
        """``jax.export`` safety checks its export for ``platform`` must waive."""
        del platform
        return []

    def third_party_code(self) -> dict[str, dict[str, str] | None]:
        """Each distribution of ``third_party`` -> its record as installed here
        (:func:`distribution_record`; ``None``: not installed)."""
        return {name: distribution_record(name) for name in self.third_party}

    def check_third_party(self, recorded: Mapping[str, Any] | None) -> None:
        """Refuse to run a version whose build recorded other third-party code than is
        installed here (``recorded``: the build's :meth:`third_party_code`; ``None``, an
        older record, counts as nothing recorded).

        Raises:
            RuntimeError: a distribution's name, version or sha256 differs, or it is
                missing here or in the record (the message gives both).
        """
        installed = self.third_party_code()
        for name in self.third_party:
            built = (recorded or {}).get(name)
            if built != installed[name]:
                raise RuntimeError(f"{self.name} runs {name}: the version was built with "
                                   f"{built}, this host has {installed[name]}")

    def kernel(self) -> Kernel:
        """The callable ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths, config)``."""
        return self

    def __repr__(self) -> str:
        return f"<kernel {self.name}: {type(self).__module__}.{type(self).__qualname__}>"
