"""Step 5 of the audit: what the MLflow store shows, against what the signatures vouch for.

Run tags, metrics and params against the values each attestation signed; every stored
artifact re-hashed against its signed digest (an artifact no signature covers, or one
signed and gone, is named); the version's tags against its signed build, its link tags
against the signed promotion; deleted runs an auditor would follow. Each function
returns the problems it found (``lineage.audit.audit`` collects them) and never raises on a
mismatch.
"""

from __future__ import annotations

import hashlib
import math
import sys

from mlflow.exceptions import MlflowException

from lineage.aliases import registered_model
from lineage.signing.attestations import ATTESTATION_DIR, Attestation, subject_name
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from lineage.store.tracking import Tracking


def cross_check(tracking: Tracking, source: StoreSource, runs: set[str], family: str,
                version: str, build: Attestation | None,
                warnings: list[str] | None = None) -> tuple[int, int, list[str]]:
    """MLflow's metrics, params and tags of ``runs`` against the signed values, every
    artifact against its signed digest, and the version's tags against its signed
    ``build``. Returns ``(artifacts verified, artifacts checked, problems)``; never raises
    on a mismatch (each is a problem named). A dataset input whose content (digest and
    sha256) is the signed one but whose location moved (a store restored or relocated
    elsewhere) is appended to ``warnings`` instead (:func:`moved_datasets`)."""
    verified = checked = 0
    problems: list[str] = []
    by_run: dict[str, list[Attestation]] = {}
    for a in source.attestations():
        by_run.setdefault(a.run_id, []).append(a)
    for run_id in sorted(r for r in runs if r):
        try:
            run = tracking.client().get_run(run_id)
        except MlflowException:
            continue  # named as missing evidence already
        signed_subjects: dict[str, str] = {}
        for attestation in by_run.get(run_id, []):
            signed_subjects.update(attestation.subjects)
            p = attestation.predicate
            for key, value in (p.get("tags") or {}).items():
                if run.data.tags.get(key) != str(value):
                    problems.append(f"run {run_id}: tag {key} is {run.data.tags.get(key)!r}, "
                                         f"signed {value!r}")
            for key, value in (p.get("metrics") or {}).items():
                shown = run.data.metrics.get(key)
                if shown is None or not same_value(shown, value):
                    problems.append(f"run {run_id}: metric {key} is {shown}, signed {value}")
            for key, value in (p.get("params") or {}).items():
                if run.data.params.get(key) != str(value):
                    problems.append(f"run {run_id}: param {key} is "
                                         f"{run.data.params.get(key)!r}, signed {value!r}")
            if "datasets" in p:
                shown = tr.dataset_facts(run)
                problems += dataset_problems(run_id, shown, p["datasets"])
                if warnings is not None:
                    warnings += moved_datasets(run_id, shown, p["datasets"])
        stored = tr.list_artifact_files(tracking, run_id)
        for path in stored:
            if path.startswith(f"{ATTESTATION_DIR}/"):
                continue
            checked += 1
            name = subject_name(run_id, path)
            if name not in signed_subjects:
                problems.append(f"artifact {path!r} of run {run_id}: not covered by any "
                                     "signature (added after signing)")
                continue
            digest = hashlib.sha256(tr.read_artifact(tracking, run_id, path)).hexdigest()
            if digest != signed_subjects[name]:
                problems.append(f"artifact {path!r} of run {run_id}: sha256 mismatch with "
                                     "its signed digest (altered after signing)")
            else:
                verified += 1
        for name in signed_subjects:
            run_part, _, path = name.partition("/")
            if run_part == run_id and path not in stored:
                checked += 1
                problems.append(f"artifact {path!r} of run {run_id}: signed but missing "
                                     "from the artifact store")
    if build is not None:
        shown = registered_model.version_tags(tracking, family, version)
        for key, value in (build.predicate.get("version_tags") or {}).items():
            if shown.get(key) != value:
                problems.append(f"v{version}: tag {key} is {shown.get(key)!r}, the signed "
                                     f"build says {value!r} (what serves is read from the "
                                     "signed build, not the tag)")
    return verified, checked, problems


