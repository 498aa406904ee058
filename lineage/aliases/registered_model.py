"""The family's registered model as read and annotated: never an alias move.

* Registered model ``kernelgate-<family>`` (:func:`registered_model_name`); a version is one
  build, created from the build run (:func:`register_build`, ``source = runs:/<build run
  id>/model``, the build logged as an MLflow model).
* Reading: the aliases MLflow shows (through ``get_registered_model(...).aliases`` — the
  search APIs return empty aliases on SQLite), whether a version exists, its tags.
* Tagging: the link tags and the description that lead people in the MLflow UI from a
  version to the runs that judged it. Tags are for people; nothing that decides reads them.
* The signed alias history read back (:func:`alias_history`, :func:`signed_aliases`,
  :func:`production_history`): the numbered, hash-chained ``alias`` attestations, which
  the alias-moving wall (:mod:`lineage.aliases.registry`) and the audit both replay.

Every alias move lives in :mod:`lineage.aliases.registry`, where its invariant is checked.
"""

from __future__ import annotations

import contextlib
import json
from typing import Literal

from mlflow.exceptions import MlflowException

from kernels.config import KernelConfig
from lineage.aliases import production_story
from lineage.records.records import LineageError
from lineage.signing.attestations import Attestation, TrustPolicy
from lineage.signing.sources import EvidenceSource, StoreSource
from lineage.store import tags
from lineage.store.names import experiment_name
from lineage.store.ownership import refusing_squatted
from lineage.store.tracking import ArtifactIntegrityError, Tracking, read_verified_artifact

Alias = Literal["shadow", "canary", "production"]
ALIASES: tuple[Alias, ...] = ("shadow", "canary", "production")


def registered_model_name(family: str) -> str:
    """``kernelgate-<family>`` (same as the experiment name)."""
    return experiment_name(family)


def ensure_registered_model(tracking: Tracking, family: str) -> str:
    """Create the family's registered model if needed; returns its name.

    Raises:
        MlflowException: the store refuses the creation (e.g. read-only account).
    """
    client = tracking.client()
    name = registered_model_name(family)
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, tags={tags.FAMILY: family},
            description=f"Attention kernel family {family!r} (kernelgate).")
    return name


def register_build(tracking: Tracking, family: str, build_run_id: str, *, implementation: str,
                   config: KernelConfig | None, artifact_path: str = "model",
                   extra_tags: dict[str, str] | None = None) -> str:
    """Create a model version for a build run; returns the version number (as str).

    The version is tagged with what it serves: ``implementation`` and its resolved
    block sizes (``null`` for untiled kernels) — for people; what serves is read from
    the signed build.

    Raises:
        LineageError: the run does not exist or is not a ``build`` run.
        lineage.store.ownership.FamilyOwnedElsewhere: another account owns the registered model.
    """
    client = tracking.client()
    try:
        run = client.get_run(build_run_id)
    except MlflowException as exc:
        raise LineageError(f"build run {build_run_id!r} not found") from exc
    if run.data.tags.get(tags.STAGE) != "build":
        raise LineageError(f"run {build_run_id} is not a build run")
    with refusing_squatted(tracking, family, "create a model version"):
        name = ensure_registered_model(tracking, family)
        version = client.create_model_version(
            name, source=f"runs:/{build_run_id}/{artifact_path}", run_id=build_run_id,
            tags={tags.BUILD_RUN_ID: build_run_id, tags.FAMILY: family,
                  tags.IMPLEMENTATION: implementation,
                  tags.CONFIG: json.dumps(config.fields_set() if config else None),
                  **(extra_tags or {})})
    return str(version.version)


def aliases(tracking: Tracking, family: str) -> dict[str, str]:
    """Alias -> version of the family's registered model (empty when none exists)."""
    try:
        model = tracking.client().get_registered_model(registered_model_name(family))
    except MlflowException:
        return {}
    return {a: str(v) for a, v in model.aliases.items()}


def families_in_production(tracking: Tracking) -> dict[str, str]:
    """Family -> the version its ``production`` alias points at, for every family of the
    store (registered models named ``kernelgate-<family>``) that has one, by name."""
    found = {}
    for model in tracking.client().search_registered_models(max_results=1000):
        if model.name.startswith("kernelgate-") and "production" in model.aliases:
            found[model.name.removeprefix("kernelgate-")] = str(model.aliases["production"])
    return dict(sorted(found.items()))


def alias_version(tracking: Tracking, family: str, alias: Alias) -> str | None:
    """The version an alias points at, or None."""
    return aliases(tracking, family).get(alias)


def version_exists(tracking: Tracking, family: str, version: str) -> bool:
    """Whether the registered model still has ``version``."""
    try:
        tracking.client().get_model_version(registered_model_name(family), version)
    except MlflowException:
        return False
    return True


def version_tags(tracking: Tracking, family: str, version: str) -> dict[str, str]:
    """The tags of one model version of the family's registered model.

    Raises:
        MlflowException: no such registered model or version.
    """
    return dict(tracking.client().get_model_version(registered_model_name(family), version).tags)


