"""The float64 reference of each test case, computed where it is cheap and computed once.

Where: on the accelerator in float64 when it has native float64 (a GPU), else NumPy on
the host (``kernels.reference``: ``attention_reference_jax`` and ``attention_reference``,
the same formula). Long cases (``q_len * kv_len`` above ``SAMPLE_ABOVE``) are computed
on a fixed sample of query rows, each still exact against every key, and the kernel's
output is scored on the same rows; the sample (``sample_rows``) is part of the key.

Once: each reference is stored as ``<cache>/<key>.npy``, the key a sha256 over the
case's digest (which covers its arrays), the reference code's digest (the bytes of
``kernels/reference.py``), the method and the rows. A second rollout, the
confirmation of a later one and the nightly re-validation on the same test set reuse
it. The cache is evidence, not trust: every evaluation writes an index (key, array
sha256, hit or computed, method) that is logged and signed with the evaluation, and
:func:`recheck` recomputes a sample with NumPy on the host and compares.

Signed when computed: with a :class:`EntrySeal` (the pipeline passes
``lineage.signing.reference_seal.SignedReferences``, its own key), each array is sealed as it is
written (``<key>.dsse.json`` beside ``<key>.npy``: the key and the array's sha256, signed)
and a hit counts only when its seal opens with the pipeline's trusted keys; anything else
— an array written by someone with the folder but not the key, a missing or foreign seal
— is recomputed (and sealed) and the index says why. The index alone would only sign
whatever bytes were read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel, Field

from evaluation.cases import TestCase
from kernels import reference as reference_module
from kernels.reference import attention_reference, relative_error

SAMPLE_ABOVE = 4096 * 4096
"""Cases with more query x key pairs than this are referenced on sampled rows."""
SAMPLE_ROWS = 256
"""Query rows sampled per long case: the first and last 16, the rest spread evenly
(the ends are where causal masking and padding are hardest)."""
DEVICE_ABOVE = 2**24
"""Cases with more float64 multiply-adds per head-row pair than this (batch x heads x
q_len x kv_len) go to the accelerator; below it NumPy on the host is quicker than a
fresh XLA compile (milliseconds against about a second)."""
INDEX_FILE = "reference_cache.json"


def reference_code_sha256() -> str:
    """sha256 of ``kernels/reference.py``: a change to the reference invalidates the cache."""
    return hashlib.sha256(Path(reference_module.__file__).read_bytes()).hexdigest()


def sample_rows(q_len: int, kv_len: int, *, above: int = SAMPLE_ABOVE) -> np.ndarray | None:
    """The query rows a case is referenced on (sorted, unique int64), or ``None`` for all
    of them: cases with more than ``above`` query x key pairs get ``SAMPLE_ROWS`` rows."""
    if q_len * kv_len <= above or q_len <= SAMPLE_ROWS:
        return None
    ends = np.r_[np.arange(16), np.arange(q_len - 16, q_len)]
    middle = np.linspace(16, q_len - 17, SAMPLE_ROWS - 32).round().astype(np.int64)
    return np.unique(np.r_[ends, middle])


def reference_method() -> str:
    """``jax-<backend>-float64`` on a GPU (native float64), else ``numpy-float64``."""
    import jax

    backend = jax.default_backend()
    return f"jax-{backend}-float64" if backend == "gpu" else "numpy-float64"


class CacheEntry(BaseModel):
    """One case's reference in the index."""

    case_id: str
    case_digest: str
    method: str = Field(description="how this entry was computed (numpy-float64, jax-gpu-float64)")
    key: str
    sha256: str = Field(description="sha256 of the stored float64 array's bytes")
    rows: list[int] | None = Field(description="sampled query rows; None: all rows")
    hit: bool = Field(description="read from the cache (True) or computed now")
    seconds: float = Field(description="time to read or compute, seconds")
    recomputed: str | None = Field(default=None, description=(
        "why a cached array was not used (its seal missing or not opening): computed again"))


class EntrySeal(Protocol):
    """Signs a cache entry when it is computed and checks it when it is read.

    ``seal(entry)`` returns the bytes stored as ``<key>.dsse.json``; ``opens(data,
    entry)`` is True only when ``data`` is a seal by a trusted key of exactly
    ``entry.key`` and ``entry.sha256`` (the array's bytes as read)."""

    def seal(self, entry: CacheEntry) -> bytes: ...

    def opens(self, data: bytes, entry: CacheEntry) -> bool: ...


