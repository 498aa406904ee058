"""Build a kernel: compile it locally, fingerprint it, export it per target platform.

"Build" (design notes, "Building a kernel") means: lower and compile the kernel
for the local backend, recording compile time and the compiler's memory and cost
analysis; fingerprint the lowered module and the kernel's source; and serialise
it with ``jax.export`` for each target platform it supports (a TPU kernel lowers
for ``tpu`` from any host). Everything lands in one pydantic ``KernelBuild``.

Kept in one module (over 350 lines) because compiling, fingerprinting and exporting
share the same bound function and their results form one ``KernelBuild`` record.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import export as jax_export
from pydantic import BaseModel, Field, field_validator

from kernels.api import IMPLEMENTATIONS, ConfigLike, Resolution, default_backend, resolve
from kernels.config import AnyConfig, KernelConfig
from kernels.contract import validate
from kernels.kernel import Kernel
from kernels.registry import stored_config
from kernels.shapes import AttentionShape

EXPORT_PLATFORMS = ("cpu", "cuda", "tpu")
"""``jax.export`` platform names a build targets by default."""

_BACKEND_OF_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_PATTERNS = ("*.py", "*.json")
"""Files of the kernels package whose content can change what a kernel computes, how
fast it runs or which kernel ``auto`` picks (the selection table ``gpu_table.json`` is
JSON): all of them are fingerprinted, bar ``EXCLUDED_PARTS``."""
EXCLUDED_PARTS = ("__pycache__", "tools")
"""Folders of the package left out of the fingerprint: caches, and ``kernels/tools``
(benchmark, serving benchmark, autotuner, their results and notes), which run kernels
but cannot change one."""


class CompilerMemory(BaseModel):
    """``Compiled.memory_analysis()`` in bytes (``None`` where the backend has no figure)."""

    temp_bytes: int | None = None
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    generated_code_bytes: int | None = None
    peak_bytes: int | None = None


class CompilerCost(BaseModel):
    """``Compiled.cost_analysis()``: XLA's static estimate (not a measurement)."""

    flops: float | None = None
    transcendentals: float | None = None
    bytes_accessed: float | None = None


class LocalCompile(BaseModel):
    """Lowering and compiling for the local backend."""

    backend: str
    native: bool = Field(description="compiled natively, not interpreted")
    lower_time_s: float
    compile_time_s: float
    lowered_sha256: str = Field(description="sha256 of the lowered StableHLO text")
    memory: CompilerMemory
    cost: CompilerCost


class ExportArtifact(BaseModel):
    """One ``jax.export`` serialisation (or why there is none)."""

    platform: str
    status: Literal["exported", "skipped", "failed"]
    reason: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    path: str | None = None


