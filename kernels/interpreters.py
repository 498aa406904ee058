"""Which Pallas interpreter runs a TPU kernel on a host without a TPU, per purpose.

Off its native platform ``pallas_tpu`` cannot be compiled by Mosaic; Pallas offers two
interpreters, which compute the same numbers (``tests/test_kernels_interpreters.py``
compares them bit for bit and against float64) but check different things:

``tpu_interpret`` (``pltpu.InterpretParams()``, Pallas' TPU interpret mode)
    Simulates the TPU's memories (HBM, VMEM, SMEM) in host buffers reached by
    ``io_callback``: every block copy is a DMA issued only when the block index changes
    (the pipeline's skip), outputs are written back only when their block index changes,
    a read or write out of a buffer's bounds raises ``IndexError``, allocated memory and
    padding start as NaN (uninitialised memory is poisoned), an output block revisited
    after another raises, semaphores and DMA waits keep their semantics, and with
    ``detect_races=True`` a happens-before race detector runs. Every kernel-body memory
    access is a Python call: about 10 ms of CPU per grid step, and a program with host
    callbacks is never written to JAX's persistent compilation cache.
``generic_interpret`` (``interpret=True``, Pallas' generic HLO interpreter)
    Discharges the kernel's state into a functional jaxpr and runs it as one XLA
    ``while_loop`` over the grid (row-major, every step): blocks are ``dynamic_slice``-d
    from whole arrays, so an out-of-bounds block index is silently clamped, not
    reported; scratch, outputs and padding still start as NaN. No DMA, semaphore,
    write-back or race semantics. XLA compiles and fuses it (tens of times faster per
    call here) and the persistent cache keeps it.

Neither checks that Mosaic accepts the kernel: ``kernels.build`` exports it for TPU
under ``kernels.pallas_tpu.mosaic_lowering()`` for that.

The held-out and confirmation **accuracy cases always run in TPU interpret mode**: they
are what proves the TPU kernel on a CPU host. The serving paths that run the kernel many
times at serving shapes (the MiniLM check, shadow, canary) run whichever interpreter the
registered profile names (``gates.thresholds.Thresholds.serving_tpu_interpret_mode``):
:meth:`InterpreterPlan.for_profile` is the one place that maps a registration to the
interpreter of each purpose, and a stage enters :meth:`InterpreterPlan.scope`. The
choice is a ``jax.make_user_context``, part of jit's cache key, so a function traced
under one interpreter is re-traced, never reused, under the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal, get_args

import jax
from pydantic import BaseModel, ConfigDict

Interpreter = Literal["tpu_interpret", "generic_interpret"]
INTERPRETERS: tuple[str, ...] = get_args(Interpreter)
TPU_INTERPRET: Interpreter = "tpu_interpret"
GENERIC_INTERPRET: Interpreter = "generic_interpret"

Purpose = Literal["accuracy", "model_check", "shadow", "canary"]
PURPOSES: tuple[str, ...] = get_args(Purpose)

_CHOICE = jax.make_user_context(default_value=TPU_INTERPRET)


def check_interpreter(name: str) -> Interpreter:
    """``name`` if it is one of ``INTERPRETERS``; else ``ValueError`` naming them."""
    if name not in INTERPRETERS:
        raise ValueError(f"unknown Pallas interpreter {name!r}; choose one of {list(INTERPRETERS)}")
    return name  # type: ignore[return-value]


def current() -> Interpreter:
    """The interpreter a Pallas TPU kernel traced now runs under off-TPU (default
    ``tpu_interpret``)."""
    return _CHOICE.value


@contextlib.contextmanager
def interpreter(name: str) -> Iterator[None]:
    """Context manager: trace Pallas TPU kernels for interpreter ``name`` off-TPU.

    Raises:
        ValueError: ``name`` is not one of ``INTERPRETERS``.
    """
    with _CHOICE(check_interpreter(name)):
        yield


def takes_the_choice(info) -> bool:
    """Whether the implementation ``info`` describes (``evaluation.report.ImplementationInfo``:
    ``native``, ``target_platform``) runs under the interpreter chosen here: a TPU kernel
    interpreted off-TPU. A GPU kernel interpreted on a CPU (``pallas_gpu``) always runs
    Pallas' generic lowering, so no TPU-interpret-mode check may be claimed for it."""
    return not info.native and info.target_platform == "tpu"


class InterpreterPlan(BaseModel):
    """The interpreter of each purpose a rollout runs a TPU kernel for off-TPU.

    Attributes:
        accuracy: always ``tpu_interpret`` (the held-out and confirmation cases).
        model_check, shadow, canary: the serving paths, as the registration says.
    """

    model_config = ConfigDict(frozen=True)

    accuracy: Literal["tpu_interpret"] = TPU_INTERPRET
    model_check: Interpreter = TPU_INTERPRET
    shadow: Interpreter = TPU_INTERPRET
    canary: Interpreter = TPU_INTERPRET

    @classmethod
    def for_profile(cls, serving_tpu_interpret_mode: bool) -> InterpreterPlan:
        """The plan a registration's ``serving_tpu_interpret_mode`` gives: TPU interpret
        mode everywhere (``True``), or the generic lowering on the serving paths."""
        serving = TPU_INTERPRET if serving_tpu_interpret_mode else GENERIC_INTERPRET
        return cls(model_check=serving, shadow=serving, canary=serving)

    def for_purpose(self, purpose: str) -> Interpreter:
        """The interpreter of ``purpose``; ``ValueError`` naming ``PURPOSES`` otherwise."""
        if purpose not in PURPOSES:
            raise ValueError(f"unknown purpose {purpose!r}; choose one of {list(PURPOSES)}")
        return getattr(self, purpose)

    def scope(self, purpose: str) -> contextlib.AbstractContextManager:
        """The context a stage runs ``purpose`` under (see :func:`interpreter`)."""
        return interpreter(self.for_purpose(purpose))


__all__ = ["GENERIC_INTERPRET", "INTERPRETERS", "PURPOSES", "TPU_INTERPRET", "Interpreter",
           "InterpreterPlan", "Purpose", "check_interpreter", "current", "interpreter",
           "takes_the_choice"]
