"""How the suite's files are spread over the two test processes, and what each cost.

``pytest -n 2 --dist loadfile`` hands whole files to the processes one at a time as each
process frees up. By default xdist first sorts the files by how many tests they hold, most
first, which hands the chaos, cluster and demo files (one to three long tests each) out
last: a ten-minute file handed out last leaves the other process idle for ten minutes.
``--no-loadscope-reorder`` (the Makefile and ``tests/spark_versions.py`` pass it) keeps the
collection order instead, which this module sets: handing out the longest files first (the
classic longest-first rule) bounds that tail by the shortest files instead.
:data:`LONGEST_FIRST` is the measured order; a file not named keeps its place after them.
The end-of-run table (per file: seconds and process; per process: when it went idle) is
what to update the list from.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest

# Files by their cost in CI (seconds of one process, most first), from the per-file table
# this module prints at the end of a run. Keep the long ones; order matters only roughly.
LONGEST_FIRST = (
    "tests/spark/test_standalone_chaos.py",
    "tests/dbt/test_dbt.py",
    "tests/reference/test_interop.py",
    "tests/spark/test_chaos.py",
    "tests/test_demo_s3.py",
    "tests/spark/test_catalog_persistence.py",
    "tests/spark/test_realtime_chaos.py",
    "tests/pipelines/test_pipeline_chaos.py",
    "tests/ingest/test_cloudfiles_chaos.py",
    "tests/spark/test_s3a_checkpoints.py",
    "tests/spark/test_standalone.py",
    "tests/spark/test_hosts.py",
    "tests/spark/test_server_dml_sql.py",
    "tests/pipelines/test_spark_pipelines.py",
    "tests/spark/test_s3a.py",
    "tests/pipelines/test_pipelines_s3a.py",
    "tests/spark/test_sql_server_auth.py",
    "tests/reference/test_deltaspark_suite.py",
)


def order_longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the files of :data:`LONGEST_FIRST` first, in its order;
    within a file and for every other file, the collected order is kept."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    unranked = len(rank)
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(
        key=lambda item: (rank.get(item.nodeid.split("::", 1)[0], unranked), position[id(item)])
    )


class FileCosts:
    """Per file: seconds spent (setup + call + teardown) and the process that ran it; per
    process: seconds from the session's start until its last report."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.process: dict[str, str] = {}
        self.last_report: dict[str, float] = {}

    def add(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        node: Any = getattr(report, "node", None)
        process = str(getattr(getattr(node, "gateway", None), "id", "main"))
        self.seconds[path] += report.duration
        self.process[path] = process
        self.last_report[process] = time.monotonic() - self.started

    def lines(self, top: int = 30) -> list[str]:
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:top]
        out = [f"{seconds:8.1f} s  {self.process[path]:>4}  {path}" for path, seconds in ranked]
        out.append(
            "idle from (s after start): "
            + ", ".join(f"{p} {t:.0f}" for p, t in sorted(self.last_report.items()))
        )
        return out
