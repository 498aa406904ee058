"""kernelgate kernels: exact attention behind one contract (see ``kernels.api``)."""

from kernels.api import (
    AUTO_ORDER,
    IMPLEMENTATIONS,
    AttentionFn,
    Implementation,
    Resolution,
    attention,
    default_backend,
    get_attention_fn,
    resolve,
)
from kernels.config import BlockSizes
from kernels.contract import AttentionSpec, validate
from kernels.reference import attention_reference, relative_error


def build(*args, **kwargs):
    """Compile and export a kernel; see ``kernels.build.build``."""
    from kernels.build import build as _build

    return _build(*args, **kwargs)


__all__ = [
    "AUTO_ORDER", "IMPLEMENTATIONS", "AttentionFn", "AttentionSpec", "BlockSizes",
    "Implementation", "Resolution", "attention", "attention_reference", "build",
    "default_backend", "get_attention_fn", "relative_error", "resolve", "validate",
]
