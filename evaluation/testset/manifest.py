"""The manifest of a test set: splits, cases, documents, digests, and the proofs that no
case or document serves two splits.

``manifest.json`` records per split its seed, documents (name + sha256), case specs
and a digest; the set digest covers the split digests. Digests are how gates, the
audit and the reference cache refer to a test set.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from evaluation.cases import SPLIT_NAME_PATTERN, SPLITS, CaseSpec, Split
from evaluation.documents import DocumentRef
from evaluation.testset.recipes import Profile
from evaluation.testset.store import atomic_write

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"


class ModelRef(BaseModel):
    """The model whose Q/K/V make the ordinary cases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "sentence-transformers/all-MiniLM-L6-v2"
    weights_sha256: str
    max_length: int


class SplitManifest(BaseModel):
    """One split: its seed, documents, cases and digest.

    ``total_q_tokens``/``total_kv_tokens`` sum ``batch * q_len`` / ``batch * kv_len``
    over cases (padding included).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SPLIT_NAME_PATTERN,
                      description="one of SPLITS, or confirmation-<k> for a fresh draw")
    seed: int
    arrays_file: str
    documents: list[DocumentRef]
    cases: list[CaseSpec]
    digest: str = Field(description="sha256 over the split's case specs (which include case digests)")
    total_q_tokens: int
    total_kv_tokens: int


class TestSetManifest(BaseModel):
    """``manifest.json`` of a test set. ``digest`` covers the split digests; the
    environment fields are lineage only and not part of any digest."""

    __test__ = False  # not a pytest class
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    profile: Profile
    document_source: str = Field(description="'installed-distributions' or the folder path")
    model: ModelRef
    splits: dict[Split, SplitManifest]
    draws: dict[str, SplitManifest] = Field(
        default_factory=dict,
        description="fresh confirmation draws (confirmation-<k>), added as rollouts spend "
                    "confirmation splits; not part of the set digest")
    digest: str
    numpy_version: str
    jax_version: str
    jax_backend: str

    def entries(self) -> dict[str, SplitManifest]:
        """Every split and confirmation draw, by name."""
        return {**self.splits, **self.draws}

    def split(self, name: str) -> SplitManifest:
        """The split or draw called ``name``; ``KeyError`` naming those available otherwise."""
        entries = self.entries()
        if name not in entries:
            raise KeyError(f"split {name!r} is not in this test set; it has {sorted(entries)}")
        return entries[name]


def split_digest(cases: list[CaseSpec]) -> str:
    """sha256 over the JSON of every case spec in order (so over every case digest)."""
    h = hashlib.sha256()
    for spec in cases:
        h.update(spec.model_dump_json().encode())
        h.update(b"\n")
    return h.hexdigest()


def set_digest(splits: dict[Split, SplitManifest]) -> str:
    """sha256 over ``"<split>:<split digest>"`` for each split in canonical order."""
    text = "\n".join(f"{s}:{splits[s].digest}" for s in SPLITS if s in splits)
    return hashlib.sha256(text.encode()).hexdigest()


def write_manifest(directory: str | Path, manifest: TestSetManifest) -> Path:
    """Write ``manifest.json`` atomically; returns its path."""
    path = Path(directory) / MANIFEST_FILE
    atomic_write(path, lambda tmp: tmp.write_text(manifest.model_dump_json(indent=2)))
    return path


def load_manifest(directory: str | Path) -> TestSetManifest:
    """Read ``manifest.json``.

    Raises:
        FileNotFoundError: no manifest in ``directory``.
        pydantic.ValidationError: the file does not match the schema.
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no test-set manifest at {path}; build one with build_testset")
    return TestSetManifest.model_validate_json(path.read_text())


def split_overlaps(manifest: TestSetManifest) -> dict[str, list[str]]:
    """Case digests and document digests found in more than one split.

    Returns:
        ``{"case:<digest>" or "document:<sha256>": [case ids / "split:doc name", ...]}``;
        empty when the splits are disjoint.
    """
    seen: dict[str, list[tuple[str, str]]] = {}
    for split, entry in manifest.entries().items():
        for spec in entry.cases:
            seen.setdefault(f"case:{spec.digest}", []).append((split, spec.case_id))
        for doc in entry.documents:
            seen.setdefault(f"document:{doc.sha256}", []).append((split, f"{split}:{doc.name}"))
    return {key: [name for _, name in where] for key, where in seen.items()
            if len({s for s, _ in where}) > 1}


def check_disjoint(manifest: TestSetManifest) -> None:
    """Prove that no case (by digest) and no document (by sha256) serves two splits
    (confirmation draws count as splits of their own).

    Raises:
        ValueError: listing every shared case and document.
    """
    overlaps = split_overlaps(manifest)
    if overlaps:
        lines = "; ".join(f"{key[:24]}... in {names}" for key, names in sorted(overlaps.items()))
        raise ValueError(f"splits are not disjoint: {lines}")


def describe(manifest: TestSetManifest) -> dict[str, dict[str, int]]:
    """Per split: number of cases per category and token totals (for reports/BENCHMARKS)."""
    out = {}
    for split, entry in manifest.entries().items():
        counts = {c: sum(s.category == c for s in entry.cases) for c in ("ordinary", "hard", "adversarial")}
        out[split] = {"cases": len(entry.cases), **counts, "q_tokens": entry.total_q_tokens,
                      "kv_tokens": entry.total_kv_tokens}
    return out


def manifest_json(manifest: TestSetManifest) -> dict:
    """The manifest as a JSON-ready dict (for MLflow logging)."""
    return json.loads(manifest.model_dump_json())
