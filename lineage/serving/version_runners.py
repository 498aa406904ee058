"""Runners that execute a registered version's own code.

:class:`VersionPool` gives a :class:`evaluation.runners.Runner` per version for
evaluation, shadow, canary, rollback checks and re-validation. A version's files are
first copied from its storage location (what ``models:/…`` loads) and checked against
its signed file manifest (``lineage.serving.model_files``), the code digest computed from them:
a version whose checked code is byte-for-byte this process's code (same snapshot
digest) runs here; any other version runs in a process of its own
(:class:`VersionWorker`, ``model_worker.py``) that loads the checked copy. Source drift cannot happen on these paths: code either is the
version's, proven by digest, or runs from the version's snapshot.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evaluation.longdoc.canary_source import LongdocEndpoint
from evaluation.longdoc.spec import WorkloadSpec
from evaluation.model import MiniLM
from evaluation.runners import LocalRunner, Runner
from evaluation.serving import Endpoint
from kernels import interpreters
from kernels.registry import IMPLEMENTATIONS, stored_config
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model
from lineage.serving import model_files
from lineage.serving.dispatch_version import (
    DISPATCH,
    is_dispatch,
    version_policy,
    worker_environment,
)
from lineage.serving.versions import recorded_kernel, this_process_code
from lineage.signing.attestations import TrustPolicy
from lineage.signing.sources import StoreSource
from lineage.store.tracking import Tracking

WORKER_SCRIPT = Path(__file__).with_name("model_worker.py")
NATIVE_BASELINE = "xla"
"""What serves when no version is in production: XLA's fused attention, this process."""


