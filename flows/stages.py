"""The stage task: the decorator of every stage (``stage_task``), the wall clock each
stage's runs are stamped with (``stage_clock``), and the run logger. Re-exported by
``flows.tasks``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from prefect import Task, get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.utilities.annotations import quote

from flows.errored import mark_stage
from flows.results import RolloutContext
from lineage.records import timeline


class StageTask(Task):
    """A stage's task: its first parameter is the session's ``RolloutContext``, handed to
    Prefect wrapped in ``quote`` (Prefect's annotation for an input it must neither walk
    nor copy: the context holds a signer, a tracking client and the model). The stage's
    findings are its return value; later stages get them as ordinary parameters."""

    def __call__(self, context: RolloutContext, /, *args, **kwargs):
        with stage_clock(context, self.name):
            try:
                return super().__call__(quote(context), *args, **kwargs)
            except (Exception, KeyboardInterrupt) as err:
                mark_stage(err, self.name)  # the errored (or interrupted) outcome names it
                raise


@contextlib.contextmanager
def stage_clock(context: RolloutContext, stage: str) -> Iterator[None]:
    """Time a stage by the wall clock and record its start and end into the MLflow runs
    it created (``lineage.records.timeline.record_stage_time``), also when it raises; a failure to
    record is a warning (the evidence is complete without it)."""
    started = time.time()
    try:
        yield
    finally:
        try:
            timeline.record_stage_time(context.record.tracking, context.record.rollout_run_id,
                                       stage, started, time.time())
        except Exception as err:  # noqa: BLE001 - timing is a courtesy, never a verdict
            run_logger().warning("could not record the %s stage's wall time: %s", stage, err)


def stage_task(*, name: str):
    """Make a function a stage task: never cached, results not persisted (the evidence
    is logged to MLflow; a re-run must do the stage again)."""
    def decorate(fn):
        return StageTask(fn, name=name, cache_policy=NO_CACHE, persist_result=False)
    return decorate


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run (lines show in the UI), the
    ``flows`` logger when a task's function is called directly."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("flows")
