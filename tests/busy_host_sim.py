"""Synthetic per-repeat latencies drawn like a busy 2-core host, interleaved like
``evaluation.performance``.

Per shape, the roles (candidate, baseline, production) are called ``warmup - 1 + repeats``
times in an order that rotates every repeat, exactly as ``_measure_shape`` does; only the
last ``repeats`` rounds are kept. Every call sees

* the machine's load, a log-scale AR(1) process over the sequence of calls (a busy period
  spans several calls, so the calls of one repeat share most of it);
* its own heavy-tailed jitter (Student t, 3 degrees of freedom);
* with a small probability, a preemption (another process takes the core): the call
  takes ``1 + Exp(mean)`` times longer — the spikes that make the maximum of 10 calls,
  the CPU's "p99", a draw of the noise rather than of the kernel.

The numbers are chosen to look like the measured failure (an identical kernel's p99
ratio of 1.25 to 2.2 on the 2-core host), not fitted to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROLES = ("candidate", "baseline", "production")


@dataclass(frozen=True)
class BusyHost:
    """The noise model's parameters (see the module docstring)."""

    load_sd: float = 0.25
    load_phi: float = 0.9
    jitter_scale: float = 0.03
    spike_probability: float = 0.06
    spike_mean: float = 1.5


def draw(rng: np.random.Generator, *, slowdown: float = 1.0, baseline_factor: float = 2.0,
         shapes: int = 4, repeats: int = 10, warmup: int = 2,
         host: BusyHost = BusyHost()) -> dict[str, list[list[float]]]:
    """role -> per shape, the ``repeats`` timed latencies (s) of one simulated evaluation.

    The candidate is ``slowdown`` times the production kernel (1.0: the same kernel, an
    A/A evaluation); the naive baseline is ``baseline_factor`` times slower."""
    factor = {"candidate": slowdown, "baseline": baseline_factor, "production": 1.0}
    out: dict[str, list[list[float]]] = {role: [] for role in ROLES}
    innovation = host.load_sd * np.sqrt(1 - host.load_phi ** 2)
    load = rng.normal(0.0, host.load_sd)
    order = list(ROLES)
    for s in range(shapes):
        base = 1e-3 * 2 ** s
        timed: dict[str, list[float]] = {role: [] for role in ROLES}
        for i in range(warmup - 1 + repeats):
            for role in order[i % len(order):] + order[:i % len(order)]:
                load = host.load_phi * load + rng.normal(0.0, innovation)
                seconds = base * factor[role] * np.exp(
                    load + host.jitter_scale * rng.standard_t(3))
                if rng.random() < host.spike_probability:
                    seconds *= 1.0 + rng.exponential(host.spike_mean)
                if i >= warmup - 1:
                    timed[role].append(float(seconds))
        for role in ROLES:
            out[role].append(timed[role])
    return out


def point_metric(samples: list[list[float]], q: float) -> float:
    """The report's metric: geometric mean over shapes of ``np.percentile`` (linear)."""
    per_shape = [np.percentile(s, q) for s in samples]
    return float(np.exp(np.mean(np.log(per_shape))))
