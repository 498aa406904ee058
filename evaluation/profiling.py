"""A profiler trace of attention implementations at one representative shape.

Why (design note "Native, not forced": profilers must be able to see into the
kernel). An evaluation that reports a latency should leave the evidence behind
it: a ``jax.profiler`` trace of the candidate and the baseline, in which each kernel is
found by name. Kernels carry their names into HLO and the device timeline: a Pallas
kernel through its ``pallas_call(name=...)`` (pallas_gpu: the Triton kernel is named
``kernelgate_flash_attention_fwd_gpu``), naive and the XLA/cuDNN adapters through
``jax.named_call`` (``kernelgate_naive_attention``, ...); the registry lists them
(``Kernel.trace_name``), and ``kernels.get_attention_fn`` names its jitted
function after the kernel it resolved to, so the host timeline shows the dispatch as
``PjitFunction(<kernel name>)`` on every backend (on a CPU the only place the name can
appear: XLA:CPU does not trace individual kernels). Each implementation's calls are also
wrapped in a ``jax.profiler.TraceAnnotation`` (``kernelgate/<role>:<name>``).

:func:`record_trace` compiles and warms every implementation first (compilation stays out
of the trace), then records ``calls`` blocking calls of each into a fresh folder:
``<out_dir>/plugins/profile/<run>/<host>.xplane.pb`` (XProf/TensorBoard) and, by
default, ``perfetto_trace.json.gz`` next to it (Perfetto). How to open them:
:data:`HOW_TO_VIEW`.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import jax
from pydantic import BaseModel, Field

from evaluation.runners import LocalRunner, Runner
from kernels.api import IMPLEMENTATIONS, AttentionFn
from kernels.dispatch import get_attention_fn
from kernels.shapes import AttentionShape, random_inputs

logger = logging.getLogger(__name__)

HOW_TO_VIEW = (
    "Perfetto: open https://ui.perfetto.dev and load perfetto_trace.json.gz. "
    "XProf/TensorBoard: pip install xprof (or tensorboard tensorboard-plugin-profile), then "
    "xprof --logdir=<trace_dir> (or tensorboard --logdir=<trace_dir>) and open the Profile "
    "tab; the trace viewer shows each kernel by name on the device timeline and the "
    "kernelgate/<role>:<name> annotations on the host timeline.")


class ProfileTrace(BaseModel):
    """Where a trace was written and which kernels it shows (paths as strings)."""

    path: str = Field(description="the XProf trace file (*.xplane.pb)")
    trace_dir: str = Field(description="the folder to give TensorBoard/XProf as --logdir")
    perfetto_path: str | None = Field(None, description="perfetto_trace.json.gz, if written")
    shape: AttentionShape
    calls: int = Field(description="timed calls recorded per implementation")
    implementations: dict[str, str] = Field(description="role -> registry name or callable name")
    trace_names: dict[str, str | None] = Field(
        description="role -> the kernel name looked for in the trace (None: not declared)")
    names_found: dict[str, bool] = Field(description="role -> trace_name appears in the trace")
    how_to_view: str = HOW_TO_VIEW


def _bind(impl: AttentionFn | str) -> tuple[AttentionFn, str, str | None]:
    if isinstance(impl, str):
        registry = IMPLEMENTATIONS.get(impl)
        return get_attention_fn(impl), impl, registry.trace_name if registry else None
    name = getattr(impl, "__name__", None) or type(impl).__name__
    return impl, name, None


def record_trace(implementations: Mapping[str, AttentionFn | str], shape: AttentionShape,
                 out_dir: str | Path, *, calls: int = 5, seed: int = 0,
                 perfetto: bool = True,
                 kernels_of: Mapping[str, str] | None = None) -> ProfileTrace:
    """Record a ``jax.profiler`` trace of ``implementations`` at ``shape`` under ``out_dir``.

    Args:
        implementations: role (e.g. ``candidate``, ``baseline``) -> registry name (bound
            with ``kernels.get_attention_fn``; ``auto`` resolves as in the evaluation) or
            an ``AttentionFn``.
        shape: the problem (random normal q/k/v, ``kernels.shapes.random_inputs``).
        out_dir: a folder; the profiler adds ``plugins/profile/<run>/`` inside it.
        calls: blocking calls recorded per implementation (after one untraced warm-up
            call that compiles).
        seed: input seed.
        perfetto: also write ``perfetto_trace.json.gz``.
        kernels_of: role -> registry name, for roles given as an ``AttentionFn`` (e.g. a
            kernel bound to explicit block sizes): the trace is searched for that
            kernel's ``trace_name``.

    Returns:
        :class:`ProfileTrace`: the trace file, its folder and, per role, whether the
        kernel's declared trace name was found in it.

    Raises:
        ValueError: no implementations, or ``calls < 1``.
        RuntimeError: the profiler wrote no ``*.xplane.pb`` (another trace was running).
        Whatever an implementation raises on the shape.
    """
    if not implementations:
        raise ValueError("record_trace needs at least one implementation")
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bound = {role: _bind(impl) for role, impl in implementations.items()}
    for role, name in (kernels_of or {}).items():
        if role in bound and name in IMPLEMENTATIONS:
            fn, label, _ = bound[role]
            bound[role] = (fn, label, IMPLEMENTATIONS[name].trace_name)
    q, k, v = random_inputs(shape, seed)
    for fn, _, _ in bound.values():  # compile and warm outside the trace
        jax.block_until_ready(fn(q, k, v, causal=shape.causal))
    before = set(out_dir.glob("plugins/profile/*/*.xplane.pb"))
    with jax.profiler.trace(str(out_dir), create_perfetto_trace=perfetto):
        for role, (fn, name, _) in bound.items():
            with jax.profiler.TraceAnnotation(f"kernelgate/{role}:{name}"):
                for _ in range(calls):
                    jax.block_until_ready(fn(q, k, v, causal=shape.causal))
    new = sorted(set(out_dir.glob("plugins/profile/*/*.xplane.pb")) - before,
                 key=lambda p: p.stat().st_mtime)
    if not new:
        raise RuntimeError(f"jax.profiler wrote no *.xplane.pb under {out_dir}")
    xplane = new[-1]
    run_dir = xplane.parent
    perfetto_file = run_dir / "perfetto_trace.json.gz"
    found = names_in_trace(xplane, [t for _, _, t in bound.values() if t])
    return ProfileTrace(
        path=str(xplane), trace_dir=str(out_dir),
        perfetto_path=str(perfetto_file) if perfetto_file.exists() else None,
        shape=shape, calls=calls,
        implementations={role: name for role, (_, name, _) in bound.items()},
        trace_names={role: t for role, (_, _, t) in bound.items()},
        names_found={role: bool(t and found.get(t)) for role, (_, _, t) in bound.items()})


def trace_event_names(path: str | Path) -> set[str]:
    """The names of the events recorded in a trace: an XProf ``*.xplane.pb`` (every plane,
    host and device, read with ``jax.profiler.ProfileData``) or a Perfetto/Chrome
    ``*.json.gz``. Only events: the HLO of every module compiled in the process is
    metadata in the same file and names kernels that may not have run in the trace."""
    path = Path(path)
    if path.suffix == ".gz":
        trace = json.loads(gzip.decompress(path.read_bytes()))
        events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
        return {e["name"] for e in events if isinstance(e, dict) and "name" in e}
    data = jax.profiler.ProfileData.from_serialized_xspace(path.read_bytes())
    return {event.name for plane in data.planes for line in plane.lines for event in line.events}


def names_in_trace(path: str | Path, names) -> dict[str, bool]:
    """Which of ``names`` label an event of the trace at ``path`` (as the whole name or
    inside it, e.g. ``PjitFunction(kernelgate_naive_attention)``; on a GPU also the
    device kernel itself, e.g. the Triton kernel ``kernelgate_flash_attention_fwd_gpu``)."""
    events = trace_event_names(path)
    return {n: any(n in e for e in events) for n in names}


def profile_runners(runners: Mapping[str, Runner], shape: AttentionShape,
                    out_dir: Path) -> ProfileTrace | None:
    """A trace of the runners whose kernel runs in this process (a version in a process
    of its own is not traced here); ``None`` when none does or the profiler failed
    (logged: a trace is evidence about speed, never a reason to fail the evaluation)."""
    local = {role: r.attention_fn for role, r in runners.items() if isinstance(r, LocalRunner)}
    if not local:
        logger.info("no in-process implementation to profile")
        return None
    try:
        trace = record_trace(local, shape, out_dir, kernels_of={
            role: runners[role].describe().get("implementation") for role in local})
    except Exception as err:  # noqa: BLE001 - see docstring
        logger.warning("profiler trace not recorded: %s", err)
        return None
    logger.info("profiler trace of %s at %s: %s (%s)", ", ".join(local), shape.label,
                trace.path, HOW_TO_VIEW)
    return trace

