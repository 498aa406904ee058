"""The long-document serving workload as a preregistered, frozen spec (YAML -> pydantic).

A spec declares everything a serving run depends on besides the kernel: the encoder's
architecture and its weights' seed, the length distribution of documents, the open-loop
arrival process, the batcher's length buckets and token budget, the SLO that goodput is
counted under and the device price that cost is counted with. Two runs of one spec on
one device differ only in the attention implementation.

Shipped specs live in ``workloads/`` at the repository root (:func:`shipped`), not in
``thresholds/``: a thresholds file is a registration with its own schema, loosening rules
and hash chain (and the tests read every ``thresholds/*.yaml`` as one); a workload is
what a registration *binds* (by the digest of its bytes, :func:`spec_sha256`), the way it
binds the test set.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernels.errors import KernelgateError

WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "workloads"
"""The shipped specs (``<repo>/workloads/*.yaml``)."""

SCHEMA_VERSION = 1


class InvalidWorkload(KernelgateError, ValueError):
    """A workload file that cannot be read or breaks the schema (the message names the
    file and the constraint)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class EncoderSpec(_Frozen):
    """A pre-norm long-context encoder (ModernBERT-like: RoPE, GeGLU MLP, bias-free
    LayerNorm, global attention in every layer; Warner et al. 2024, arXiv:2412.13663).

    ModernBERT-base: ``layers=22, hidden=768, heads=12, head_dim=64, mlp_hidden=1152,
    vocab=50368``. ``heads * head_dim`` need not equal ``hidden`` (the projections map
    between them), so a head_dim-128 variant keeps ``hidden`` 768 with 6 heads.
    """

    layers: int = Field(ge=1, le=128)
    hidden: int = Field(ge=8, le=16384)
    heads: int = Field(ge=1, le=256)
    head_dim: int = Field(ge=8, le=256, description="a multiple of 8")
    mlp_hidden: int = Field(ge=8, le=65536, description="GeGLU inner size (per gate half)")
    vocab: int = Field(ge=2, le=1_000_000)
    rope_theta: Positive = 160_000.0
    norm_eps: Positive = 1e-5
    dtype: Literal["float32", "bfloat16"] = "float32"
    seed: int = Field(0, ge=0, description="seeds the weights (fingerprinted: no weights ship)")
    init_std: Positive = 0.02

    @model_validator(mode="after")
    def _head_dim(self) -> EncoderSpec:
        if self.head_dim % 8:
            raise ValueError(f"head_dim must be a multiple of 8, got {self.head_dim}")
        return self

    def parameter_count(self) -> int:
        """Parameters of the encoder (embedding, per-layer projections and norms)."""
        inner = self.heads * self.head_dim
        per_layer = 4 * self.hidden * inner + 3 * self.hidden * self.mlp_hidden + 2 * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + 2 * self.hidden


class LogNormalLengths(_Frozen):
    """Document lengths (tokens) ``round(exp(N(log median, sigma^2)))`` clipped to
    ``[min_tokens, max_tokens]``."""

    kind: Literal["lognormal"]
    median_tokens: Positive
    sigma: float = Field(gt=0.0, le=5.0)
    min_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)


class LengthBin(_Frozen):
    """Lengths uniform over ``[low, high]`` tokens with relative ``weight``."""

    low: int = Field(ge=1)
    high: int = Field(ge=1)
    weight: Positive


class HistogramLengths(_Frozen):
    """Document lengths drawn from weighted bins (a measured histogram), clipped to
    ``[min_tokens, max_tokens]``."""

    kind: Literal["histogram"]
    bins: list[LengthBin] = Field(min_length=1)
    min_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _bins(self) -> HistogramLengths:
        for b in self.bins:
            if b.low > b.high:
                raise ValueError(f"a bin's low ({b.low}) must not exceed its high ({b.high})")
        return self


class ArrivalSpec(_Frozen):
    """An open-loop Poisson arrival process: requests arrive at ``rate_per_s`` whatever
    the server does (exponential gaps, seeded), ``requests`` of them; the first
    ``warmup_requests`` are served but left out of the steady-state figures."""

    rate_per_s: Positive
    requests: int = Field(ge=1, le=1_000_000)
    warmup_requests: int = Field(0, ge=0)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _warmup(self) -> ArrivalSpec:
        if self.warmup_requests >= self.requests:
            raise ValueError(f"warmup_requests ({self.warmup_requests}) must be below "
                             f"requests ({self.requests})")
        return self


class WorkloadSpec(_Frozen):
    """One serving workload (see the module docstring). Units: tokens, seconds, requests
    per second, a currency unit per device-hour."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    encoder: EncoderSpec
    lengths: LogNormalLengths | HistogramLengths = Field(discriminator="kind")
    arrivals: ArrivalSpec
    buckets: list[int] = Field(min_length=1, description="padded lengths, increasing")
    max_batch_tokens: int = Field(ge=1, description="padded rows x bucket length per batch")
    slo_s: Positive = Field(description="time to result counted as good (goodput)")
    price_per_device_hour: Positive = Field(description="for cost per 1,000 documents")

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        b = self.buckets
        if any(x < 1 for x in b) or any(y <= x for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"buckets must be positive and strictly increasing, got {b}")
        lengths = self.lengths
        if lengths.min_tokens > lengths.max_tokens:
            raise ValueError(f"lengths.min_tokens ({lengths.min_tokens}) must not exceed "
                             f"lengths.max_tokens ({lengths.max_tokens})")
        if lengths.max_tokens > b[-1]:
            raise ValueError(f"lengths.max_tokens ({lengths.max_tokens}) exceeds the largest "
                             f"bucket ({b[-1]}): such a document could not be served")
        if self.max_batch_tokens < b[-1]:
            raise ValueError(f"max_batch_tokens ({self.max_batch_tokens}) must hold one "
                             f"request of the largest bucket ({b[-1]})")
        return self


def max_rows(spec: WorkloadSpec, bucket: int) -> int:
    """The most rows one batch of ``bucket`` may have: the largest power of two whose
    padded tokens fit ``max_batch_tokens`` (batches are padded to a power of two rows
    to bound recompilation)."""
    return 1 << int(math.floor(math.log2(spec.max_batch_tokens // bucket)))


def load_spec(path: str | Path) -> WorkloadSpec:
    """Read and check a workload YAML file.

    Raises:
        InvalidWorkload: unreadable file, bad YAML or a schema violation (the message
            names the file and each broken constraint).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise InvalidWorkload(f"{path}: cannot read the workload: {err}") from err
    if not isinstance(raw, dict):
        raise InvalidWorkload(f"{path}: a workload is a mapping, got {type(raw).__name__}")
    try:
        return WorkloadSpec.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                             for e in err.errors())
        raise InvalidWorkload(f"{path}: {problems}") from err


def spec_sha256(path: str | Path) -> str:
    """sha256 hex of a workload file's bytes (what a registration binds)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shipped(name: str) -> Path:
    """The path of a shipped spec, ``workloads/<name>.yaml``.

    Raises:
        InvalidWorkload: no such spec (the message lists the shipped ones).
    """
    path = WORKLOADS_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))
        raise InvalidWorkload(f"no shipped workload {name!r}; shipped: {names}")
    return path
