"""Where the project's own files are: the checkout, and the thresholds file a rollout
preregisters by default. A leaf without heavy imports (the CLI's ``--help`` reads it)."""

from __future__ import annotations

from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-dry-run.yaml"
