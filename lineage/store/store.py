"""Where the MLflow store is and how to talk to it: location, reachability, a client that
retries transient errors.

Store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<project>/.kernelgate/mlflow.db``
with artifacts under ``<project>/.kernelgate/mlartifacts``. The registry uses the same URI.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from kernels.errors import KernelgateError

if TYPE_CHECKING:  # MLflow is imported on first use: `check_reachable` answers in seconds
    from mlflow import MlflowClient

# Background logging would let a run end before its tags are written; off for a record store.
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# MLflow's default HTTP retry budget (7 retries, exponential backoff) keeps a command
# waiting for minutes on a dead server; bounded here (an environment setting wins).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

TRANSIENT = ("database is locked", "IntegrityError", "UNIQUE constraint failed",
             "TEMPORARILY_UNAVAILABLE", "503", "502", "Connection reset")
"""Error texts of store failures worth retrying: SQLite lock contention and the
insert race of two writers setting the same tag (the retry becomes an update), and a
server restarting."""
RETRIES = 4

STORE_DIR = ".kernelgate"


class Tracking(BaseModel):
    """Where runs, artifacts and the model registry live.

    Attributes:
        tracking_uri: MLflow tracking (and registry) URI, e.g. ``sqlite:////abs/mlflow.db``.
        artifact_root: directory URI under which each family's experiment stores artifacts
            (``<root>/<experiment name>``); ``None`` leaves it to the tracking server.
    """

    model_config = ConfigDict(frozen=True)

    tracking_uri: str
    artifact_root: str | None = None

    def client(self) -> MlflowClient:
        """A client for this store (cached per URI) whose calls retry transient store
        errors (``TRANSIENT``) up to ``RETRIES`` times with a short backoff."""
        return _client(self.tracking_uri)


class StoreUnreachable(KernelgateError, RuntimeError):
    """The tracking store does not answer; the message names its URI."""


class _RetryingClient:
    """``MlflowClient`` with every call retried on transient store errors."""

    def __init__(self, client: MlflowClient):
        self._client = client

    def __getattr__(self, name: str):
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(*args, **kwargs):
            for attempt in range(RETRIES + 1):
                try:
                    return attribute(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - re-raised unless transient
                    text = f"{type(err).__name__}: {err}"
                    if attempt == RETRIES or not any(t in text for t in TRANSIENT):
                        raise
                    time.sleep(0.05 * 2**attempt)
            raise AssertionError("unreachable")
        return call


@functools.lru_cache(maxsize=16)
def _client(uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return _RetryingClient(MlflowClient(tracking_uri=uri, registry_uri=uri))


def check_reachable(tracking: Tracking, timeout_s: float = 5.0) -> None:
    """Fail within ``timeout_s`` when the store cannot answer, naming it.

    A tracking server must answer its ``/health`` endpoint; an embedded SQLite store's
    folder must exist or be creatable.

    Raises:
        StoreUnreachable: naming the URI and the reason.
    """
    uri = tracking.tracking_uri
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        except requests.RequestException as err:
            raise StoreUnreachable(f"MLflow tracking server {uri} does not answer "
                                   f"({type(err).__name__}: {err})") from err
        if response.status_code != 200:
            raise StoreUnreachable(f"MLflow tracking server {uri} answers /health with "
                                   f"{response.status_code}")
    elif uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreUnreachable(f"MLflow store {uri}: cannot use {folder} ({err})") from err


def local_tracking(store_dir: str | Path) -> Tracking:
    """An SQLite store at ``<store_dir>/mlflow.db`` with artifacts in ``<store_dir>/mlartifacts``."""
    store = Path(store_dir).resolve()
    store.mkdir(parents=True, exist_ok=True)
    return Tracking(
        tracking_uri=f"sqlite:///{store / 'mlflow.db'}",
        artifact_root=(store / "mlartifacts").as_uri(),
    )


def default_tracking(project_dir: str | Path | None = None) -> Tracking:
    """``MLFLOW_TRACKING_URI`` when set, else the embedded store under ``<project>/.kernelgate``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return Tracking(tracking_uri=uri)
    return local_tracking(Path(project_dir or Path.cwd()) / STORE_DIR)


def tracking_for(store_dir: str | Path) -> Tracking:
    """The store a command uses: ``MLFLOW_TRACKING_URI`` when set (a tracking server),
    else the embedded SQLite store in ``store_dir``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return Tracking(tracking_uri=uri) if uri else local_tracking(store_dir)
