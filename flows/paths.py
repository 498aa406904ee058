"""Where the project's own files are: the checkout, and the thresholds files a rollout
preregisters by default, and the store's compilation cache. A leaf without heavy imports at
module level (the CLI's ``--help`` reads it)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-dry-run.yaml"
INTERPRETED_THRESHOLDS = PROJECT_DIR / "thresholds" / "local-interpreted.yaml"
"""The CLI's default for a candidate that runs interpreted on this host (the TPU kernel on
a CPU host, ``make run``): local-dry-run's criteria at the sizes an interpreted candidate
is judged at (``flows.kernel_choice.default_thresholds``)."""


def compilation_cache(store_dir: Path) -> Path | None:
    """Keep compiled programs across runs in ``<store>/jax-cache`` (returned) unless
    ``JAX_COMPILATION_CACHE_DIR`` names a folder (``make`` sets one for every target; then
    None): a CPU rollout compiles about 150 programs, the interpreted kernel's at 1-2 s
    each and the MiniLM forward with it inlined at about 2 s per length bucket."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    import jax

    folder = (store_dir / "jax-cache").resolve()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder
