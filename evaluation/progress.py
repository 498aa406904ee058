"""Progress of a long evaluation loop (accuracy cases, benchmark shapes), said where a
person sees it: a tqdm bar where bars are on, and log lines at each quarter and at the end,
which the command line (whose bars are off: ``TQDM_DISABLE``) and the flow run's log show."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


def progress_bar(total: int, desc: str) -> Callable[[int, int, str], None]:
    """A progress callback ``(done, total, label)``: a tqdm bar (off where ``TQDM_DISABLE``
    is set, as the command line sets it) and a log line at each quarter and at the end
    (``accuracy heldout: 8/31 (hard/gqa2), 25 s``), which the command line and the flow
    run's log show while a long evaluation runs."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, leave=False)
    started = time.monotonic()
    said = {0}

    def update(done: int, total: int, label: str) -> None:
        bar.set_postfix_str(label[-40:])
        bar.update(done - bar.n)
        quarter = 4 * done // max(total, 1)
        if quarter not in said:
            said.add(quarter)
            logger.info("%s: %d/%d (%s), %.0f s", desc, done, total, label,
                        time.monotonic() - started)
        if done == total:
            bar.close()

    return update
