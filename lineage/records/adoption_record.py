"""The adoption decision on its rollout run, for the auditor and for the MLflow UI.

:func:`log_adoption` logs the decision itself (``adoption/decision.json``, which the
outcome's attestation signs) and two views of it that MLflow shows without opening a
file: metrics (:func:`adoption_metrics`: the pooled effect, and each required bucket's
pairs, median ratio, interval and always-valid p) and a plot
(``adoption/effect.png``, ``gates.adoption_plot``). The views are made from the
decision, never the other way round: the audit reads the signed JSON only.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from gates.adoption_decision import AdoptionVerdict
from gates.adoption_plot import plot_adoption
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking

PLOT_ARTIFACT = "adoption/effect.png"
_FIGURES = ("n_pairs", "median_ratio", "ratio_lower", "ratio_upper", "p_value")


def adoption_metrics(verdict: AdoptionVerdict) -> dict[str, float]:
    """MLflow metrics of ``verdict``: ``adoption.adopted`` (1 or 0), the pooled
    ``adoption.<figure>`` and, per required bucket, ``adoption.bucket_<tokens>.assessed``
    (1 or 0) and ``adoption.bucket_<tokens>.<figure>`` for figure in n_pairs,
    median_ratio, ratio_lower, ratio_upper, p_value (a bucket not assessed: n_pairs only,
    since the median of too few pairs is no finding). A figure that is unset or not finite
    (an unbounded interval side) is left out, never logged as a number it is not."""
    out = {"adoption.adopted": float(verdict.outcome == "adopted")}

    def add(prefix: str, source) -> None:
        for name in _FIGURES:
            value = getattr(source, name)
            if value is not None and math.isfinite(value):
                out[f"{prefix}.{name}"] = float(value)

    add("adoption", verdict)
    for bucket in verdict.buckets:
        prefix = f"adoption.bucket_{bucket.bucket}"
        out[f"{prefix}.assessed"] = float(bucket.status != "not_assessed")
        if bucket.status == "not_assessed":  # its few pairs' median is no finding
            out[f"{prefix}.n_pairs"] = float(bucket.n_pairs)
        else:
            add(prefix, bucket)
    return out


def log_adoption(tracking: Tracking, run_id: str, verdict: AdoptionVerdict,
                 minimum_worthwhile_ratio: float) -> None:
    """Log ``verdict`` to the rollout run ``run_id``: the decision JSON first (what the
    outcome's attestation signs), then its metrics and plot."""
    tr.log_model_json(tracking, run_id, verdict, tags.ADOPTION_ARTIFACT)
    tr.log_metrics(tracking, run_id, adoption_metrics(verdict))
    with tempfile.TemporaryDirectory() as folder:
        png = plot_adoption(verdict, minimum_worthwhile_ratio, Path(folder) / "effect.png")
        tr.log_bytes(tracking, run_id, png.read_bytes(), PLOT_ARTIFACT)
