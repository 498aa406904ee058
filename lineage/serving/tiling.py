"""What tiling a version runs with, in words an auditor can read: the rule (block sizes
asked for, the kernel's own per-call choice, the measured GPU table, or untiled) and the
block sizes that rule resolves to at the serving model's attention shapes and at the
evaluation's benchmark shapes. A version's configuration then never reads ``null``: a
kernel that chooses its tiling per call still has a definite tiling at every shape that
matters (``kernels.Kernel.resolve_config``, the same function a call runs).
"""

from __future__ import annotations

from collections.abc import Sequence

import kernels
from kernels.config import KernelConfig
from kernels.shapes import AttentionShape


def tiling_rule(implementation: str, requested: KernelConfig | None) -> str:
    """The rule that picks ``implementation``'s block sizes for a call, in words.

    Raises:
        KeyError: no such kernel in the registry.
    """
    kernel = kernels.IMPLEMENTATIONS[implementation]
    if not kernel.tiled:
        return "untiled (no block sizes: the kernel does not tile)"
    if requested is not None and requested.model_dump(exclude_none=True):
        asked = ", ".join(f"{k}={v}" for k, v in requested.model_dump(exclude_none=True).items())
        return f"fixed block sizes asked for ({asked}); unset fields: the kernel's default per call"
    if kernel.tuned:
        return ("per call: the measured GPU table (kernels/gpu_table.json) by dtype, head_dim "
                "and length, else the kernel's default, checked against shared memory")
    return "per call: the kernel's default for the call's shape"


def shape_label(shape: AttentionShape) -> str:
    """``1×128×12×32 float32`` (batch × length × heads × head_dim, dtype; ``causal``)."""
    length = (f"{shape.q_len}" if shape.q_len == shape.kv_len
              else f"{shape.q_len}/{shape.kv_len}")
    return (f"{shape.batch}×{length}×{shape.num_heads}×{shape.head_dim} {shape.dtype}"
            + (" causal" if shape.causal else ""))


def resolved_tiling(implementation: str, requested: KernelConfig | None,
                    shapes: Sequence[AttentionShape]) -> dict[str, str]:
    """Shape label -> the block sizes a call of ``implementation`` at that shape runs
    with (``"untiled"``; ``"refused: <why>"`` where the kernel refuses the shape)."""
    kernel = kernels.IMPLEMENTATIONS[implementation]
    out = {}
    for shape in shapes:
        try:
            spec, _, _ = kernels.validate(*shape.structs(), causal=shape.causal)
            config = kernel.resolve_config(spec, requested)
        except (ValueError, NotImplementedError) as err:
            out[shape_label(shape)] = f"refused: {err}"[:160]
            continue
        fields = config.model_dump(exclude_none=True) if config is not None else {}
        out[shape_label(shape)] = (", ".join(f"{k}={v}" for k, v in fields.items())
                                   or "untiled")
    return out
