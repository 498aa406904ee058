"""Whether a kernel's declared capability reaches every call of a bucket.

A bucket is a box of calls (``kernels.dispatch_space.Region``); its evidence is measured
at a few shapes inside it. A kernel can win at the measured shapes and still refuse other
calls of the bucket: ``fa3`` runs head_dim 128 only, while the default grid's bucket spans
head_dim 65-128; ``cudnn`` needs head_dim a multiple of 8; ``fa3`` runs causal calls only
with ``q_len == kv_len`` and without lengths. :func:`capability_gap` names one call of the
bucket outside the kernel's declared :class:`kernels.kernel.Capability` (dtypes, head_dim
limit and multiple, the causal restrictions), or returns ``None`` when the capability
reaches every call. The policy records it per candidate and bucket, and a bucket whose
chosen kernel does not reach every call keeps its ranking, so a call the chosen kernel
refuses goes to the next kernel of the bucket that accepts it (``kernels.dispatch_policy``,
``kernels.dispatch_kernel``). The backend and device are not a bucket's axes: the evidence,
measured on the device, says where a kernel cannot run at all.
"""

from __future__ import annotations

from kernels.dispatch_space import IntRange, Region
from kernels.kernel import Capability


def _head_dim_gap(capability: Capability, head_dim: IntRange) -> str | None:
    limit = capability.max_head_dim
    if limit is not None and (head_dim.hi is None or head_dim.hi - 1 > limit):
        return (f"runs head_dim <= {limit}; the bucket's head_dim {head_dim.label} reaches "
                f"{limit + 1}")
    multiple = capability.head_dim_multiple
    if multiple > 1:
        outside = next((x for x in (head_dim.lo, head_dim.lo + 1) if x in head_dim
                        and x % multiple), None)
        if outside is not None:
            return (f"needs head_dim a multiple of {multiple}; the bucket's head_dim "
                    f"{head_dim.label} holds {outside}")
    return None


def _single(r: IntRange) -> int | None:
    return r.lo if r.hi == r.lo + 1 else None


def capability_gap(capability: Capability, region: Region) -> str | None:
    """Why some call of ``region`` lies outside ``capability`` (one such call's value
    named), or ``None`` when every call of the region lies inside it. Calls with lengths
    belong to every region (lengths are no axis of it)."""
    missing = [d for d in region.dtypes if d not in capability.dtypes]
    if missing:
        return f"runs dtypes {list(capability.dtypes)}; the bucket holds {missing}"
    gap = _head_dim_gap(capability, region.head_dim)
    if gap is not None:
        return gap
    if True not in region.causal:
        return None
    square = _single(region.q_len) is not None and _single(region.q_len) == _single(
        region.kv_len)
    if capability.causal_needs_square and not square:
        return (f"runs causal calls only with q_len == kv_len; the bucket holds causal calls "
                f"with q_len {region.q_len.label} and kv_len {region.kv_len.label} apart")
    if not capability.causal_with_lengths:
        return "runs no causal call with lengths; the bucket's causal calls may carry them"
    return None
