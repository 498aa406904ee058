"""Print the attacks table of RELIABILITY.md from ``make attacks``'s JSON:
``python -m tests.attack_table reliability/attacks.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(report: dict) -> str:
    """Markdown: one row per kind (tried, caught), then the total."""
    rows = ["| kind | what the attacker exploited before | tried | caught |", "|---|---|---|---|"]
    for row in report["by_kind"]:
        rows.append(f"| {row['kind']} | {row['what']} | {row['tried']} | {row['caught']} |")
    tried = sum(r["tried"] for r in report["by_kind"])
    caught = sum(r["caught"] for r in report["by_kind"])
    rows.append(f"| all | | {tried} | {caught} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