class VersionWorker:
    """A registered version loaded in a process of its own, as a ``Runner``.

    Its files are copied from the version's storage location (what ``models:/…``
    loads) and checked against the signed build's file manifest *here*, with the code
    digest computed from them (``lineage.serving.model_files``); the process loads that checked
    copy, nothing else. What the loaded model says of itself is never the evidence.

    Raises (at construction):
        RuntimeError: the files are not the signed ones (naming each), the process
            could not load the version (the message carries its error), or a dispatch
            version's signed policy fails its audit (``lineage.serving.dispatch_version``).
        lineage.signing.attestations.AttestationError: the version has no signed build.
    """

    def __init__(self, tracking: Tracking, family: str, version: str, *, trust: TrustPolicy,
                 attention_dtype: str = "float32"):
        self.family, self.version = family, version
        env = {**os.environ, "MLFLOW_TRACKING_URI": tracking.tracking_uri,
               "MLFLOW_REGISTRY_URI": tracking.tracking_uri}
        # Two JAX processes share one accelerator: neither may take it all up front.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        self._cwd = tempfile.mkdtemp(prefix="kernelgate-worker-")
        self._proc = None
        source = StoreSource(tracking, family, trust, stages=("build",))  # read once, used twice
        try:
            self.files = model_files.fetch(tracking, source, version, Path(self._cwd) / "model")
        except BaseException:
            shutil.rmtree(self._cwd, ignore_errors=True)
            raise
        if self.files.problems:
            shutil.rmtree(self._cwd, ignore_errors=True)
            raise RuntimeError(f"v{version} of {family} refused: {self.files.summary()}")
        try:  # a dispatch version: its signed policy, audited (lineage.serving.dispatch_version)
            env.update(worker_environment(source, version, Path(self._cwd) / "dispatch"))
        except BaseException:
            shutil.rmtree(self._cwd, ignore_errors=True)
            raise
        # Kept open for the process's lifetime (its errors are read on failure); closed in close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        # MiniLM's attention dtype is the registration's serving contract (model_dtype), not
        # the version's: both sides of a bf16 canary run MiniLM's attention in bf16.
        self._proc = subprocess.Popen([sys.executable, "-P", str(WORKER_SCRIPT),
                                       str(self.files.path), attention_dtype],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, cwd=self._cwd, env=env)
        hello = self._receive()
        if not hello["ok"]:
            self.close()
            raise RuntimeError(f"v{version} of {family} could not be loaded in its own process: "
                               f"{hello['error']}")
        # the code digest is the one computed from the checked files, not the model's word
        self.info = {**hello["describe"], "code_sha256": self.files.code_sha256,
                     "files_checked": self.files.summary()}
        self.name = f"{self.info['implementation']}@v{version}"

    def _receive(self) -> dict:
        header = self._proc.stdout.read(8)
        if len(header) < 8:
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"the process serving v{self.version} of {self.family} exited "
                               f"(code {self._proc.poll()}): {tail}")
        (size,) = struct.unpack("<Q", header)
        return pickle.loads(self._proc.stdout.read(size))

    def _ask(self, op: str, **fields) -> dict:
        data = pickle.dumps({"op": op, **fields}, protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self._proc.stdin.flush()
        reply = self._receive()
        if not reply["ok"]:
            raise RuntimeError(f"{self.name}: {reply['error']}")
        return reply

    def __call__(self, q, k, v, *, causal: bool, scale: float | None, q_lengths=None,
                 kv_lengths=None) -> np.ndarray:
        def host(x):
            return None if x is None else np.asarray(x)
        return self._ask("attention", q=host(q), k=host(k), v=host(v), causal=causal,
                         scale=scale, q_lengths=host(q_lengths), kv_lengths=host(kv_lengths),
                         interpreter=interpreters.current())["out"]

    def embed(self, texts: Sequence[str]) -> tuple[np.ndarray, float]:
        # this process's Pallas interpreter choice travels with the request
        reply = self._ask("embed", texts=list(texts), interpreter=interpreters.current())
        return reply["embeddings"], reply["seconds"]

    def compile_for(self, shape: AttentionShape, seed: int) -> tuple[float, int | None]:
        reply = self._ask("compile_for", shape=shape.model_dump(), seed=seed)
        return reply["seconds"], reply["compiler_bytes"]

    def call_compiled(self, shape: AttentionShape) -> float:
        return self._ask("call_compiled", shape=shape.model_dump())["seconds"]

    def memory_stats(self) -> dict | None:
        return self._ask("memory_stats")["stats"]

    def describe(self) -> dict:
        return {"implementation": self.info["implementation"], "config": self.info["config"],
                "resolution": None, "native": self.info["native"],
                "target_platform": self.info["target_platform"],
                "float32_matmul_precision": self.info.get("float32_matmul_precision")}

    def close(self) -> None:
        """Ask the process to stop, then make sure it has."""
        if self._proc is None:
            shutil.rmtree(self._cwd, ignore_errors=True)
            return
        if self._proc.poll() is None:
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                self._ask("shutdown")
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._stderr.close()
        shutil.rmtree(self._cwd, ignore_errors=True)


def serves_signed_policy(source: StoreSource, version: str) -> bool:
    """Whether this process registers the ``dispatch`` kernel of ``version``'s signed
    policy, audited (``lineage.serving.dispatch_version.version_policy``) — as a rollout
    of that policy does for its session (``flows.dispatch_candidate``). Then the version
    runs here beside a baseline that runs here, and a canary compares two kernels, not
    two placements (on an H100 a dispatch version served from a process of its own was
    rolled back at 1.077x an ``xla`` baseline in this process where its policy chose
    ``xla`` too: BENCHMARKS)."""
    if DISPATCH not in IMPLEMENTATIONS:
        return False
    here = getattr(IMPLEMENTATIONS[DISPATCH], "fingerprint", None)
    found = version_policy(source, version)
    if found is None or here is None:
        return False
    audit, policy = found
    return not audit.problems and policy is not None and policy.fingerprint() == here


class VersionPool:
    """One runner per registered version of a family, closed together (a context manager).

    Args:
        tracking, family: the registry.
        encoder: this process's encoder (for versions that run here).
        trust: the keys whose signed builds say what a version is.
    """

    def __init__(self, tracking: Tracking, family: str, encoder: MiniLM, trust: TrustPolicy):
        self.tracking, self.family, self.encoder, self.trust = tracking, family, encoder, trust
        self._runners: dict[str, Runner] = {}
        self._here, _ = this_process_code()

    def runner(self, version: str) -> Runner:
        """The version's runner: here when its logged code is this process's code (for a
        ``dispatch`` version, and this process registers its signed policy), else its own
        process. Raises what :class:`VersionWorker` raises."""
        if version not in self._runners:
            source = StoreSource(self.tracking, self.family, self.trust, stages=("build",))
            kernel = recorded_kernel(source, version)
            files = model_files.check(self.tracking, source, version)
            if files.problems:
                raise RuntimeError(f"v{version} of {self.family} refused: {files.summary()}")
            # a dispatch version runs here only where this process already serves its
            # signed policy (a rollout of it): else from a process of its own
            if files.manifest_signed and files.code_sha256 == self._here and (
                    not is_dispatch(kernel) or serves_signed_policy(source, version)):
                config = kernel["config"]
                local = LocalRunner.for_implementation(
                    kernel["implementation"], stored_config(kernel["implementation"], config),
                    self.encoder)
                local.name = f"{kernel['implementation']}@v{version}"
                self._runners[version] = local
            else:
                self._runners[version] = VersionWorker(
                    self.tracking, self.family, version, trust=self.trust,
                    attention_dtype=self.encoder.config.attention_dtype)
        return self._runners[version]

    def in_own_process(self, version: str) -> bool:
        """Whether the version runs in a process of its own (its code differs from ours)."""
        return isinstance(self.runner(version), VersionWorker)

    def close(self) -> None:
        for runner in self._runners.values():
            if isinstance(runner, VersionWorker):
                runner.close()
        self._runners.clear()

    def __enter__(self) -> VersionPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def production_version(tracking: Tracking, family: str) -> str | None:
    """The version behind ``production``, or None."""
    return registered_model.alias_version(tracking, family, "production")


def endpoint(pool: VersionPool, alias: registered_model.Alias, *,
             expect_version: str | None = None) -> Endpoint:
    """The serving endpoint behind ``alias`` of the pool's family: the version's runner,
    or ``NATIVE_BASELINE`` (this process) when the alias points at nothing.

    Raises:
        RuntimeError: ``expect_version`` is given and the alias no longer points at it
            (another run moved it): stop rather than judge the wrong kernel.
    """
    version = registered_model.alias_version(pool.tracking, pool.family, alias)
    if expect_version is not None and version != expect_version:
        raise RuntimeError(f"{alias} alias of {pool.family} points at v{version}, not at the "
                           f"v{expect_version} this rollout is judging; another run moved it")
    if version is None:
        return Endpoint(f"{NATIVE_BASELINE} (native baseline)",
                        LocalRunner.for_implementation(NATIVE_BASELINE, None, pool.encoder))
    runner = pool.runner(version)
    return Endpoint(runner.name, runner)


def longdoc_endpoint(pool: VersionPool, alias: registered_model.Alias, spec: WorkloadSpec, *,
                     expect_version: str | None = None) -> LongdocEndpoint:
    """The long-document endpoint behind ``alias``: the workload's encoder with the
    attention of the version's runner (or ``NATIVE_BASELINE`` when the alias points at
    nothing), served in this process.

    Raises:
        RuntimeError: what :func:`endpoint` raises; or the version runs its own code in a
            process of its own: the encoder traces the kernel inside its compiled forward,
            which a kernel behind a pipe cannot join, so such a version cannot replay the
            workload (the message names it).
    """
    served = endpoint(pool, alias, expect_version=expect_version)
    runner = served.runner
    if not isinstance(runner, LocalRunner):
        raise RuntimeError(
            f"{served.name} runs its own code in a process of its own; canary.workload "
            f"{spec.name!r} is served only by versions whose code is this process's (the "
            "encoder compiles the kernel into its forward): roll it out without a workload, "
            "or from a checkout of its code")
    return LongdocEndpoint(served.name, spec, runner.attention_fn)
