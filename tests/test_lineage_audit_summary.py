"""The audit's one-line summary says when the audited version was built but never judged
(no signed gate decision): a passing audit of its records is no verdict on it."""

from __future__ import annotations

from lineage.audit.audit_report import GATE_LINK, AuditLink, AuditReport


def _report(chain: list[AuditLink], problems: list[str] | None = None) -> AuditReport:
    return AuditReport(family="fam", target="2", model_name="kernelgate-fam", version="2",
                       aliases={}, signed_aliases={}, chain=chain, registrations=[],
                       attestations_verified=24, artifacts_verified=62, artifacts_checked=62,
                       problems=problems or [])


BUILD = AuditLink(name="build", ref="run-b", ok=True, detail="pallas_mosaic_gpu default config")
NO_GATE = AuditLink(name=GATE_LINK, ref=None, ok=True, detail="none signed")
GATE = AuditLink(name=GATE_LINK, ref="run-d", ok=True, detail="verdict promote (p, scope all)")


def test_a_version_built_and_never_judged_says_so_in_the_summary():
    report = _report([AuditLink(name="version", ref="2", ok=True, detail="build run run-b"),
                      BUILD, NO_GATE])
    assert report.ok and report.exit_code == 0
    assert report.summary().startswith(
        "AUDIT PASSED: kernelgate-fam 2 -> v2 (built, never judged: no gate decision signed);")
    assert report.render().splitlines()[-1] == report.summary()


def test_a_judged_version_and_a_failed_audit_keep_their_summaries():
    judged = _report([BUILD, GATE])
    assert "never judged" not in judged.summary()
    assert judged.summary().startswith("AUDIT PASSED: kernelgate-fam 2 -> v2; 24 attestations")
    failed = _report([BUILD, NO_GATE], problems=["something altered"])
    assert failed.summary().startswith("AUDIT FAILED: kernelgate-fam 2 -> v2 (built, never judged")
    assert failed.exit_code == 1

