"""The test-set builder: reproducible digests, disjoint splits, required coverage."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

import kernels
from evaluation.cases import SPLITS, case_digest, make_case
from evaluation.documents import (
    Document,
    assign_splits,
    clean_markup,
    folder_documents,
    installed_documents,
    split_of,
)
from evaluation.model import MiniLM
from evaluation.testset import (
    DEFAULT_SEEDS,
    build_split,
    build_testset,
    check_disjoint,
    load_manifest,
    load_split,
    split_digest,
)
from tests.shared_builds import copy_of, flow_testset


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("testset")
    manifest = build_testset(out, profile="ci")
    return out, manifest


@pytest.fixture(scope="module")
def heldout(built):
    out, manifest = built
    return load_split(out, "heldout", manifest=manifest)


def _heldout_documents():
    docs = assign_splits(installed_documents())["heldout"]
    return docs


def test_building_a_split_twice_gives_the_same_digest(built):
    _, manifest = built
    docs = {d.name: d for d in _heldout_documents()}
    used = [docs[ref.name] for ref in manifest.splits["heldout"].documents]
    again, cases = build_split("heldout", profile="ci", documents=used,
                               seed=DEFAULT_SEEDS["heldout"], model=MiniLM.load())
    assert again.digest == manifest.splits["heldout"].digest
    assert [c.spec.digest for c in cases] == [s.digest for s in manifest.splits["heldout"].cases]


def test_changing_one_value_changes_the_case_and_split_digest(built, heldout):
    _, manifest = built
    case = next(c for c in heldout if c.spec.dtype == "float32")
    q = case.q.copy()
    q.flat[7] = np.nextafter(q.flat[7], np.float32(np.inf))  # one ulp
    changed = make_case(case_id=case.spec.case_id, category=case.spec.category,
                        tags=case.spec.tags, q=q, k=case.k, v=case.v, q_lengths=case.q_lengths,
                        kv_lengths=case.kv_lengths, causal=case.spec.causal,
                        scale=case.spec.scale, source=case.spec.source)
    assert changed.spec.digest != case.spec.digest
    specs = [changed.spec if s.case_id == case.spec.case_id else s
             for s in manifest.splits["heldout"].cases]
    assert split_digest(specs) != manifest.splits["heldout"].digest


def test_digest_does_not_depend_on_storage(built, heldout):
    out, manifest = built
    loaded = {c.spec.case_id: c for c in heldout}
    bf16 = [c for c in heldout if c.spec.dtype == "bfloat16"]
    assert bf16 and all(c.q.dtype.name == "bfloat16" for c in bf16)
    for case in loaded.values():
        assert case_digest(case.arrays(), causal=case.spec.causal,
                           scale=case.spec.scale) == case.spec.digest
    assert load_manifest(out) == manifest


def test_splits_use_different_seeds_documents_and_cases(built):
    _, manifest = built
    check_disjoint(manifest)
    assert len({s.seed for s in manifest.splits.values()}) == 3
    docs = [{d.sha256 for d in s.documents} for s in manifest.splits.values()]
    assert all(docs) and not (docs[0] & docs[1] or docs[0] & docs[2] or docs[1] & docs[2])


def test_check_disjoint_detects_a_case_in_two_splits(built):
    _, manifest = built
    leaked = manifest.splits["tuning"].cases[3].model_copy(
        update={"case_id": "heldout/hard/leaked"})
    heldout = manifest.splits["heldout"].model_copy(
        update={"cases": [*manifest.splits["heldout"].cases, leaked]})
    bad = manifest.model_copy(update={"splits": {**manifest.splits, "heldout": heldout}})
    with pytest.raises(ValueError, match="heldout/hard/leaked"):
        check_disjoint(bad)


def test_heldout_covers_the_required_cases(heldout):
    specs = [c.spec for c in heldout]
    by_cat = {cat: [s for s in specs if s.category == cat] for cat in ("ordinary", "hard", "adversarial")}
    assert all(by_cat.values())
    ordinary = by_cat["ordinary"]
    assert all(s.q_shape[2:] == (12, 32) and s.source.startswith("document:") for s in ordinary)
    assert {s.dtype for s in ordinary} == {"float32", "bfloat16", "float16"}
    assert any(s.has_lengths and s.q_shape[0] > 1 for s in ordinary)
    hard = by_cat["hard"]
    groups = {s.q_shape[2] // s.kv_shape[2] for s in hard}
    assert {2, 3} <= groups and any(s.kv_shape[2] == 1 and s.q_shape[2] > 1 for s in hard)
    assert any(s.q_shape[1] < s.kv_shape[1] for s in hard)
    assert any(s.q_shape[1] > s.kv_shape[1] for s in hard)
    lengths = {n for s in hard for n in (s.q_shape[1], s.kv_shape[1])}
    assert {1, 127, 129, 300} <= lengths
    head_dims = {s.q_shape[3] for s in specs}
    assert min(head_dims) == 32 and max(head_dims) == 256
    assert any(d & (d - 1) for d in head_dims)  # a head_dim that is not a power of two
    assert {s.dtype for s in hard} == {"float32", "bfloat16", "float16"}
    assert any(s.causal for s in hard) and any(s.has_lengths for s in hard)
    assert any(c.kv_lengths is not None and (c.kv_lengths == 0).any()
               for c in heldout if c.spec.category == "hard")
    assert all(s.source.startswith("seed:") for s in hard + by_cat["adversarial"])


def test_ci_heldout_stays_small_enough_for_interpret_mode(built):
    _, manifest = built
    split = manifest.splits["heldout"]
    assert 25 <= len(split.cases) <= 40
    seqs = [max(s.q_shape[1], s.kv_shape[1]) for s in split.cases]
    assert max(seqs) <= 2048 and sum(n > 512 for n in seqs) <= 2
    assert split.total_q_tokens < 20_000


def _logits(case) -> np.ndarray:
    q = case.q.astype(np.float64)
    k = np.repeat(case.k.astype(np.float64), q.shape[2] // case.k.shape[2], axis=2)
    scale = case.spec.scale or 1 / math.sqrt(q.shape[-1])
    return np.einsum("bqhd,bkhd->bhqk", q, k) * scale


def test_adversarial_cases_are_adversarial(heldout):
    adv = {c.spec.case_id.rsplit("/", 1)[1]: c for c in heldout if c.spec.category == "adversarial"}
    assert np.abs(_logits(adv["huge-logits"])).max() > 1e4
    with np.errstate(over="ignore"):  # the overflow is the point of the case
        assert np.exp(np.float32(np.abs(_logits(adv["huge-logits"])).max())) == np.inf
        assert np.isinf(_logits(adv["near-limit-f16"]).astype(np.float16)).any()
    ties = _logits(adv["near-ties"])
    assert (ties.max(-1) - ties.min(-1)).max() < 0.1 < np.abs(ties).max()
    const = adv["constant"]
    assert len({float(x) for a in (const.q, const.k, const.v) for x in np.unique(a)}) == 1
    assert (adv["all-keys-masked"].kv_lengths == 0).any()
    f16 = adv["near-limit-f16"]
    assert np.abs(f16.v.astype(np.float32)).max() > 3e4 and f16.v.dtype == np.float16
    assert np.isfinite(_logits(f16).astype(np.float32)).all()
    assert adv["single-key"].k.shape[1] == 1
    for case in adv.values():  # the float64 reference stays finite on every case
        ref = kernels.attention_reference(case.q, case.k, case.v, causal=case.spec.causal,
                                          scale=case.spec.scale, q_lengths=case.q_lengths,
                                          kv_lengths=case.kv_lengths)
        assert np.isfinite(ref).all(), case.spec.case_id


def test_build_rejects_repeated_seeds(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        build_testset(tmp_path, seeds=dict.fromkeys(SPLITS, 7))
    with pytest.raises(ValueError, match="profile"):
        build_testset(tmp_path, profile="huge")


def test_documents_split_by_name_and_clean_markup(tmp_path):
    prose = ("This library lets you compute attention with less memory than the naive "
             "approach, and it is tested against a float64 reference on every release. "
             "It runs on any backend that JAX supports, and the results are the same "
             "whether the inputs are padded or not.")
    raw = f"# Title\n\n[![badge](https://x/y.svg)](https://x)\n\n```python\nimport x\n```\n\n{prose}\n"
    assert clean_markup(raw) == prose
    for i in range(6):
        (tmp_path / f"doc{i}.md").write_text(raw.replace("library", f"library {i}"))
    (tmp_path / "ignored.py").write_text(prose)
    docs = folder_documents(tmp_path)
    assert [d.name for d in docs] == [f"file:doc{i}.md" for i in range(6)]
    parts = assign_splits(docs)
    assert sorted(d.name for p in parts.values() for d in p) == [d.name for d in docs]
    assert all(split_of(d.name) == s for s, p in parts.items() for d in p)
    # The split of a document does not depend on which other documents exist.
    assert assign_splits(docs[:2]) == {s: [d for d in p if d in docs[:2]] for s, p in parts.items()}
    assert Document.from_text("x", prose).sha256 == Document.from_text("y", prose).sha256
    with pytest.raises(FileNotFoundError):
        folder_documents(tmp_path / "missing")


def _fake_distribution(folder, name: str, sentence: str) -> None:
    """A distribution's metadata folder whose long description is ``sentence`` x 40."""
    info = folder / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\n"
                                   + " ".join([sentence] * 40) + "\n")


