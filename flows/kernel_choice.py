"""Which kernel a rollout builds, and why (printed by the CLI, used by the flows).

``--implementation auto`` on a GPU builds what the measured selection table
(``kernels/gpu_table.json``, this device kind's entries) found fastest over the shapes
the registration's serving contract covers; elsewhere, and without a table entry inside
the contract, the host's flash kernel (``kernels.native_flash_kernel``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flows.paths import DEFAULT_THRESHOLDS, INTERPRETED_THRESHOLDS

if TYPE_CHECKING:
    from gates.serving_contract import ServingContract


def rollout_kernel(implementation: str, backend: str,
                   contract: ServingContract | None) -> tuple[str, str]:
    """``(registry name, one sentence why)`` for a rollout of ``implementation`` on
    ``backend`` under the serving ``contract`` of its thresholds (``None``: auto without a
    contract takes the host's flash kernel).

    Raises:
        ValueError: unknown implementation, or an unreadable selection table.
    """
    import kernels
    from kernels import selection

    name = kernels.native_flash_kernel(implementation, backend)
    why = kernels.why_picked(implementation, backend)
    if implementation != "auto" or backend != "gpu" or contract is None:
        return name, why

    def runs_all_of_it(name: str) -> bool:
        # only a kernel that can run every dtype and head_dim the contract serves: one
        # that refuses part of it is rejected by the gate's coverage criterion (the H200
        # rollout of 2026-12-01 picked cuDNN for a float32 contract: 16 cases refused)
        capability = kernels.IMPLEMENTATIONS[name].capability
        widest = contract.max_head_dim or 256
        if capability.head_dim_multiple > 1 and widest > contract.min_head_dim:
            return False  # a range of head_dims holds ones that are not multiples
        return all(capability.allows(dtype, head_dim) for dtype in contract.dtypes
                   for head_dim in {contract.min_head_dim, widest})

    pick = selection.fastest_over(
        lambda dtype, head_dim, seq: contract.serves(dtype, head_dim, seq, seq),
        eligible=lambda name: name in kernels.IMPLEMENTATIONS and runs_all_of_it(name))
    if pick is None:
        return name, f"{why}; the selection table has no entry inside the serving contract"
    return pick[0], f"auto -> {pick[0]}: {pick[1]}"


def default_thresholds(implementation: str, backend: str) -> tuple[Path, str]:
    """``(thresholds file, one sentence why)`` for a rollout given no ``--thresholds``:
    ``thresholds/local-interpreted.yaml`` when the kernel ``implementation`` resolves to
    runs interpreted on ``backend`` (not among its native platforms), else
    ``thresholds/local-dry-run.yaml``. Both profiles have the same criteria and serving
    contract; the interpreted one judges at smaller sizes (its file says which and why).

    Raises:
        ValueError: unknown implementation.
    """
    import kernels
    from gates.thresholds import load_thresholds

    name, _ = rollout_kernel(implementation, backend, load_thresholds(DEFAULT_THRESHOLDS).serving)
    if kernels.IMPLEMENTATIONS[name].is_native(backend):
        return DEFAULT_THRESHOLDS, f"{name} is native on {backend}: the local-dry-run profile"
    return INTERPRETED_THRESHOLDS, (
        f"{name} runs interpreted on {backend}: the local-interpreted profile (local-dry-run's "
        "criteria; MiniLM check on 4 documents, canary of 16 candidate requests, whose latency "
        "is not assessed; the accuracy cases in TPU interpret mode, the MiniLM check, shadow "
        "and canary under the generic interpret lowering); pass --thresholds "
        "thresholds/local-dry-run.yaml for its sizes")
