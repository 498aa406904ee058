"""The rollout's parameters (a typed Prefect form); what its stages establish is in
``flows.results``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flows.paths import DEFAULT_THRESHOLDS
from kernels.shapes import AttentionShape


class RolloutSettings(BaseModel):
    """Everything a rollout needs; defaults are the embedded local dry run.

    Attributes:
        implementation: candidate kernel (registry name) or ``auto`` (the native flash
            kernel of this backend, ``kernels.native_flash``), or ``dispatch`` (a
            dispatch policy: ``dispatch_policy``; ``flows.dispatch_candidate``).
        dispatch_policy: with ``dispatch``, the policy file the rollout serves (audited
            before anything is registered).
        family: kernel family = MLflow experiment and registered model (default: the
            implementation's name).
        thresholds: the thresholds file to preregister (profile inside).
        config: block sizes asked for the candidate, field -> value (``block_q``,
            ``block_kv``; read by its own config type, ``Kernel.config_from``; ``None``:
            kernel default / tuned table).
        testset_profile: ``ci`` (short sequences, CPU-friendly) or ``gpu``; ``auto`` picks by
            backend; ``minimal`` (17 small cases a split: the pipeline's flow tests, not
            evidence about a kernel; ``evaluation.testset.recipes``).
        testset_dir: test-set folder; default ``<store>/testsets/<profile>`` (built if missing).
        documents_dir: folder of real documents (``*.txt``/``*.md``); default: the
            long descriptions of installed Python distributions.
        store_dir: local store for MLflow (when ``MLFLOW_TRACKING_URI`` is unset) and work files.
        shadow_requests: requests replayed in shadow (recorded MiniLM requests, or the
            documents of the canary's workload where the registration names one).
        perf_repeats: timed repeats per implementation and shape in evaluation.
        perf_shapes: benchmark shapes of the evaluation (``None``: the platform's defaults).
        model_check: embed held-out documents with the candidate and float64 attention
            (the ``model.*`` metrics); a profile whose criteria use them needs it.
        stale_alias_after_s: lease of a running rollout on its ``shadow``/``canary`` alias
            (on a tracking server; on the embedded store the family's lock says exactly
            whether the owner is alive).
        key_dir: the pipeline's key folder (its signing key ``pipeline.pem``, created on
            first use, and the public keys it trusts); default ``~/.kernelgate/keys`` or
            ``KERNELGATE_KEY_DIR``. Never inside the MLflow store.
        loosening_approval: a person's signed approval (``kernelgate approve-loosening``)
            of thresholds looser than the family's previous registration.
    """

    model_config = ConfigDict(extra="forbid")

    implementation: str = "auto"
    dispatch_policy: Path | None = None
    family: str | None = None
    thresholds: Path = DEFAULT_THRESHOLDS
    config: dict[str, int] | None = None
    testset_profile: Literal["auto", "ci", "gpu", "minimal"] = "auto"
    testset_dir: Path | None = None
    documents_dir: Path | None = None
    store_dir: Path = Path(".kernelgate")
    shadow_requests: int = Field(24, ge=2)
    perf_repeats: int | None = Field(None, ge=1)
    perf_shapes: list[AttentionShape] | None = None
    model_check: bool = True
    stale_alias_after_s: float = Field(6 * 3600, ge=0, le=30 * 24 * 3600, description=(
        "a shadow/canary alias whose owning rollout run is still RUNNING after this many "
        "seconds is taken as left by a killed process and cleared"))
    key_dir: Path | None = None
    loosening_approval: Path | None = None

    def testset_profile_for(self, backend: str) -> Literal["ci", "gpu", "minimal"]:
        """``ci`` on a CPU host, ``gpu`` on an accelerator, unless set."""
        if self.testset_profile != "auto":
            return self.testset_profile
        return "ci" if backend == "cpu" else "gpu"
