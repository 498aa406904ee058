"""Commands a person runs with their own key: answer a paused approval, approve looser
thresholds. Registered on the ``kernelgate`` app by ``flows.cli``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_keys import KeyDir, check_name, person_signer


def approve(flow_run_id: Annotated[str, typer.Argument(help="the paused rollout's flow run id")],
            key: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="your private key (PEM)")],
            comment: Annotated[str, typer.Option(help="why; shown to auditors")],
            reject: Annotated[bool, typer.Option(help="answer no")] = False,
            name: Annotated[str | None, typer.Option(help="your name (default: from the policy)")] = None,
            key_dir: KeyDir = None) -> None:
    """Answer a paused approval with your own key: signs the answer and resumes the flow run (needs PREFECT_API_URL). A key the key folder revokes is refused first, in the rollout's words."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_API_URL

    from lineage.signing import keys
    from lineage.signing.approvals import revocations, revoked_key, sign_approval

    if key_dir is not None and not key_dir.is_dir():  # a mistyped folder revokes nothing
        raise typer.BadParameter(f"{key_dir}: no such key folder, so the revocations it "
                                 "would hold cannot be checked", param_hint="--key-dir")
    signer = person_signer(key, key_dir=key_dir)
    keyid = signer.public_key.keyid
    # the key folder's revocations, refused before any server is asked (the rollout
    # refuses them too, and those its family's log records)
    why = revoked_key([keyid], revocations(keys.folder_trust(key_dir or keys.default_key_dir())))
    if why is not None:
        raise typer.BadParameter(why, param_hint="--key")
    if not PREFECT_API_URL.value():
        raise typer.BadParameter("PREFECT_API_URL is not set: an approval answers a flow run "
                                 "paused on a Prefect server (export the URL the rollout used, "
                                 "e.g. http://127.0.0.1:4200/api)", param_hint="FLOW_RUN_ID")
    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
    except ObjectNotFound:
        raise typer.BadParameter(f"no flow run {flow_run_id} on the Prefect server at "
                                 f"{PREFECT_API_URL.value()}", param_hint="FLOW_RUN_ID") from None
    except httpx.HTTPError as err:
        raise typer.BadParameter(f"the Prefect server at {PREFECT_API_URL.value()} cannot be "
                                 f"reached ({err})", param_hint="FLOW_RUN_ID") from None
    details = run.state.state_details if run.state else None
    pause_key = getattr(details, "pause_key", None) or ""
    if not run.state or not run.state.is_paused() or not pause_key.startswith("approval-"):
        raise typer.BadParameter(f"flow run {flow_run_id} is not waiting for an approval "
                                 f"(state {run.state.name if run.state else None})")
    transition = re.sub(r"-retry\d+$", "", pause_key).removeprefix("approval-").replace("-to-", "->")
    envelope = sign_approval(signer, flow_run_id=flow_run_id, transition=transition,
                             approve=not reject, comment=comment)
    resume_flow_run(flow_run_id, run_input={"decision": "reject" if reject else "approve",
                                            "approver": name or f"key {signer.public_key.keyid[:12]}",
                                            "comment": comment,
                                            "signed_approval": envelope.decode()})
    typer.echo(f"{'rejected' if reject else 'approved'} {transition} of flow run {flow_run_id}, "
               f"signed with key {signer.public_key.keyid}")


def approve_loosening(thresholds: Annotated[Path, typer.Option(help="thresholds file to preregister", exists=True, dir_okay=False)], family: Annotated[str, typer.Option(help="kernel family")],
                      key: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="your private key (PEM)")],
                      reason: Annotated[str, typer.Option(help="who asked and why the bounds may be looser")],
                      out: Annotated[Path, typer.Option(help="where to write the signed approval")],
                      store_dir: Annotated[Path, typer.Option(help="local store (the family's registrations)")] = Path(".kernelgate"),
                      binding: Annotated[list[str] | None, typer.Option(
                          help="NAME=VALUE (JSON): a rollout setting the registration binds that the "
                               "rollout will change (default: the previous registration's); repeat")] = None,
                      valid_for_days: Annotated[float, typer.Option(min=0.01, max=90,
                                                                    help="days the approval stays usable")] = 7.0,
                      key_dir: KeyDir = None) -> None:
    """Sign an approval of thresholds looser than the family's newest registration (pass it to `rollout --loosening-approval`). It binds that registration, the file, the rollout settings, an expiry and a one-time nonce; what a rollout would refuse is refused here first."""
    from flows.cli_store import open_store
    from gates.loosening import loosenings
    from gates.thresholds import load_thresholds
    from lineage.log.family_log import read as read_log
    from lineage.records.loosening_approval import sign_loosening, unnamed
    from lineage.records.registration import latest_registration
    from lineage.records.roster import approvers_of, beyond_roster
    from lineage.signing import keys
    from lineage.signing.approvals import revocations, revoked_key
    from lineage.signing.sources import StoreSource

    if not reason.strip():
        raise typer.BadParameter("a loosening needs a reason", param_hint="--reason")
    family = check_name(family)
    tracking = open_store(store_dir, must_exist=True)
    folder = key_dir or keys.default_key_dir()
    trust = keys.folder_trust(folder)
    source = StoreSource(tracking, family, trust)
    newest = latest_registration(source)
    if newest is None:
        raise typer.BadParameter(f"family {family!r} has no registration: its first one needs "
                                 "no approval", param_hint="--family")
    previous, frozen = newest
    signer = person_signer(key, key_dir=folder)
    keyid = signer.public_key.keyid
    approvers = approvers_of(source, newest)
    named = {a.keyid: a.name for a in approvers}
    try:
        asked = load_thresholds(thresholds)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--thresholds") from None
    loosened = loosenings(frozen, asked)
    if not named and loosened and not beyond_roster(frozen, asked, loosened) and not binding:
        raise typer.BadParameter(
            f"{thresholds} only names the family's first approvers: that needs no approval "
            "(trust on first use, each entry signed by its own key: kernelgate keys entry); "
            "roll it out as it is", param_hint="--thresholds")
    why = unnamed(previous, frozen, {keyid}, family, approvers)  # the rollout's own words
    if why is not None:
        raise typer.BadParameter(f"{why}: a rollout would refuse this approval",
                                 param_hint="--key")
    refusal = revoked_key([keyid], revocations(trust, read_log(source).entries.values()))
    if refusal is not None:
        raise typer.BadParameter(refusal, param_hint="--key")
    bindings = dict(previous.predicate.get("bindings") or {})
    for item in binding or []:
        name, _, value = item.partition("=")
        if not value or name not in bindings:
            raise typer.BadParameter(f"{item!r}: give NAME=VALUE for one of {sorted(bindings)}",
                                     param_hint="--binding")
        try:
            bindings[name] = json.loads(value)
        except json.JSONDecodeError:
            bindings[name] = value
    if not loosened and not binding:
        raise typer.BadParameter(f"{thresholds} is not looser than registration "
                                 f"{previous.predicate['registration_id']}: nothing to approve",
                                 param_hint="--thresholds")
    envelope = sign_loosening(signer, family, thresholds, reason, previous=previous,
                              bindings=bindings or None, valid_for_s=valid_for_days * 86400)
    out.write_bytes(envelope)
    typer.echo(f"wrote {out}: {named[keyid]} approves {'; '.join(loosened) or 'the bindings'} "
               f"as a loosening of registration {previous.predicate['registration_id']}, "
               f"usable once within {valid_for_days:g} days")