def tag_version(tracking: Tracking, family: str, version: str, values: dict[str, str]) -> None:
    """Set tags on one model version (links for people reading the MLflow UI).

    Raises:
        MlflowException: no such registered model or version.
    """
    client = tracking.client()
    for key, value in values.items():
        client.set_model_version_tag(registered_model_name(family), version, key, value)


def drop_version_tag(tracking: Tracking, family: str, version: str, key: str) -> None:
    """Remove one tag from a model version (nothing happens when it is not set)."""
    with contextlib.suppress(MlflowException):  # not set
        tracking.client().delete_model_version_tag(registered_model_name(family), version, key)


def link_traffic_run(tracking: Tracking, family: str, version: str,
                     stage: Literal["shadow", "canary"], run_id: str) -> None:
    """Link a shadow run, or append a canary-step run, to the version (for people).

    Raises:
        MlflowException: no such registered model or version.
    """
    if stage == "shadow":
        tag_version(tracking, family, version, {tags.SHADOW_RUN_ID: run_id})
        return
    runs = json.loads(version_tags(tracking, family, version).get(tags.CANARY_RUN_IDS, "[]"))
    tag_version(tracking, family, version, {tags.CANARY_RUN_IDS: json.dumps([*runs, run_id])})


def link_gate(tracking: Tracking, family: str, version: str, *, decision_run_id: str,
              evaluation_run_id: str, registration_id: str) -> None:
    """Link the held-out gate decision, its evaluation and registration to the version it
    judged, whatever the verdict (for people: a rejected version's description links its
    chain; the promotion sets the same values from the signed chain).

    Raises:
        MlflowException: no such registered model or version.
    """
    tag_version(tracking, family, version, {tags.DECISION_RUN_ID: decision_run_id,
                                            tags.EVALUATION_RUN_ID: evaluation_run_id,
                                            tags.REGISTRATION_ID: registration_id})


def link_confirmation(tracking: Tracking, family: str, version: str, decision_run_id: str) -> None:
    """Link the confirmation-split decision to the version it judged (for people).

    Raises:
        MlflowException: no such registered model or version.
    """
    tag_version(tracking, family, version, {tags.CONFIRMATION_RUN_ID: decision_run_id})


def link_approval(tracking: Tracking, family: str, version: str, transition: str,
                  approval_run_id: str) -> None:
    """Link an approval run to the version it is about (for people).

    Raises:
        MlflowException: no such registered model or version.
    """
    tag_version(tracking, family, version, {tags.approval_run_id(transition): approval_run_id})


def approvers(tracking: Tracking, family: str, version: str) -> dict[str, str]:
    """Transition -> who answered its approval for ``version`` and how they were
    identified where no key authenticated them (``alice (unauthenticated: typed into the
    Prefect UI)``): the approval runs the version's link tags name, their approval record
    read as logged (checked against its recorded sha256). For people: the signed records
    are what the audit reads.

    Raises:
        MlflowException: no such registered model or version.
    """
    client = tracking.client()
    out = {}
    for key, run_id in sorted(version_tags(tracking, family, version).items()):
        if key.startswith(tags.APPROVAL_RUN_ID + "."):
            transition = key.removeprefix(tags.APPROVAL_RUN_ID + ".approval-").replace("-to-", "->")
            who = client.get_run(run_id).data.tags.get(tags.APPROVER, "?")
            try:
                record = json.loads(read_verified_artifact(tracking, run_id,
                                                           tags.APPROVAL_ARTIFACT))
            except (ArtifactIntegrityError, ValueError):
                record = {"authenticated": False, "authentication": "its record is unreadable"}
            if not record.get("authenticated") and not record.get("auto_approved"):
                who += f" ({record.get('authentication') or 'unauthenticated'})"
            out[transition] = who
    return out


def _tiling_lines(values: dict[str, str]) -> list[str]:
    """What the version serves, for its description: the kernel, the block sizes asked
    for, the tiling rule and the tiling it resolves to per shape (versions registered
    before these tags: the block sizes asked for, ``null`` meaning the kernel's choice)."""
    implementation, config = values.get(tags.IMPLEMENTATION, "?"), values.get(tags.CONFIG)
    if tags.TILING_RULE not in values:
        return [f"`{implementation}` with config `{config}` (null: the kernel's choice per call)"]
    lines = [f"`{implementation}`; tiling: {values[tags.TILING_RULE]}", "",
             "| shape (batch×length×heads×head_dim) | block sizes |", "|---|---|"]
    for label, blocks in json.loads(values.get(tags.TILING, "{}")).items():
        lines.append(f"| {label} | {blocks} |")
    return lines


