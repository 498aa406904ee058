"""What a registration binds besides its thresholds: every rollout setting that can
change a verdict.

Whoever starts a rollout chooses the performance shapes and repeats, the shadow traffic
size, whether the model-level check runs, and which test set and documents are read
(``flows.settings.RolloutSettings``). Each of them can turn a reject into a pass as
surely as a looser bound can, so the signed registration records them
(``RolloutBindings``, the predicate's ``bindings``: a separate signed part beside the
thresholds file's sha256, which stays the hash of the file's bytes). A rollout that
registers the *same* thresholds file as the family's newest registration (same
registration: family, profile, thresholds sha256) with other values is refused naming
each one (:class:`BindingsRefused`); with another thresholds file it is a new
registration, and after a rejection a changed binding counts among its loosenings (it
needs the same signed approval, ``lineage.records.registration``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evaluation.documents import Document
from evaluation.testset import load_manifest
from gates.preregistration import PreregistrationError
from kernels.shapes import AttentionShape


class BindingsRefused(PreregistrationError):
    """A rollout reuses a registration with settings other than the ones it bound."""


class RolloutBindings(BaseModel):
    """The verdict-changing settings a registration binds (signed with it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    perf_shapes: list[dict[str, Any]] | None
    perf_repeats: int | None
    shadow_requests: int
    model_check: bool
    testset_profile: str
    testset_digest: str
    documents_digest: str

    def attention_shapes(self) -> list[AttentionShape] | None:
        """The bound benchmark shapes as ``AttentionShape`` (``None``: the platform's
        defaults were bound)."""
        if self.perf_shapes is None:
            return None
        return [AttentionShape.model_validate(whole_numbers(s)) for s in self.perf_shapes]


def documents_digest(documents: Sequence[Document]) -> str:
    """sha256 over ``name sha256`` lines of the documents, by name: which texts the
    traffic and the test set are drawn from."""
    text = "".join(f"{d.name} {d.sha256}\n" for d in sorted(documents, key=lambda d: d.name))
    return hashlib.sha256(text.encode()).hexdigest()


def bindings_for(*, perf_shapes: Sequence[BaseModel] | None, perf_repeats: int | None,
                 shadow_requests: int, model_check: bool, testset_profile: str,
                 testset_dir: Path, documents: Sequence[Document]) -> RolloutBindings:
    """The bindings of a rollout about to register (the test set already in
    ``testset_dir``: its manifest's digest is bound)."""
    return RolloutBindings(
        perf_shapes=None if perf_shapes is None else [s.model_dump(mode="json")
                                                      for s in perf_shapes],
        perf_repeats=perf_repeats, shadow_requests=shadow_requests, model_check=model_check,
        testset_profile=testset_profile, testset_digest=load_manifest(testset_dir).digest,
        documents_digest=documents_digest(documents))


def changes(bound: Mapping[str, Any] | None, asked: RolloutBindings) -> list[str]:
    """``field: bound -> asked`` for each binding that differs (none when nothing was
    bound: a registration made before bindings existed)."""
    if not bound:
        return []
    now, then = whole_numbers(asked.model_dump(mode="json")), whole_numbers(dict(bound))
    return [f"{name}: registered {then.get(name)!r}, this rollout {now[name]!r}"
            for name in sorted(now) if then.get(name) != now[name]]


def whole_numbers(value: Any) -> Any:
    """A signed predicate is a protobuf Struct, whose numbers are doubles: ``8`` reads
    back as ``8.0``. Whole doubles become ints again before comparing."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [whole_numbers(v) for v in value]
    return value


def refuse_rebinding(registration_id: str, bound: Mapping[str, Any] | None,
                     asked: RolloutBindings) -> None:
    """Refuse reusing registration ``registration_id`` (same thresholds file) with other
    settings than it bound.

    Raises:
        BindingsRefused: naming every field that differs.
    """
    differ = changes(bound, asked)
    if differ:
        raise BindingsRefused(
            f"registration {registration_id} of this thresholds file bound other rollout "
            "settings: " + "; ".join(differ) + ". Keep the registered values, or register a "
            "new thresholds file (a new registration, under the family chain's rules)")


def check_bound_testset(bound: RolloutBindings, testset_dir: Path) -> None:
    """Refuse judging under a registration with a test set other than the one it bound
    (a re-validation reads the test set of the registration's profile from disk).

    Raises:
        BindingsRefused: the manifest's digest in ``testset_dir`` is not the bound one.
    """
    found = load_manifest(testset_dir).digest
    if found != bound.testset_digest:
        raise BindingsRefused(
            f"the test set at {testset_dir} has digest {found[:12]}, the registration bound "
            f"{bound.testset_digest[:12]} (profile {bound.testset_profile}): judging under it "
            "needs the bound test set (the settings' testset_dir pointing at it, or the set "
            "rebuilt from the same documents)")
