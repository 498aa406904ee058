"""What a process serving a ``dispatch`` version is given: the version's signed policy.

A ``dispatch`` version's code is the project's kernels, and its config only the policy's
fingerprint; the policy itself is the build run's signed artifact
(``lineage.records.dispatch_record``). So the process serving the version (a
``lineage.serving.version_runners.VersionWorker``: evaluation, shadow, canary, the audit's
loaded-model check) is started with the environment :func:`worker_environment` gives:
the policy, read back only through the signed record and audited, written to the
process's folder, and its fingerprint. The version's model then registers the
``dispatch`` kernel of that policy pinned to its signed config
(``kernels.dispatch_kernel.register_configured``) before it serves a call.
"""

from __future__ import annotations

from pathlib import Path

from kernels.dispatch_policy import DispatchPolicy
from lineage.records.dispatch_record import DispatchAudit, audit_dispatch_build, serving_environment
from lineage.serving.model_files import find_build
from lineage.signing.sources import EvidenceSource

DISPATCH = "dispatch"
"""The implementation name of a version that serves a dispatch policy."""


def is_dispatch(kernel: dict) -> bool:
    """Whether a version's recorded kernel (its ``kernel.json``) serves a dispatch policy."""
    return kernel.get("implementation") == DISPATCH


def version_policy(source: EvidenceSource, version: str
                   ) -> tuple[DispatchAudit, DispatchPolicy | None] | None:
    """The audit of ``version``'s signed dispatch build and its policy
    (``lineage.records.dispatch_record.audit_dispatch_build``: the policy is ``None``
    when it cannot be read from the signed record); ``None`` when ``version`` has no
    signed build or one of another implementation."""
    build = find_build(source, version)
    if build is None or build.predicate.get("implementation") != DISPATCH:
        return None
    return audit_dispatch_build(source, build.run_id)


def worker_environment(source: EvidenceSource, version: str, folder: Path) -> dict[str, str]:
    """The environment variables the process serving ``version`` needs: for a
    ``dispatch`` version (its signed build says so), its audited signed policy written
    under ``folder`` and the policy's fingerprint
    (``lineage.records.dispatch_record.serving_environment``); for any other version none.

    Raises:
        lineage.records.dispatch_record.DispatchRecordError: the policy fails its audit (each
            problem named); the version is not served.
    """
    build = find_build(source, version)
    if build is None or build.predicate.get("implementation") != DISPATCH:
        return {}
    return serving_environment(source, build.run_id, Path(folder))
