"""Block-size configuration shared by the tiled (flash) attention kernels."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BlockSizes(BaseModel):
    """Tile sizes of a flash-attention kernel.

    Attributes:
        block_q: query rows per tile (tokens).
        block_kv: key/value rows per tile (tokens).
        num_warps: GPU warps per program (Triton lowering); ``None`` = kernel default.
        num_stages: GPU software-pipeline depth; ``None`` = kernel default.

    Platform legality (e.g. TPU tiles must be multiples of 8 rows by 128 lanes) is
    checked by each kernel, which raises ``ValueError`` naming the constraint.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_q: int = Field(128, gt=0, description="query rows per tile")
    block_kv: int = Field(128, gt=0, description="key/value rows per tile")
    num_warps: int | None = Field(None, gt=0, description="GPU warps per program")
    num_stages: int | None = Field(None, gt=0, description="GPU pipeline depth")
