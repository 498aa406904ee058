"""The model-level accuracy check: MiniLM sentence embeddings computed with an attention
implementation against the same model with float64 attention (``float64_attention``),
compared by cosine similarity per document. The rest of the model is unchanged, so a
difference isolates the attention kernel."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluation.coverage import is_refusal
from kernels.reference import attention_reference


def float64_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                      q_lengths=None, kv_lengths=None) -> jax.Array:
    """An ``AttentionFn`` that computes attention in float64 on the host.

    ``jax.pure_callback`` hands the (possibly traced) operands to
    ``kernels.reference.attention_reference`` (NumPy, float64); the result is rounded
    once to ``q.dtype`` so it slots into a float32 model. The rest of the model is
    unchanged, so an embedding difference against it isolates the attention kernel.
    Works under ``jit``; batched (``vmap``) calls run sequentially.
    """
    out_type = jax.ShapeDtypeStruct(q.shape, q.dtype)
    has_q, has_kv = q_lengths is not None, kv_lengths is not None

    def host(q, k, v, *lengths):
        ql = lengths[0] if has_q else None
        kl = lengths[-1] if has_kv else None
        ref = attention_reference(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal,
                                  scale=scale, q_lengths=ql, kv_lengths=kl)
        return ref.astype(out_type.dtype)

    lengths = [x for x in (q_lengths, kv_lengths) if x is not None]
    return jax.pure_callback(host, out_type, q, k, v, *lengths, vmap_method="sequential")


class ModelAccuracy(BaseModel):
    """Sentence embeddings with an implementation vs with float64 attention.

    ``cosine_similarities[i]`` is the cosine similarity (float64) of document ``i``'s
    embedding computed both ways.
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    implementation: str
    n_documents: int
    weights_sha256: str | None = None
    reference: str = "float64 attention via jax.pure_callback (kernels.reference), rest of model float32"
    cosine_similarities: list[float]
    min_cosine_similarity: float
    mean_cosine_similarity: float
    dtype: str = Field("float32", description="the dtype the model ran its attention in")
    refused: str | None = Field(None, description="the implementation refused the model's "
                                "calls by contract (NotImplementedError: why); no similarity "
                                "then (NaN: the check fails, and coverage counts it)")

    def metrics(self) -> dict[str, float]:
        """``model.min_cosine_similarity`` and ``model.mean_cosine_similarity``."""
        return {"model.min_cosine_similarity": self.min_cosine_similarity,
                "model.mean_cosine_similarity": self.mean_cosine_similarity}


def _texts(documents) -> list[str]:
    texts = [d if isinstance(d, str) else d.text for d in documents]
    if not texts:
        raise ValueError("model accuracy needs at least one document")
    return texts


def cosine_similarities(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``[n, dim]`` arrays, in float64 (NaN where
    a row is non-finite or zero, so it can never pass a threshold)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"embeddings must both be [n, dim] of one shape, got {a.shape} and {b.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def model_accuracy(documents, embed: Callable[[list[str]], np.ndarray], *,
                   reference_embeddings: np.ndarray, name: str = "candidate",
                   weights_sha256: str | None = None, dtype: str = "float32") -> ModelAccuracy:
    """Cosine similarity of sentence embeddings: an implementation vs float64 attention.

    Args:
        documents: strings or objects with a ``.text``.
        embed: ``texts -> [n, 384]`` embeddings with the implementation under test (a
            runner's ``embed``; for a kernel of this process, ``lambda t:
            model.embed(t, attention_fn=fn)``).
        reference_embeddings: the same documents embedded with float64 attention
            (``model.embed(texts, attention_fn=float64_attention)``), shared between
            candidate, baseline and production.
        name: label stored in the result.
        weights_sha256: the encoder weights' digest, for the record.
        dtype: the dtype the model ran its attention in (the serving contract's), recorded.

    Returns:
        ``ModelAccuracy``; a NaN embedding gives a NaN similarity and a NaN minimum.

    A refusal by contract (``NotImplementedError`` naming why, here or relayed by a
    version's process) is recorded in ``refused``, not raised.

    Raises:
        ValueError: no documents, or embeddings of mismatched shape.
        Exception: whatever ``embed`` raises other than a refusal (a crash).
    """
    texts = _texts(documents)
    try:
        cos = cosine_similarities(embed(texts), reference_embeddings)
    except Exception as err:
        why = f"{type(err).__name__}: {err}"
        if not is_refusal(why):
            raise  # a crash, not a refusal: the stage ends the rollout as Errored
        return ModelAccuracy(implementation=name, n_documents=len(texts), dtype=dtype,
                             weights_sha256=weights_sha256, cosine_similarities=[],
                             min_cosine_similarity=math.nan, mean_cosine_similarity=math.nan,
                             refused=why)
    return ModelAccuracy(
        implementation=name, n_documents=len(texts), weights_sha256=weights_sha256, dtype=dtype,
        cosine_similarities=[float(c) for c in cos],
        # np.min propagates NaN, so one broken document fails the whole check
        min_cosine_similarity=float(np.min(cos)), mean_cosine_similarity=float(np.mean(cos)),
    )
