"""Run by test_chaos.py: the streaming job that gets killed, and the appender that gets killed.

``stream <source> <silver> <gold> <ck_silver> <ck_gold> <loop|once>`` runs two queries
from one Delta source: silver (filter + projection, append) and gold (counts per key,
complete mode). ``loop`` triggers every 500 ms until killed and prints
``PROGRESS <query> <batchId> <rows>`` whenever a query finishes a batch; ``once`` runs
both with availableNow, one after the other, and prints DONE.

``windows <source> <sink> <checkpoint>`` runs one stateful query (test_standalone_chaos.py,
state on S3A): an event-time windowed count per key (``WINDOW`` tumbling windows of
``event_time``, watermark ``WATERMARK`` behind, append mode) with the RocksDB state store
and the checkpoint format ``STATE_CONF`` names; it loops and prints as ``stream loop`` does.

``append <path> <first_batch> <batches> <rows>`` appends ``batches`` tagged writes through
``df.write.format("delta")``, printing ``COMMITTED <batch>`` after each returns.

The transform and the aggregation are defined here and mirrored in plain Python by the test.
``DELTAFLOW_JOB_CONF`` (JSON Spark settings, ``spark.master`` included) adds to or overrides
the local defaults: test_standalone_chaos.py runs the stream job on a standalone cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from pyspark.errors import StreamingQueryException

import deltaflow

SILVER_FILTER = "value % 3 <> 0"
KEYS = 7
WINDOW_SECONDS = 30  # 40 events a commit, a second apart: windows straddle commits
WINDOW = f"{WINDOW_SECONDS} seconds"
WATERMARK = "10 seconds"
# docs/notes/s3a-next.md 4.C: RocksDB state, changelog checkpointing, checkpoint format 2
# (unique state file names per attempt: a zombie task cannot overwrite a batch's state).
STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
}


def silver_frame(spark: Any, source: str) -> Any:
    return (
        spark.readStream.format("delta")
        .load(source)
        .where(SILVER_FILTER)
        .selectExpr("event_id", "key", "value * 2 AS doubled")
    )


def gold_frame(spark: Any, source: str) -> Any:
    return spark.readStream.format("delta").load(source).groupBy("key").count()


def windows_frame(spark: Any, source: str) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("delta")
        .load(source)
        .withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", WINDOW), "key")
        .count()
        .selectExpr("window.start AS window_start", "key", "count")
    )


def run_windows(source: str, sink: str, checkpoint: str) -> None:
    spark = job_session(
        "chaos-windows",
        {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", **STATE_CONF},
    )
    query = (
        windows_frame(spark, source)
        .writeStream.format("delta")
        .queryName("windows")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start(sink)
    )
    print("STARTED", flush=True)
    report_until_killed(spark, [("windows", query)])


def run_stream(
    source: str, silver: str, gold: str, ck_silver: str, ck_gold: str, mode: str
) -> None:
    spark = job_session(
        "chaos-stream", {"spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "false"}
    )
    queries = []
    for name, frame, out_mode, checkpoint, target in (
        ("silver", silver_frame(spark, source), "append", ck_silver, silver),
        ("gold", gold_frame(spark, source), "complete", ck_gold, gold),
    ):
        if mode == "once" and queries:
            # The catch-up runs the queries one after the other, the loop starts them
            # together. (Starting two at once used to fail 1 run in 3 with
            # java.io.OptionalDataException; deltaflow.register() now prevents the race,
            # see _settle_worker_env in deltaflow/_session.py.)
            _await(queries[-1][1])
        writer = (
            frame.writeStream.format("delta")
            .queryName(name)
            .outputMode(out_mode)
            .option("checkpointLocation", checkpoint)
        )
        if mode == "once":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime="500 milliseconds")
        queries.append((name, writer.start(target)))
    print("STARTED", flush=True)
    if mode == "once":
        _await(queries[-1][1])
        print("DONE", flush=True)
        spark.stop()
        return
    report_until_killed(spark, queries)


def report_until_killed(spark: Any, queries: list[tuple[str, Any]]) -> None:
    """Print ``PROGRESS <query> <batchId> <rows>`` per finished batch, ``FAILED ...`` and
    exit 1 when a query fails; runs until the test kills the process."""
    seen: dict[str, int] = {}
    while True:  # killed by the test
        for name, query in queries:
            if query.exception() is not None:
                error = query.exception()
                typed = deltaflow.typed_error(error)
                kind = type(typed).__name__ if typed is not None else "untyped"
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                print(f"FAILED {name} {kind} {first_line}", flush=True)
                print(f"query {name} failed: {error}", file=sys.stderr, flush=True)
                sys.exit(1)
            progress = query.lastProgress
            if progress and progress["batchId"] != seen.get(name):
                seen[name] = progress["batchId"]
                print(
                    f"PROGRESS {name} {progress['batchId']} {progress['numInputRows']}", flush=True
                )
        # Wakes at once when a query fails; the loop's next pass reports it (FAILED ...).
        with contextlib.suppress(StreamingQueryException):
            spark.streams.awaitAnyTermination(0.05)


def job_session(app_name: str, defaults: dict[str, str]) -> Any:
    conf = {**defaults, **json.loads(os.environ.get("DELTAFLOW_JOB_CONF", "{}"))}
    master = conf.pop("spark.master", "local[1]")
    return deltaflow.session(app_name=app_name, master=master, conf=conf)


def _await(query: Any) -> None:
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()


def run_append(path: str, first_batch: int, batches: int, rows: int) -> None:
    from pyspark.sql import functions as F

    spark = deltaflow.session(app_name="chaos-append", master="local[1]")
    print("STARTED", flush=True)
    for batch in range(first_batch, first_batch + batches):
        df = spark.range(rows, numPartitions=2).select(
            F.lit(batch).alias("batch"), F.col("id").alias("row")
        )
        df.write.format("delta").mode("append").save(path)
        print(f"COMMITTED {batch}", flush=True)
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        run_stream(*sys.argv[2:8])
    elif sys.argv[1] == "windows":
        run_windows(*sys.argv[2:5])
    else:
        run_append(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
