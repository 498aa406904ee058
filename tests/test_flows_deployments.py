"""Deployments and the CLI: the nightly schedule is declared, every entrypoint imports."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).parents[1]


def deployments() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in spec["deployments"]}


def test_nightly_revalidation_is_scheduled_on_a_process_pool():
    nightly = deployments()["nightly-revalidation"]
    (schedule,) = nightly["schedules"]
    cron = CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone", "UTC"))
    minute, hour, *days = cron.cron.split()
    assert minute.isdigit() and hour.isdigit() and days == ["*", "*", "*"]  # once a day
    assert schedule.get("active", True)
    assert nightly["entrypoint"].endswith(":revalidate_production")
    assert nightly["work_pool"]["name"]


def test_every_entrypoint_loads_as_a_flow(monkeypatch):
    monkeypatch.chdir(ROOT)
    names = {}
    for name, deployment in deployments().items():
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        assert isinstance(flow, Flow), name
        # the declared parameters bind to the flow's signature (pydantic-validated)
        flow.validate_parameters(deployment.get("parameters", {}))
        names[name] = flow.name
    assert names == {"nightly-revalidation": "kernelgate-revalidate-production",
                     "candidate-rollout": "kernelgate-rollout"}


def test_cli_exposes_the_documented_commands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("rollout", "evaluate", "revalidate", "audit", "ui"):
        assert command in result.output


def test_cli_rejects_a_missing_thresholds_file(tmp_path):
    result = CliRunner().invoke(app, ["rollout", "--thresholds", str(tmp_path / "nope.yaml")])
    assert result.exit_code != 0
