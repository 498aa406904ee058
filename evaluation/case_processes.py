"""A second process that runs half of a split's cases on a CPU host.

Pallas' TPU interpret mode keeps one simulated memory per process, so two interpreted
calls cannot run in two threads; on a 2-core CPU host the accuracy cases of an
interpreted candidate ran on one core. :class:`CaseHelper` is a process of its own
(``python -m evaluation.case_processes``) that builds the same built-in kernels from the
same checkout (``LocalRunner.for_implementation``: a version runs here only when its code
digest is this checkout's, ``lineage.serving.version_runners``) and runs its share of the cases
with ``evaluation.accuracy``'s own call and timing, returning each output, its seconds
and any error. Scoring (float64 reference, naive, ratios) stays in the parent, case by
case in the split's order, so the report is the one a single process writes.

Interpreted programs are not kept by the persistent compilation cache (they call back
to the host), so one helper lives for the session and takes the same shapes every time:
the confirmation split reuses what it compiled for the held-out split.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence

from evaluation.cases import TestCase

logger = logging.getLogger(__name__)

PROCESSES_ENV = "KERNELGATE_CASE_PROCESSES"
"""Processes that run an interpreted candidate's cases on a CPU host: ``1`` keeps them in
this process; default 2 where the host has at least two cores."""

STARTUP_S = 4.0
"""The helper's head start given away (seconds of estimated work): importing JAX."""
COMPILE_S = 2.5
"""Estimated seconds to trace and compile an interpreted kernel for one case shape."""
STEP_S = 0.01
"""Estimated seconds per interpreted grid step (batch x heads x q blocks x kv blocks)."""

Outputs = dict[str, tuple]
"""role -> ``(output or None, seconds, error or None)`` for one case."""


def case_cost(case: TestCase) -> float:
    """Estimated seconds an interpreted kernel takes on ``case`` (first call: compile
    included); depends on the shapes only, so every split is divided the same way."""
    batch, q_len, heads, _ = case.spec.q_shape
    kv_len = case.spec.kv_shape[1]
    return COMPILE_S + STEP_S * batch * heads * math.ceil(q_len / 128) * math.ceil(kv_len / 128)


def divide(cases: Sequence[TestCase]) -> set[int]:
    """The indices of the cases the helper runs: largest first, each to the process with
    less estimated work (the helper starting ``STARTUP_S`` behind)."""
    load = [0.0, STARTUP_S]
    theirs: set[int] = set()
    for i in sorted(range(len(cases)), key=lambda i: (-case_cost(cases[i]), i)):
        side = 0 if load[0] <= load[1] else 1
        load[side] += case_cost(cases[i])
        if side:
            theirs.add(i)
    return theirs


def shippable(runner) -> tuple[str, dict | None] | None:
    """``(implementation, config)`` of a runner a helper can build identically: a
    ``LocalRunner`` of a built-in kernel as the registry has it; else None."""
    from evaluation.runners import LocalRunner
    from kernels.registry import BUILTIN, IMPLEMENTATIONS

    if not isinstance(runner, LocalRunner):
        return None
    desc = runner.describe()
    name = desc.get("implementation")
    if name not in BUILTIN or desc.get("runtime_fallbacks"):
        return None
    kernel = IMPLEMENTATIONS[name]
    if f"{type(kernel).__module__}:{type(kernel).__qualname__}" != BUILTIN[name]:
        return None  # replaced in this process (a test): the helper would run another
    return name, desc.get("config")


def helper_for(runners: Mapping[str, object], backend: str) -> CaseHelper | None:
    """The session's helper for the shippable ``runners`` when one is worth it: a CPU
    host with two cores or more (``PROCESSES_ENV``) and a shippable runner that runs
    interpreted here; else None (every case runs in this process, as before)."""
    wanted = int(os.environ.get(PROCESSES_ENV) or (2 if (os.cpu_count() or 1) >= 2 else 1))
    if backend != "cpu" or wanted < 2:
        return None
    specs = {role: spec for role, r in runners.items() if (spec := shippable(r)) is not None}
    if not any(not runners[role].describe().get("native", True) for role in specs):
        return None
    key = tuple(sorted((role, name, repr(config)) for role, (name, config) in specs.items()))
    helper = _HELPERS.get(key)
    if helper is None or not helper.alive():
        for old in _HELPERS.values():
            old.close()
        _HELPERS.clear()
        helper = _HELPERS[key] = CaseHelper(specs)
    return helper


class CaseHelper:
    """The helper process for fixed roles ``{role: (implementation, config)}``."""

    def __init__(self, specs: Mapping[str, tuple[str, dict | None]]):
        self.roles = tuple(specs)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self._proc = subprocess.Popen([sys.executable, "-m", "evaluation.case_processes"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, env=_child_env())
        self._lock = threading.Lock()
        _send(self._proc.stdin, dict(specs))

    def alive(self) -> bool:
        return self._proc.poll() is None

    def submit(self, cases: Sequence[TestCase]) -> dict[int, Callable[[], Outputs | None]]:
        """Run ``divide(cases)`` there; index -> a call that waits for that case's
        outputs (None when the helper failed: the caller runs the case itself)."""
        theirs = sorted(divide(cases))
        if not theirs:
            return {}
        results: dict[int, Outputs | None] = {}
        ready = {i: threading.Event() for i in theirs}

        def exchange():
            with self._lock:
                try:
                    _send(self._proc.stdin, [cases[i] for i in theirs])
                    for i in theirs:
                        results[i] = _receive(self._proc.stdout)
                        ready[i].set()
                except Exception as err:  # noqa: BLE001 - the parent runs what is left
                    logger.warning("case helper failed (%s): %s; its cases run here", err,
                                   self._stderr_tail())
                    self.close()
                finally:
                    for event in ready.values():
                        event.set()

        threading.Thread(target=exchange, name="case-helper", daemon=True).start()
        logger.info("%d of %d cases (%s) run in a second process", len(theirs), len(cases),
                    ", ".join(self.roles))

        def waiter(i: int) -> Callable[[], Outputs | None]:
            def wait() -> Outputs | None:
                ready[i].wait()
                return results.get(i)
            return wait
        return {i: waiter(i) for i in theirs}

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - it is going anyway
                self._proc.kill()


_HELPERS: dict[tuple, CaseHelper] = {}


@atexit.register
def _close_all() -> None:
    for helper in _HELPERS.values():
        helper.close()
    _HELPERS.clear()


def _child_env() -> dict[str, str]:
    """This environment, with the persistent compilation cache this process uses."""
    import jax

    env = dict(os.environ)
    if folder := jax.config.jax_compilation_cache_dir:
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                       str(jax.config.jax_persistent_cache_min_compile_time_secs))
    env.setdefault("JAX_PLATFORMS", jax.default_backend())
    return env


def _send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the case helper exited")
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _serve() -> None:
    """The helper's loop: the roles first, then lists of cases until stdin closes."""
    from evaluation.accuracy import _timed
    from evaluation.runners import LocalRunner
    from kernels.registry import stored_config

    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(1), "wb")  # the replies; anything printed goes to stderr
    os.dup2(2, 1)
    specs = _receive(stdin)
    runners = {role: LocalRunner.for_implementation(name, stored_config(name, config))
               for role, (name, config) in specs.items()}
    while True:
        try:
            cases = _receive(stdin)
        except EOFError:
            return
        for case in cases:
            _send(stdout, {role: _timed(fn, case) for role, fn in runners.items()})


if __name__ == "__main__":
    _serve()
