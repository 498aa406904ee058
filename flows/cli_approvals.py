"""Commands a person runs with their own key: answer a paused approval, approve looser
thresholds. Registered on the ``kernelgate`` app by ``flows.cli``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_keys import check_name


def approve(flow_run_id: Annotated[str, typer.Argument(help="the paused rollout's flow run id")],
            key: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="your private key (PEM)")],
            comment: Annotated[str, typer.Option(help="why; shown to auditors")],
            reject: Annotated[bool, typer.Option(help="answer no")] = False,
            name: Annotated[str | None, typer.Option(help="your name (default: from the policy)")] = None) -> None:
    """Answer a paused approval with your own key: signs the answer and resumes the flow run (needs PREFECT_API_URL)."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    from lineage import keys
    from lineage.approvals import sign_approval

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    details = run.state.state_details if run.state else None
    pause_key = getattr(details, "pause_key", None) or ""
    if not run.state or not run.state.is_paused() or not pause_key.startswith("approval-"):
        raise typer.BadParameter(f"flow run {flow_run_id} is not waiting for an approval "
                                 f"(state {run.state.name if run.state else None})")
    transition = re.sub(r"-retry\d+$", "", pause_key).removeprefix("approval-").replace("-to-", "->")
    signer = keys.load_signer(key)
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
                      out: Annotated[Path, typer.Option(help="where to write the signed approval")]) -> None:
    """Sign an approval of thresholds looser than the family's previous registration (pass it to `rollout --loosening-approval`)."""
    from lineage import keys
    from lineage.registration import sign_loosening

    if not reason.strip():
        raise typer.BadParameter("a loosening needs a reason")
    envelope = sign_loosening(keys.load_signer(key), check_name(family), thresholds, reason)
    out.write_bytes(envelope)
    typer.echo(f"wrote {out}")
