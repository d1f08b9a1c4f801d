"""Run by test_realtime_source.py in a child process: a real-time query over a Delta table
on Spark's local-cluster master, its long-lived task in an executor JVM that reaches the
driver (and through it the brain) only by Spark's RPC. Prints one JSON line. With a second
argument ``cdf``: the table's change feed (a DELETE adds a cdc file)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import deltaflow
from tests.spark.test_realtime_source import FileSink, real_time, received


def main(root: str, feed: bool) -> None:
    source, out = f"{root}/src", Path(root, "out")
    out.mkdir()
    configuration = {"delta.enableChangeDataFeed": "true"} if feed else None
    write_deltalake(
        source, pa.table({"id": pa.array([0, 1, 2], pa.int64())}), configuration=configuration
    )
    spark = deltaflow.session(
        app_name="deltaflow-realtime-cluster-test",
        master="local-cluster[1,1,1024]",
        conf={
            "spark.executor.memory": "512m",
            "spark.sql.streaming.realTimeMode.minBatchDuration": "1000",
        },
    )
    try:
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
            .option("checkpointLocation", f"{root}/ck")
        )
        query = real_time(writer, "2 seconds").start()
        for i in range(3):  # commits by delta-rs in this (the driver's) process
            write_deltalake(source, pa.table({"id": pa.array([10 + i], pa.int64())}), mode="append")
        if feed:
            DeltaTable(source).delete("id = 0")
        expected = 7 if feed else 6
        deadline = time.monotonic() + 120
        while len(received(out)) < expected and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
        result = {
            "ids": received(out),
            "error": str(query.exception()) if query.exception() else None,
            "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
            "driver_pid": os.getpid(),
        }
        query.stop()
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["cdf"])
