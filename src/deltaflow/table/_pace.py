"""A background worker's pace per table: its next run no sooner than a multiple of its
last run's duration after that run ended.

The brain's background work on a table (log upkeep: checkpoint and cleanup; auto
compaction) loads the table with delta-rs, and on a local disk every such load walks the
whole ``_delta_log`` directory: about 7 µs a file on this project's machines
(``docs/benchmarks.md``, "A long-running real-time sink's log"). A real-time sink commits
12-20 times a second and the log keeps 30 days of commits by default, so after a few
hours each load takes seconds while the work falls due several times a second: unpaced,
the work would hold a core for good and the stream's latency would double. Paced, each
kind of work takes at most about ``1 / (factor + 1)`` of a core per table, and runs less
often (it always runs the newest request) rather than never; when it is cheap (a small
log) the pace is a few milliseconds and changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

# A table's next run waits this many times its last run's duration: at most about a
# tenth of a core per table and kind of work.
FACTOR = 9.0


class Pace:
    """When each table's next background run may start (``time.monotonic()`` seconds).
    Not thread-safe: its worker calls it under the worker's own lock."""

    # Entries kept before those whose pace has passed are forgotten.
    MAX_TABLES = 256

    def __init__(self, factor: float = FACTOR) -> None:
        self.factor = factor
        self._not_before: dict[str, float] = {}

    def ran(self, table_uri: str, started: float, ended: float) -> None:
        """A run on ``table_uri`` took from ``started`` to ``ended`` (monotonic)."""
        self._not_before[table_uri] = ended + self.factor * max(ended - started, 0.0)
        if len(self._not_before) > self.MAX_TABLES:
            for key in [k for k, t in self._not_before.items() if t <= ended]:
                del self._not_before[key]

    def first_ready(self, waiting: Iterable[str], hurry: bool = False) -> tuple[str | None, float]:
        """The first of ``waiting`` that may run now (all of them when ``hurry``: a
        flush), or None and the seconds until one may."""
        now = time.monotonic()
        soonest = float("inf")
        for table_uri in waiting:
            allowed = self._not_before.get(table_uri, 0.0)
            if hurry or allowed <= now:
                return table_uri, 0.0
            soonest = min(soonest, allowed - now)
        return None, soonest

    def next_ready(
        self,
        changed: threading.Condition,
        waiting: Mapping[str, object],
        hurry: Callable[[], bool],
        idle_seconds: float,
    ) -> str | None:
        """With ``changed`` held: wait until a table of ``waiting`` may run (its pace
        passed, or ``hurry()``) and return it; None when nothing waited for
        ``idle_seconds`` (the worker's thread then ends)."""
        while True:
            if not waiting:
                if not changed.wait(idle_seconds) and not waiting:
                    return None
                continue
            table_uri, wait = self.first_ready(waiting, hurry())
            if table_uri is not None:
                return table_uri
            changed.wait(wait)
