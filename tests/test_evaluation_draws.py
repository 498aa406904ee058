"""Fresh confirmation draws: disjoint from every split, reproducible, spent once, and a
clear stop when the documents run out."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.documents import split_of
from evaluation.model import MiniLM
from evaluation.testset import build_testset, check_disjoint, load_manifest, load_split
from evaluation.testset.draws import ConfirmationExhausted, ensure_draw, unspent_draw
from evaluation.validation import validate_testset
from tests.shared_builds import ci_testset, copy_of


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return ci_testset(tmp_path_factory)  # read-only: each test draws into its own copy


@pytest.fixture
def testset(pristine, tmp_path):
    return copy_of(pristine, tmp_path / "testset")


def test_a_draw_shares_no_case_or_document_with_any_split(testset):
    name = ensure_draw(testset, 1)
    manifest = load_manifest(testset)
    draw = manifest.split(name)
    assert name == "confirmation-1" and name in manifest.draws
    for split, entry in manifest.splits.items():
        assert not {s.digest for s in draw.cases} & {s.digest for s in entry.cases}, split
        assert not {d.sha256 for d in draw.documents} & {d.sha256 for d in entry.documents}, split
    assert all(split_of(d.name) == "confirmation" for d in draw.documents)
    check_disjoint(manifest)
    # the set digest (over the three base splits) does not move when a draw is added
    assert manifest.digest == load_manifest(testset).digest
    outcome = validate_testset(testset, name, raise_on_failure=False)
    assert outcome.success, outcome.reasons()
    assert outcome.split_digest == draw.digest != manifest.splits["confirmation"].digest


def test_a_draw_is_built_once_and_its_arrays_are_real(testset):
    ensure_draw(testset, 1)
    arrays = testset / "confirmation-1.npz"
    before = arrays.stat().st_mtime_ns
    assert ensure_draw(testset, 1) == "confirmation-1"
    assert arrays.stat().st_mtime_ns == before
    cases = load_split(testset, "confirmation-1")
    assert cases and all(np.isfinite(c.q.astype(np.float32)).any() and np.abs(c.q.astype(np.float32)).max() > 0
                         for c in cases)


def test_the_first_unspent_draw_is_picked(testset):
    manifest = load_manifest(testset)
    base = manifest.splits["confirmation"].digest
    assert unspent_draw(testset, set()) == "confirmation"
    assert unspent_draw(testset, {base}) == "confirmation-1"
    first = load_manifest(testset).split("confirmation-1").digest
    assert unspent_draw(testset, {base, first}) == "confirmation-2"


def test_running_out_of_confirmation_documents_names_the_limit(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    counts = {"tuning": 0, "heldout": 0, "confirmation": 0}
    words = ["attention", "kernels", "tile", "queries", "and", "keys", "so", "the", "softmax", "never", "leaves", "fast", "memory", "while", "the", "running", "maximum", "keeps", "the", "sum", "stable"]
    i = 0
    while min(counts.values()) < 6 or counts["confirmation"] < 6:
        name = f"doc{i:04d}.txt"
        i += 1
        split = split_of(f"file:{name}")
        if counts[split] >= 6:
            continue
        counts[split] += 1
        rng = np.random.default_rng(i)
        (folder / name).write_text(" ".join(rng.choice(words, 120)) + ".")
    out = tmp_path / "testset"
    build_testset(out, profile="ci", documents_dir=folder, model=MiniLM.load())
    with pytest.raises(ConfirmationExhausted, match=r"6 confirmation documents.*larger"):
        ensure_draw(out, 1)
    assert "confirmation-1" not in load_manifest(out).draws
    assert not (out / "confirmation-1.npz").exists()
