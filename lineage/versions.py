"""What serves behind an alias: the kernel a model version was built with, as a serving
endpoint, and whether the checkout still holds the code it was built from."""

from __future__ import annotations

import logging

import kernels
from evaluation.model import MiniLM
from evaluation.serving import Endpoint
from kernels.build import source_digests
from kernels.config import BlockSizes
from lineage import registry, tags
from lineage import tracking as tr
from lineage.tracking import Tracking

logger = logging.getLogger(__name__)

NATIVE_BASELINE = "xla"
"""What serves when a family has no ``production`` version (the recovery target of a
rollback with no earlier production): XLA's attention, native on every backend and
able to run every dtype and shape the serving model uses (cuDNN, for one, refuses
the model's float32)."""


def production_kernel(tracking: Tracking, family: str
                      ) -> tuple[str | None, str | None, BlockSizes | None]:
    """``(version, implementation, block sizes)`` behind ``production``, or Nones."""
    version = registry.alias_version(tracking, family, "production")
    if version is None:
        return None, None, None
    return (version, *registry.version_kernel(tracking, family, version))


def source_drift(tracking: Tracking, family: str, version: str) -> str | None:
    """Why the checked-out kernels package differs from what ``version`` was built from
    (sha256 per file, recorded on its build run), or None when it is the same."""
    build_run_id = registry.version_tags(tracking, family, version)[tags.BUILD_RUN_ID]
    run_tags = tracking.client().get_run(build_run_id).data.tags
    n = len(tags.SOURCE_FILE_PREFIX)
    built = {k[n:]: v for k, v in run_tags.items() if k.startswith(tags.SOURCE_FILE_PREFIX)}
    now = source_digests()
    changed = sorted(f for f in set(built) | set(now) if built.get(f) != now.get(f))
    return f"source of v{version} changed since its build: {changed}" if changed else None


def endpoint(tracking: Tracking, family: str, alias: registry.Alias, model: MiniLM, *,
             expect_version: str | None = None, note_run_id: str | None = None) -> Endpoint:
    """The serving endpoint behind ``alias``; ``NATIVE_BASELINE`` when it points at nothing.

    A source drift is logged and, with ``note_run_id``, tagged on that run
    (``kernelgate.source_drift.<alias>``).

    Raises:
        RuntimeError: ``expect_version`` is given and the alias no longer points at it
            (another run moved it): stop rather than judge the wrong kernel.
    """
    version = registry.alias_version(tracking, family, alias)
    if expect_version is not None and version != expect_version:
        raise RuntimeError(f"{alias} alias of {family} points at v{version}, not at the "
                           f"v{expect_version} this rollout is judging; another run moved it")
    if version is None:
        return Endpoint(f"{NATIVE_BASELINE} (native baseline)",
                        kernels.get_attention_fn(NATIVE_BASELINE), model)
    drift = source_drift(tracking, family, version)
    if drift:
        logger.warning("%s: serving from the checkout although %s", alias, drift)
        if note_run_id:
            tr.set_tags(tracking, note_run_id, {tags.source_drift(alias): drift})
    implementation, config = registry.version_kernel(tracking, family, version)
    return Endpoint(f"{implementation}@v{version}",
                    kernels.get_attention_fn(implementation, config), model)
