"""The flow-test thresholds with a latency plan that does not time the host they run on.

The rollouts of the flow, attack, services and approval tests judge gates, faults,
approvals and the record, not latency; they share the 2-core host with the other xdist
workers and the services lane, whose load made a good kernel's canary *inconclusive* with
the written plan (noise_sd 0.5: measured noise sd 0.545 in CI on 2026-12-02 00:16, 0.531
in a fresh clone's `make test` at 04:48, which errored all 17 flow tests). The one test
that judges latency (``test_flows_rollout``'s slow candidate) keeps the written plan."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import yaml

FLOW_TEST = Path(__file__).parent / "data" / "thresholds-flow-test.yaml"
UNTIMED_NOISE_SD = 5.0
"""The schema's largest ``noise_sd``: 24-request canary steps cannot reach the latency
test's power with it, so a canary says latency is *not assessed* (the plan's
``power_problem``), with that reason, never passed."""


def untimed(path: Path, out: Path, **approval) -> Path:
    """Write ``path``'s thresholds with ``noise_sd`` :data:`UNTIMED_NOISE_SD` to ``out``
    (``approval`` updates the approval block) and return ``out``. The same input gives
    the same bytes, so every process registers the same ``source_sha256``."""
    data = yaml.safe_load(path.read_text())
    data["approval"].update(approval)
    data["canary"]["latency"]["noise_sd"] = UNTIMED_NOISE_SD
    out.write_text(yaml.safe_dump(data))
    return out


def untimed_flow_test() -> Path:
    """:data:`FLOW_TEST`, untimed: a module constant of the attack and services tests. The
    file is named by the digest of its bytes in the temporary folder, so every process (the
    xdist workers, a services worker) reads the same file and no run leaves another behind;
    it is written under a process-unique name and renamed into place (atomic)."""
    folder = Path(tempfile.mkdtemp(prefix="kg-thresholds-"))
    fresh = untimed(FLOW_TEST, folder / "flow-test.yaml")
    digest = hashlib.sha256(fresh.read_bytes()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"kg-flow-test-untimed-{digest}.yaml"
    os.replace(fresh, target)
    folder.rmdir()
    return target
