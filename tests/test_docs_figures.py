"""Figures in the docs come from committed outputs of commands."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attack_table import table

ROOT = Path(__file__).resolve().parents[1]


def test_reliability_attack_table_is_the_committed_make_attacks_output():
    report = json.loads((ROOT / "reliability" / "attacks.json").read_text())
    text = (ROOT / "RELIABILITY.md").read_text()
    shown = text.split("<!-- attacks-table: from reliability/attacks.json -->")[1].split("\n\n")[0]
    assert shown.strip() == table(report).strip()
    assert all(row["caught"] for row in report["attacks"]), "an attack was not caught"
    kinds = {row["kind"] for row in report["attacks"]}
    # every kind the attack suite defines was tried (a kind added later counts too)
    from tests.test_attacks import KINDS

    assert kinds == set(KINDS), f"kinds without an attack: {set(KINDS) - kinds}"


def test_reliability_servers_table_is_the_committed_make_test_services_output():
    from tests.services import table as servers_table

    report = json.loads((ROOT / "reliability" / "services.json").read_text())
    text = (ROOT / "RELIABILITY.md").read_text()
    shown = text.split("<!-- servers-table: from reliability/services.json -->")[1].split("\n\n")[0]
    assert shown.strip() == servers_table(report).strip()
    load = report["load"]
    assert load["metric_points_read_back"] == load["metric_points_written"] > 0
    assert load["tags_read_back"] == load["tags_written"] > 0
