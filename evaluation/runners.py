"""Runners: where an implementation under evaluation executes.

Evaluation, shadow and canary talk to every implementation through one small
interface (:class:`Runner`): attention on given arrays, embeddings of documents, and a
prepared, compiled attention call that can be timed. :class:`LocalRunner` runs a
kernel of this process (the naive baseline, a plain function in a test); a registered
model version runs in a process of its own that loaded *its* code
(``lineage.serving.version_runners.VersionWorker``, same interface), so two versions with different
kernel code can run side by side.

Every timing is taken inside the runner around a call that blocks until the device is
done, so the transport to a version's process never enters a latency.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import jax
import numpy as np

import kernels
from evaluation.model import MiniLM
from kernels.api import AttentionFn, ConfigLike
from kernels.shapes import AttentionShape, random_inputs
from kernels.timing import compiler_peak_bytes


@runtime_checkable
class Runner(Protocol):
    """What evaluation needs from an implementation (see the module docstring).

    Attributes:
        name: what runs (e.g. ``naive``, ``pallas_tpu@v3``).
    """

    name: str

    def __call__(self, q, k, v, *, causal: bool, scale: float | None, q_lengths=None,
                 kv_lengths=None) -> np.ndarray:
        """Attention on host arrays (the contract of ``kernels.attention``); returns
        ``[batch, q_len, num_heads, head_dim]`` as a NumPy array. Raises what the
        kernel raises."""

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, float]:
        """Sentence embeddings ``[len(texts), 384]`` float32 and the seconds the
        call took inside the runner."""

    def compile_for(self, shape: AttentionShape, seed: int) -> tuple[float, int | None]:
        """Draw random inputs of ``shape`` (``kernels.shapes.random_inputs(shape,
        seed)``), compile attention for them ahead of time and keep both. Returns
        ``(compile seconds, compiler's peak-memory estimate in bytes or None)``."""

    def call_compiled(self, shape: AttentionShape) -> float:
        """Run the call prepared by ``compile_for(shape)`` once; seconds, device
        synchronised."""

    def memory_stats(self) -> dict | None:
        """The device allocator's statistics in the runner's process (``None`` where
        the backend keeps none, e.g. the CPU)."""

    def describe(self) -> dict:
        """What runs, as the fields of ``evaluation.report.ImplementationInfo`` other
        than ``role`` and ``name``: ``implementation``, ``config``, ``resolution``,
        ``native``, ``target_platform``, and where known ``float32_matmul_precision``
        and ``runtime_fallbacks``."""


class LocalRunner:
    """An ``AttentionFn`` of this process as a :class:`Runner`.

    Args:
        name: what runs.
        attention_fn: ``fn(q, k, v, *, causal, scale, q_lengths, kv_lengths)``; jitted
            or traceable (``compile_for`` wraps it in ``jax.jit``).
        model: the encoder for ``embed`` (``None``: ``embed`` raises).
        description: ``describe()``'s answer (default: a plain callable, native here).
    """

    def __init__(self, name: str, attention_fn: AttentionFn, model: MiniLM | None = None,
                 description: dict | None = None):
        self.name = name
        self.attention_fn = attention_fn
        self.model = model
        self._description = description or {
            "implementation": None, "config": None, "resolution": None, "native": True,
            "target_platform": kernels.default_backend()}
        self._prepared: dict[AttentionShape, tuple] = {}

    @classmethod
    def for_implementation(cls, implementation: str, config: ConfigLike = None,
                           model: MiniLM | None = None) -> LocalRunner:
        """A registry implementation of this process's ``kernels`` package (resolved on
        this backend; ``auto`` names what it resolved to).

        Raises:
            ValueError: unknown implementation, or a config illegal for its kernel.
        """
        backend = kernels.default_backend()
        resolution = kernels.resolve(implementation, backend=backend)
        registry = kernels.IMPLEMENTATIONS[resolution.name]
        config = registry.config_from(config)  # its own config type (ValueError: illegal)
        target = backend if resolution.native else registry.native_platforms[0]
        return cls(resolution.name, kernels.get_attention_fn(implementation, config), model, {
            "implementation": resolution.name,
            "config": config.fields_set() if config is not None else None,
            "resolution": resolution.model_dump(mode="json"), "native": resolution.native,
            "target_platform": target,
            "float32_matmul_precision": registry.float32_matmul_precision})

    def describe(self) -> dict:
        # kernels.dispatch records, per call shape, what auto skipped for want of a
        # device resource; read live, since it grows with the calls.
        return {**self._description,
                "runtime_fallbacks": dict(getattr(self.attention_fn, "fallbacks", {}))}

    def __call__(self, q, k, v, *, causal: bool, scale: float | None, q_lengths=None,
                 kv_lengths=None) -> np.ndarray:
        lengths = {n: None if x is None else jax.numpy.asarray(x)
                   for n, x in (("q_lengths", q_lengths), ("kv_lengths", kv_lengths))}
        out = self.attention_fn(jax.numpy.asarray(q), jax.numpy.asarray(k),
                                jax.numpy.asarray(v), causal=causal, scale=scale, **lengths)
        return np.asarray(jax.block_until_ready(out))

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, float]:
        if self.model is None:
            raise RuntimeError(f"runner {self.name} has no encoder model to embed with")
        start = time.perf_counter()
        out = self.model.embed(list(texts), attention_fn=self.attention_fn)
        return out, time.perf_counter() - start

    def compile_for(self, shape: AttentionShape, seed: int) -> tuple[float, int | None]:
        q, k, v = random_inputs(shape, seed)

        lengths = shape.kv_lengths()  # a shape with a fill: its padding masked, as served

        def call(q, k, v):
            return self.attention_fn(q, k, v, causal=shape.causal, scale=None, q_lengths=None,
                                     kv_lengths=lengths)

        start = time.perf_counter()
        compiled = jax.jit(call).lower(q, k, v).compile()
        seconds = time.perf_counter() - start
        self._prepared[shape] = (compiled, (q, k, v))
        return seconds, compiler_peak_bytes(compiled)

    def call_compiled(self, shape: AttentionShape) -> float:
        compiled, args = self._prepared[shape]
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        return time.perf_counter() - start

    def memory_stats(self) -> dict | None:
        try:
            return jax.devices()[0].memory_stats()
        except Exception:  # noqa: BLE001 - CPU and some plugins keep no statistics
            return None
