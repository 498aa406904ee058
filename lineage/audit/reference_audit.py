"""The audit's reference recheck: recompute cached float64 references with NumPy.

``kernelgate audit --recheck-reference N`` recomputes N of the references the held-out
evaluation read from ``evaluation.reference_cache`` and compares them with the cached
arrays, so a cache entry written by someone other than the evaluation shows up as a
difference rather than as a passing kernel.
"""

from __future__ import annotations

from lineage.audit.audit_report import Walk
from lineage.signing.sources import EvidenceSource


def recheck_reference(source: EvidenceSource, evaluation_run_id: str, sample: int,
                       walk: Walk) -> None:
    """Recompute ``sample`` cached float64 references of the evaluation run
    ``evaluation_run_id`` (its signed index says which arrays it used) with NumPy and
    show the comparison on ``walk`` (a difference is a problem); a test set that is not
    on this host is said, not counted as a problem. Never raises on a missing index."""
    from evaluation.reference_cache import INDEX_FILE, ReferenceIndex, recheck
    from evaluation.report import REPORT_FILENAME, EvaluationReport
    from evaluation.testset import load_split

    try:
        index = ReferenceIndex.model_validate_json(
            source.artifact(evaluation_run_id, f"evaluation/{INDEX_FILE}"))
        report = EvaluationReport.model_validate_json(
            source.artifact(evaluation_run_id, f"evaluation/{REPORT_FILENAME}"))
    except Exception as err:  # noqa: BLE001 - a missing index is a finding, not a crash
        walk.link("reference", evaluation_run_id, False, f"no readable reference index: {err}")
        return
    try:
        cases = {c.spec.case_id: c for c in load_split(report.testset_dir, report.split)}
    except FileNotFoundError:
        walk.link("reference", evaluation_run_id, False, f"test set {report.testset_dir} is not "
                  "on this host; the cached reference was not rechecked", problem=False)
        return
    result = recheck(index, cases, sample=sample)
    walk.link("reference", evaluation_run_id, not result.problems,
              f"{result.checked} cached references ({', '.join(result.methods) or 'none'}) "
              "recomputed with NumPy: max "
              f"relative difference {result.max_rel_diff:.2g}" + "".join(f"; {p}" for p in result.problems))
