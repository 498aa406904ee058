"""Answer paused approvals through the Prefect API, as a release manager's form would, on a
host with no browser (the lent GPU machine).

Polls the Prefect server named by ``PREFECT_API_URL`` for flow runs paused on an
approval (pause key ``approval-…``) and resumes each with the same run input the Prefect
UI's form sends: ``decision``, ``approver``, ``comment``. The rollout records such an
answer as *unauthenticated* (no key signed it), exactly like a form answer, so a profile
with ``require_signed: true`` refuses it; use ``kernelgate approve --key`` there. Every
answer is printed as one line (time, flow run id, pause key, decision).

Usage::

    PREFECT_API_URL=http://127.0.0.1:4200/api python tools/answer_paused.py \\
        --answers 2 --approver rm@example.com --comment "evidence read; go"

Exits 0 after ``--answers`` answers, 1 when ``--timeout-s`` passes first.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Answer ``--answers`` paused approvals, then exit 0 (1 on timeout)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decision", choices=("approve", "reject"), default="approve",
                        help="the answer given to every paused approval (default approve)")
    parser.add_argument("--approver", required=True, help="the name recorded as approver")
    parser.add_argument("--comment", required=True, help="the comment recorded with it")
    parser.add_argument("--answers", type=int, default=1,
                        help="exit after this many answers (default 1)")
    parser.add_argument("--timeout-s", type=float, default=1800,
                        help="give up after this many seconds (default 1800)")
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between polls")
    args = parser.parse_args(argv)
    if args.answers < 1:
        parser.error("--answers must be at least 1")

    import httpx
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # else Prefect would poll a throwaway local server
        parser.error("PREFECT_API_URL is not set: name the Prefect server the rollout runs on")
    try:
        return _answer(args)
    except httpx.HTTPError as err:
        print(f"the Prefect server at {PREFECT_API_URL.value()} cannot be reached: {err}",
              file=sys.stderr)
        return 1


def _answer(args: argparse.Namespace) -> int:
    """Poll and answer as ``main`` says; 0 after ``args.answers`` answers, 1 on timeout."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    paused = FlowRunFilter(state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    answered: set[tuple[str, str]] = set()
    deadline = time.monotonic() + args.timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(flow_run_filter=paused):
                details = run.state.state_details if run.state else None
                key = getattr(details, "pause_key", None) or ""
                if not key.startswith("approval-") or (str(run.id), key) in answered:
                    continue
                try:
                    resume_flow_run(run.id, run_input={"decision": args.decision,
                                                       "approver": args.approver,
                                                       "comment": args.comment})
                except Exception as err:  # the form may not exist yet: ask again next poll
                    print(f"not yet answerable: {run.id} {key}: {err}", file=sys.stderr)
                    continue
                answered.add((str(run.id), key))
                print(f"{time.strftime('%H:%M:%S')} {args.decision} {run.id} {key}", flush=True)
                if len(answered) >= args.answers:
                    return 0
            time.sleep(args.poll_s)
    print(f"timed out after {args.timeout_s:.0f} s with {len(answered)} of {args.answers} "
          "answers", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
