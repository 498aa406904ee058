"""The real server of a replay: one encoder and one attention implementation on one device.

``EncoderServer(encoder, attention_fn)`` is a ``loadgen.ServeFn``: for each batch it
builds the padded token ids (synthetic documents, seeded per request id, so every kernel
sees the same ones), compiles the batch's shape once (outside any measured time:
``compile_s``; then one untimed warm run), and measures the batch for real: the
host-to-device copy of the ids, the forward, and ``jax.block_until_ready`` on the
result, with ``time.perf_counter``. An exception in a batch is reported as that batch's
error (its requests fail), never raised: errors under load are a figure.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from evaluation.longdoc.batcher import Batch
from evaluation.longdoc.encoder import LongDocEncoder, encode_jit
from evaluation.longdoc.loadgen import BatchOutcome
from kernels.api import AttentionFn
from kernels.timing import compiler_peak_bytes


def device_peak_bytes() -> tuple[int | None, str]:
    """The default device's peak memory in use (bytes) and a note saying where it came
    from, or ``None`` and why (a CPU host's runtime reports none)."""
    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception as err:  # noqa: BLE001 - backends without memory stats raise
        return None, f"{device.platform}: the runtime reports no memory stats ({err})"
    if not stats or "peak_bytes_in_use" not in stats:
        return None, f"{device.platform}: the runtime reports no peak memory"
    return int(stats["peak_bytes_in_use"]), (
        f"{device.platform}: peak_bytes_in_use since the process started (process-wide)")


class EncoderServer:
    """Serves batches with ``encoder`` and ``attention_fn`` (see the module docstring).

    Attributes:
        compile_s: seconds spent compiling and warming new shapes (never measured time).
        compiled_peak_bytes: the largest compiled program's memory (XLA's analysis), or
            ``None`` where the backend has none.
        outputs: request id -> float32 ``[hidden]`` embedding (when ``keep_outputs``).
    """

    def __init__(self, encoder: LongDocEncoder, attention_fn: AttentionFn, *,
                 ids_seed: int = 0, keep_outputs: bool = True):
        self.encoder = encoder
        self.attention_fn = attention_fn
        self.ids_seed = ids_seed
        self.keep_outputs = keep_outputs
        self.compile_s = 0.0
        self.compiled_peak_bytes: int | None = None
        self.outputs: dict[int, np.ndarray] = {}
        self._compiled: dict[tuple[int, int], object] = {}  # a program or its error

    def batch_inputs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids ``[rows, bucket]`` (zeros past each length) and lengths ``[rows]``;
        rows past the batch's requests repeat its last document."""
        reqs = list(batch.requests) + [batch.requests[-1]] * (batch.rows - len(batch.requests))
        ids = np.zeros((batch.rows, batch.bucket), dtype=np.int32)
        for row, r in zip(ids, reqs, strict=True):
            row[: r.tokens] = self.encoder.document_ids(r.id, r.tokens, self.ids_seed)
        return ids, np.array([r.tokens for r in reqs], dtype=np.int32)

    def _program(self, ids: np.ndarray, lengths: np.ndarray):
        """The compiled forward of this batch shape (compiled and warmed once); a shape
        that failed to compile raises its first error again without recompiling."""
        key = ids.shape
        if isinstance(self._compiled.get(key), Exception):
            raise self._compiled[key]
        if key not in self._compiled:
            t0 = time.perf_counter()
            try:
                compiled = encode_jit.lower(self.encoder.params, ids, lengths,
                                            attention_fn=self.attention_fn,
                                            spec=self.encoder.spec).compile()
                jax.block_until_ready(compiled(self.encoder.params, jnp.asarray(ids),
                                               jnp.asarray(lengths)))
            except Exception as err:  # noqa: BLE001 - kept: every batch of it fails alike
                self._compiled[key] = err
                raise
            finally:
                self.compile_s += time.perf_counter() - t0
            peak = compiler_peak_bytes(compiled)
            if peak is not None:
                self.compiled_peak_bytes = max(peak, self.compiled_peak_bytes or 0)
            self._compiled[key] = compiled
        return self._compiled[key]

    def __call__(self, batch: Batch) -> BatchOutcome:
        ids, lengths = self.batch_inputs(batch)
        try:
            program = self._program(ids, lengths)
        except Exception as err:  # noqa: BLE001 - a failure under load is a figure
            return BatchOutcome(0.0, None, f"compile: {type(err).__name__}: {err}"[:500])
        t0 = time.perf_counter()
        try:
            out = program(self.encoder.params, jnp.asarray(ids), jnp.asarray(lengths))
            out = jax.block_until_ready(out)
        except Exception as err:  # noqa: BLE001 - a failure under load is a figure
            return BatchOutcome(time.perf_counter() - t0, None,
                                f"{type(err).__name__}: {err}"[:500])
        service = time.perf_counter() - t0
        host = np.asarray(out, dtype=np.float32)[: len(batch.requests)]
        if self.keep_outputs:
            for r, row in zip(batch.requests, host, strict=True):
                self.outputs[r.id] = row
        return BatchOutcome(service, tuple(bool(x) for x in np.isfinite(host).all(axis=1)))
