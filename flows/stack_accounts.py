"""The servers profile's accounts and families on the MLflow tracking server: the
``pipeline``, ``auditor`` and ``release-manager`` accounts (``create_accounts``, as the
admin), and each configured family's experiment and registered model created as the
pipeline account before anyone else can take the names (``claim_families``: otherwise
any account could squat them). ``flows.stack.up`` calls both; ``kernelgate audit`` on the
servers profile checks who owns the family it audits (``audit_ownership``)."""

from __future__ import annotations

import contextlib
import os
from unittest import mock

from flows.stack_config import Secrets, StackConfig, StackError

ACCOUNTS = ("pipeline", "auditor", "release-manager")


def _as_account(username: str, password: str):
    """MLflow's client credentials set to ``username`` for a block, the caller's restored
    after it (``unittest.mock.patch.dict`` on ``os.environ``)."""
    return mock.patch.dict(os.environ, {"MLFLOW_TRACKING_USERNAME": username,
                                        "MLFLOW_TRACKING_PASSWORD": password})


def create_accounts(config: StackConfig, mlflow_url: str) -> None:
    """Create the ``pipeline``, ``auditor`` and ``release-manager`` accounts (idempotent).

    Raises:
        StackError: a password variable is unset.
        mlflow.exceptions.RestException: the server refused (e.g. a wrong admin password).
    """
    from mlflow.exceptions import RestException
    from mlflow.server import get_app_client

    passwords = {a: config.secrets.value(a.replace("-", "_")) for a in ACCOUNTS}
    with _as_account("admin", config.secrets.value("mlflow_admin")):
        auth = get_app_client("basic-auth", tracking_uri=mlflow_url)
        for account, password in passwords.items():
            try:
                auth.create_user(account, password)
            except RestException as err:
                if "RESOURCE_ALREADY_EXISTS" not in str(err):
                    raise
                auth.update_user_password(account, password)


def claim_families(config: StackConfig, mlflow_url: str) -> list[str]:
    """Create the experiment and registered model of each of ``config.families`` as the
    pipeline account (idempotent), so it owns them before any other account can create
    the names (``lineage.store.ownership``); returns the families claimed.

    Raises:
        StackError: a family is already owned by another account (the message says how
            an admin hands it back), or a password variable is unset.
    """
    from lineage.aliases.registered_model import ensure_registered_model
    from lineage.store.ownership import FamilyOwnedElsewhere, refusing_squatted
    from lineage.store.tracking import Tracking, ensure_experiment

    tracking = Tracking(tracking_uri=mlflow_url)
    try:
        with _as_account("pipeline", config.secrets.value("pipeline")):
            for family in config.families:
                with refusing_squatted(tracking, family, "create the experiment"):
                    ensure_experiment(tracking, family)
                with refusing_squatted(tracking, family, "create the registered model"):
                    ensure_registered_model(tracking, family)
    except FamilyOwnedElsewhere as err:
        raise StackError(f"{err} (owned by: {', '.join(_owners(config, mlflow_url, family)) or 'unknown'})"
                         ) from err
    return list(config.families)


def _owners(config: StackConfig, mlflow_url: str, family: str) -> list[str]:
    """The accounts owning ``family`` on the server, read as the admin."""
    from mlflow.server import get_app_client

    from lineage.store.ownership import owners
    from lineage.store.tracking import Tracking, experiment_name

    with _as_account("admin", config.secrets.value("mlflow_admin")):
        found = Tracking(tracking_uri=mlflow_url).client().get_experiment_by_name(
            experiment_name(family))
        return owners(get_app_client("basic-auth", tracking_uri=mlflow_url),
                      [a for a in ACCOUNTS if a != "pipeline"], family,
                      found.experiment_id if found else None)


def audit_ownership(mlflow_url: str, family: str,
                    secrets: Secrets | None = None) -> tuple[list[str], list[str]]:
    """Who owns ``family`` on the tracking server at ``mlflow_url``, for the audit:
    ``(problems, warnings)``, the problems from ``lineage.store.ownership.squatting`` (an
    owner other than the pipeline named; the pipeline not owning it).

    With the MLflow admin's password in the environment (``secrets.mlflow_admin``,
    ``KERNELGATE_MLFLOW_ADMIN_PASSWORD``) every account on the server is read; without it
    only the auditing account's own permissions (``MLFLOW_TRACKING_USERNAME``: MLflow lets
    every account read its own), which finds an auditor that squatted the family itself,
    and a warning says the other accounts were not read. Never raises on the server's
    refusals (a permission it may not read counts as not held)."""
    from mlflow.server import get_app_client
    from mlflow.server.auth.routes import LIST_USERS
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    from lineage.store.ownership import manage_holders, squatting
    from lineage.store.tracking import Tracking, experiment_name

    secrets = secrets or Secrets()
    admin = os.environ.get(secrets.mlflow_admin, "")
    me = os.environ.get("MLFLOW_TRACKING_USERNAME", "")
    if not admin and not me:
        return [], [f"who owns `{experiment_name(family)}` was not checked: no MLflow account "
                    "is set (MLFLOW_TRACKING_USERNAME)"]
    credentials = _as_account("admin", admin) if admin else contextlib.nullcontext()
    with credentials:
        found = Tracking(tracking_uri=mlflow_url).client().get_experiment_by_name(
            experiment_name(family))
        if admin:
            listed = verify_rest_response(http_request(get_default_host_creds(mlflow_url),
                                                       LIST_USERS, "GET"), LIST_USERS)
            read = [u["username"] for u in listed.json()["users"] if not u["is_admin"]]
        else:
            read = [me]
        holders = manage_holders(get_app_client("basic-auth", tracking_uri=mlflow_url), read,
                                 family, found.experiment_id if found else None)
    warnings = [] if admin else [
        f"who owns `{experiment_name(family)}` was read for {me!r} only: the other accounts' "
        f"permissions only the MLflow admin can read (set {secrets.mlflow_admin} to check them)"]
    return squatting(holders, family, read), warnings