def test_installed_documents_are_read_again_when_a_distribution_comes_or_goes(tmp_path,
                                                                              monkeypatch):
    """Read once per environment: a folder joining ``sys.path``, or a distribution
    installed into or removed from one already there, is seen by the next call."""
    sentence = ("The kernelgate probe distribution describes attention kernels in plain "
                "prose for the document reader.")
    names = lambda: {d.name for d in installed_documents()}  # noqa: E731
    before = names()
    assert "dist:kernelgate-probe-one" not in before
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_distribution(tmp_path, "kernelgate_probe_one", sentence)
    assert names() == before | {"dist:kernelgate-probe-one"}
    stamp = os.stat(tmp_path).st_mtime_ns
    _fake_distribution(tmp_path, "kernelgate_probe_two", sentence.replace("probe", "second"))
    os.utime(tmp_path, ns=(stamp + 10**9, stamp + 10**9))  # past the clock's granularity
    assert names() == before | {"dist:kernelgate-probe-one", "dist:kernelgate-probe-two"}
    shutil.rmtree(tmp_path / "kernelgate_probe_one-1.0.dist-info")
    os.utime(tmp_path, ns=(stamp + 2 * 10**9, stamp + 2 * 10**9))
    assert names() == before | {"dist:kernelgate-probe-two"}


