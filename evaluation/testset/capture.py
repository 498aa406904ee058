"""Ordinary cases: Q/K/V captured from all-MiniLM-L6-v2 on real documents.

The cases depend on the documents installed on the building machine and on its
floating-point arithmetic, so their digests (and the split digests) are
machine-specific: build once, then ship the directory.
"""

from __future__ import annotations

import functools

import numpy as np

from evaluation.cases import Split, TestCase, make_case
from evaluation.documents import Document
from evaluation.testset.recipes import DTYPES, OrdinaryPlan


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
    from kernels.dispatch import get_attention_fn

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
        q, k, v = (a[:, :n].astype(DTYPES[dtype]) for a in (cap.q, cap.k, cap.v))
        cases.append(make_case(case_id=f"{split}/ordinary/minilm-l{layer}-single-{dtype}",
                               category="ordinary", tags=("minilm", f"layer{layer}"),
                               q=q, k=k, v=v, source=_doc_source([doc])))
    texts = _chunks(batch_docs, rng, plan.max_length)
    for layer, dtype in plan.batched_layers:
        cap = model.capture_qkv(texts, layer=layer, max_length=plan.max_length,
                                attention_fn=attention_fn)[0]
        q, k, v = (a.astype(DTYPES[dtype]) for a in (cap.q, cap.k, cap.v))
        cases.append(make_case(case_id=f"{split}/ordinary/minilm-l{layer}-batch-{dtype}",
                               category="ordinary", tags=("minilm", f"layer{layer}", "padding"),
                               q=q, k=k, v=v, kv_lengths=cap.kv_lengths,
                               source=_doc_source(batch_docs)))
    return cases
