"""Run by test_realtime_chaos.py: a real-time mode query into a Delta table, to be killed.

``<location> <checkpoint> <rows>``: feeds Spark's real-time memory source the ids
``0 .. rows-1`` in chunks of ``CHUNK`` (the same chunks on every run, so a restart replays
the killed run's epoch row for row), streams them into the table at ``location`` with
``trigger(realTime=...)``, prints ``ROWS <n>`` as rows land and ``DONE`` once all have.

``<location> <checkpoint> <rows> <source>``: the change data feed of the Delta table at
``source`` (from version 0; the test changes it while this runs) streamed in real-time
mode into the table at ``location``; ``ROWS``/``DONE`` as above (``rows`` is the number of
change rows to wait for).

``<location> <checkpoint> <rows> <source> dedup``: the rows of the Delta table at
``source`` (the test appends ids to it, some twice) through ``dropDuplicates(["id"])`` in
real-time mode (Spark >= 4.3, one shuffle partition) into the table at ``location``;
``ROWS``/``DONE`` as above (``rows``: distinct ids to wait for).

``<location> <checkpoint> <rows> <source> copy``: the rows of the Delta table at ``source``
(no ``startingVersion``: its snapshot when the query first starts, then its commits) in
real-time mode into the table at ``location``; ``ROWS``/``DONE`` as above.

``<location> <checkpoint> <rows> <downstream> rowlog``: the ids as in the first form, into
the table at ``location`` with a row log (``realTimeRowLog``), and a second real-time
query that reads that table (its row log, the union read of docs/notes/rowlog.md) into
the table at ``downstream``, with a row log too (checkpoint ``<checkpoint>-down``);
``ROWS``/``DONE`` count the downstream table's rows.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import DataFrame

import deltaflow

CHUNK = 10
_SOURCES = "org.apache.spark.sql.execution.streaming.sources"


def main(
    location: str, checkpoint: str, rows: int, source: str | None = None, mode: str = "cdf"
) -> None:
    conf = {"spark.sql.streaming.realTimeMode.allowlistCheck": "false"}
    if mode == "dedup":  # on local[2] the source task and the shuffle's reader run at once
        conf["spark.sql.shuffle.partitions"] = "1"
    spark = deltaflow.session(app_name="realtime-chaos", master="local[2]", conf=conf)
    jvm = spark._jvm
    row_log = mode == "rowlog"
    if source is None or row_log:
        spark.sql(f"CREATE TABLE IF NOT EXISTS rt (id INT) USING delta LOCATION '{location}'")
        # With a row log a second query runs beside this one: one task each on local[2].
        stream = getattr(jvm, f"{_SOURCES}.LowLatencyMemoryStream").apply(
            spark._jsparkSession, 1 if row_log else 2, jvm.org.apache.spark.sql.Encoders.INT()
        )
        frame = DataFrame(stream.toDF(), spark).selectExpr("value AS id")
        target = "rt"
    elif mode == "dedup":
        frame = spark.readStream.format("delta").load(source).dropDuplicates(["id"])
        target = f"delta.`{location}`"
    elif mode == "copy":
        frame = spark.readStream.format("delta").load(source)
        target = f"delta.`{location}`"
    else:
        frame = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(source)
        )
        target = f"delta.`{location}`"
    query = _start(frame, checkpoint, target, row_log, jvm)
    queries = [query]
    counted = location
    if row_log:
        assert source is not None
        spark.sql(f"CREATE TABLE IF NOT EXISTS down (id INT) USING delta LOCATION '{source}'")
        upstream = spark.readStream.format("delta").load(location)
        queries.append(_start(upstream, f"{checkpoint}-down", "down", row_log, jvm))
        counted = source
        source = None  # the ids come from the memory source
    seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
    landed = -1

    def report() -> int:
        nonlocal landed
        for q in queries:
            if q.exception() is not None:
                print(f"FAILED {q.exception()}", flush=True)
                sys.exit(1)
        try:
            n = DeltaTable(counted).to_pyarrow_table().num_rows
        except Exception:  # the table's first commit may not have landed yet
            n = 0
        if n != landed:
            landed = n
            print(f"ROWS {n}", flush=True)
        return n

    report()  # the query runs: ROWS 0 (or what earlier runs left) at once
    if source is None:
        for start in range(0, rows, CHUNK):
            stream.addData(seq(list(range(start, min(start + CHUNK, rows)))))
            time.sleep(0.05)
            report()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and report() < rows:
        time.sleep(0.05)
    for q in queries:
        q.stop()
    print("DONE", flush=True)


def _start(frame: DataFrame, checkpoint: str, target: str, row_log: bool, jvm: Any) -> Any:
    writer = (
        frame.writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .option("realTimeCommitIntervalMs", "20")
    )
    # test_realtime_rowlog_sink.py: the same kills with the sink's row log on.
    logged = "true" if row_log else os.environ.get("DELTAFLOW_TEST_ROW_LOG", "false")
    writer = writer.option("realTimeRowLog", logged)
    if "realTime" in inspect.signature(writer.trigger).parameters:
        writer = writer.trigger(realTime="5 minutes")
    else:  # PySpark 4.1 and 4.2 have the trigger only in Scala
        writer._jwrite = writer._jwrite.trigger(
            jvm.org.apache.spark.sql.streaming.Trigger.RealTime("5 minutes")
        )
    return writer.toTable(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6])
