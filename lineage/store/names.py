"""Names on the tracking server: a kernel family's experiment and registered model
(``kernelgate-<family>``). A leaf: ``lineage.store.tracking`` and ``lineage.store.ownership`` both read it."""

from __future__ import annotations


def experiment_name(family: str) -> str:
    """The experiment (and registered model) name of a kernel family: ``kernelgate-<family>``."""
    if not family or not family.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"family must be a non-empty [A-Za-z0-9_-] name, got {family!r}")
    return f"kernelgate-{family}"
