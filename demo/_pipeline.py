"""Stage 2 of the demo: streaming jobs from bronze to silver to gold, while events arrive.

Three Structured Streaming queries, all Delta to Delta except the first:

- ``landing``: ``readStream.format("cloudFiles")`` over the landing folder -> bronze
  (the same table ``deltaflow serve`` appends to: both are blind appends, which never
  conflict).
- ``silver``: bronze -> silver. Drops rows that could not be parsed (``_rescued_data``) and
  GPS fixes outside the globe or at (0, 0), then drops re-uploaded events: the same
  ``event_id`` again within the watermark (``dropDuplicatesWithinWatermark``).
- ``gold``: silver -> gold. Events per minute, state and event type, with a watermark:
  a minute is written once (append mode) when the watermark passes its end, and never
  changes afterwards.

Checkpoints live under ``<data dir>/checkpoints``.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from demo._checks import DemoRunError
from demo._ingest import BRONZE_DDL_RESCUED

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

# Event time runs faster than wall time in the demo (the generator's trackers report once a
# second each; the feed sends several times that), so a one-minute watermark tolerates a
# few wall-clock seconds of lag between the two ingest paths.
WATERMARK = "1 minute"
WATERMARK_DELTA = dt.timedelta(minutes=1)
SILVER_CONDITION = (
    "_rescued_data IS NULL AND event_id IS NOT NULL AND event_time IS NOT NULL"
    " AND latitude BETWEEN -90 AND 90 AND longitude BETWEEN -180 AND 180"
    " AND NOT (latitude = 0 AND longitude = 0)"
)
FIRST_BATCH_TIMEOUT_S = 180.0
EVENT_COLUMNS = (
    "event_id", "device_id", "user_id", "state", "event_type", "latitude", "longitude",
    "heart_rate", "steps", "battery_pct", "event_time", "event_date",
)  # fmt: skip


@dataclass(frozen=True)
class PipelinePaths:
    """The tables are URIs (file:// or s3://). The landing folder and the stream checkpoints
    are on the object store too when Spark's Hadoop opens it (S3A on the class path), else
    local paths; Auto Loader's schema location (a SQLite seen-file store) is always local."""

    landing: Path | str
    bronze: str
    silver: str
    gold: str
    checkpoints: str
    schema_location: str

    @classmethod
    def under(cls, data_dir: Path, tables_root: str, spark: SparkSession) -> PipelinePaths:
        from deltaflow.spark._hadoop_fs import hadoop_uri

        on_store = None if tables_root.startswith("file:") else hadoop_uri(spark, tables_root)
        # Without S3A (the pyspark wheel has none) Spark cannot write checkpoints to s3://.
        return cls(
            landing=f"{tables_root}/landing/device_events"
            if on_store
            else data_dir / "landing" / "device_events",
            bronze=f"{tables_root}/bronze/live_events",
            silver=f"{tables_root}/silver/events",
            gold=f"{tables_root}/gold/events_per_minute",
            checkpoints=f"{on_store}/checkpoints" if on_store else str(data_dir / "checkpoints"),
            schema_location=str(data_dir / "checkpoints" / "landing_schema"),
        )

    @property
    def checkpoints_on_store(self) -> bool:
        return "://" in self.checkpoints


def silver_frame(spark: SparkSession, bronze: str) -> DataFrame:
    return (
        spark.readStream.format("delta")
        .load(bronze)
        .where(SILVER_CONDITION)
        .withWatermark("event_time", WATERMARK)
        .dropDuplicatesWithinWatermark(["event_id"])
        .select(*EVENT_COLUMNS)
    )


def gold_frame(spark: SparkSession, silver: str) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("delta")
        .load(silver)
        .withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", "1 minute"), "state", "event_type")
        .agg(F.count("*").alias("events"))
        .select(F.col("window.start").alias("minute"), "state", "event_type", "events")
    )


def start_queries(
    spark: SparkSession, paths: PipelinePaths, trigger_seconds: float
) -> dict[str, StreamingQuery]:
    """Start landing -> bronze, bronze -> silver and silver -> gold; returns them by name."""
    trigger = f"{int(trigger_seconds * 1000)} milliseconds"
    checkpoints = paths.checkpoints
    landing = (
        spark.readStream.format("cloudFiles")
        .schema(BRONZE_DDL_RESCUED)
        .option("cloudFiles.format", "json")
        .option("cloudFiles.schemaLocation", paths.schema_location)
        .load(str(paths.landing))
    )
    plans = (
        ("landing", landing, paths.bronze),
        ("silver", silver_frame(spark, paths.bronze), paths.silver),
        ("gold", gold_frame(spark, paths.silver), paths.gold),
    )
    queries: dict[str, StreamingQuery] = {}
    try:
        for name, frame, target in plans:
            queries[name] = _sink(frame, name, checkpoints, trigger).start(target)
            # One at a time: each start forks Python workers for planning, and on a busy
            # machine several at once can miss Spark's connect-back timeout.
            wait_for_first_batch(queries[name], name)
    except BaseException:
        for query in queries.values():
            query.stop()
        raise
    return queries


