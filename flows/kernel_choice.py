"""Which kernel a rollout builds, and why (printed by the CLI, used by the flows).

``--implementation auto`` on a GPU builds what the measured selection table
(``kernels/gpu_table.json``, this device kind's entries) found fastest over the shapes
the registration's serving contract covers; elsewhere, and without a table entry inside
the contract, the host's flash kernel (``kernels.native_flash_kernel``).
"""

from __future__ import annotations

from pathlib import Path


def rollout_kernel(implementation: str, backend: str,
                   thresholds_path: Path | None) -> tuple[str, str]:
    """``(registry name, one sentence why)`` for a rollout of ``implementation``.

    Raises:
        ValueError: unknown implementation, or an unreadable thresholds file or table.
        FileNotFoundError: ``thresholds_path`` does not exist.
    """
    import kernels
    from kernels import selection

    name = kernels.native_flash_kernel(implementation, backend)
    why = kernels.why_picked(implementation, backend)
    if implementation != "auto" or backend != "gpu" or thresholds_path is None:
        return name, why
    from gates.thresholds import load_thresholds

    contract = load_thresholds(thresholds_path).serving
    pick = selection.fastest_over(lambda dtype, head_dim, seq:
                                  contract.serves(dtype, head_dim, seq, seq))
    if pick is None:
        return name, f"{why}; the selection table has no entry inside the serving contract"
    return pick[0], f"auto -> {pick[0]}: {pick[1]}"
