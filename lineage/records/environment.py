"""Hardware and software facts recorded on every run (what decided an outcome, and where).

Collected from JAX (backend platform, device kind and count, the backend's
``platform_version`` which carries the CUDA/libtpu driver build), ``nvidia-smi`` where it
exists (driver version), the interpreter, the host, git (commit and dirty flag), and the
install: the sha256 of the checkout's ``requirements.lock`` (what ``make venv`` installs,
hash-pinned) and every locked package whose installed version differs from its pin
(``lock_drift``; empty where the environment is the lock's). A fact that cannot be
determined is ``None``, never a guess.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform as _platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from pydantic import BaseModel, ConfigDict

from lineage.store import tags


class EnvironmentFacts(BaseModel):
    """Software versions, accelerator and source revision of the current process."""

    model_config = ConfigDict(frozen=True)

    python_version: str
    jax_version: str
    jaxlib_version: str
    os: str
    host: str
    platform: str  # JAX default backend: cpu / gpu / tpu
    device_kind: str
    device_count: int
    backend_version: str | None = None  # e.g. "cuda 12080" or the libtpu build
    driver_version: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    lock_sha256: str | None = None
    lock_drift: tuple[str, ...] | None = None

    def as_tags(self) -> dict[str, str]:
        """Run tags ``kernelgate.env.<field>`` (``None`` fields become ``"unknown"``)."""
        def text(value) -> str:
            if value is None:
                return "unknown"
            if isinstance(value, (tuple, list)):
                joined = "; ".join(value) or "none"
                return joined if len(joined) <= 4000 else f"{joined[:3990]}... ({len(value)})"
            return str(value)

        return {f"{tags.ENV_PREFIX}{k}": text(v) for k, v in self.model_dump().items()}


LOCK_FILE = "requirements.lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
_NOT_LOCKED = {"pip", "setuptools", "uv", "kernelgate"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_drift(lock_path: str | Path) -> tuple[str, ...]:
    """Each package pinned in the lock file whose installed version differs from its pin
    (or that is not installed), as ``"name: locked X, installed Y"``; empty when this
    environment is the lock's.

    Raises:
        FileNotFoundError: no lock file at ``lock_path``.
    """
    out = []
    for line in Path(lock_path).read_text().splitlines():
        match = _PIN.match(line)
        if not match or _normal(match[1]) in _NOT_LOCKED:
            continue
        if match[3] and not Marker(match[3]).evaluate():
            continue  # pinned for another interpreter or platform
        try:
            installed = importlib.metadata.version(match[1])
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != match[2]:
            out.append(f"{_normal(match[1])}: locked {match[2]}, installed {installed}")
    return tuple(out)


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip()


def git_revision(repo_dir: str | Path) -> tuple[str | None, bool | None]:
    """``(commit sha, dirty)`` of the git work tree at ``repo_dir``; ``(None, None)`` outside git."""
    repo = Path(repo_dir)
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if not commit:
        return None, None
    status = _run(["git", "status", "--porcelain"], cwd=repo)
    return commit, None if status is None else bool(status)


def _nvidia_driver() -> str | None:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def collect_environment(repo_dir: str | Path | None = None) -> EnvironmentFacts:
    """Collect :class:`EnvironmentFacts` for this process.

    Args:
        repo_dir: git work tree for commit/dirty; defaults to the kernelgate checkout.
    """
    import jax
    import jaxlib

    devices = jax.devices()
    # Device.client is an implementation detail that newer JAX may drop: optional.
    backend_version = getattr(getattr(devices[0], "client", None), "platform_version", None)
    root = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[2]
    commit, dirty = git_revision(root)
    lock = root / LOCK_FILE
    platform = jax.default_backend()
    return EnvironmentFacts(
        python_version=sys.version.split()[0],
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        os=_platform.platform(),
        host=socket.gethostname(),
        platform=platform,
        device_kind=devices[0].device_kind,
        device_count=len(devices),
        backend_version=str(backend_version) if backend_version else None,
        driver_version=_nvidia_driver() if platform == "gpu" else None,
        git_commit=commit,
        git_dirty=dirty,
        lock_sha256=hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
        lock_drift=lock_drift(lock) if lock.is_file() else None,
    )