class KernelBuild(BaseModel):
    """Everything one build produced; logged to MLflow as the version's lineage."""

    implementation: str
    resolution: Resolution | None = Field(
        description="how the name resolved on the local backend; None if it cannot run here")
    requested_config: AnyConfig | None = Field(
        description="the config asked for, as the kernel's own type (None: its choice)")
    config: AnyConfig | None = Field(
        description="the config the build ran with (defaults filled in); None: untiled")
    shape: AttentionShape
    with_lengths: bool
    jax_version: str
    jaxlib_version: str
    source_sha256: str = Field(description="sha256 over the per-file digests below")
    source_files: dict[str, str] = Field(
        description="path relative to the kernels package -> sha256, every source file")
    local: LocalCompile | None
    local_skipped_reason: str | None = None
    artifacts: list[ExportArtifact]
    third_party: dict[str, dict[str, str] | None] = Field(
        default_factory=dict, description="distribution -> {distribution, version, sha256} "
        "of the installed third-party code the kernel runs (``Kernel.third_party``), which "
        "the source digest does not cover; None: not installed at build")

    @field_validator("requested_config", "config", mode="before")
    @classmethod
    def _kernels_config(cls, value: Any, info) -> Any:
        # A stored build's JSON is read back as the kernel's own config type; an older
        # build's block sizes (the shape every kernel shared) included.
        if value is None or isinstance(value, KernelConfig) or "implementation" not in info.data:
            return value
        return stored_config(info.data["implementation"], value)

    def artifact(self, platform: str) -> ExportArtifact:
        """The artifact record for ``platform`` (KeyError if it was not a target)."""
        for a in self.artifacts:
            if a.platform == platform:
                return a
        raise KeyError(platform)

    @property
    def ok(self) -> bool:
        """No target failed to export (skipped targets are fine)."""
        return all(a.status != "failed" for a in self.artifacts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_digests(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """sha256 of every source file of the kernels package (``SOURCE_PATTERNS``), keyed
    by path relative to ``package_dir``, leaving out ``EXCLUDED_PARTS`` (the tools). A
    change anywhere else in it (the dispatch in ``api.py`` included) changes the
    build's fingerprint."""
    package_dir = Path(package_dir)
    files = sorted({f for pattern in SOURCE_PATTERNS for f in package_dir.rglob(pattern)
                    if not set(f.relative_to(package_dir).parts) & set(EXCLUDED_PARTS)})
    return {f.relative_to(package_dir).as_posix(): _sha256(f.read_bytes()) for f in files}


def combined_digest(files: dict[str, str]) -> str:
    """One sha256 over ``path sha256`` lines in path order."""
    return _sha256("".join(f"{k} {v}\n" for k, v in sorted(files.items())).encode())


def _memory(compiled) -> CompilerMemory:
    try:
        m = compiled.memory_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
        return CompilerMemory()
    if m is None:
        return CompilerMemory()
    get = lambda name: int(getattr(m, name)) if hasattr(m, name) else None  # noqa: E731
    return CompilerMemory(temp_bytes=get("temp_size_in_bytes"),
                          argument_bytes=get("argument_size_in_bytes"),
                          output_bytes=get("output_size_in_bytes"),
                          alias_bytes=get("alias_size_in_bytes"),
                          generated_code_bytes=get("generated_code_size_in_bytes"),
                          peak_bytes=get("peak_memory_in_bytes"))


def _cost(compiled) -> CompilerCost:
    try:
        cost = compiled.cost_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
        return CompilerCost()
    # Older JAX returned one dict per program, newer a dict.
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return CompilerCost(flops=cost.get("flops"), transcendentals=cost.get("transcendentals"),
                        bytes_accessed=cost.get("bytes accessed"))


def _bound_fn(implementation: str, config: KernelConfig | None, causal: bool,
              with_lengths: bool):
    """A fresh (never cached) function of ``q, k, v[, q_lengths, kv_lengths]``.

    It validates and calls the implementation's kernel directly: whether the
    implementation suits a platform was decided by the caller (for exports, on
    the target platform, not on this host).
    """
    kernel = IMPLEMENTATIONS[implementation].kernel()

    def attention_fn(q, k, v, q_lengths=None, kv_lengths=None):
        spec, q_lengths, kv_lengths = validate(q, k, v, causal=causal, q_lengths=q_lengths,
                                               kv_lengths=kv_lengths)
        return kernel(q, k, v, causal=spec.causal, scale=spec.scale, q_lengths=q_lengths,
                      kv_lengths=kv_lengths, config=config)

    if with_lengths:
        return attention_fn
    return lambda q, k, v: attention_fn(q, k, v)


def _example_args(shape: AttentionShape, with_lengths: bool):
    args = shape.structs()
    if with_lengths:
        lengths = jax.ShapeDtypeStruct((shape.batch,), jnp.int32)
        args = (*args, lengths, lengths)
    return args


@contextlib.contextmanager
def _reproducible_locations():
    """Source locations of the caller's frames (and absolute paths) would make the
    serialised bytes depend on who called ``build`` and where the checkout lives:
    keep one frame per op and only file base names."""
    from jax._src import config as jax_config  # no public context manager for these

    with contextlib.ExitStack() as stack:
        for name, value in (("include_full_tracebacks_in_locations", False),
                            ("hlo_source_file_canonicalization_regex", r".*/")):
            state = getattr(jax_config, name, None)
            if state is not None:
                stack.enter_context(state(value))
        yield


def compile_local(implementation: str, config: KernelConfig | None, shape: AttentionShape,
                  backend: str, native: bool, with_lengths: bool = False) -> LocalCompile:
    """Lower and compile for the local backend; times in seconds, sizes in bytes."""
    jitted = jax.jit(_bound_fn(implementation, config, shape.causal, with_lengths))
    start = time.perf_counter()
    with _reproducible_locations():
        lowered = jitted.lower(*_example_args(shape, with_lengths))
    lower_time = time.perf_counter() - start
    text = lowered.as_text()
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_time = time.perf_counter() - start
    return LocalCompile(backend=backend, native=native, lower_time_s=lower_time,
                        compile_time_s=compile_time, lowered_sha256=_sha256(text.encode()),
                        memory=_memory(compiled), cost=_cost(compiled))


def _export_skip_reason(implementation: str, platform: str, spec, local_backend: str) -> str | None:
    """Why ``implementation`` is not exported for ``platform`` (``None``: export it)."""
    impl = IMPLEMENTATIONS[implementation]
    backend = _BACKEND_OF_PLATFORM.get(platform)
    if backend is None:
        return f"unknown jax.export platform {platform!r}; choose from {sorted(_BACKEND_OF_PLATFORM)}"
    if not impl.is_native(backend):
        return (f"{implementation} is not native on {platform} (native: "
                f"{list(impl.native_platforms)}); it would run interpreted or not at all")
    try:
        impl.check_supported(spec, backend)
    except NotImplementedError as err:
        return str(err)
    if impl.export_needs_local_device and backend != local_backend:
        return (f"{implementation} lowering needs a local {platform} device (it queries the "
                f"library version); this host is {local_backend}")
    if (impl.lowers_at_trace_time and backend != local_backend
            and type(impl).export_context is Kernel.export_context):
        return (f"{implementation} lowers natively or interpreted when traced and declares no "
                f"export_context(platform): from a {local_backend} host it would export its "
                f"interpreter, not the {platform} kernel")
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def export_for(implementation: str, config: KernelConfig | None, shape: AttentionShape,
               platform: str, output_dir: Path | None, local_backend: str,
               with_lengths: bool = False) -> ExportArtifact:
    """Serialise the kernel with ``jax.export`` for one platform.

    The bytes are deterministic for the same source, config, shapes and JAX
    version: the function is traced afresh and ``Exported.serialize()`` carries
    no timestamps. Failures are recorded (``status="failed"``), not raised, so a
    compile failure after a library upgrade is itself a build result.
    """
    spec, _, _ = validate(*shape.structs(), causal=shape.causal)
    reason = _export_skip_reason(implementation, platform, spec, local_backend)
    if reason is not None:
        return ExportArtifact(platform=platform, status="skipped", reason=reason)
    impl = IMPLEMENTATIONS[implementation]
    context = impl.export_context
    # A kernel whose lowering embeds a version-bound custom call (e.g. Triton IR) says
    # which safety checks its export must waive; the waiver is recorded as the reason.
    disabled = impl.export_disabled_checks(platform)
    fn = jax.jit(_bound_fn(implementation, config, shape.causal, with_lengths))
    try:
        with context(platform), _reproducible_locations():
            exported = jax_export.export(fn, platforms=[platform], disabled_checks=disabled)(
                *_example_args(shape, with_lengths))
        data = bytes(exported.serialize())
    except Exception as err:  # noqa: BLE001 - every lowering error is a build result
        return ExportArtifact(platform=platform, status="failed",
                              reason=f"{type(err).__name__}: {err}"[:2000])
    path = None
    if output_dir is not None:
        target = Path(output_dir) / f"{implementation}.{platform}.jax_exported"
        _write_atomic(target, data)
        path = str(target)
    note = (f"exported with disabled safety checks {[str(c) for c in disabled]}: load it with "
            f"the same jaxlib ({jax.__version__})") if disabled else None
    return ExportArtifact(platform=platform, status="exported", reason=note, sha256=_sha256(data),
                          size_bytes=len(data), path=path)


def build(implementation: str, config: ConfigLike, shape: AttentionShape | dict,
          platforms: Sequence[str] = EXPORT_PLATFORMS, *, with_lengths: bool = False,
          output_dir: str | Path | None = None) -> KernelBuild:
    """Compile, fingerprint and export one kernel.

    Args:
        implementation: a registry name or ``"auto"`` (resolved on the local backend).
        config: the config asked for (the kernel's own type, or a mapping of its
            fields: ``kernels.api.ConfigLike``); ``None`` (or unset fields) = the
            kernel's default, filled in and recorded as ``KernelBuild.config``.
        shape: the example problem (``AttentionShape`` or a dict of its fields): shapes,
            dtype and causal flag the build is compiled and exported for.
        platforms: ``jax.export`` platform names ("cpu", "cuda", "rocm", "tpu").
        with_lengths: the compiled/exported function also takes int32 ``[batch]``
            ``q_lengths`` and ``kv_lengths`` (padding); otherwise only ``q, k, v``.
        output_dir: where the serialised artifacts (``{impl}.{platform}.jax_exported``)
            and ``kernel_build.json`` are written; ``None`` writes nothing.

    Returns:
        ``KernelBuild``. A platform the implementation does not support is recorded
        as ``skipped`` with the reason; a lowering error as ``failed``.

    Raises:
        ValueError: unknown implementation, invalid shape or an illegal config.
    """
    shape = AttentionShape.model_validate(shape)
    spec, _, _ = validate(*shape.structs(), causal=shape.causal)
    backend = default_backend()
    name = implementation
    resolution: Resolution | None = None
    local: LocalCompile | None = None
    local_skipped = None
    try:
        resolution = resolve(implementation, spec, backend, config=config)
        name = resolution.name
    except NotImplementedError as err:
        if implementation == "auto":
            raise
        local_skipped = str(err)
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}")
    impl = IMPLEMENTATIONS[name]
    if resolution is None:
        # Not runnable here (e.g. a GPU kernel on a CPU host): the block sizes must still
        # be legal for it, checked on a backend where it exists.
        impl.check_supported(spec, impl.native_platforms[0], config)
    requested = impl.config_from(config)
    resolved = resolution.config if resolution is not None else impl.resolve_config(spec, config)
    if resolution is not None:
        local = compile_local(name, resolved, shape, backend, resolution.native, with_lengths)
    out = Path(output_dir) if output_dir is not None else None
    artifacts = [export_for(name, resolved, shape, p, out, backend, with_lengths)
                 for p in platforms]
    sources = source_digests()
    result = KernelBuild(
        implementation=name, resolution=resolution, requested_config=requested, config=resolved,
        shape=shape, with_lengths=with_lengths, jax_version=jax.__version__,
        jaxlib_version=importlib.metadata.version("jaxlib"),
        source_sha256=combined_digest(sources), source_files=sources, local=local,
        local_skipped_reason=local_skipped, artifacts=artifacts,
        third_party=impl.third_party_code())
    if out is not None:
        _write_atomic(out / "kernel_build.json", result.model_dump_json(indent=2).encode())
    return result
