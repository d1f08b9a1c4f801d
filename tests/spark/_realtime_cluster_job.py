"""Run by test_realtime_source.py in a child process: a real-time query over a Delta table
on Spark's local-cluster master, its long-lived task in an executor JVM that reaches the
driver (and through it the brain) only by Spark's RPC. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

import deltaflow
from tests.spark.test_realtime_source import FileSink, real_time, received


def main(root: str) -> None:
    source, out = f"{root}/src", Path(root, "out")
    out.mkdir()
    write_deltalake(source, pa.table({"id": pa.array([0, 1, 2], pa.int64())}))
    spark = deltaflow.session(
        app_name="deltaflow-realtime-cluster-test",
        master="local-cluster[1,1,1024]",
        conf={
            "spark.executor.memory": "512m",
            "spark.sql.streaming.realTimeMode.minBatchDuration": "1000",
        },
    )
    try:
        writer = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.foreach(FileSink(str(out)))
            .outputMode("update")
            .option("checkpointLocation", f"{root}/ck")
        )
        query = real_time(writer, "2 seconds").start()
        for i in range(3):  # commits by delta-rs in this (the driver's) process
            write_deltalake(source, pa.table({"id": pa.array([10 + i], pa.int64())}), mode="append")
        deadline = time.monotonic() + 120
        while len(received(out)) < 6 and time.monotonic() < deadline and query.isActive:
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
    main(sys.argv[1])
