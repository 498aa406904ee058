"""The block-size configuration of a tiled (flash) attention kernel: one type for all.

Every field may be ``None``, meaning "the kernel's default for this call". A kernel
fills the defaults in with its ``resolve_config(spec, config)`` (so lineage always
records concrete numbers) and checks legality in ``check_supported(spec, backend,
config)``, raising ``ValueError`` that names the constraint (TPU tiles are multiples of
8 x 128; Triton tiles are powers of two; ...). Kernels without tiling (naive, XLA,
cuDNN) refuse any block size rather than silently ignore it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BlockSizes(BaseModel):
    """Tile sizes and GPU launch parameters of a flash-attention kernel.

    Attributes:
        block_q: query rows per tile (tokens); ``None`` = kernel default.
        block_kv: key/value rows per tile (tokens); ``None`` = kernel default.
        num_warps: GPU warps per program (Triton lowering); ``None`` = kernel default.
        num_stages: GPU software-pipeline depth of the key/value loop; ``None`` = default.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_q: int | None = Field(None, gt=0, le=4096, description="query rows per tile")
    block_kv: int | None = Field(None, gt=0, le=4096, description="key/value rows per tile")
    num_warps: int | None = Field(None, gt=0, le=32, description="GPU warps per program")
    num_stages: int | None = Field(None, gt=0, le=16, description="GPU pipeline depth")

    def is_empty(self) -> bool:
        """True when no field is set (the kernel's defaults apply to everything)."""
        return all(v is None for v in self.model_dump().values())

    def merged_over(self, defaults: BlockSizes) -> BlockSizes:
        """These values where set, ``defaults`` elsewhere."""
        mine = {k: v for k, v in self.model_dump().items() if v is not None}
        return defaults.model_copy(update=mine)


def refuse_block_sizes(name: str, config: BlockSizes | None) -> None:
    """For kernels without tiling: raise ``ValueError`` when block sizes were given.

    A block size passed to naive/XLA/cuDNN would be ignored, and an ignored setting
    recorded in lineage as if it had taken effect is a false record.
    """
    if config is not None and not config.is_empty():
        raise ValueError(f"{name} has no block sizes (it does not tile); got {config.model_dump(exclude_none=True)}")
