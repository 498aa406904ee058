"""kernelgate kernels: exact attention behind one contract (see ``kernels.api``)."""

from kernels.api import (
    IMPLEMENTATIONS,
    AttentionFn,
    ConfigLike,
    Resolution,
    attention,
    auto_order,
    default_backend,
    native_flash,
    native_flash_kernel,
    resolve,
    why_picked,
)

# ``build`` is imported eagerly: a lazy wrapper function of that name would be
# replaced by the submodule ``kernels.build`` the first time anyone imports it.
from kernels.build import build
from kernels.config import KernelConfig
from kernels.contract import AttentionSpec, validate
from kernels.dispatch import GuardedAttention, ResourceLimitError, get_attention_fn
from kernels.kernel import Capability, Kernel
from kernels.reference import attention_reference, relative_error
from kernels.registry import register, registered, stored_config, unregister
from kernels.shapes import AttentionShape, random_inputs

__all__ = [
    "IMPLEMENTATIONS", "AttentionFn", "AttentionShape", "AttentionSpec", "Capability",
    "ConfigLike", "GuardedAttention", "Kernel", "KernelConfig", "Resolution",
    "ResourceLimitError", "attention", "attention_reference", "auto_order", "build",
    "default_backend", "get_attention_fn", "native_flash", "native_flash_kernel",
    "random_inputs", "register", "registered", "relative_error", "resolve", "stored_config",
    "unregister", "validate", "why_picked",
]
