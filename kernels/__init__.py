"""kernelgate kernels: exact attention behind one contract (see ``kernels.api``)."""

from kernels.api import (
    AUTO_ORDER,
    IMPLEMENTATIONS,
    NATIVE_FLASH,
    AttentionFn,
    Resolution,
    attention,
    default_backend,
    native_flash_kernel,
    resolve,
    why_picked,
)

# ``build`` is imported eagerly: a lazy wrapper function of that name would be
# replaced by the submodule ``kernels.build`` the first time anyone imports it.
from kernels.build import build
from kernels.config import BlockSizes
from kernels.contract import AttentionSpec, validate
from kernels.dispatch import GuardedAttention, ResourceLimitError, get_attention_fn
from kernels.kernel import Capability, Kernel
from kernels.reference import attention_reference, relative_error
from kernels.registry import register, registered, unregister
from kernels.shapes import AttentionShape, random_inputs

__all__ = [
    "AUTO_ORDER", "IMPLEMENTATIONS", "NATIVE_FLASH", "AttentionFn", "AttentionShape",
    "AttentionSpec", "BlockSizes", "Capability", "GuardedAttention", "Kernel", "Resolution",
    "ResourceLimitError", "attention", "attention_reference", "build", "default_backend",
    "get_attention_fn", "native_flash_kernel", "random_inputs", "register", "registered",
    "relative_error", "resolve", "unregister", "validate", "why_picked",
]
