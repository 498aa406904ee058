"""Count the ``MlflowClient`` calls one ``kernelgate`` command makes, by method.

Why: a server's CPU follows the requests it serves (every request to the stack's MLflow
pays the basic-auth app's lookups first), so this is where to start cutting it. Every
public method of ``mlflow.tracking.MlflowClient`` is wrapped in this process (the fluent
API goes through it too) before the command runs in-process; the table counts calls and
their seconds of client time, and a bad command's own error is what it ends with::

    python tools/mlflow_calls.py rollout --store-dir /tmp/count-store
"""

from __future__ import annotations

import collections
import functools
import sys
import time

CALLS: collections.Counter[str] = collections.Counter()
SECONDS: collections.Counter[str] = collections.Counter()


def count_calls(cls) -> None:
    """Wrap every public method of ``cls`` so that each call adds to :data:`CALLS`."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or not callable(method) or isinstance(method, staticmethod
                                                                      | classmethod):
            continue

        @functools.wraps(method)
        def counted(*args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                CALLS[_name] += 1
                SECONDS[_name] += time.perf_counter() - start

        setattr(cls, name, counted)


def table() -> str:
    """The calls by method, most first, with their total."""
    rows = [f"| {n} | {c} | {SECONDS[n]:.2f} |" for n, c in CALLS.most_common()]
    return "\n".join([f"{sum(CALLS.values())} MlflowClient calls",
                      "| method | calls | client s |", "|---|---|---|", *rows])


if __name__ == "__main__":
    from mlflow.tracking import MlflowClient

    count_calls(MlflowClient)
    from flows.cli import app

    try:
        app(args=sys.argv[1:], prog_name="kernelgate")
    except SystemExit as end:
        print(table())
        sys.exit(end.code)