def wait_for_first_batch(query: StreamingQuery, name: str) -> None:
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while query.lastProgress is None:
        check_running({name: query})
        if time.monotonic() > deadline:
            raise DemoRunError(
                f"streaming query {name} did not finish a first batch in"
                f" {FIRST_BATCH_TIMEOUT_S:.0f}s"
            )
        query.awaitTermination(0.1)  # returns at once when the query stopped


def _sink(frame: DataFrame, name: str, checkpoints: str, trigger: str) -> Any:
    writer = (
        frame.writeStream.format("delta")
        .queryName(f"demo_{name}")
        .outputMode("append")
        .option("checkpointLocation", f"{checkpoints}/{name}")
        .trigger(processingTime=trigger)
    )
    if name != "gold":
        writer = writer.option("partitionBy", "event_date")
    return writer


def check_running(queries: dict[str, StreamingQuery]) -> None:
    for name, query in queries.items():
        error = query.exception()
        if error is not None:
            raise DemoRunError(f"streaming query {name} failed: {error}") from error


def drain_and_stop(queries: dict[str, StreamingQuery]) -> None:
    """Process everything that has arrived, upstream first, then stop every query."""
    try:
        for query in queries.values():
            query.processAllAvailable()
    finally:
        for query in queries.values():
            query.stop()


def dropped_by_watermark(progress: list[dict[str, Any]]) -> int:
    """Rows a query's stateful operator dropped as late (Spark's own count)."""
    return sum(
        int(op.get("numRowsDroppedByWatermark", 0))
        for p in progress
        for op in p.get("stateOperators") or []
    )


@dataclass(frozen=True)
class BatchFigures:
    batches: int
    rows: int
    rows_per_second: float  # rows over the summed batch durations
    p50_batch_ms: float
    max_batch_ms: float


def batch_figures(progress: list[dict[str, Any]]) -> BatchFigures:
    busy = [p for p in progress if p.get("numInputRows", 0) > 0]
    durations = sorted(float(p["durationMs"]["triggerExecution"]) for p in busy)
    rows = sum(int(p["numInputRows"]) for p in busy)
    total_s = sum(durations) / 1000
    return BatchFigures(
        batches=len(busy),
        rows=rows,
        rows_per_second=rows / total_s if total_s else 0.0,
        p50_batch_ms=durations[len(durations) // 2] if durations else 0.0,
        max_batch_ms=durations[-1] if durations else 0.0,
    )


def commit_latencies_ms(progress: list[dict[str, Any]], source_uri: str) -> list[float]:
    """For each source commit a query read: from that commit to the batch that finished it.

    The batch's end is its trigger timestamp plus its duration.
    """
    import deltalake

    committed_at = {
        int(entry["version"]): int(entry["timestamp"]) / 1000
        for entry in deltalake.DeltaTable(source_uri).history()
    }
    latencies: list[float] = []
    done = -1
    for p in progress:
        end = _offset(p)
        if end is None:
            continue
        version, _ = end
        complete = version - 1  # (v, -1): all below v; (v, i >= 0): v is not finished
        finished = _epoch(p["timestamp"]) + float(p["durationMs"]["triggerExecution"]) / 1000
        for v in range(done + 1, complete + 1):
            if v in committed_at and finished >= committed_at[v] and v > 0:
                latencies.append((finished - committed_at[v]) * 1000)
        done = max(done, complete)
    return latencies


def _offset(progress: dict[str, Any]) -> tuple[int, int] | None:
    import json

    sources = progress.get("sources") or []
    if not sources or not sources[0].get("endOffset"):
        return None
    end = sources[0]["endOffset"]
    if isinstance(end, str):
        end = json.loads(end)
    return int(end["reservoirVersion"]), int(end["index"])


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# ---- independent expectations (plain Arrow over what the feed sent) -------------------


def expected_silver(sent: pa.Table) -> pa.Table:
    """Valid GPS, one row per event id (re-uploads repeat ids; sent holds each event once)."""
    lat, lon = sent["latitude"], sent["longitude"]
    valid = pc.and_(
        pc.and_(
            pc.and_(pc.greater_equal(lat, -90.0), pc.less_equal(lat, 90.0)),
            pc.and_(pc.greater_equal(lon, -180.0), pc.less_equal(lon, 180.0)),
        ),
        pc.invert(pc.and_(pc.equal(lat, 0.0), pc.equal(lon, 0.0))),
    )
    return sent.filter(valid)


def minute_counts(events: pa.Table) -> dict[tuple[dt.datetime, str, str], int]:
    minutes = pc.floor_temporal(events["event_time"], unit="minute")
    grouped = (
        pa.table({"minute": minutes, "state": events["state"], "event_type": events["event_type"]})
        .group_by(["minute", "state", "event_type"])
        .aggregate([([], "count_all")])
    )
    return {
        (row["minute"], row["state"], row["event_type"]): int(row["count_all"])
        for row in grouped.to_pylist()
    }
