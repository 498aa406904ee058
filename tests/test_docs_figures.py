"""Figures in the docs come from committed outputs of commands."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attack_table import table

ROOT = Path(__file__).resolve().parents[1]
LONGDOC_FIGURES = "docs/longdoc"
LONGDOC_COMMAND = ("python -m evaluation.longdoc.figures "
                   "kernels/tools/bench_results/h200-2026-12-04-longdoc docs/longdoc")


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


def test_the_readme_screenshots_are_what_make_docs_screenshots_copies_from_the_browser_tests():
    """``make docs-screenshots`` copies screenshots the browser tests write (so README's
    pictures are of the paths those tests assert), and README shows exactly those."""
    import re

    target = (ROOT / "Makefile").read_text().split("\ndocs-screenshots:")[1].split("\n\n")[0]
    copies = re.findall(r"cp \.kernelgate/screenshots/(\S+\.png) (docs/\S+\.png)", target)
    assert copies, target
    written = set(re.findall(r'screenshots / "([^"]+\.png)"',
                             (ROOT / "tests" / "test_browser.py").read_text()))
    assert {source for source, _ in copies} <= written, written
    shown = set(re.findall(r"\]\((docs/[^)]+\.png)\)", (ROOT / "README.md").read_text()))
    shown -= {path for path in shown if path.startswith(f"{LONGDOC_FIGURES}/")}  # plots, below
    assert shown == {dest for _, dest in copies}
    assert all((ROOT / dest).is_file() for _, dest in copies)


def test_the_readme_long_document_figures_are_the_figures_command_on_committed_results():
    """README names the command; each plot it shows has its effects file beside it, made
    from a committed result whose bytes are still those plotted
    (``tests/test_evaluation_longdoc_plots.py`` re-runs the command and compares)."""
    import hashlib
    import re

    text = (ROOT / "README.md").read_text()
    assert LONGDOC_COMMAND in " ".join(text.split())
    shown = re.findall(rf"\]\(({LONGDOC_FIGURES}/[^)]+)-(?:bucket-effect|time-to-result)\.png\)",
                       text)
    assert shown, "README shows no long-document figure"
    for stem in shown:
        record = json.loads((ROOT / f"{stem}-effects.json").read_text())
        source = ROOT / record["source"]
        assert record["source"].startswith(LONGDOC_COMMAND.split()[3] + "/")
        assert hashlib.sha256(source.read_bytes()).hexdigest() == record["source_sha256"]