def test_the_model_check_documents_are_the_first_of_the_split_and_never_another_split(built):
    """``split_documents(..., count)``: the registration's ``model_check_documents`` picks
    the first ``count`` of the documents the check uses by default (held-out: of its
    first 16; a confirmation split: of the documents its cases were cut from)."""
    from evaluation.evaluate import MODEL_DOCUMENTS_PER_SPLIT, split_documents

    out, manifest = built
    names = lambda docs: [d.name for d in docs]  # noqa: E731
    heldout = split_documents(out, "heldout")
    assert len(heldout) == MODEL_DOCUMENTS_PER_SPLIT
    assert names(split_documents(out, "heldout", 4)) == names(heldout)[:4]
    confirmation = split_documents(out, "confirmation")
    assert set(names(confirmation)) == {d.name for d in manifest.split("confirmation").documents}
    assert names(split_documents(out, "confirmation", 4)) == names(confirmation)[:4]
    assert not set(names(heldout)) & set(names(confirmation))
    with pytest.raises(ValueError, match="at least one document"):
        split_documents(out, "heldout", 0)


def test_the_minimal_profile_is_ci_recipes_at_the_validation_s_minimum(tmp_path,
                                                                       tmp_path_factory):
    """The flow tests' test set (the run's shared build of it, which
    ``build_testset(profile="minimal")`` made): every category at exactly the minimum the
    validation accepts, every dtype, nothing over 384 tokens, CI recipes unchanged; a
    fresh confirmation draw is built to the same profile."""
    from collections import Counter

    from evaluation.testset.draws import unspent_draw
    from evaluation.testset.recipes import PROFILES
    from evaluation.validation import MIN_CASES_PER_CATEGORY, validate_testset
    from flows.settings import RolloutSettings

    minimal, ci = PROFILES["minimal"], PROFILES["ci"]
    assert set(minimal.hard) <= set(ci.hard) and set(minimal.adversarial) <= set(ci.adversarial)
    folder = copy_of(flow_testset(tmp_path_factory), tmp_path / "minimal")  # a draw is added
    manifest = load_manifest(folder)
    assert manifest.profile == "minimal"
    draw = unspent_draw(folder, {manifest.split(s).digest for s in SPLITS})
    for split in (*SPLITS, draw):
        specs = load_manifest(folder).split(split).cases
        if split in ("heldout", draw):  # GX's few seconds a split: the gate's and a draw
            assert validate_testset(folder, split).success, split
        assert Counter(s.category for s in specs) == MIN_CASES_PER_CATEGORY, split
        assert {s.dtype for s in specs} == {"float32", "bfloat16", "float16"}, split
        assert max(n for s in specs for n in (s.q_shape[1], s.kv_shape[1])) <= 384, split
        assert any(s.causal for s in specs) and any(s.has_lengths for s in specs), split
    assert RolloutSettings(testset_profile="minimal").testset_profile_for("cpu") == "minimal"
