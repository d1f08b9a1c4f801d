"""Run by test_realtime_sink.py in a child process: a real-time query into Delta on
``local[2,2]``, where Spark gives a task two attempts (``local[N]`` gives one), so a task
failure mid-epoch is retried inside the epoch's job, against the same driver endpoint.
Prints one JSON line with the result.

Modes: ``retry``, a task fails mid-epoch and its retry reads on (the query goes on);
``short``, a task fails only after the epoch's deadline, so its retry starts past it and
reads no row: the epoch would end before the rows the table already holds for it."""

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
    real_time,
    start,
)

# The short mode's epoch, and how long row 25 holds its task before failing: longer than
# the epoch, so the deadline (fixed once for every attempt) passes first.
SHORT_EPOCH = "5 seconds"
SHORT_HOLD_MS = 7000


def retry(spark: Any, root: str) -> dict[str, Any]:
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


def _short_query(frame: Any, name: str, checkpoint: str) -> Any:
    writer = frame.writeStream.format("delta").outputMode("update")
    writer = writer.option("checkpointLocation", checkpoint)
    return real_time(writer, SHORT_EPOCH).toTable(name)


def _two_epochs_done(query: Any) -> bool:
    return not query.isActive or len(query.recentProgress) >= 2


def short(spark: Any, root: str) -> dict[str, Any]:
    name, location = new_table(spark)
    marker = "deltaflow.test.realtime.short"
    source = MemoryStream(spark)
    frame = source.frame().selectExpr(
        f"CASE WHEN id = 25 AND reflect('java.lang.System', 'setProperty', '{marker}', 'x')"
        f" = 'null' AND reflect('java.lang.Thread', 'sleep', CAST({SHORT_HOLD_MS} AS BIGINT))"
        " = 'null' THEN CAST(raise_error('injected failure past the deadline') AS INT)"
        " ELSE id END AS id"
    )
    checkpoint = f"{root}/ck-short"
    query = _short_query(frame, name, checkpoint)
    try:
        source.add(list(range(20)))
        wait_until(lambda: len(ids(location)) >= 20 or not query.isActive, 120, "20 rows")
        source.add(list(range(20, 40)))
        # Two epochs: the one the failure spans, and the next, which would read again
        # whatever the first ended before.
        wait_until(lambda: _two_epochs_done(query), 120, "two epochs or the query's end")
        error = query.exception()
        typed = deltaflow.typed_error(error) if error else None
    finally:
        query.stop()
    restarted = None
    if error is not None:  # the restart replays the epoch from the checkpoint
        restarted = _short_query(frame, name, checkpoint)
        try:
            wait_until(lambda: _two_epochs_done(restarted), 120, "two epochs after the restart")
            assert restarted.exception() is None, restarted.exception()
        finally:
            restarted.stop()
    return {
        "ids": ids(location),
        "error": str(error) if error else None,
        "typed": type(typed).__name__ if typed else None,
        "fields": dict(typed._fields) if typed else None,
        "failed": spark._jvm.java.lang.System.getProperty(marker) == "x",
    }


def main(root: str, mode: str) -> None:
    spark = deltaflow.session(
        app_name="deltaflow-realtime-retry-test",
        master="local[2,2]",  # two attempts per task
        conf={ALLOWLIST: "false", "spark.sql.warehouse.dir": f"{root}/warehouse"},
    )
    try:
        result = short(spark, root) if mode == "short" else retry(spark, root)
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "retry")
