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

# ``build`` is imported eagerly: a lazy wrapper function of that name would be
# replaced by the submodule ``kernels.build`` the first time anyone imports it.
from kernels.build import build
from kernels.config import BlockSizes
from kernels.contract import AttentionSpec, validate
from kernels.reference import attention_reference, relative_error

__all__ = [
    "AUTO_ORDER", "IMPLEMENTATIONS", "AttentionFn", "AttentionSpec", "BlockSizes",
    "Implementation", "Resolution", "attention", "attention_reference", "build",
    "default_backend", "get_attention_fn", "relative_error", "resolve", "validate",
]
