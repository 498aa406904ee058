"""Ctrl-C in the middle of a rollout: the command ends in seconds, exit 130, the record
closed as a signed *interrupted* outcome naming the stage, no traceback, production and
the aliases untouched. (A terminal's Ctrl-C reaches the whole foreground process group:
the test sends SIGINT to the command's group the same way.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.flow_thresholds import FLOW_TEST, untimed
from tests.shared_builds import copy_of, flow_testset

KERNELGATE = Path(sys.executable).parent / "kernelgate"
ROOT = Path(__file__).resolve().parents[1]


AS_FROM_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; "
                      "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])"]
"""Runs the command after it with SIGINT at its default, as for a command a person starts
in a terminal. An ignored SIGINT is inherited through exec (POSIX), and a test run started
as a background job of a script without job control (``.ci/run``'s lanes) ignores it
unless something in the test process set a handler first: the command would then never see
the Ctrl-C this test sends, whichever tests ran before it."""


def test_ctrl_c_mid_stage_ends_in_seconds_as_a_signed_interrupted_outcome(tmp_path_factory,
                                                                           tmp_path, signing):
    from lineage.aliases import registered_model
    from lineage.signing.sources import StoreSource
    from lineage.store import tags
    from lineage.store import tracking as tr

    store = tmp_path / "store"
    copy_of(flow_testset(tmp_path_factory), store / "testsets" / "minimal")
    thresholds = untimed(FLOW_TEST, tmp_path / "flow.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_API"))}
    rollout = subprocess.Popen(
        [*AS_FROM_A_TERMINAL, str(KERNELGATE), "rollout", "--implementation", "xla",
         "--testset-profile", "minimal", "--thresholds", str(thresholds),
         "--store-dir", str(store)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    lines, sent = [], None
    try:
        for line in rollout.stdout:
            lines.append(line)
            if sent is None and "accuracy heldout:" in line:  # inside the evaluate stage
                os.killpg(rollout.pid, signal.SIGINT)
                sent = time.monotonic()
        code = rollout.wait(timeout=120)
    finally:
        if rollout.poll() is None:
            os.killpg(rollout.pid, signal.SIGKILL)
    output = "".join(lines)
    assert sent is not None, output[-3000:]
    took = time.monotonic() - sent
    assert code == 130, output[-3000:]
    assert took < 60, f"{took:.0f} s after Ctrl-C"
    assert "Traceback" not in output and "ConnectError" not in output, output[-3000:]
    assert "— interrupted at evaluate" in output, output[-1500:]
    tracking = tr.local_tracking(store)
    (outcome,) = [a for a in StoreSource(tracking, "xla", signing.trust).attestations()
                  if a.kind == "outcome"]
    assert (outcome.predicate["result"], outcome.predicate["stage"]) == ("interrupted",
                                                                         "evaluate")
    run = tracking.client().get_run(outcome.run_id)
    assert run.info.status == "KILLED" and run.data.tags[tags.RESULT] == "interrupted"
    assert registered_model.aliases(tracking, "xla") == {}
