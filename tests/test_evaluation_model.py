"""all-MiniLM-L6-v2 in JAX: known behaviour, attention pluggability, padding, capture."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import kernels
from evaluation.model import LENGTH_BUCKETS, MiniLM
from evaluation.model_check import cosine_similarities as cosine_similarity

PARAPHRASES = ("A man is eating food.", "A man is eating a piece of bread.")
UNRELATED = ("A man is eating food.", "The girl is carrying a baby.")


@pytest.fixture(scope="session")
def model() -> MiniLM:
    return MiniLM.load()


@pytest.fixture(scope="session")
def attention_fns():
    # One jitted function per implementation for the whole session (each new one recompiles).
    return {name: kernels.get_attention_fn(name) for name in ("xla", "naive")}


def _paraphrase_margin(model: MiniLM, fn) -> tuple[float, float]:
    e = model.embed([*PARAPHRASES, UNRELATED[1]], fn)
    return float(e[0] @ e[1]), float(e[0] @ e[2])


def test_reproduces_published_similarities(model, attention_fns):
    # sbert.net "Semantic Textual Similarity" page, all-MiniLM-L6-v2, printed to 4 decimals.
    published = np.array([[0.0543, 0.8939, -0.0502],
                          [0.2838, -0.0029, 0.1310],
                          [0.2277, -0.0136, -0.0327]])
    a = model.embed(["The new movie is awesome", "The cat sits outside",
                     "A man is playing guitar"], attention_fns["xla"])
    b = model.embed(["The dog plays in the garden", "The new movie is so great",
                     "A woman watches TV"], attention_fns["xla"])
    np.testing.assert_allclose(a @ b.T, published, atol=1e-3)


@pytest.mark.parametrize("implementation", ["xla", "naive"])
def test_paraphrases_embed_closer_than_unrelated(model, attention_fns, implementation):
    close, far = _paraphrase_margin(model, attention_fns[implementation])
    assert close > 0.6
    assert close > far + 0.3


def test_naive_and_xla_embeddings_agree(model, attention_fns):
    texts = ["Flash attention tiles the softmax so the logits never leave on-chip memory.",
             "short", "The quick brown fox jumps over the lazy dog " * 12]
    naive = model.embed(texts, attention_fns["naive"])
    xla = model.embed(texts, attention_fns["xla"])
    assert cosine_similarity(naive, xla).min() > 0.9999


def test_float64_reference_attention_runs_eagerly(model, attention_fns):
    texts = ["A woman is playing violin.", "Two men pushed carts through the woods."]
    ref = model.embed(texts, kernels.attention_reference, jit=False)
    assert cosine_similarity(ref, model.embed(texts, attention_fns["xla"])).min() > 0.9999


def test_embeddings_are_unit_norm_in_input_order_and_padding_invariant(model, attention_fns):
    fn = attention_fns["xla"]
    texts = ["tiny", "A considerably longer sentence that lands in a larger length bucket " * 4,
             "mid length sentence here"]
    batched = model.embed(texts, fn, batch_size=4)
    alone = np.concatenate([model.embed([t], fn) for t in texts])
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    # Sorting by length inside embed must not permute rows; padding must not leak.
    assert cosine_similarity(batched, alone).min() > 0.99999
    reversed_ = model.embed(texts[::-1], fn, batch_size=4)
    np.testing.assert_allclose(reversed_[::-1], batched, atol=1e-5)


def test_capture_qkv_shapes_and_padding_invariance(model, attention_fns):
    short, long = "attention is all you need", "a much longer document about attention " * 6
    (batched,) = model.capture_qkv([short, long], layer=3, attention_fn=attention_fns["xla"])
    (alone,) = model.capture_qkv([short], layer=3, attention_fn=attention_fns["xla"])
    _, lengths = model.tokenize([short, long])
    np.testing.assert_array_equal(batched.kv_lengths, lengths)
    assert batched.q.shape[1] in LENGTH_BUCKETS
    assert batched.q.shape == batched.k.shape == batched.v.shape == (2, batched.q.shape[1], 12, 32)
    n = int(lengths[0])
    # Layers 0-2 mask the padded keys, so the short text's Q/K/V do not depend on its batch-mate.
    for got, want in zip(batched[:3], alone[:3], strict=True):
        np.testing.assert_allclose(got[0, :n], want[0, :n], atol=2e-5)


def test_tokenize_truncates_like_hugging_face_and_rejects_bad_lengths(model):
    ids, lengths = model.tokenize(["word " * 100], max_length=16)
    assert lengths.tolist() == [16]
    assert ids[0][0] == model.tokenizer.token_to_id("[CLS]")
    assert ids[0][-1] == model.tokenizer.token_to_id("[SEP]")
    with pytest.raises(ValueError, match="max_length"):
        model.tokenize(["x"], max_length=513)
    with pytest.raises(ValueError, match="layer"):
        model.capture_qkv(["x"], layer=6)
    assert len(model.weights_sha256) == 64


@pytest.mark.skipif(importlib.util.find_spec("kernels.pallas_tpu") is None,
                    reason="kernels/pallas_tpu.py not present")
def test_paraphrases_with_pallas_tpu(model):
    # Interpret mode off-TPU is slow: one short batch only.
    close, far = _paraphrase_margin(model, kernels.get_attention_fn("pallas_tpu"))
    assert close > 0.6
    assert close > far + 0.3
