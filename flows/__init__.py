"""kernelgate's orchestration: the Prefect flows, their stage tasks and the command line.

Importing the package sets the defaults that Prefect, MLflow and tqdm read when they are
imported (every module here is imported through the package, so they are set first);
an explicit setting in the environment is kept:

* ``PREFECT_LOGGING_EXTRA_LOGGERS``: the project's packages, so their log lines reach the
  Prefect run logs (Prefect reads it when it configures logging);
* ``PREFECT_SERVER_ANALYTICS_ENABLED=false``: no analytics from the local server;
* ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120``: Prefect's local server gets 20 s
  to start by default, and a busy 2-core host needed more ("Timed out while attempting to
  connect to ephemeral Prefect API server");
* ``MLFLOW_CONFIGURE_LOGGING=false`` and ``TQDM_DISABLE=1`` (``flows.log_noise``): the
  libraries do not write to the console themselves.
"""

from __future__ import annotations

import os

from flows.log_noise import quiet_environment

PROJECT_LOGGERS = "kernelgate,kernels,evaluation,gates,lineage,flows"
"""The loggers Prefect attaches its run-log handlers to (``PREFECT_LOGGING_EXTRA_LOGGERS``)."""

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", PROJECT_LOGGERS)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
quiet_environment()
