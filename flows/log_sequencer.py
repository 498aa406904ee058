"""The family log's sequencer on a Prefect server (``lineage.log.log_sequence.LogSequencer``).

* A claim of position N of family F is the Prefect variable
  ``kernelgate-log-<F>-<N>`` (value: the entry's envelope sha256). The Prefect server
  creates a variable name once (HTTP 409 for the second: a unique constraint in its
  database), so of two writers that signed entry N exactly one logs it.
* The pipeline's checkpoint of F's log is the variable ``kernelgate-checkpoint-<F>``:
  the signed checkpoint envelope (base64). MLflow accounts cannot touch Prefect
  variables, so whoever can rewrite the MLflow store (or restores an older backup of
  it) cannot move the checkpoint back: the log is then shorter than the checkpoint, a
  cut log, until a person re-anchors it.

Prefect's variables are readable and writable by every holder of the server's shared
auth string (RELIABILITY.md, *Servers*: the open-source server has no per-person
accounts); the checkpoint is signed, so a holder can delete or replace it with an older
*signed* one, not forge one. Claims are kept (one small variable per entry).
"""

from __future__ import annotations

import base64
import contextlib

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate, VariableUpdate
from prefect.exceptions import ObjectAlreadyExists

from lineage.log.log_sequence import safe_name


def claim_name(family: str, seq: int) -> str:
    """The variable that claims position ``seq`` of ``family``'s log."""
    return f"kernelgate-log-{safe_name(family)}-{int(seq)}"


def checkpoint_name(family: str) -> str:
    """The variable holding the pipeline's signed checkpoint of ``family``'s log."""
    return f"kernelgate-checkpoint-{safe_name(family)}"


class PrefectSequencer:
    """:class:`lineage.log.log_sequence.LogSequencer` on the Prefect server this process is a
    client of (``PREFECT_API_URL`` and its auth string from Prefect's settings)."""

    def claim(self, family: str, seq: int, envelope_sha256: str) -> bool:
        """Create the claim variable; False when it exists (another writer's)."""
        with get_client(sync_client=True) as client:
            try:
                client.create_variable(VariableCreate(name=claim_name(family, seq),
                                                      value=envelope_sha256,
                                                      tags=["kernelgate", "log-claim"]))
            except ObjectAlreadyExists:
                return False
        return True

    def checkpoint(self, family: str) -> bytes | None:
        """The signed checkpoint envelope kept in the checkpoint variable, or None."""
        with get_client(sync_client=True) as client:
            variable = client.read_variable_by_name(checkpoint_name(family))
        if variable is None or not isinstance(variable.value, str):
            return None
        return base64.b64decode(variable.value)

    def write_checkpoint(self, family: str, data: bytes) -> None:
        """Create or replace the checkpoint variable."""
        name, value = checkpoint_name(family), base64.b64encode(data).decode()
        with get_client(sync_client=True) as client:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_variable(VariableCreate(name=name, value=value,
                                                      tags=["kernelgate", "checkpoint"]))
                return
            client.update_variable(VariableUpdate(name=name, value=value))

    def where(self, family: str) -> str:
        """The checkpoint variable, named for messages."""
        return f"the Prefect variable {checkpoint_name(family)}"


def server_sequencer() -> PrefectSequencer | None:
    """A :class:`PrefectSequencer` when this process works against a tracking server and
    a Prefect server (the servers profile); None on the embedded store."""
    import os

    from prefect.settings import PREFECT_API_URL

    if os.environ.get("MLFLOW_TRACKING_URI") and PREFECT_API_URL.value():
        return PrefectSequencer()
    return None
