"""The order in which ``make test`` hands modules to its two workers.

``make test`` runs ``--dist loadfile --no-loadscope-reorder``: whole modules go to the
two workers in collection order, each worker asking for the next when it is nearly done.
xdist's default order (most tests first) started the slowest modules last, so a run ended
with one worker deep in test_attacks.py (a pristine store of five rollouts, then an audit
per attack) and the other idle. Here:

- ``SLOWEST_FIRST`` go first, longest first (set-up + calls per module from
  ``--durations``, 2026-12-01);
- test_attacks.py's attacks of the kinds in ``SECOND_PART`` form a unit of their own
  (``SplitLoadFileScheduling``), handed out after test_flows_rollout.py, so the other
  worker replays them while the first replays the rest. Both use the one pristine store
  (``tests.shared_builds``: built once per run; the second part's worker reaches it after
  test_flows_rollout.py, by when it is built, or waits on its lock).

Every other module and the order of the tests inside a module are unchanged.
"""

from __future__ import annotations

import re

from xdist.scheduler import LoadFileScheduling

SLOWEST_FIRST = ("test_attacks.py", "test_flows_rollout.py")
SECOND_PART = {"tests/test_attacks.py": re.compile(r"\[kind(9|1[0-7])-")}
"""Per module: the node ids (a pattern) that run as a separate unit of work."""
SECOND_PART_AFTER = "test_flows_rollout.py"
"""The second parts are handed out after this module."""


def second_part(nodeid: str) -> bool:
    """Whether the test ``nodeid`` belongs to its module's second unit of work."""
    module = nodeid.split("::", 1)[0]
    pattern = SECOND_PART.get(module)
    return pattern is not None and pattern.search(nodeid) is not None


def order(items: list) -> None:
    """Sort collected ``items`` in place: ``SLOWEST_FIRST`` modules first (in that order),
    the second parts right after ``SECOND_PART_AFTER``, everything else as collected (a
    stable sort)."""
    rank = {name: 2 * i for i, name in enumerate(SLOWEST_FIRST)}
    after = rank.get(SECOND_PART_AFTER, 2 * len(rank))
    last = 2 * len(rank) + 2

    def key(item) -> int:
        if second_part(item.nodeid):
            return after + 1
        return rank.get(item.path.name, last)

    items.sort(key=key)


class SplitLoadFileScheduling(LoadFileScheduling):
    """``--dist loadfile``, except that a module's ``SECOND_PART`` is a unit of its own."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return f"{scope}#second-part" if second_part(nodeid) else scope
