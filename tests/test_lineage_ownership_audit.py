"""The audit's ownership check (against squatting): on the servers profile ``kernelgate
audit`` names every account other than the pipeline holding MANAGE on the family's
experiment or registered model, reading every account with the admin's password and
only its own without it. A fake basic-auth server stands in for MLflow (the real one is in
``tests/test_services_attacks.py``'s squatting attack)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flows import stack_accounts
from flows.cli_store import add_ownership_findings
from lineage.store.ownership import manage_holders, squatting

GRANTS = {("auditor", "experiment", "7"): "MANAGE",
          ("release-manager", "registered_model", "kernelgate-xla"): "MANAGE",
          ("pipeline", "registered_model", "kernelgate-xla"): "MANAGE"}
"""The fake server's explicit grants: the auditor squatted the experiment, the release
manager was given MANAGE on the model beside the pipeline."""


class FakeAuth:
    """``get_user_permission`` as MLflow answers it: an admin reads anyone's, an account
    only its own (403 otherwise); no grant is the default, READ."""

    def __init__(self, requester: str, admin: bool) -> None:
        self.requester, self.admin, self.asked = requester, admin, []

    def get_user_permission(self, account, kind, key):
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

        self.asked.append(account)
        if not self.admin and account != self.requester:
            raise MlflowException("Permission denied", error_code=PERMISSION_DENIED)
        return SimpleNamespace(permission=GRANTS.get((account, kind, key), "READ"))


def test_every_owner_but_the_pipeline_is_a_problem_naming_it():
    holders = manage_holders(FakeAuth("admin", admin=True),
                             ["pipeline", "auditor", "release-manager"], "xla", "7")
    assert holders == {"experiment": ["auditor"],
                       "registered_model": ["pipeline", "release-manager"]}
    problems = squatting(holders, "xla", read=["pipeline", "auditor", "release-manager"])
    assert len(problems) == 2, problems
    experiment, model = problems
    assert "experiment `kernelgate-xla`" in experiment and "owned by 'auditor'" in experiment
    assert "registered model `kernelgate-xla`" in model and "'release-manager'" in model
    assert all('README "A squatted family"' in p for p in problems)
    # the experiment is not the pipeline's either: said once, with its owner
    assert "pipeline" not in experiment.split("not the pipeline account")[0]


def test_the_pipeline_not_owning_is_a_problem_only_when_its_permissions_were_read():
    holders = {"experiment": [], "registered_model": ["pipeline"]}
    [problem] = squatting(holders, "xla", read=["pipeline"])
    assert "experiment `kernelgate-xla`" in problem and "not owned by the pipeline" in problem
    assert squatting(holders, "xla", read=["auditor"]) == []
    assert squatting({"experiment": ["pipeline"], "registered_model": ["pipeline"]}, "xla",
                     read=["pipeline", "auditor"]) == []


@pytest.fixture
def fake_server(monkeypatch):
    """``audit_ownership``'s MLflow calls answered by the fake: users listed (an admin
    only), the experiment found with id 7, the basic-auth client per requester."""
    import mlflow.server
    import mlflow.utils.rest_utils as rest

    import lineage.store.tracking as tr

    clients: list[FakeAuth] = []

    def app_client(_name, tracking_uri):
        import os

        user = os.environ["MLFLOW_TRACKING_USERNAME"]
        clients.append(FakeAuth(user, admin=user == "admin"))
        return clients[-1]

    users = {"users": [{"username": u, "is_admin": u == "admin"}
                       for u in ("admin", "pipeline", "auditor", "release-manager")]}
    monkeypatch.setattr(mlflow.server, "get_app_client", app_client)
    monkeypatch.setattr(rest, "http_request", lambda *a, **k: SimpleNamespace(json=lambda: users))
    monkeypatch.setattr(rest, "verify_rest_response", lambda resp, _endpoint: resp)
    monkeypatch.setattr(tr, "Tracking", lambda tracking_uri: SimpleNamespace(
        client=lambda: SimpleNamespace(
            get_experiment_by_name=lambda name: SimpleNamespace(experiment_id="7"))))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "auditor")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "auditor-password")
    return clients


def test_with_the_admin_password_every_account_is_read(fake_server, monkeypatch):
    monkeypatch.setenv("KERNELGATE_MLFLOW_ADMIN_PASSWORD", "admin-password")
    problems, warnings = stack_accounts.audit_ownership("http://mlflow", "xla")
    assert warnings == []
    assert [("'auditor'" in p, "'release-manager'" in p) for p in problems] == \
        [(True, False), (False, True)]
    assert set(fake_server[-1].asked) == {"pipeline", "auditor", "release-manager"}
    import os
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "auditor"  # the caller's, restored


def test_without_it_the_auditing_account_reads_its_own_and_says_the_rest_was_not(
        fake_server, monkeypatch):
    monkeypatch.delenv("KERNELGATE_MLFLOW_ADMIN_PASSWORD", raising=False)
    problems, [warning] = stack_accounts.audit_ownership("http://mlflow", "xla")
    # the squatting auditor is found by its own permissions; the release manager is not
    [problem] = problems
    assert "experiment `kernelgate-xla`" in problem and "owned by 'auditor'" in problem
    assert set(fake_server[-1].asked) == {"auditor"}
    assert "'auditor' only" in warning and "KERNELGATE_MLFLOW_ADMIN_PASSWORD" in warning


def test_a_local_store_has_no_accounts_to_check():
    result = SimpleNamespace(problems=[], warnings=[])
    add_ownership_findings(SimpleNamespace(tracking_uri="sqlite:////tmp/mlflow.db"), "xla", result)
    assert (result.problems, result.warnings) == ([], [])
