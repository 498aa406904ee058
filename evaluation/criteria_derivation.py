"""Criteria sized for a serving dtype, derived from the tuning split only.

``python -m evaluation.criteria_derivation --dtype bfloat16`` embeds the tuning split's
documents with MiniLM running its attention in ``--dtype``, once with the float64
reference attention and once with each of two correct implementations of that dtype
(the naive baseline and XLA), and prints:

* ``embedding-cosine``: ``1 - margin * (1 - c)``, ``c`` the lower of the two
  implementations' minimum cosine similarity to the reference (``margin`` 4: a candidate
  may lose up to 4x the embedding accuracy that dtype's correct kernels lose);
* ``canary.max_output_drift``: ``margin`` times the larger per-document relative L2
  difference between the two correct implementations (what two correct kernels of the
  dtype differ by, as the canary measures candidate against production).

The allowed loss ``margin * (1 - c)`` and the drift are rounded up to two significant
digits. The held-out and confirmation
documents are never read (``evaluation.documents.assign_splits``), so the figures can
be frozen in a thresholds file before its registration reads any held-out case
(README, "Serving contracts").
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from evaluation.documents import assign_splits, load_documents
from evaluation.model import MiniLM
from evaluation.model_check import cosine_similarities, float64_attention
from kernels.dispatch import get_attention_fn

MARGIN = 4.0
DOCUMENTS = 16


def _round_out(x: float, up: bool) -> float:
    """``x`` to two significant digits, rounded away from the reference (up or down)."""
    if x == 0:
        return 0.0
    exp = math.floor(math.log10(abs(x))) - 1
    scaled = x / 10 ** exp
    return float(f"{(math.ceil(scaled) if up else math.floor(scaled)) * 10 ** exp:.2g}")


def derive(dtype: str, *, documents: int = DOCUMENTS, margin: float = MARGIN) -> dict:
    """The derived figures and what they rest on (see the module docstring)."""
    texts = [d.text for d in assign_splits(load_documents(None), per_split=documents)["tuning"]]
    model = MiniLM.load().with_attention_dtype(dtype)
    ref = model.embed(texts, attention_fn=float64_attention)
    emb = {name: model.embed(texts, attention_fn=get_attention_fn(name))
           for name in ("naive", "xla")}
    worst_cos = min(float(np.min(cosine_similarities(e, ref))) for e in emb.values())
    a, b = emb["naive"].astype(np.float64), emb["xla"].astype(np.float64)
    drift = float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))
    return {"dtype": dtype, "split": "tuning", "documents": len(texts), "margin": margin,
            "min_cosine_of_correct_kernels": worst_cos,
            "max_drift_between_correct_kernels": drift,
            "embedding_cosine_min": 1 - _round_out(margin * (1 - worst_cos), up=True),
            "canary_max_output_drift": _round_out(max(margin * drift, 1e-6), up=True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--documents", type=int, default=DOCUMENTS)
    args = parser.parse_args(argv)
    print(json.dumps(derive(args.dtype, documents=args.documents), indent=1))


if __name__ == "__main__":
    main()
