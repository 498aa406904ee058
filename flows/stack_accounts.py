"""The servers profile's accounts and families on the MLflow tracking server: the
``pipeline``, ``auditor`` and ``release-manager`` accounts (``create_accounts``, as the
admin), and each configured family's experiment and registered model created as the
pipeline account before anyone else can take the names (``claim_families``; issue 22's
squatting). ``flows.stack.up`` calls both."""

from __future__ import annotations

import os
from unittest import mock

from flows.stack_config import StackConfig, StackError

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
    the names (``lineage.ownership``); returns the families claimed.

    Raises:
        StackError: a family is already owned by another account (the message says how
            an admin hands it back), or a password variable is unset.
    """
    from lineage.ownership import FamilyOwnedElsewhere, refusing_squatted
    from lineage.registered_model import ensure_registered_model
    from lineage.tracking import Tracking, ensure_experiment

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

    from lineage.ownership import owners
    from lineage.tracking import Tracking, experiment_name

    with _as_account("admin", config.secrets.value("mlflow_admin")):
        found = Tracking(tracking_uri=mlflow_url).client().get_experiment_by_name(
            experiment_name(family))
        return owners(get_app_client("basic-auth", tracking_uri=mlflow_url),
                      [a for a in ACCOUNTS if a != "pipeline"], family,
                      found.experiment_id if found else None)
