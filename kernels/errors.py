"""The one base class of every error kernelgate raises on purpose.

A leaf module (it imports nothing), so that every package may import it without
breaking the layering of ARCHITECTURE.md: ``except KernelgateError`` catches every
refusal of the pipeline (a refused promotion, an unreachable store, a failed
validation, ...) and lets genuine bugs (``TypeError``, ``KeyError``, ...) through.
Each subclass also keeps the built-in base it had (``RuntimeError``, ``ValueError``),
so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class KernelgateError(Exception):
    """Base of every deliberate kernelgate error (see the module docstring)."""
