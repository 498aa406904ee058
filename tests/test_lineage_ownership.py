"""A family's experiment or model owned by another account: a 403 on the pipeline's write
becomes an error saying so (squatting); other errors pass through unchanged."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, PERMISSION_DENIED

from flows import stack as st
from lineage.store.ownership import FamilyOwnedElsewhere, owners, refusing_squatted


def test_a_permission_denied_write_names_the_family_the_account_and_the_hand_back(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "pipeline")
    with (pytest.raises(FamilyOwnedElsewhere) as err,
          refusing_squatted(None, "xla", "create a run", owner=lambda: ["auditor"])):
        raise MlflowException("Permission denied", error_code=PERMISSION_DENIED)
    said = str(err.value)
    for part in ("'xla'", "owned by another account", "owner: auditor", "'pipeline'",
                 "create a run", "`kernelgate-xla`", 'README "A squatted family"'):
        assert part in said, (part, said)
    assert isinstance(err.value.__cause__, MlflowException)
    assert err.value.get_http_status_code() == 403  # still the server's refusal to callers


def test_an_owner_nobody_can_read_is_said_so_and_other_errors_pass_through():
    with (pytest.raises(FamilyOwnedElsewhere, match="only an MLflow admin can read"),
          refusing_squatted(None, "xla", "create a run")):
        raise MlflowException("no", error_code=PERMISSION_DENIED)
    with (pytest.raises(MlflowException) as err,
          refusing_squatted(None, "xla", "create a run")):
        raise MlflowException("bad", error_code=INVALID_PARAMETER_VALUE)
    assert not isinstance(err.value, FamilyOwnedElsewhere)


def test_owners_are_the_accounts_holding_manage():
    class Auth:
        def get_user_permission(self, account, kind, key):
            held = {("auditor", "registered_model", "kernelgate-xla"): "MANAGE",
                    ("release-manager", "experiment", "7"): "READ"}
            return type("P", (), {"permission": held.get((account, kind, key), "READ")})()

    assert owners(Auth(), ["auditor", "release-manager"], "xla", "7") == ["auditor"]
    assert owners(Auth(), ["release-manager"], "xla", None) == []


def test_stack_families_are_names_and_the_committed_file_claims_the_kernels():
    from kernels.registry import IMPLEMENTATIONS

    committed = st.StackConfig.load(st.PROJECT_DIR / "stack.yaml").families
    assert "xla" in committed and set(committed) <= set(IMPLEMENTATIONS)
    with pytest.raises(ValueError, match="families"):
        st.StackConfig(families=["bad name"])
