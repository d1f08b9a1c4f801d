"""Run by test_realtime_source.py in a child process: a real-time query over a Delta table
on Spark's local-cluster master, its long-lived task in an executor JVM that reaches the
driver (and through it the brain) only by Spark's RPC. Two queries, one after the other in
one session (one executor start for both): the rows of a table, then a table's change feed
(a DELETE adds a cdc file). Prints one JSON line with a result per query."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import deltaflow
from tests.spark.test_realtime_source import FileSink, real_time, received


def run(spark: Any, root: str, feed: bool) -> dict[str, Any]:
    name = "cdf" if feed else "rows"
    source, out = f"{root}/{name}_src", Path(root, f"{name}_out")
    out.mkdir()
    configuration = {"delta.enableChangeDataFeed": "true"} if feed else None
    write_deltalake(
        source, pa.table({"id": pa.array([0, 1, 2], pa.int64())}), configuration=configuration
    )
    reader = spark.readStream.format("delta")
    if feed:  # every change from version 0 (the commits below may precede the first
        # epoch, which pins a fresh query's snapshot); the timestamp left out
        reader = reader.option("readChangeFeed", "true").option("startingVersion", "0")
    frame = reader.load(source)
    if feed:
        frame = frame.select("id", "_change_type", "_commit_version")
    writer = (
        frame.writeStream.foreach(FileSink(str(out)))
        .outputMode("update")
        .option("checkpointLocation", f"{root}/{name}_ck")
    )
    query = real_time(writer, "2 seconds").start()
    try:
        for i in range(3):  # commits by delta-rs in this (the driver's) process
            write_deltalake(source, pa.table({"id": pa.array([10 + i], pa.int64())}), mode="append")
        if feed:
            DeltaTable(source).delete("id = 0")
        expected = 7 if feed else 6
        deadline = time.monotonic() + 120
        while len(received(out)) < expected and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
        return {
            "ids": received(out),
            "error": str(query.exception()) if query.exception() else None,
            "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
        }
    finally:
        query.stop()


def main(root: str) -> None:
    spark = deltaflow.session(
        app_name="deltaflow-realtime-cluster-test",
        master="local-cluster[1,1,1024]",
        conf={
            "spark.executor.memory": "512m",
            "spark.sql.streaming.realTimeMode.minBatchDuration": "1000",
        },
    )
    try:
        # The executor has one core: the long-lived task of one query at a time.
        result = {name: run(spark, root, feed) for name, feed in (("rows", False), ("cdf", True))}
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
