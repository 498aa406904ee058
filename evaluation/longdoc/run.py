"""One workload served with one attention implementation: arrivals, replay, report.

``serve_workload(spec, "xla")`` draws the spec's request stream, builds (once per
process) its seeded encoder, binds the implementation through
``kernels.get_attention_fn`` (the kernel contract, with its compile fallback), replays
the stream on the default device and summarises it. Serving two implementations on the
same spec pairs them request by request (same arrivals, same documents).
"""

from __future__ import annotations

from pathlib import Path

import jax

from evaluation.longdoc.arrivals import draw_requests
from evaluation.longdoc.encoder import LongDocEncoder
from evaluation.longdoc.loadgen import replay
from evaluation.longdoc.report import LongdocReport, summarise
from evaluation.longdoc.server import EncoderServer, device_peak_bytes
from evaluation.longdoc.spec import WorkloadSpec, spec_sha256
from kernels.api import AttentionFn


def serve_workload(spec: WorkloadSpec, implementation: str, *,
                   attention_fn: AttentionFn | None = None, rate_per_s: float | None = None,
                   spec_path: str | Path | None = None
                   ) -> tuple[LongdocReport, EncoderServer]:
    """Serve ``spec``'s stream with one implementation on the default device.

    Args:
        spec: the workload.
        implementation: a registry name (``xla``, ``pallas_mosaic_gpu``, ...) or a label
            for ``attention_fn``.
        attention_fn: an ``AttentionFn`` to serve with instead of
            ``kernels.get_attention_fn(implementation)`` (tests, plug-ins).
        rate_per_s: arrival rate override (requests/s; default the spec's).
        spec_path: the spec's file, to record its sha256 in the report.

    Returns:
        ``(report, server)``; ``server.outputs`` holds each request's embedding.

    Raises:
        ValueError: unknown implementation name, bad rate.
    """
    if attention_fn is None:
        from kernels.dispatch import get_attention_fn

        attention_fn = get_attention_fn(implementation)
    requests = draw_requests(spec, rate_per_s=rate_per_s)
    encoder = LongDocEncoder.for_spec(spec.encoder)
    server = EncoderServer(encoder, attention_fn, ids_seed=spec.arrivals.seed)
    trace = replay(requests, spec, server)
    peak, note = device_peak_bytes()
    device = jax.devices()[0]
    report = summarise(
        trace, spec, implementation=implementation,
        device=f"{device.platform}:{getattr(device, 'device_kind', '?')}",
        rate_per_s=rate_per_s, weights_sha256=encoder.weights_sha256,
        workload_sha256=spec_sha256(spec_path) if spec_path else None,
        device_peak_bytes=peak, compiled_peak_bytes=server.compiled_peak_bytes,
        memory_note=note, compile_s=server.compile_s)
    return report, server