def describe_version(tracking: Tracking, family: str, version: str, decision: str, *,
                     evidence: str | None = None) -> str:
    """Write the version's MLflow description: ``decision`` in one line, ``evidence``
    (markdown, e.g. the adoption test's claim and measured effect) under it, then its
    chain as markdown links to every run the version's link tags name (build, evaluation,
    gate, approvals, shadow, canary steps, confirmation, the rollout with its promotion
    or rollback runs). For people; the audit never reads it. Returns the markdown.

    Raises:
        MlflowException: no such registered model or version.
    """
    client = tracking.client()
    values = version_tags(tracking, family, version)
    experiment = client.get_experiment_by_name(experiment_name(family))

    def link(label: str, run_id: str | None) -> str | None:
        if not run_id:
            return None
        return (f"- {label}: [{run_id[:8]}](#/experiments/{experiment.experiment_id}/runs/"
                f"{run_id}?{tags.UI_VIEW_QUERY})")

    rows = [link("build", values.get(tags.BUILD_RUN_ID)),
            link("evaluation (held-out)", values.get(tags.EVALUATION_RUN_ID)),
            link("gate decision", values.get(tags.DECISION_RUN_ID))]
    rows += [link(f"approval {key.removeprefix(tags.APPROVAL_RUN_ID + '.approval-').replace('-to-', ' → ')}",
                  run_id) for key, run_id in sorted(values.items())
             if key.startswith(tags.APPROVAL_RUN_ID + ".")]
    rows.append(link("shadow", values.get(tags.SHADOW_RUN_ID)))
    rows += [link(f"canary step {i}", run_id) for i, run_id in
             enumerate(json.loads(values.get(tags.CANARY_RUN_IDS, "[]")), start=1)]
    rows.append(link("confirmation decision", values.get(tags.CONFIRMATION_RUN_ID)))
    rows.append(link("rollout (parent run: promotion and rollback runs are its children)",
                     values.get(tags.ROLLOUT_RUN_ID)))
    # the signed production story at the top (lineage.aliases.production_story) outlives a rewrite
    kept = production_story.story_block(
        client.get_model_version(registered_model_name(family), version).description)
    text = kept + "\n".join([
        f"**{decision}**", "",
        *([evidence, ""] if evidence else []),
        *_tiling_lines(values), "",
        "Chain of evidence (each run holds its signed `attestations/*.dsse.json`; "
        "`kernelgate audit` re-verifies them):", "",
        *[r for r in rows if r]])
    client.update_model_version(registered_model_name(family), version, description=text)
    return text


# --- the signed alias history ----------------------------------------------------------


def alias_history(source: EvidenceSource) -> tuple[list[Attestation], list[str]]:
    """The family's verified alias moves in sequence order, and problems with the
    history itself (gaps, broken hash links)."""
    problems: list[str] = []
    moves = sorted((a for a in source.attestations() if a.kind == "alias"),
                   key=lambda a: int(a.predicate.get("sequence", 0)))
    for i, move in enumerate(moves, start=1):
        sequence = int(move.predicate.get("sequence", 0))
        if sequence != i:
            problems.append(f"signed alias history: move {i} is missing (next signed move is "
                            f"number {sequence}); its run was deleted or never signed")
            break
        expected = moves[i - 2].envelope_sha256 if i > 1 else None
        if move.predicate.get("previous_envelope") != expected:
            problems.append(f"signed alias history: move {i} does not chain to move {i - 1}")
        if i > 1 and str(move.predicate.get("attested_at", "")) < str(
                moves[i - 2].predicate.get("attested_at", "")):
            # a key revoked from a position could otherwise sign a backdated move after it
            problems.append(f"signed alias history: move {i} is signed as earlier than move "
                            f"{i - 1} (backdated)")
    return moves, problems


def signed_aliases(moves: list[Attestation]) -> dict[str, str]:
    """The aliases as the signed history leaves them (alias -> version)."""
    state: dict[str, str] = {}
    for move in moves:
        alias, version = move.predicate["alias"], move.predicate.get("version")
        if version is None:
            state.pop(alias, None)
        else:
            state[alias] = str(version)
    return state

def store_alias_history(tracking: Tracking, family: str,
                        trust: TrustPolicy) -> tuple[list[Attestation], list[str]]:
    """:func:`alias_history` read from every run of the family in the store: a run's
    ``kernelgate.stage`` tag is not signed, so it cannot say which runs hold moves (a
    signed rollback re-tagged as another stage would drop out, and ``reconcile`` would
    move production back to what it rolled away from)."""
    return alias_history(StoreSource(tracking, family, trust))


def promoted_versions(moves: list[Attestation]) -> list[str]:
    """Versions promoted to production and not rolled back since, oldest first, as
    signed (a rolled-back version is never restored by a later rollback)."""
    out: list[str] = []
    for move in moves:
        p = move.predicate
        if p["alias"] != "production":
            continue
        if p["action"] == "promote" and p.get("version"):
            out = [v for v in out if v != str(p["version"])] + [str(p["version"])]
        elif p["action"] == "rollback" and p.get("previous_version"):
            out = [v for v in out if v != str(p["previous_version"])]
    return out


def production_history(tracking: Tracking, family: str, trust: TrustPolicy) -> list[str]:
    """Versions promoted to production, oldest first, from the signed history."""
    moves, _ = store_alias_history(tracking, family, trust)
    return promoted_versions(moves)
