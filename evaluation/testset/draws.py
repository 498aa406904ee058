"""Fresh confirmation draws: a confirmation split is spent once per family.

A held-out set that several rollouts of one family have been judged on stops being
held out (a candidate can be tuned until it passes). So each family uses a
confirmation split once, and the next rollout of the family draws a fresh one:
``confirmation-<k>`` is built from the ``k``-th slice of the documents assigned to
the confirmation split (``evaluation.documents.split_of``) that no earlier draw used,
with seed ``<confirmation seed> + k`` for its synthetic cases. Draws are added to the
test set's manifest under ``draws`` (the set digest, over the three base splits, does
not change), and :func:`check_disjoint` proves every draw disjoint from every split
and every other draw. Which draws a family has spent is not kept here: the signed
evaluation attestations record each split digest used (``lineage.records.chain``).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from filelock import FileLock

from evaluation.cases import confirmation_draw_name
from evaluation.documents import assign_splits, load_documents
from evaluation.testset import build_split, load_manifest, write_manifest
from evaluation.testset.manifest import check_disjoint
from evaluation.testset.recipes import PROFILES
from evaluation.testset.store import write_split_arrays
from kernels.errors import KernelgateError

MAX_DRAWS = 64
"""Draws tried before giving up (each needs its own documents, so a document folder
runs out well before)."""


class ConfirmationExhausted(KernelgateError, RuntimeError):
    """Every confirmation draw the documents allow has been spent by this family."""


def ensure_draw(testset_dir: str | Path, k: int, *, model=None) -> str:
    """Add confirmation draw ``k`` to the test set (built once, then reused) and return
    its split name (``confirmation`` for ``k == 0``).

    Args:
        testset_dir: a test set written by ``build_testset``.
        k: the draw, ``0 <= k <= 9999``.
        model: a loaded ``MiniLM`` for the ordinary cases (default ``MiniLM.load()``).

    Raises:
        ConfirmationExhausted: the document source has too few confirmation documents
            for draw ``k`` (names how many there are and how many it needs).
        ValueError: the draw's seed would equal another split's.
    """
    name = confirmation_draw_name(k)
    directory = Path(testset_dir)
    if name in load_manifest(directory).entries():
        return name
    with FileLock(str(directory / ".draws.lock")):
        manifest = load_manifest(directory)
        if name in manifest.entries():
            return name
        per_draw = PROFILES[manifest.profile].ordinary.documents_needed
        source = None if manifest.document_source == "installed-distributions" else manifest.document_source
        pool = assign_splits(load_documents(source))["confirmation"]
        documents = pool[k * per_draw:(k + 1) * per_draw]
        if len(documents) < per_draw:
            raise ConfirmationExhausted(
                f"confirmation draw {k} needs documents {k * per_draw}..{(k + 1) * per_draw - 1} of "
                f"the {len(pool)} confirmation documents in {manifest.document_source}: every "
                "fresh confirmation split has been spent; build a new test set from a larger "
                "document folder (--documents-dir)")
        seed = manifest.splits["confirmation"].seed + k
        taken = {entry.seed for entry in manifest.entries().values()}
        if seed in taken:
            raise ValueError(f"confirmation draw {k} would reuse seed {seed} of another split")
        from evaluation.model import MiniLM

        entry, cases = build_split(name, profile=manifest.profile, documents=documents, seed=seed,
                                   model=model or MiniLM.load())
        entry = entry.model_copy(update={"arrays_file": f"{name}.npz"})
        updated = manifest.model_copy(update={"draws": {**manifest.draws, name: entry}})
        check_disjoint(updated)
        write_split_arrays(directory / entry.arrays_file, cases)
        write_manifest(directory, updated)
    return name


def unspent_draw(testset_dir: str | Path, spent_digests: Collection[str], *, model=None) -> str:
    """The first confirmation draw (``confirmation``, ``confirmation-1``, ...) whose split
    digest is not in ``spent_digests``, built if needed.

    Raises:
        ConfirmationExhausted: no unspent draw is left.
    """
    for k in range(MAX_DRAWS):
        name = ensure_draw(testset_dir, k, model=model)
        if load_manifest(testset_dir).split(name).digest not in spent_digests:
            return name
    raise ConfirmationExhausted(f"all {MAX_DRAWS} confirmation draws are spent")
