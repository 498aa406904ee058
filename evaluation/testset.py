"""The held-out test set: a content-addressed artifact of attention cases.

Layout of a built test set (``build_testset``)::

    <dir>/manifest.json      TestSetManifest: per split, its cases (CaseSpec),
                             documents (name + sha256), seed and digest
    <dir>/tuning.npz         arrays of the tuning split, keys "<case_id>/<array>"
    <dir>/heldout.npz        ... used only by the gate
    <dir>/confirmation.npz   ... used once, before production

Categories (design note "The held-out test set"):

* ``ordinary``: Q/K/V captured from all-MiniLM-L6-v2 (``evaluation.model``) on real
  documents (``evaluation.documents``), float32 and cast to bf16/f16;
* ``hard``: long context, ``q_len != kv_len`` both ways, GQA (groups 2, 3 and one kv
  head), lengths that are not block multiples, head_dim 32..256 (incl. 80), all
  dtypes, causal, padding (incl. zero length);
* ``adversarial``: huge-magnitude logits, near-ties, rows with every key masked,
  constant inputs, values near dtype limits, single-key rows.

Splits use different seeds and different documents, so no case can appear in two
splits; ``check_disjoint`` proves it from the case digests. Random cases are
reproducible from their seed (NumPy ``PCG64``); the ordinary cases depend on the
documents installed on the building machine and on its floating-point arithmetic,
so their digests (and the split digests) are machine-specific. Build once, then
ship the directory: its digests are what the gates and the audit refer to.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluation.cases import SPLITS, CaseSpec, Category, Split, TestCase, case_digest
from evaluation.documents import Document, DocumentRef, assign_splits, load_documents

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
DEFAULT_SEEDS: dict[Split, int] = {"tuning": 1009, "heldout": 2003, "confirmation": 3001}
Profile = Literal["ci", "gpu"]
Values = Literal["normal", "huge_logits", "near_ties", "constant", "near_limit"]
Lengths = Literal["none", "random", "with_zero", "single_key"]

_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jnp.bfloat16),
           "float16": np.dtype(np.float16)}


# --- recipes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """A synthetic case: shapes, dtype, masking and how values are drawn.

    ``lengths``: ``none``; ``random`` q/kv lengths in ``[1, len]``; ``with_zero``
    random lengths with one example whose q and kv lengths are 0 and one whose kv
    length is 0 (every key masked); ``single_key`` kv length 1 for every example.
    """

    name: str
    category: Category
    tags: tuple[str, ...]
    q_len: int
    kv_len: int
    batch: int = 1
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    dtype: str = "float32"
    causal: bool = False
    scale: float | None = None
    lengths: Lengths = "none"
    values: Values = "normal"


def _hard(name, tags, q_len, kv_len, **kw) -> Recipe:
    return Recipe(name, "hard", tags, q_len, kv_len, **kw)


def _adv(name, tags, q_len, kv_len, **kw) -> Recipe:
    return Recipe(name, "adversarial", tags, q_len, kv_len, **kw)


# The CI profile keeps most sequences <= 512 and two at 1024/2048, so that evaluating
# a kernel in TPU interpret mode (cost ~ number of blocks) on a split takes minutes.
_CI_HARD = (
    _hard("long-2048-causal", ("long", "causal"), 2048, 2048, num_heads=2, num_kv_heads=2,
          dtype="bfloat16", causal=True),
    _hard("long-1024", ("long",), 1024, 1024, num_heads=2, num_kv_heads=2),
    _hard("q-shorter-than-kv", ("q_len!=kv_len",), 128, 512, batch=2),
    _hard("q-longer-than-kv-causal", ("q_len!=kv_len", "causal", "non_block_multiple"), 300, 129,
          dtype="bfloat16", causal=True),
    _hard("gqa2", ("gqa",), 256, 256, batch=2, num_heads=8, num_kv_heads=4, dtype="float16"),
    _hard("gqa3-causal", ("gqa", "causal", "non_block_multiple"), 129, 129, num_heads=6,
          num_kv_heads=2, causal=True),
    _hard("mqa", ("gqa", "mqa", "q_len!=kv_len"), 200, 300, num_heads=8, num_kv_heads=1,
          dtype="bfloat16"),
    _hard("decode-q1", ("non_block_multiple", "q_len!=kv_len"), 1, 127, batch=2),
    _hard("len127-causal-d32", ("non_block_multiple", "causal", "head_dim"), 127, 127,
          head_dim=32, dtype="float16", causal=True),
    _hard("len1", ("non_block_multiple",), 1, 1, batch=3),
    _hard("d80", ("head_dim", "non_power_of_two"), 256, 256, head_dim=80, dtype="bfloat16"),
    _hard("d128-causal", ("head_dim", "causal"), 384, 384, head_dim=128, causal=True),
    _hard("d256", ("head_dim", "q_len!=kv_len"), 256, 128, num_heads=2, num_kv_heads=2,
          head_dim=256, dtype="float16"),
    _hard("padding-zero-causal", ("padding", "zero_length", "causal"), 256, 256, batch=3,
          causal=True, lengths="with_zero"),
    _hard("padding-gqa", ("padding", "gqa", "q_len!=kv_len"), 128, 384, batch=4, num_heads=8,
          num_kv_heads=2, dtype="bfloat16", lengths="random"),
    _hard("custom-scale", ("scale",), 64, 64, scale=0.3),
)

_CI_ADVERSARIAL = (
    _adv("huge-logits", ("huge_logits", "softmax_overflow"), 128, 128, values="huge_logits"),
    _adv("huge-logits-causal-bf16", ("huge_logits", "softmax_overflow", "causal"), 256, 256,
         num_heads=2, num_kv_heads=2, dtype="bfloat16", causal=True, values="huge_logits"),
    _adv("near-ties", ("near_ties",), 128, 256, values="near_ties"),
    _adv("all-keys-masked", ("all_masked", "padding", "zero_length"), 64, 128, batch=3,
         lengths="with_zero"),
    _adv("all-keys-masked-gqa-bf16", ("all_masked", "padding", "gqa"), 129, 129, batch=3,
         num_heads=4, num_kv_heads=2, dtype="bfloat16", lengths="with_zero"),
    _adv("constant", ("constant",), 128, 128, values="constant"),
    _adv("constant-causal-bf16", ("constant", "causal"), 129, 129, dtype="bfloat16",
         causal=True, values="constant"),
    _adv("near-limit-f16", ("near_limit",), 128, 128, dtype="float16", values="near_limit"),
    _adv("near-limit-bf16", ("near_limit",), 128, 256, dtype="bfloat16", values="near_limit"),
    _adv("single-key", ("single_key",), 64, 1),
    _adv("single-key-padded-f16", ("single_key", "padding"), 128, 128, batch=2,
         dtype="float16", lengths="single_key"),
)

_GPU_EXTRA_HARD = (
    _hard("long-4096", ("long",), 4096, 4096, num_heads=8, num_kv_heads=8, head_dim=128,
          dtype="bfloat16"),
    _hard("long-8192-causal-gqa", ("long", "causal", "gqa"), 8192, 8192, num_heads=8,
          num_kv_heads=2, head_dim=128, dtype="bfloat16", causal=True),
    _hard("long-16384-causal", ("long", "causal", "gqa"), 16384, 16384, num_heads=2,
          num_kv_heads=1, head_dim=128, dtype="bfloat16", causal=True),
    _hard("long-decode", ("long", "q_len!=kv_len"), 64, 8192, num_heads=8, num_kv_heads=1,
          head_dim=128, dtype="float16"),
    _hard("long-padding", ("long", "padding"), 4096, 4096, batch=2, num_heads=4,
          num_kv_heads=4, head_dim=64, dtype="bfloat16", lengths="random"),
)


@dataclass(frozen=True)
class OrdinaryPlan:
    """How many documents and which layers feed the ordinary cases of one split."""

    single_layers: tuple[tuple[int, str], ...]  # (layer, dtype) per single-document case
    batched_layers: tuple[tuple[int, str], ...]  # (layer, dtype) per batched case (one batch)
    batch: int
    max_length: int

    @property
    def documents_needed(self) -> int:
        return len(self.single_layers) + self.batch


@dataclass(frozen=True)
class ProfileSpec:
    """The recipes and ordinary-case plan of a profile (``ci`` or ``gpu``)."""

    hard: tuple[Recipe, ...]
    adversarial: tuple[Recipe, ...]
    ordinary: OrdinaryPlan


PROFILES: dict[str, ProfileSpec] = {
    "ci": ProfileSpec(_CI_HARD, _CI_ADVERSARIAL,
                      OrdinaryPlan(single_layers=((0, "float32"), (5, "float16")),
                                   batched_layers=((2, "float32"), (4, "bfloat16")),
                                   batch=4, max_length=256)),
    "gpu": ProfileSpec(_CI_HARD + _GPU_EXTRA_HARD, _CI_ADVERSARIAL,
                       OrdinaryPlan(single_layers=((0, "float32"), (3, "bfloat16"),
                                                   (5, "float16")),
                                    batched_layers=((1, "float32"), (2, "bfloat16"),
                                                    (4, "float16")),
                                    batch=8, max_length=512)),
}


# --- value generators ---------------------------------------------------------------------


def _normal(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _huge_logits(rng, q_shape, kv_shape, dtype):
    # |q.k| * scale ~ a^2 * N(0, 1) with a = 100: logits of order 1e4, so exp overflows
    # float32 unless the row max is subtracted (the online-softmax invariant).
    a = np.float32(100.0)
    return a * _normal(rng, q_shape), a * _normal(rng, kv_shape), _normal(rng, kv_shape)


def _near_ties(rng, q_shape, kv_shape, dtype):
    # Keys differ from one shared key by 1e-3 relative noise: logits within ~1e-3 of
    # each other, so the result hinges on summing many nearly equal probabilities.
    base = _normal(rng, (kv_shape[0], 1, *kv_shape[2:]))
    k = base + np.float32(1e-3) * _normal(rng, kv_shape)
    return _normal(rng, q_shape), k, _normal(rng, kv_shape)


def _constant(rng, q_shape, kv_shape, dtype):
    # Every logit equal, every value row equal: the exact output is the constant.
    c = np.float32(rng.uniform(0.5, 2.0))
    return np.full(q_shape, c, np.float32), np.full(kv_shape, c, np.float32), \
        np.full(kv_shape, c, np.float32)


def _near_limit(rng, q_shape, kv_shape, dtype):
    """Values near the top of the storage dtype's range.

    float16 (max 65504): q, k, v with magnitudes in [0.5, 0.9] * 65504; their logits
    (<= head_dim * 65504^2 * scale ~ 3e10) are finite in float32 but not in float16,
    so a kernel must form q.k in float32. bfloat16/float32 (max ~3.4e38): v at ~1e30,
    leaving 2^26 headroom for float32 accumulation of un-normalised sums, with
    q and k ordinary so the logits stay finite.
    """
    def big(shape, limit):
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(np.float32)
        return sign * rng.uniform(0.5, 0.9, shape).astype(np.float32) * np.float32(limit)

    if dtype == "float16":
        return big(q_shape, 65504.0), big(kv_shape, 65504.0), big(kv_shape, 65504.0)
    return _normal(rng, q_shape), _normal(rng, kv_shape), big(kv_shape, 1e30)


_VALUE_GENERATORS: dict[str, Callable] = {
    "normal": lambda rng, qs, ks, dt: (_normal(rng, qs), _normal(rng, ks), _normal(rng, ks)),
    "huge_logits": _huge_logits,
    "near_ties": _near_ties,
    "constant": _constant,
    "near_limit": _near_limit,
}


def _lengths(rng, recipe: Recipe) -> tuple[np.ndarray | None, np.ndarray | None]:
    b = recipe.batch
    if recipe.lengths == "none":
        return None, None
    if recipe.lengths == "single_key":
        return None, np.ones(b, np.int32)
    q = rng.integers(1, recipe.q_len + 1, b).astype(np.int32)
    kv = rng.integers(1, recipe.kv_len + 1, b).astype(np.int32)
    if recipe.lengths == "with_zero":
        if b < 2:
            raise ValueError(f"recipe {recipe.name}: lengths='with_zero' needs batch >= 2")
        kv[0] = 0           # every key masked, queries valid
        q[1], kv[1] = 0, 0  # an empty example
        q[-1], kv[-1] = recipe.q_len, recipe.kv_len  # one full row keeps the case non-trivial
    return q, kv


def synthetic_case(recipe: Recipe, split: Split, seed: int) -> TestCase:
    """Draw the arrays of ``recipe`` from ``np.random.default_rng(seed)``.

    Returns:
        A ``TestCase`` with ``q`` ``[batch, q_len, num_heads, head_dim]``, ``k``/``v``
        ``[batch, kv_len, num_kv_heads, head_dim]`` in ``recipe.dtype`` and int32
        lengths when the recipe masks; ``spec.source`` is ``seed:<seed>``.

    Raises:
        ValueError: an inconsistent recipe (heads not divisible, lengths need batch).
    """
    if recipe.num_heads % recipe.num_kv_heads:
        raise ValueError(f"recipe {recipe.name}: num_heads must be a multiple of num_kv_heads")
    rng = np.random.default_rng(seed)
    q_shape = (recipe.batch, recipe.q_len, recipe.num_heads, recipe.head_dim)
    kv_shape = (recipe.batch, recipe.kv_len, recipe.num_kv_heads, recipe.head_dim)
    q, k, v = _VALUE_GENERATORS[recipe.values](rng, q_shape, kv_shape, recipe.dtype)
    q_lengths, kv_lengths = _lengths(rng, recipe)
    dtype = _DTYPES[recipe.dtype]
    return make_case(
        case_id=f"{split}/{recipe.category}/{recipe.name}", category=recipe.category,
        tags=recipe.tags, q=q.astype(dtype), k=k.astype(dtype), v=v.astype(dtype),
        q_lengths=q_lengths, kv_lengths=kv_lengths, causal=recipe.causal, scale=recipe.scale,
        source=f"seed:{seed}")


def make_case(*, case_id: str, category: Category, tags: tuple[str, ...], q, k, v,
              q_lengths=None, kv_lengths=None, causal: bool = False,
              scale: float | None = None, source: str) -> TestCase:
    """A ``TestCase`` whose spec (shapes, dtype, digest) is derived from its arrays."""
    arrays = {"q": q, "k": k, "v": v}
    if q_lengths is not None:
        arrays["q_lengths"] = np.asarray(q_lengths, np.int32)
    if kv_lengths is not None:
        arrays["kv_lengths"] = np.asarray(kv_lengths, np.int32)
    spec = CaseSpec(
        case_id=case_id, category=category, tags=tuple(tags), q_shape=q.shape,
        kv_shape=k.shape, dtype=np.dtype(q.dtype).name, causal=causal, scale=scale,
        has_lengths=q_lengths is not None or kv_lengths is not None, source=source,
        digest=case_digest(arrays, causal=causal, scale=scale))
    return TestCase(spec=spec, q=q, k=k, v=v, q_lengths=arrays.get("q_lengths"),
                    kv_lengths=arrays.get("kv_lengths"))


# --- ordinary cases from the real model -----------------------------------------------------


def _doc_source(docs: list[Document]) -> str:
    return "document:" + ";".join(f"{d.name}#{d.sha256[:16]}" for d in docs)


def _chunks(docs: list[Document], rng, max_words: int) -> list[str]:
    """A prefix of each document with a random word count, so a batch has varied lengths."""
    out = []
    for doc in docs:
        words = doc.text.split()
        n = int(rng.integers(min(16, len(words)), min(max_words, len(words)) + 1))
        out.append(" ".join(words[:n]))
    return out


@functools.lru_cache(maxsize=1)
def _capture_attention():
    # The layers before the captured one use XLA's attention, never the kernel under
    # test (``auto`` would pick it on its native platform). Cached: one compilation.
    from kernels.api import get_attention_fn

    return get_attention_fn("xla")


def ordinary_cases(split: Split, documents: list[Document], plan: OrdinaryPlan, seed: int,
                   model=None) -> list[TestCase]:
    """Q/K/V captured from all-MiniLM-L6-v2 (12 heads, head_dim 32) on ``documents``.

    Single-document cases keep the real token count (no padding); the batched
    cases pad a batch of document prefixes of random length to a bucket and carry
    ``kv_lengths``. Captures are float32 and cast to the plan's dtype; earlier layers
    run XLA attention (``kernels.get_attention_fn("xla")``).

    Raises:
        ValueError: fewer documents than the plan needs.
    """
    from evaluation.model import MiniLM

    if len(documents) < plan.documents_needed:
        raise ValueError(f"split {split} has {len(documents)} documents; the ordinary cases "
                         f"need {plan.documents_needed} (add documents or use another folder)")
    model = model or MiniLM.load()
    attention_fn = _capture_attention()
    rng = np.random.default_rng(seed)
    cases = []
    singles, batch_docs = (documents[: len(plan.single_layers)],
                           documents[len(plan.single_layers): plan.documents_needed])
    for doc, (layer, dtype) in zip(singles, plan.single_layers, strict=True):
        cap = model.capture_qkv([doc.text], layer=layer, max_length=plan.max_length,
                                attention_fn=attention_fn)[0]
        n = int(cap.kv_lengths[0])
        q, k, v = (a[:, :n].astype(_DTYPES[dtype]) for a in (cap.q, cap.k, cap.v))
        cases.append(make_case(case_id=f"{split}/ordinary/minilm-l{layer}-single-{dtype}",
                               category="ordinary", tags=("minilm", f"layer{layer}"),
                               q=q, k=k, v=v, source=_doc_source([doc])))
    texts = _chunks(batch_docs, rng, plan.max_length)
    for layer, dtype in plan.batched_layers:
        cap = model.capture_qkv(texts, layer=layer, max_length=plan.max_length,
                                attention_fn=attention_fn)[0]
        q, k, v = (a.astype(_DTYPES[dtype]) for a in (cap.q, cap.k, cap.v))
        cases.append(make_case(case_id=f"{split}/ordinary/minilm-l{layer}-batch-{dtype}",
                               category="ordinary", tags=("minilm", f"layer{layer}", "padding"),
                               q=q, k=k, v=v, kv_lengths=cap.kv_lengths,
                               source=_doc_source(batch_docs)))
    return cases


# --- manifest -------------------------------------------------------------------------------


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

    name: Split
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
    digest: str
    numpy_version: str
    jax_version: str
    jax_backend: str

    def split(self, name: Split) -> SplitManifest:
        """The split called ``name``; ``KeyError`` naming the available splits otherwise."""
        if name not in self.splits:
            raise KeyError(f"split {name!r} is not in this test set; it has {sorted(self.splits)}")
        return self.splits[name]


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


# --- building --------------------------------------------------------------------------------


def build_split(split: Split, *, profile: Profile = "ci", documents: list[Document],
                seed: int, model=None) -> tuple[SplitManifest, list[TestCase]]:
    """Build one split in memory.

    Args:
        split: ``tuning``, ``heldout`` or ``confirmation``.
        profile: ``ci`` (short sequences, at most 2048) or ``gpu`` (up to 16384).
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
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
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