class ReferenceIndex(BaseModel):
    """What one evaluation used as its reference (written as ``reference_cache.json``)."""

    method: str
    reference_code_sha256: str
    cache_dir: str | None
    entries: list[CacheEntry] = []

    @property
    def hits(self) -> int:
        return sum(e.hit for e in self.entries)


class ReferenceSummary(BaseModel):
    """The reference of one evaluation in a line: how, how much was reused, how long."""

    method: str = Field(description="jax-gpu-float64 or numpy-float64")
    reference_code_sha256: str
    cases: int
    cache_hits: int
    sampled_cases: list[str] = Field(description="cases scored on a sample of query rows")
    seconds: float = Field(description="total time to read or compute the references, seconds")


class ReferenceCache:
    """Float64 references by case, cached under ``directory`` (``None``: not cached).

    Args:
        directory: the cache folder, created on first write.
        method: ``reference_method()`` by default.
        sample_above: cases with more query x key pairs are referenced on sampled rows.
        seal: signs each array written and checks each one read (a hit whose seal does
            not open is recomputed); None: cached arrays are used as read (tests, tools).
    """

    def __init__(self, directory: str | Path | None, *, method: str | None = None,
                 sample_above: int = SAMPLE_ABOVE, seal: EntrySeal | None = None):
        self.directory = None if directory is None else Path(directory)
        self.seal = seal
        self.sample_above = sample_above
        self.method = method or reference_method()
        self.code = reference_code_sha256()
        self.index = ReferenceIndex(method=self.method, reference_code_sha256=self.code,
                                    cache_dir=None if directory is None else str(directory))

    def key(self, case: TestCase, rows: np.ndarray | None, method: str | None = None) -> str:
        """The cache key: sha256 over the case digest, reference code, method and rows."""
        text = json.dumps({"case": case.spec.digest, "code": self.code,
                           "method": method or self.method,
                           "rows": None if rows is None else rows.tolist()})
        return hashlib.sha256(text.encode()).hexdigest()

    def method_for(self, case: TestCase, rows: np.ndarray | None) -> str:
        """The accelerator's method for large cases, NumPy for the rest (``DEVICE_ABOVE``)."""
        batch, q_len, heads, _ = case.q.shape
        work = batch * heads * (q_len if rows is None else len(rows)) * case.k.shape[1]
        return self.method if work > DEVICE_ABOVE else "numpy-float64"

    def __call__(self, case: TestCase) -> tuple[np.ndarray, np.ndarray | None]:
        """``(reference, rows)``: the case's float64 reference on ``rows`` (``None``: all)."""
        start = time.perf_counter()
        rows = sample_rows(case.q.shape[1], case.k.shape[1], above=self.sample_above)
        method = self.method_for(case, rows)
        key = self.key(case, rows, method)
        path = None if self.directory is None else self.directory / f"{key}.npy"
        hit, recomputed = path is not None and path.exists(), None
        if hit:
            ref = np.load(path)
            entry = self._entry(case, method, key, rows, ref)
            if self.seal is not None:
                recomputed = self._unsealed(path, entry)
                hit = recomputed is None
        if not hit:
            ref = compute(case, rows, method)
            if path is not None:
                _save(path, ref)
            entry = self._entry(case, method, key, rows, ref)
        entry = entry.model_copy(update={
            "hit": hit, "recomputed": recomputed, "seconds": time.perf_counter() - start})
        if path is not None and not hit and self.seal is not None:
            _write(path.with_suffix(".dsse.json"), self.seal.seal(entry))
        self.index.entries.append(entry)
        return ref, rows

    @staticmethod
    def _entry(case: TestCase, method: str, key: str, rows: np.ndarray | None,
               ref: np.ndarray) -> CacheEntry:
        return CacheEntry(
            case_id=case.spec.case_id, case_digest=case.spec.digest, method=method, key=key,
            sha256=hashlib.sha256(np.ascontiguousarray(ref).tobytes()).hexdigest(),
            rows=None if rows is None else rows.tolist(), hit=False, seconds=0.0)

    def _unsealed(self, path: Path, entry: CacheEntry) -> str | None:
        """Why the cached array at ``path`` may not be used, or None when its seal opens."""
        seal_path = path.with_suffix(".dsse.json")
        if not seal_path.exists():
            return "no seal beside the cached array"
        if not self.seal.opens(seal_path.read_bytes(), entry):
            return "its seal does not open for these bytes with a trusted key"
        return None

    def summary(self) -> ReferenceSummary:
        """What this cache served so far, for the evaluation report."""
        entries = self.index.entries
        return ReferenceSummary(
            method=self.method, reference_code_sha256=self.code, cases=len(entries),
            cache_hits=self.index.hits,
            sampled_cases=[e.case_id for e in entries if e.rows is not None],
            seconds=sum(e.seconds for e in entries))

    def write_index(self, path: str | Path) -> Path:
        """Write the index (every entry so far) as JSON to ``path``; returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.index.model_dump_json(indent=1))
        return path


def compute(case: TestCase, rows: np.ndarray | None, method: str) -> np.ndarray:
    """The float64 reference of ``case`` on ``rows`` by ``method``."""
    args = dict(causal=case.spec.causal, scale=case.spec.scale, q_lengths=case.q_lengths,
                kv_lengths=case.kv_lengths, rows=rows)
    if method.startswith("jax-"):
        from kernels.reference import attention_reference_jax

        return attention_reference_jax(case.q, case.k, case.v, **args)
    return attention_reference(case.q, case.k, case.v, **args)


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a seal)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npy")
    os.close(fd)
    try:
        np.save(tmp, array)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sample(entries: list[CacheEntry], n: int,
            rng: np.random.Generator | None = None) -> list[CacheEntry]:
    """Which ``n`` entries a recheck recomputes: the most expensive one (the long cases a
    planted reference pays most to hide in), then the costliest of each other method
    (so an accelerator-computed one is among them when there is one), then a random
    sample of the rest (``rng``; fresh when None): a forger cannot know which entries
    will be looked at."""
    rng = rng or np.random.default_rng()
    by_cost = sorted(entries, key=lambda e: -e.seconds)
    chosen: list[CacheEntry] = []
    for entry in by_cost:
        if len(chosen) < n and all(c.method != entry.method for c in chosen):
            chosen.append(entry)
    rest = [e for e in by_cost if e not in chosen]
    picks = rng.permutation(len(rest))[:max(0, n - len(chosen))]
    return chosen + [rest[i] for i in sorted(picks)]


class RecheckResult(BaseModel):
    """A sample of cached references recomputed with NumPy on the host."""

    methods: list[str] = Field(default_factory=list, description="methods of the entries checked")
    checked: int
    max_rel_diff: float
    problems: list[str]


def recheck(index: ReferenceIndex, cases: dict[str, TestCase], *, sample: int = 3,
            tolerance: float = 1e-10) -> RecheckResult:
    """Recompute ``sample`` entries of ``index`` (:func:`_sample`: the most expensive, one
    per method, the rest at random) with NumPy and compare them with the cached arrays,
    whose bytes must match the index's sha256.

    Raises:
        ValueError: the index has no cache folder.
    """
    if index.cache_dir is None:
        raise ValueError("the reference was not cached; nothing to recheck")
    problems, worst, checked, methods = [], 0.0, 0, []
    for entry in _sample(index.entries, sample):
        path = Path(index.cache_dir) / f"{entry.key}.npy"
        case = cases.get(entry.case_id)
        if case is None or not path.exists():
            problems.append(f"{entry.case_id}: {'case' if case is None else 'cached array'} missing")
            continue
        cached = np.load(path)
        if hashlib.sha256(np.ascontiguousarray(cached).tobytes()).hexdigest() != entry.sha256:
            problems.append(f"{entry.case_id}: cached array differs from the signed index")
            continue
        rows = None if entry.rows is None else np.asarray(entry.rows)
        diff = relative_error(cached, compute(case, rows, "numpy-float64"))
        worst, checked = max(worst, diff), checked + 1
        methods.append(entry.method)
        if not diff <= tolerance:
            problems.append(f"{entry.case_id}: cached reference differs from a recomputation "
                            f"by {diff:.3g} (> {tolerance:g})")
    return RecheckResult(methods=methods, checked=checked, max_rel_diff=worst, problems=problems)
