"""Where the project's own files are: the checkout, and the thresholds files a rollout
preregisters by default. A leaf without heavy imports (the CLI's ``--help`` reads it)."""

from __future__ import annotations

from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-dry-run.yaml"
INTERPRETED_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-interpreted.yaml"
"""The CLI's default for a candidate that runs interpreted on this host (the TPU kernel on
a CPU host, ``make run``): local-dry-run's criteria at the sizes an interpreted candidate
is judged at (``flows.kernel_choice.default_thresholds``)."""
