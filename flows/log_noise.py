"""Third-party log lines kept out of the stage log: MLflow's own warnings (e.g. the
CloudPickle notice when a version's model is logged), Great Expectations' temporary
directory lines, progress bars and Python warnings go to a debug log file instead of
between the stage lines a person reads. Nothing is dropped: the file keeps them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

NOISY = ("mlflow", "great_expectations", "alembic", "urllib3", "absl", "py.warnings",
         "matplotlib", "httpx")
"""Loggers whose lines go to the debug log file, not the console or the flow run's log."""


def quiet_environment() -> None:
    """Set, before those libraries are imported, what keeps them from writing to the
    console themselves: MLflow's own logging setup off (``MLFLOW_CONFIGURE_LOGGING``),
    tqdm progress bars off (``TQDM_DISABLE``). An explicit setting is kept."""
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")


def route_to_debug_log(path: Path) -> Path:
    """Send the :data:`NOISY` loggers (and Python warnings) to ``path`` (appended, INFO
    and up, timestamped) instead of the console. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.captureWarnings(True)
    for name in NOISY:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
    return path
