"""Shared input generators and accuracy rules for the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from kernels.config import KernelConfig
from kernels.reference import attention_reference, relative_error

F32_TOLERANCE = 2e-6
"""float32 rel. error bound: "well under 1e-5" (the issue) with 5x margin."""
LOW_PRECISION_FACTOR = 2.0
"""bf16/f16: a kernel's error may be at most this multiple of naive's own error."""
LOW_PRECISION_NAIVE_BOUND = {"bfloat16": 2e-2, "float16": 3e-3}
"""Sanity bounds for naive's own error, so the 2x rule cannot pass on a broken baseline."""


@dataclass(frozen=True)
class Case:
    """One attention problem. Sequence lengths are deliberately not block multiples."""

    name: str
    batch: int = 1
    q_len: int = 16
    kv_len: int = 16
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "float32"
    causal: bool = False
    q_lengths: tuple[int, ...] | None = None
    kv_lengths: tuple[int, ...] | None = None
    config: KernelConfig | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name


def random_inputs(case: Case, seed: int = 0, *, q_scale: float = 1.0):
    """Fresh standard-normal q, k, v (never zeros) in ``case.dtype``, plus lengths.

    Returns ``(q, k, v, q_lengths, kv_lengths)``; lengths are int32 arrays or None.
    """
    rng = np.random.default_rng(seed)
    q_shape = (case.batch, case.q_len, case.num_heads, case.head_dim)
    kv_shape = (case.batch, case.kv_len, case.num_kv_heads, case.head_dim)
    q = rng.standard_normal(q_shape) * q_scale
    k = rng.standard_normal(kv_shape)
    v = rng.standard_normal(kv_shape)
    dtype = jnp.dtype(case.dtype)
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    ql = None if case.q_lengths is None else np.asarray(case.q_lengths, np.int32)
    kl = None if case.kv_lengths is None else np.asarray(case.kv_lengths, np.int32)
    return q, k, v, ql, kl


def reference_for(q, k, v, case: Case, ql=None, kl=None) -> np.ndarray:
    """The float64 reference on exactly the (already rounded) inputs the kernel saw."""
    return attention_reference(q, k, v, causal=case.causal, q_lengths=ql, kv_lengths=kl)


def assert_accurate(out, ref, dtype: str, naive_error: float | None = None) -> float:
    """The issue's accuracy rule; returns the rel. error.

    float32: below ``F32_TOLERANCE``. bf16/f16: at most ``LOW_PRECISION_FACTOR`` x the
    naive baseline's own error on the same inputs. Pass ``naive_error=None`` for the
    naive baseline itself: a ratio to its own error would always hold, so it is held to
    the absolute bound ``LOW_PRECISION_NAIVE_BOUND`` instead. Always finite.
    """
    out = np.asarray(out, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output on finite input"
    err = relative_error(out, ref)
    if dtype == "float32":
        assert err < F32_TOLERANCE, f"float32 rel. error {err:.3e} >= {F32_TOLERANCE}"
    elif naive_error is None:
        assert err < LOW_PRECISION_NAIVE_BOUND[dtype], f"baseline {dtype} error {err:.3e}"
    else:
        assert naive_error < LOW_PRECISION_NAIVE_BOUND[dtype], f"naive {dtype} error {naive_error}"
        # Where naive is (nearly) exact, a floor of one unit of the dtype's rounding
        # keeps the ratio meaningful.
        floor = float(jnp.finfo(jnp.dtype(dtype)).eps) / 4
        bound = LOW_PRECISION_FACTOR * max(naive_error, floor)
        assert err <= bound, f"{dtype} rel. error {err:.3e} > {LOW_PRECISION_FACTOR} x naive {naive_error:.3e}"
    return err


def mosaic_module_text(monkeypatch, fn, *args) -> tuple[str, str]:
    """``(lowered, module)``: the text of ``fn(*args)`` lowered for CUDA (on any host), and
    the Mosaic GPU module in it as text without locations (the serialized module carries
    source lines, which any edit of a file moves), captured where Mosaic GPU serializes
    it. Exactly one kernel."""
    lowered, modules = mosaic_module_texts(monkeypatch, fn, *args)
    assert len(modules) == 1, f"{len(modules)} Mosaic GPU modules, expected one"
    return lowered, modules[0]


def mosaic_module_texts(monkeypatch, fn, *args) -> tuple[str, list[str]]:
    """:func:`mosaic_module_text` for any number of kernels: their modules in launch order."""
    import jax
    import jax.experimental.mosaic.gpu.core as mgpu_core

    texts: list[str] = []
    serde = mgpu_core._run_serde_pass

    def capture(module, *a, **kw):
        if kw.get("serialize"):
            texts.append(module.operation.get_asm(enable_debug_info=False))
        return serde(module, *a, **kw)

    monkeypatch.setattr(mgpu_core, "_run_serde_pass", capture)
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return lowered, texts
