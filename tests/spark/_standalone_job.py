"""Run by test_standalone.py as its own driver process against a standalone cluster.

``python _standalone_job.py <base> <checkpoints> [parts]``: the Spark settings come from the
environment variable ``DELTAFLOW_JOB_CONF`` (JSON; ``spark.master`` included), tables go
under ``<base>`` (a local directory or an ``s3://`` prefix), stream checkpoints under the
local directory ``<checkpoints>``. It writes and reads a partitioned table, runs
UPDATE / DELETE / MERGE through ``DeltaTable``, and streams one Delta table into another
with ``availableNow`` (three runs from one checkpoint), then prints one ``RESULT <json>``
line with what it saw. ``parts`` (comma-separated, default ``batch,dml,stream``) picks
which of the three run; ``dml`` needs ``batch``. The test checks the figures against its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import deltaflow

ROWS = 20000
APPENDED = 100  # ids 0..99 once more
STREAM_FIRST, STREAM_MORE = 1000, 500


def job_session(app_name: str) -> Any:
    conf = json.loads(os.environ.get("DELTAFLOW_JOB_CONF", "{}"))
    master = conf.pop("spark.master", "local[1]")
    return deltaflow.session(app_name=app_name, master=master, conf=conf)


def executors_view(spark: Any) -> dict[str, Any]:
    """Which processes ran tasks, and which deltaflow their Python workers import."""

    def probe(_: Any) -> list[tuple[int, str]]:
        import deltaflow as on_executor  # the wheel installed on the node

        return [(os.getpid(), os.path.dirname(on_executor.__file__))]

    seen = spark.sparkContext.parallelize(range(8), 8).mapPartitions(probe).collect()
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    return {
        "python_pids": sorted({pid for pid, _ in seen}),
        "deltaflow_dirs": sorted({path for _, path in seen}),
        "driver_pid": os.getpid(),
        # Block managers: the driver's plus one per executor JVM.
        "block_managers": status.size(),
    }


def batch(spark: Any, table: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = spark.range(0, ROWS, numPartitions=4).select(
        F.col("id"),
        (F.col("id") % 5).cast("string").alias("bucket"),
        (F.col("id") * 0.5).alias("v"),
    )
    started = time.monotonic()
    df.write.format("delta").partitionBy("bucket").save(table)
    df.where(f"id < {APPENDED}").write.format("delta").mode("append").save(table)
    back = spark.read.format("delta").load(table)
    return {
        "count": back.count(),
        "sum": back.agg(F.sum("id")).first()[0],
        "bucket_2": back.where("bucket = '2'").count(),
        "seconds": time.monotonic() - started,
    }


def dml(spark: Any, table: str) -> dict[str, Any]:
    """UPDATE, DELETE and MERGE on the table ``batch`` wrote; the rows after all three."""
    from deltaflow.tables import DeltaTable

    started = time.monotonic()
    target = DeltaTable.forPath(spark, table)
    target.update("id >= 100 AND id < 110", {"v": "-1.0"})
    target.delete("id >= 19000")
    source = spark.range(18990, 19010).selectExpr(
        "id", "CAST(id % 5 AS STRING) AS bucket", "CAST(id AS DOUBLE) AS v"
    )
    (
        target.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdate(set={"v": "s.v + 1000"})
        .whenNotMatchedInsertAll()
        .execute()
    )
    rows = spark.read.format("delta").load(table).select("id", "bucket", "v").collect()
    return {
        "rows": sorted([r.id, r.bucket, r.v] for r in rows),
        "operations": [r.operation for r in target.history().orderBy("version").collect()],
        "seconds": time.monotonic() - started,
    }


def stream(spark: Any, source: str, sink: str, checkpoint: str) -> dict[str, Any]:
    """A Delta -> Delta stream run to completion twice from one checkpoint, with new
    source rows between the runs: each source row must reach the sink once."""
    from pyspark.sql import functions as F

    def rows(first: int, count: int) -> Any:
        return spark.range(first, first + count, numPartitions=2).select(
            F.col("id"), (F.col("id") % 7).alias("k")
        )

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .where("k <> 3")
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(sink)
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise query.exception()

    started = time.monotonic()
    rows(0, STREAM_FIRST).write.format("delta").save(source)
    run()
    rows(STREAM_FIRST, STREAM_MORE).write.format("delta").mode("append").save(source)
    run()  # restarted from the checkpoint: only the new rows
    run()  # nothing new: nothing written
    ids = [r.id for r in spark.read.format("delta").load(sink).select("id").collect()]
    return {"sink_ids": sorted(ids), "seconds": time.monotonic() - started}


def main(base: str, checkpoints: str, parts: str = "batch,dml,stream") -> None:
    started = time.monotonic()
    spark = job_session("deltaflow-standalone-test")
    result: dict[str, Any] = {"session_seconds": time.monotonic() - started}
    try:
        result["executors"] = executors_view(spark)
        if "batch" in parts:
            result["batch"] = batch(spark, f"{base}/events")
        if "dml" in parts:
            result["dml"] = dml(spark, f"{base}/events")
        if "stream" in parts:
            result["stream"] = stream(
                spark, f"{base}/stream_src", f"{base}/stream_dst", f"{checkpoints}/stream"
            )
        result["app_id"] = spark.sparkContext.applicationId
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
