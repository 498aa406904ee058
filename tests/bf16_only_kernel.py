"""A bf16-only kernel, for the tests of what a registration fixes after it is signed.

``test_bf16_only`` is XLA's attention, native everywhere, whose capability is bfloat16
alone: a float32 call is refused (``NotImplementedError``), as a kernel built for a bf16
serving contract rightly refuses it. A process gets it through the registry's plugin
variable::

    KERNELGATE_KERNELS=test_bf16_only=tests.bf16_only_kernel:Bf16OnlyKernel

Judged under a bf16 registration it passes; judged under a float32 contract every float32
case is a refusal and the gate's ``coverage`` criterion fails.
"""

from __future__ import annotations

from kernels.kernel import Capability, Kernel
from kernels.xla import XlaKernel

NAME = "test_bf16_only"
PLUGIN = f"{NAME}=tests.bf16_only_kernel:Bf16OnlyKernel"
"""The ``KERNELGATE_KERNELS`` entry that registers it."""


class Bf16OnlyKernel(Kernel):
    """XLA attention that serves bfloat16 only (inputs, outputs and errors as
    ``kernels.kernel.Kernel``; float32 and float16 calls raise ``NotImplementedError``)."""

    name = NAME
    description = "XLA attention refusing every dtype but bfloat16 (a test stand-in)"
    native_platforms = ("cpu", "gpu", "tpu")
    capability = Capability(dtypes=("bfloat16",))

    def __call__(self, q, k, v, *, causal, scale, q_lengths, kv_lengths, config=None):
        return XlaKernel()(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                           kv_lengths=kv_lengths, config=config)