def _to_storage(a: np.ndarray) -> np.ndarray:
    # .npz has no bfloat16; store its bits as uint16 (no q/k/v is ever uint16).
    return a.view(np.uint16) if a.dtype == _DTYPES["bfloat16"] else a


def _from_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.view(_DTYPES["bfloat16"]) if dtype == "bfloat16" and a.dtype == np.uint16 else a


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp creates 0600; give the artifact the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_split_arrays(path: str | Path, cases: list[TestCase]) -> None:
    """Write the cases' arrays to ``path`` (``.npz``, keys ``<case_id>/<array>``), atomically."""
    arrays = {f"{c.spec.case_id}/{n}": _to_storage(a) for c in cases for n, a in c.arrays().items()}

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:
            np.savez(f, **arrays)

    _atomic_write(Path(path), write)


def write_manifest(directory: str | Path, manifest: TestSetManifest) -> Path:
    """Write ``manifest.json`` atomically; returns its path."""
    path = Path(directory) / MANIFEST_FILE
    _atomic_write(path, lambda tmp: tmp.write_text(manifest.model_dump_json(indent=2)))
    return path


def build_testset(out_dir: str | Path, *, profile: Profile = "ci",
                  documents_dir: str | Path | None = None,
                  seeds: dict[Split, int] | None = None, model=None) -> TestSetManifest:
    """Build all three splits and write them with ``manifest.json`` to ``out_dir``.

    Args:
        out_dir: created if missing; existing split files are replaced.
        profile: ``ci`` (sequences mostly <= 512, one 1024 and one 2048) or ``gpu``
            (adds 4096-16384 and larger ordinary batches at 512 tokens).
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


# --- loading and checks -----------------------------------------------------------------------


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


def load_split(directory: str | Path, split: Split, *,
               manifest: TestSetManifest | None = None,
               skip_missing: bool = False) -> list[TestCase]:
    """The cases of one split with their arrays, in manifest order.

    Arrays are returned as stored (bf16 restored from its uint16 bits); nothing is
    checked against the manifest here: run ``evaluation.validation.validate_testset``
    before evaluating.

    Args:
        skip_missing: leave out cases whose q/k/v are not in the arrays file
            (validation reports them) instead of raising.

    Raises:
        FileNotFoundError: manifest or arrays file missing.
        KeyError: unknown split.
        ValueError: a case's q/k/v are missing from the arrays file (unless ``skip_missing``).
    """
    manifest = manifest or load_manifest(directory)
    entry = manifest.split(split)
    path = Path(directory) / entry.arrays_file
    if not path.is_file():
        raise FileNotFoundError(f"arrays of split {split} missing: {path}")
    cases = []
    with np.load(path, allow_pickle=False) as npz:
        keys = set(npz.files)
        for spec in entry.cases:
            def get(name: str, spec=spec) -> np.ndarray | None:
                key = f"{spec.case_id}/{name}"
                return _from_storage(npz[key], spec.dtype) if key in keys else None

            q, k, v = get("q"), get("k"), get("v")
            if q is None or k is None or v is None:
                if skip_missing:
                    continue
                raise ValueError(f"case {spec.case_id}: q/k/v missing from {path}")
            cases.append(TestCase(spec=spec, q=q, k=k, v=v, q_lengths=get("q_lengths"),
                                  kv_lengths=get("kv_lengths")))
    return cases


def split_overlaps(manifest: TestSetManifest) -> dict[str, list[str]]:
    """Case digests and document digests found in more than one split.

    Returns:
        ``{"case:<digest>" or "document:<sha256>": [case ids / "split:doc name", ...]}``;
        empty when the splits are disjoint.
    """
    seen: dict[str, list[tuple[str, str]]] = {}
    for split, entry in manifest.splits.items():
        for spec in entry.cases:
            seen.setdefault(f"case:{spec.digest}", []).append((split, spec.case_id))
        for doc in entry.documents:
            seen.setdefault(f"document:{doc.sha256}", []).append((split, f"{split}:{doc.name}"))
    return {key: [name for _, name in where] for key, where in seen.items()
            if len({s for s, _ in where}) > 1}


def check_disjoint(manifest: TestSetManifest) -> None:
    """Prove that no case (by digest) and no document (by sha256) serves two splits.

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
    for split, entry in manifest.splits.items():
        counts = {c: sum(s.category == c for s in entry.cases) for c in ("ordinary", "hard", "adversarial")}
        out[split] = {"cases": len(entry.cases), **counts, "q_tokens": entry.total_q_tokens,
                      "kv_tokens": entry.total_kv_tokens}
    return out


def manifest_json(manifest: TestSetManifest) -> dict:
    """The manifest as a JSON-ready dict (for MLflow logging)."""
    return json.loads(manifest.model_dump_json())
