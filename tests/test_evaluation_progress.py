"""A long evaluation says how far it is: a log line at each quarter and at the end, with
the progress bars off (``TQDM_DISABLE``, as the command line sets it)."""

from __future__ import annotations

import logging

from evaluation.progress import progress_bar


def test_progress_is_logged_at_each_quarter_and_at_the_end(caplog, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    update = progress_bar(10, "accuracy heldout")
    with caplog.at_level(logging.INFO, logger="evaluation.progress"):
        for done in range(1, 11):
            update(done, 10, f"hard/case-{done}")
    said = [r.getMessage().rsplit(",", 1)[0] for r in caplog.records]
    assert said == ["accuracy heldout: 3/10 (hard/case-3)", "accuracy heldout: 5/10 (hard/case-5)",
                    "accuracy heldout: 8/10 (hard/case-8)", "accuracy heldout: 10/10 (hard/case-10)"]
    assert all(r.getMessage().endswith(" s") for r in caplog.records)


def test_a_single_item_is_said_once():
    update = progress_bar(1, "performance")
    logger = logging.getLogger("evaluation.progress")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        update(1, 1, "b1")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert [r.getMessage().rsplit(",", 1)[0] for r in records] == ["performance: 1/1 (b1)"]
