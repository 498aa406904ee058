"""Who may write a family: the experiment and registered model ``kernelgate-<family>``
belong to the account that created them (MLflow's basic-auth app gives the creator
MANAGE and everyone else the default, READ), and it has no permission for *creating* —
so any account can create a family's name first and lock the pipeline out of it
("squatting").

``kernelgate stack up`` creates the configured families as the pipeline account before
anyone else can (``flows.stack.claim_families``); a write the server refuses with 403 on
a family's experiment or model is turned into :class:`FamilyOwnedElsewhere`, which says
so and how an admin hands the name back (README "A squatted family"). Only an MLflow
admin may read other users' permissions, so the owner is named where an admin's client
is at hand (``stack up``) and otherwise said to be another account (a run's ``user_id``
is whatever its writer sent: no evidence of an owner).

The audit (``kernelgate audit`` on the servers profile) asks the same question of a family
already written: :func:`squatting` turns who holds MANAGE on its experiment and registered
model (:func:`manage_holders`) into problems naming every owner other than the pipeline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

from kernels.errors import KernelgateError
from lineage.store.names import experiment_name

HAND_BACK = 'README "A squatted family"'
"""Where an admin reads how to hand a squatted family back to the pipeline account."""


class FamilyOwnedElsewhere(KernelgateError, MlflowException):
    """The family's experiment or registered model belongs to another account: the
    server refused this account's write (HTTP 403; still an ``MlflowException`` with
    ``PERMISSION_DENIED``, so whoever handled the server's refusal still does)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_code=PERMISSION_DENIED)


def _denied(err: MlflowException) -> bool:
    return not isinstance(err, FamilyOwnedElsewhere) and (
        err.error_code == "PERMISSION_DENIED" or err.get_http_status_code() == 403)


PIPELINE = "pipeline"
"""The account the pipeline writes as (``flows.stack_accounts.ACCOUNTS``)."""
RESOURCES = {"experiment": "experiment", "registered_model": "registered model"}
"""MLflow's permission resource types of a family, and how the messages name them."""


def manage_holders(auth, accounts, family: str, experiment_id: str | None) -> dict[str, list[str]]:
    """Who among ``accounts`` holds MANAGE on ``family``'s experiment and on its
    registered model: ``{"experiment": [...], "registered_model": [...]}`` (the experiment
    left out when ``experiment_id`` is None: it does not exist). ``auth`` is a basic-auth
    client (``mlflow.server.get_app_client("basic-auth")``); MLflow lets an admin read any
    account's permissions and every account its own, so an account ``auth`` may not read
    (or with no grant of its own: the server's default, READ) counts as not holding it."""
    keys = {"experiment": experiment_id, "registered_model": experiment_name(family)}
    found: dict[str, list[str]] = {}
    for kind, key in keys.items():
        if key is None:
            continue
        found[kind] = []
        for account in accounts:
            with contextlib.suppress(MlflowException):
                if auth.get_user_permission(account, kind, key).permission == "MANAGE":
                    found[kind].append(account)
    return found


def owners(auth, accounts, family: str, experiment_id: str | None) -> list[str]:
    """The ``accounts`` holding MANAGE on ``family``'s experiment or registered model, read
    with an admin's ``auth`` client (``mlflow.server.get_app_client("basic-auth")``: only an
    admin may read other users' permissions)."""
    held = manage_holders(auth, accounts, family, experiment_id)
    return [a for a in accounts if any(a in found for found in held.values())]


def squatting(holders: dict[str, list[str]], family: str, read: list[str]) -> list[str]:
    """The audit's problems with who owns ``family``: one for each of its experiment and
    registered model that an account other than the pipeline holds MANAGE on (naming
    them), and one for each the pipeline does not hold MANAGE on when the pipeline's own
    permissions were read (``PIPELINE`` in ``read``, the accounts whose permissions
    ``holders`` (from :func:`manage_holders`) covers). Empty when the family is the
    pipeline's alone, as far as ``read`` shows."""
    name, problems = experiment_name(family), []
    for kind, found in holders.items():
        others = [a for a in found if a != PIPELINE]
        what = f"the {RESOURCES[kind]} `{name}` of family {family!r}"
        if others:
            problems.append(
                f"{what} is owned by {', '.join(repr(a) for a in others)} (MANAGE), not the "
                f"pipeline account {PIPELINE!r} alone: squatted or granted by hand, that account "
                f"can write the family's evidence; an MLflow admin hands it back ({HAND_BACK})")
        elif PIPELINE in read and PIPELINE not in found:
            problems.append(
                f"{what} is not owned by the pipeline account {PIPELINE!r} (no MANAGE): its "
                f"writes are refused; an MLflow admin hands it back ({HAND_BACK})")
    return problems


@contextlib.contextmanager
def refusing_squatted(tracking, family: str, what: str, owner=None) -> Iterator[None]:
    """Run a write to ``family``'s experiment or registered model (``what``, in words);
    a 403 from the server becomes :class:`FamilyOwnedElsewhere`. ``owner``: a callable
    returning the owning accounts, where the caller can know them (an admin's).

    Raises:
        FamilyOwnedElsewhere: naming the family, the refused account, the owner where
            known, and how an admin hands the name back.
    """
    try:
        yield
    except MlflowException as err:
        if not _denied(err):
            raise
        import os

        name = experiment_name(family)
        named = ", ".join(owner()) if owner else ""
        account = os.environ.get("MLFLOW_TRACKING_USERNAME") or "this account"
        raise FamilyOwnedElsewhere(
            f"family {family!r} is owned by another account "
            f"({'owner: ' + named if named else 'which one only an MLflow admin can read'}): "
            f"the server refused {account!r} to {what} on `{name}` (403). The pipeline only "
            f"writes families it created; an MLflow admin hands `{name}` back to the pipeline "
            f"account ({HAND_BACK}), or `kernelgate stack up` with the family in stack.yaml's "
            "`families` claims it before anyone else on a new server") from err
