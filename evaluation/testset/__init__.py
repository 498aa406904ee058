"""The held-out test set: a content-addressed artifact of attention cases.

Layout of a built test set (``build_testset``)::

    <dir>/manifest.json      TestSetManifest: per split, its cases (CaseSpec),
                             documents (name + sha256), seed and digest
    <dir>/tuning.npz         arrays of the tuning split (the GPU autotuner's shapes)
    <dir>/heldout.npz        ... used only by the gate
    <dir>/confirmation.npz   ... used once per family, before production
    <dir>/confirmation-<k>.npz  fresh confirmation draws (``draws``), made when a
                             family has spent the earlier ones

Modules: ``recipes`` (synthetic cases), ``capture`` (ordinary cases from the real
model), ``manifest`` (digests and disjointness), ``store`` (arrays on disk), ``draws``
(fresh confirmation splits). Splits use
different seeds and different documents, so no case can appear in two splits;
``check_disjoint`` proves it from the case digests.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from evaluation.cases import SPLITS, Split, TestCase, split_kind
from evaluation.documents import Document, assign_splits, load_documents
from evaluation.testset.capture import ordinary_cases
from evaluation.testset.manifest import (
    MANIFEST_FILE,
    ModelRef,
    SplitManifest,
    TestSetManifest,
    check_disjoint,
    describe,
    load_manifest,
    manifest_json,
    set_digest,
    split_digest,
    split_overlaps,
    write_manifest,
)
from evaluation.testset.recipes import PROFILES, Profile, synthetic_case
from evaluation.testset.store import read_cases, write_split_arrays

DEFAULT_SEEDS: dict[Split, int] = {"tuning": 1009, "heldout": 2003, "confirmation": 3001}

__all__ = [
    "DEFAULT_SEEDS", "MANIFEST_FILE", "PROFILES", "ModelRef", "SplitManifest",
    "TestSetManifest", "build_split", "build_testset", "check_disjoint", "describe",
    "ensure_testset", "load_manifest", "load_split", "manifest_json", "set_digest",
    "split_digest", "split_overlaps", "write_manifest",
]


def build_split(split: str, *, profile: Profile = "ci", documents: list[Document],
                seed: int, model=None) -> tuple[SplitManifest, list[TestCase]]:
    """Build one split in memory.

    Args:
        split: ``tuning``, ``heldout``, ``confirmation`` or a confirmation draw
            ``confirmation-<k>`` (the name prefixes the case ids).
        profile: ``ci`` (short sequences, at most 2048), ``gpu`` (up to 16384) or
            ``minimal`` (the validation's minimum per category, at most 384).
        documents: this split's documents (see ``evaluation.documents.assign_splits``).
        seed: the split's seed; case ``i`` (in recipe order, ordinary last) draws
            from seed ``seed * 1000 + i``.
        model: a loaded ``MiniLM`` (default ``MiniLM.load()``).

    Returns:
        ``(SplitManifest, cases)``.

    Raises:
        ValueError: unknown profile or split, too few documents.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    split_kind(split)
    spec = PROFILES[profile]
    recipes = spec.hard + spec.adversarial
    cases = [synthetic_case(r, split, seed * 1000 + i) for i, r in enumerate(recipes)]
    plan = spec.ordinary
    used = documents[: plan.documents_needed]
    cases += ordinary_cases(split, used, plan, seed * 1000 + len(recipes), model)
    specs = [c.spec for c in cases]
    manifest = SplitManifest(
        name=split, seed=seed, arrays_file=f"{split}.npz", documents=[d.ref() for d in used],
        cases=specs, digest=split_digest(specs),
        total_q_tokens=sum(s.q_shape[0] * s.q_shape[1] for s in specs),
        total_kv_tokens=sum(s.kv_shape[0] * s.kv_shape[1] for s in specs))
    return manifest, cases


def build_testset(out_dir: str | Path, *, profile: Profile = "ci",
                  documents_dir: str | Path | None = None,
                  seeds: dict[Split, int] | None = None, model=None) -> TestSetManifest:
    """Build all three splits and write them with ``manifest.json`` to ``out_dir``.

    Args:
        out_dir: created if missing; existing split files are replaced.
        profile: ``ci`` (sequences mostly <= 512, one 1024 and one 2048), ``gpu``
            (adds 4096-16384 and larger ordinary batches at 512 tokens) or ``minimal``
            (17 CI recipes a split, at most 384 tokens: for the pipeline's flow tests).
        documents_dir: folder of ``*.txt``/``*.md`` for the ordinary cases; default
            the installed distributions' descriptions.
        seeds: per-split seeds (default ``DEFAULT_SEEDS``); must be distinct.
        model: a loaded ``MiniLM`` (default ``MiniLM.load()``).

    Returns:
        The manifest (also written to ``out_dir/manifest.json``, after the arrays).

    Raises:
        ValueError: seeds not distinct or missing a split, unknown profile, too few
            documents in a split.
    """
    from evaluation.model import MiniLM

    seeds = dict(DEFAULT_SEEDS if seeds is None else seeds)
    if set(seeds) != set(SPLITS):
        raise ValueError(f"seeds must give one seed per split {SPLITS}, got {sorted(seeds)}")
    if len(set(seeds.values())) != len(seeds):
        raise ValueError(f"split seeds must be distinct, got {seeds}")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    model = model or MiniLM.load()
    per_split = assign_splits(load_documents(documents_dir),
                              per_split=PROFILES[profile].ordinary.documents_needed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits: dict[Split, SplitManifest] = {}
    for split in SPLITS:
        manifest, cases = build_split(split, profile=profile, documents=per_split[split],
                                      seed=seeds[split], model=model)
        write_split_arrays(out / manifest.arrays_file, cases)
        splits[split] = manifest
    manifest = TestSetManifest(
        profile=profile,
        document_source="installed-distributions" if documents_dir is None else str(documents_dir),
        model=ModelRef(weights_sha256=model.weights_sha256,
                       max_length=PROFILES[profile].ordinary.max_length),
        splits=splits, digest=set_digest(splits), numpy_version=np.__version__,
        jax_version=jax.__version__, jax_backend=jax.default_backend())
    check_disjoint(manifest)
    write_manifest(out, manifest)
    return manifest


def ensure_testset(folder: str | Path, *, profile: Profile, documents_dir: str | Path | None = None,
                   model=None) -> Path:
    """``folder`` holding a test set, built (deterministically) when it has no manifest.

    Returns the folder. Raises what ``build_testset`` raises.
    """
    folder = Path(folder)
    if not (folder / MANIFEST_FILE).exists():
        build_testset(folder, profile=profile, documents_dir=documents_dir, model=model)
    return folder


def load_split(directory: str | Path, split: str, *,
               manifest: TestSetManifest | None = None,
               skip_missing: bool = False) -> list[TestCase]:
    """The cases of one split with their arrays, in manifest order (``store.read_cases``).

    Raises:
        FileNotFoundError: manifest or arrays file missing.
        KeyError: unknown split.
        ValueError: unreadable arrays file, or a case's q/k/v missing from it (unless
            ``skip_missing``).
    """
    manifest = manifest or load_manifest(directory)
    entry = manifest.split(split)
    return read_cases(Path(directory) / entry.arrays_file, entry.cases, skip_missing=skip_missing)
