"""Run by test_realtime_sink.py in a child process: a real-time query into Delta on
``local[2,2]``, where Spark gives a task two attempts (``local[N]`` gives one), so a task
failure mid-epoch is retried inside the epoch's job, against the same driver endpoint,
without the query ending. Prints one JSON line with the result."""

from __future__ import annotations

import json
import sys
from typing import Any

import deltaflow
from tests._waiting import wait_until
from tests.spark.test_realtime_sink import (
    ALLOWLIST,
    MemoryStream,
    failing_at_25,
    ids,
    new_table,
    start,
)


def run(spark: Any, root: str) -> dict[str, Any]:
    name, location = new_table(spark)
    marker = "deltaflow.test.realtime.retried"
    source = MemoryStream(spark)
    query = start(failing_at_25(source.frame(), marker), name, f"{root}/ck")
    try:
        source.add(list(range(20)))
        wait_until(lambda: len(ids(location)) >= 20 or not query.isActive, 120, "20 rows")
        source.add(list(range(20, 40)))
        wait_until(lambda: len(ids(location)) >= 40 or not query.isActive, 120, "40 rows")
        return {
            "ids": ids(location),
            "active": query.isActive,
            "error": str(query.exception()) if query.exception() else None,
            "failed": spark._jvm.java.lang.System.getProperty(marker) == "x",
        }
    finally:
        query.stop()


def main(root: str) -> None:
    spark = deltaflow.session(
        app_name="deltaflow-realtime-retry-test",
        master="local[2,2]",  # two attempts per task
        conf={ALLOWLIST: "false", "spark.sql.warehouse.dir": f"{root}/warehouse"},
    )
    try:
        print("RESULT " + json.dumps(run(spark, root)), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
