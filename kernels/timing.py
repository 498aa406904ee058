"""How kernels are timed: one method for the benchmark and the autotuner.

Device work is asynchronous, so a timed region must end with a synchronisation, and a
first call compiles: ``compile_and_warm`` compiles and runs once outside any timing;
``time_call`` warms the device up (an H200 idles at ~345 MHz and needs a busy stretch to
reach its 1980 MHz clock), sizes repeats so that one lasts ``target_repeat_s``, enqueues
the calls back to back, synchronises on the last, and reports the median over repeats.
Method after ``/work/.library/device/METHOD.md`` ("Time properly"), i.e. the usual
practice of ``triton.testing.do_bench``: warm up, repeat, take the median.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from pydantic import BaseModel

DEFAULT_WARMUP_S = 0.25
"""Wall time of device warm-up before a timing on an accelerator (seconds)."""


class Timing(BaseModel):
    """Seconds per call: median (and min/max) of ``repeats`` repeats of
    ``calls_per_repeat`` back-to-back calls."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    calls_per_repeat: int


def time_samples(fn: Callable[..., Any], args: Sequence[Any], *, repeats: int = 11,
                 target_repeat_s: float = 0.02, max_calls: int = 200,
                 warmup_s: float = DEFAULT_WARMUP_S) -> tuple[list[float], int]:
    """The per-repeat samples behind :func:`time_call` (same arguments): ``(seconds per
    call of each repeat, in the order taken; calls per repeat)``, for a caller that
    needs more than the median (``median_interval``).

    Raises:
        ValueError: ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    singles: list[float] = []
    deadline = time.perf_counter() + warmup_s
    while len(singles) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        singles.append(time.perf_counter() - t0)
    single = max(min(singles[-3:]), 1e-6)
    calls = int(min(max_calls, max(1, math.ceil(target_repeat_s / single))))
    samples = []
    for _ in range(repeats):
        jax.block_until_ready(args)
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / calls)
    return samples, calls


def time_call(fn: Callable[..., Any], args: Sequence[Any], *, repeats: int = 11,
              target_repeat_s: float = 0.02, max_calls: int = 200,
              warmup_s: float = DEFAULT_WARMUP_S) -> Timing:
    """Time ``fn(*args)`` (already compiled) in seconds per call.

    Args:
        fn: a jitted function (its C++ dispatch costs microseconds; a ``Compiled``
            object's ``__call__`` costs ~0.2 ms and would dominate small kernels).
        args: its arguments (device arrays).
        repeats: timed repeats; the median is reported.
        target_repeat_s: aimed duration of one repeat (seconds); the calls per repeat
            come from the fastest of the last three warm-up calls.
        max_calls: cap on calls per repeat.
        warmup_s: wall time of untimed calls first (0 on a CPU test run).

    Raises:
        ValueError: ``repeats < 1``.
    """
    samples, calls = time_samples(fn, args, repeats=repeats, target_repeat_s=target_repeat_s,
                                  max_calls=max_calls, warmup_s=warmup_s)
    return Timing(median_s=statistics.median(samples), min_s=min(samples),
                  max_s=max(samples), repeats=repeats, calls_per_repeat=calls)


def median_interval(samples: Sequence[float], confidence: float = 0.95
                    ) -> tuple[float, float, float]:
    """``(low, high, coverage)``: the distribution-free order-statistic interval for the
    median of independent ``samples`` (seconds): the ``k``-th smallest and ``k``-th largest
    sample, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``
    (Hahn & Meeker, *Statistical Intervals*, 1991, ch. 5), and its exact coverage. With
    too few samples for ``confidence`` (n < 6 at 0.95) it is ``[min, max]``, whose
    coverage ``1 - 2^(1-n)`` it reports.

    Raises:
        ValueError: no samples, or ``confidence`` outside (0, 1).
    """
    if not samples:
        raise ValueError("median_interval needs at least one sample")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    ordered, n = sorted(samples), len(samples)

    def below(k: int) -> float:  # P(Binomial(n, 1/2) < k): the interval misses on one side
        return sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and below(k + 1) <= (1 - confidence) / 2:
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * below(k)


def compile_and_warm(fn: Callable[..., Any], args: Sequence[Any]
                     ) -> tuple[Callable[..., Any], float, int | None, int | None]:
    """``jax.jit`` ``fn`` and run it once on ``args`` (compiling).

    Returns:
        ``(jitted, seconds of the first call, temp_bytes, peak_bytes)``; memory in bytes
        from the compiler's memory analysis (``None`` where the backend has none):
        ``peak_bytes`` = arguments + outputs + scratch of the compiled call.
    """
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    seconds = time.perf_counter() - t0
    temp = peak = None
    try:
        mem = jitted.lower(*args).compile().memory_analysis()
        temp = int(mem.temp_size_in_bytes)
        peak = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes
                   + mem.output_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports memory analysis
        pass
    return jitted, seconds, temp, peak


def compiler_peak_bytes(compiled) -> int | None:
    """``Compiled.memory_analysis()`` as one number in bytes: its peak where reported,
    else argument + output + temp - alias bytes; ``None`` where the backend has none."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if m is None:
        return None
    peak = getattr(m, "peak_memory_in_bytes", 0) or 0
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)
    return int(max(peak, total))