LINK_TAGS = {tags.DECISION_RUN_ID: "decision_run_id", tags.EVALUATION_RUN_ID: "evaluation_run_id",
             tags.REGISTRATION_ID: "registration_id",
             tags.CONFIRMATION_RUN_ID: "confirmation_run_id", tags.SHADOW_RUN_ID: "shadow_run_id"}
"""Version tags an auditor follows in the MLflow UI -> the promotion's signed link."""


def link_tag_problems(tracking: Tracking, family: str, version: str,
                      promotion: Attestation) -> list[str]:
    """The version's link tags must lead where the signed promotion does: one problem per
    tag that leads elsewhere."""
    problems: list[str] = []
    shown = registered_model.version_tags(tracking, family, version)
    links = promotion.predicate.get("chain", {})
    for key, field in LINK_TAGS.items():
        if links.get(field) and shown.get(key) != links[field]:
            problems.append(f"v{version}: tag {key} is {shown.get(key)!r}, the signed "
                                 f"promotion links {links[field]!r} (the UI's link is wrong; "
                                 "the audit follows the signed one)")
    return problems


def deleted_problems(source: StoreSource, runs: set[str]) -> list[str]:
    """One problem per run of ``runs`` that was deleted (soft delete) in the store."""
    return [f"run {run_id} was deleted: evidence an auditor follows in the "
            "MLflow UI is gone (restore it from the trash)"
            for run_id in sorted(runs & source.deleted())]


def _by_input(items: list) -> dict[tuple[str, str], dict]:
    return {(str(d.get("context")), str(d.get("name"))): d for d in items}


def _differs(now: dict, then: dict, field: str) -> bool:
    return str(now.get(field)) != str(then.get(field))


def dataset_problems(run_id: str, shown: list[dict], signed: list) -> list[str]:
    """The dataset inputs MLflow shows for a run against the signed list: one problem per
    input whose digest or sha256 differs, whose source differs while its content does too,
    or that is missing or added. (A source that moved with the content unchanged is
    :func:`moved_datasets`' warning: the digest is a dataset's identity, its source a
    location, which restoring a store elsewhere changes.)"""
    now, then = _by_input(shown), _by_input(signed)
    problems = []
    for k in sorted(set(now) | set(then)):
        label = f"run {run_id}: dataset input {k[1]} ({k[0]})"
        if k not in now:
            problems.append(f"{label}: signed but not shown by MLflow")
        elif k not in then:
            problems.append(f"{label}: shown by MLflow but not signed")
        else:
            content = [f for f in ("digest", "sha256") if _differs(now[k], then[k], f)]
            problems += [f"{label}: {field} is {now[k].get(field)!r}, signed "
                         f"{then[k].get(field)!r}"
                         for field in content + (["source"] if content else [])
                         if _differs(now[k], then[k], field)]
    return problems


def moved_datasets(run_id: str, shown: list[dict], signed: list) -> list[str]:
    """One warning per dataset input whose source is not the signed one while its digest
    and sha256 are: the same data, read from elsewhere (a relocated or restored store)."""
    now, then = _by_input(shown), _by_input(signed)
    return [f"run {run_id}: dataset input {k[1]} ({k[0]}): source is {now[k].get('source')!r}, "
            f"signed {then[k].get('source')!r}; its digest and sha256 are the signed ones "
            "(the same data, located elsewhere: a relocated or restored store)"
            for k in sorted(set(now) & set(then))
            if _differs(now[k], then[k], "source")
            and not any(_differs(now[k], then[k], f) for f in ("digest", "sha256"))]


def same_value(a: float, b) -> bool:
    """Equal up to float formatting; NaN equals NaN and an infinity itself (a metric
    that was NaN when signed and is NaN now is unchanged). MLflow stores an infinity as
    the largest finite double (``±1.7976931348623157e308``): read back, that is the
    infinity it was."""
    try:
        x, y = (_stored_infinity(float(v)) for v in (a, b))
    except (TypeError, ValueError):
        return False
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        return (math.isnan(x) and math.isnan(y)) or x == y
    return abs(x - y) <= 1e-12 * max(1.0, abs(y))


def _stored_infinity(x: float) -> float:
    return math.copysign(math.inf, x) if abs(x) >= sys.float_info.max else x
