"""The environment facts a run records, the install's lock among them."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

from lineage.records.environment import LOCK_FILE, collect_environment, lock_drift

ROOT = Path(__file__).resolve().parents[1]


def test_lock_drift_names_what_differs_from_its_pin(tmp_path):
    numpy = importlib.metadata.version("numpy")
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        f"numpy=={numpy} \\\n    --hash=sha256:{'0' * 64}\n"
        "scipy==0.0.1 \\\n    --hash=sha256:" + "1" * 64 + "\n"
        "surely-not-installed-kg==1.0 \\\n"
        "pywin32==306 ; sys_platform == 'win32'\n"
        "    # via something\n")
    assert lock_drift(lock) == (
        f"scipy: locked 0.0.1, installed {importlib.metadata.version('scipy')}",
        "surely-not-installed-kg: locked 1.0, installed not installed")


def test_the_recorded_install_is_the_lock():
    """``make venv`` installs requirements.lock (hash-pinned): a run records the lock's
    sha256 and that nothing installed differs from it."""
    facts = collect_environment(ROOT)
    assert facts.lock_sha256 == hashlib.sha256((ROOT / LOCK_FILE).read_bytes()).hexdigest()
    assert facts.lock_drift == (), facts.lock_drift
    assert f"jax=={facts.jax_version} " in (ROOT / LOCK_FILE).read_text()
    assert facts.as_tags()["kernelgate.env.lock_drift"] == "none"
