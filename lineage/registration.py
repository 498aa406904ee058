"""Preregistration in MLflow: freeze a thresholds file before any evaluation.

:func:`preregister` validates the file, logs its exact bytes as the artifact
``thresholds/<file name>`` of a run tagged ``kernelgate.stage=preregistration`` in the
family's experiment, and tags the run with the file's sha256
(``kernelgate.thresholds_sha256``) and the UTC registration time
(``kernelgate.registered_at``). The run id is the registration id. The rules of a valid
registration are ``gates.preregistration``'s.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from mlflow.exceptions import MlflowException

from gates.preregistration import PreregistrationError, Registration, check_registration
from gates.thresholds import Thresholds, parse_thresholds
from lineage import tags
from lineage import tracking as tr
from lineage.tracking import Tracking

__all__ = ["PreregistrationError", "Registration", "load_registration", "preregister",
           "registered_thresholds", "verify_registration"]


def preregister(
    path: str | Path, *, tracking: Tracking, family: str, parent_run_id: str | None = None
) -> Registration:
    """Freeze the thresholds file at ``path`` in MLflow and return its registration.

    Call it before the candidate is evaluated: the gate later refuses evaluations that
    started before ``registered_at``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a valid thresholds file (nothing is registered then).
    """
    path = Path(path)
    data = path.read_bytes()
    thresholds = parse_thresholds(data, source=str(path))  # never freeze an invalid file
    digest = hashlib.sha256(data).hexdigest()
    artifact = f"thresholds/{path.name}"
    with tr.stage_run(
        tracking,
        family,
        "preregistration",
        parent_run_id=parent_run_id,
        run_name=f"preregistration-{thresholds.profile}",
    ) as run_id:
        logged = tr.log_bytes(tracking, run_id, data, artifact)
        assert logged == digest
        registered_at = datetime.now(UTC)
        tr.set_tags(
            tracking,
            run_id,
            {
                tags.THRESHOLDS_SHA256: digest,
                tags.THRESHOLDS_ARTIFACT: artifact,
                tags.REGISTERED_AT: registered_at.isoformat(),
                tags.PROFILE: thresholds.profile,
            },
        )
    return Registration(
        registration_id=run_id,
        family=family,
        profile=thresholds.profile,
        thresholds_sha256=digest,
        thresholds_artifact=artifact,
        registered_at=registered_at,
    )


def load_registration(registration_id: str, *, tracking: Tracking) -> Registration:
    """Read a registration back from MLflow and check its frozen artifact is intact.

    Raises:
        PreregistrationError: no such run, not a preregistration run, missing tags, or the
            stored thresholds artifact no longer has the registered sha256.
    """
    try:
        run = tracking.client().get_run(registration_id)
    except MlflowException as exc:
        raise PreregistrationError(f"registration {registration_id!r} not found: {exc}") from exc
    run_tags = run.data.tags
    if run_tags.get(tags.STAGE) != "preregistration":
        raise PreregistrationError(
            f"run {registration_id} is not a preregistration run "
            f"({tags.STAGE}={run_tags.get(tags.STAGE)!r})"
        )
    needed = (tags.THRESHOLDS_SHA256, tags.THRESHOLDS_ARTIFACT, tags.REGISTERED_AT)
    missing = [k for k in needed if k not in run_tags]
    if missing:
        raise PreregistrationError(f"registration {registration_id} lacks tags {missing}")
    artifact = run_tags[tags.THRESHOLDS_ARTIFACT]
    try:
        stored = tr.read_artifact(tracking, registration_id, artifact)
    except (MlflowException, OSError) as exc:
        raise PreregistrationError(
            f"registration {registration_id}: thresholds artifact {artifact!r} unreadable: {exc}"
        ) from exc
    if hashlib.sha256(stored).hexdigest() != run_tags[tags.THRESHOLDS_SHA256]:
        raise PreregistrationError(
            f"registration {registration_id}: stored artifact {artifact!r} no longer matches "
            "the registered sha256 (the record was altered)"
        )
    return Registration(
        registration_id=registration_id,
        family=run_tags.get(tags.FAMILY, ""),
        profile=run_tags.get(tags.PROFILE, ""),
        thresholds_sha256=run_tags[tags.THRESHOLDS_SHA256],
        thresholds_artifact=artifact,
        registered_at=datetime.fromisoformat(run_tags[tags.REGISTERED_AT]),
    )


def verify_registration(
    registration_id: str,
    thresholds_path: str | Path,
    evaluation_started_at: datetime,
    *,
    tracking: Tracking,
) -> Registration:
    """Load a registration and check the file at ``thresholds_path`` and the evaluation time.

    Raises:
        PreregistrationError: see :func:`load_registration` and :func:`check_registration`.
        ValueError: naive ``evaluation_started_at``.
    """
    registration = load_registration(registration_id, tracking=tracking)
    try:
        digest = hashlib.sha256(Path(thresholds_path).read_bytes()).hexdigest()
    except OSError as exc:
        raise PreregistrationError(f"thresholds file {thresholds_path} unreadable: {exc}") from exc
    check_registration(registration, digest, evaluation_started_at)
    return registration


def registered_thresholds(registration: Registration, *, tracking: Tracking) -> Thresholds:
    """Parse the thresholds exactly as frozen in the registration run's artifact."""
    data = tr.read_artifact(
        tracking, registration.registration_id, registration.thresholds_artifact
    )
    if hashlib.sha256(data).hexdigest() != registration.thresholds_sha256:
        raise PreregistrationError(
            f"registration {registration.registration_id}: stored thresholds were altered"
        )
    return parse_thresholds(data, source=f"registration {registration.registration_id}")


def thresholds_for_gate(registration: Registration, thresholds_path: str | Path | None,
                        evaluation_started_at: datetime, *, tracking: Tracking) -> Thresholds:
    """The thresholds a gate judges by: the registered bytes, read back from MLflow.

    Checks that the registration is intact, that the file in hand (when given) is still
    the registered file, and that the evaluation started after the registration.

    Raises:
        PreregistrationError: any of those fails (a refusal to judge, not a verdict).
    """
    if thresholds_path is not None:
        verify_registration(registration.registration_id, thresholds_path,
                            evaluation_started_at, tracking=tracking)
    else:
        check_registration(load_registration(registration.registration_id, tracking=tracking),
                           registration.thresholds_sha256, evaluation_started_at)
    return registered_thresholds(registration, tracking=tracking)
