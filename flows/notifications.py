"""Who is told what: Prefect automations that send a notification when a rollout pauses
for approval, when any kernelgate flow run ends rolled back, when nobody answered an
approval in time (*TimedOut*), and when a nightly re-validation crashes or fails
(``kernelgate notifications create --webhook URL``).

Prefect's own pieces only: a ``CustomWebhookNotificationBlock`` and one
``Automation`` per rule of :data:`RULES`, with reactive ``EventTrigger``s on the flow-run state events
(``prefect.flow-run.<state name>``: the named end states make *RolledBack* one event);
each action is ``SendNotification`` through that block. ``prefect.yaml`` triggers can
only start deployments, so a command creates these.
"""

from __future__ import annotations

import contextlib

from prefect.automations import Automation
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import EventTrigger, Posture

BLOCK_NAME = "kernelgate-notifications"
ROLLOUT_FLOW = "kernelgate-rollout"
NIGHTLY_FLOW = "kernelgate-revalidate-production"
KERNELGATE_FLOWS = [ROLLOUT_FLOW, NIGHTLY_FLOW, "kernelgate-manual-rollback"]

_BODY = ("{{ flow.name }} run {{ flow_run.name }}: {{ flow_run.state.name }}"
         "{% if flow_run.state.message %} — {{ flow_run.state.message }}{% endif %}\n"
         "{{ flow_run|ui_url }}")

RULES: dict[str, tuple[set[str], list[str], str]] = {
    "kernelgate: rollout waiting for approval": (
        {"prefect.flow-run.Paused"}, [ROLLOUT_FLOW],
        "kernelgate: a rollout waits for your approval"),
    "kernelgate: rolled back": (
        {"prefect.flow-run.RolledBack"}, KERNELGATE_FLOWS, "kernelgate: rolled back"),
    "kernelgate: approval timed out": (
        {"prefect.flow-run.TimedOut"}, [ROLLOUT_FLOW],
        "kernelgate: nobody answered an approval in time; the candidate was rejected"),
    "kernelgate: nightly run crashed or failed": (
        {"prefect.flow-run.Crashed", "prefect.flow-run.Failed"}, [NIGHTLY_FLOW],
        "kernelgate: the nightly re-validation did not finish"),
}
"""Automation name -> (events, flow names, subject)."""


def create_notifications(webhook_url: str, *, allow_private_urls: bool = False,
                         block_name: str = BLOCK_NAME) -> list[Automation]:
    """Save the webhook block (replacing one of the same name) and create the
    automations (replacing those of the same names); returns the automations.

    Raises:
        ValueError: ``webhook_url`` is not an http(s) URL.
    """
    if not webhook_url.startswith(("http://", "https://")):
        raise ValueError(f"{webhook_url!r} is not an http(s) URL")
    block = CustomWebhookNotificationBlock(
        name=block_name, url=webhook_url,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        allow_private_urls=allow_private_urls)
    block_id = block.save(block_name, overwrite=True)
    created = []
    for name, (events, flows, subject) in RULES.items():
        with contextlib.suppress(ValueError):  # none of that name yet
            Automation.read(name=name).delete()
        created.append(Automation(
            name=name,
            description=f"created by `kernelgate notifications create` ({', '.join(sorted(events))})",
            trigger=EventTrigger(
                expect=events, posture=Posture.Reactive, threshold=1,
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.role": "flow",
                               "prefect.resource.name": flows}),
            actions=[SendNotification(block_document_id=block_id, subject=subject,
                                      body=_BODY)],
        ).create())
    return created
