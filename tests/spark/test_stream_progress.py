"""Per-batch progress of Delta streams: the listener's records against the sink's log."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow

TIMEOUT_S = 120.0


def append(path: str, start: int, n: int) -> None:
    table = pa.table({"id": list(range(start, start + n)), "s": ["x"] * n})
    write_deltalake(path, table, mode="append")


def commit_info(path: str, version: int) -> dict[str, Any]:
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    for line in text.splitlines():
        if '"commitInfo"' in line:
            return dict(json.loads(line)["commitInfo"])
    return {}


def commit_adds(path: str, version: int) -> list[dict[str, Any]]:
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line)["add"] for line in text.splitlines() if '"add"' in line]


@pytest.fixture
def progress(spark: Any) -> Any:
    listener = deltaflow.track_progress(spark)
    yield listener
    spark.streams.removeListener(listener)


def test_batches_report_what_the_sink_log_says(spark, table_path, progress, caplog) -> None:
    source, sink, checkpoint = table_path("src"), table_path("dst"), table_path("chk")
    append(source, 0, 10)
    append(source, 10, 5)
    caplog.set_level(logging.INFO, logger="deltaflow.stream")
    query = (
        spark.readStream.format("delta")
        .load(source)
        .selectExpr("id", "upper(s) AS s")
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start(sink)
    )
    try:
        progress.wait_until(query, lambda batches: len(batches) >= 1, TIMEOUT_S)  # snapshot
        started = time.time() * 1000
        append(source, 100, 7)  # version 2
        progress.wait_until(  # the batch of version 2
            query, lambda batches: any(b.num_output_rows == 7 for b in batches), TIMEOUT_S
        )
    finally:
        query.stop()

    records = [b for b in progress.batches(query) if b.sink_version is not None]
    assert [b.num_output_rows for b in records] == [15, 7]
    first, second = records
    for record in records:
        info = commit_info(sink, record.sink_version)
        adds = commit_adds(sink, record.sink_version)
        assert info["deltaflow.stream"] == {
            "queryId": str(query.id),
            "batchId": record.batch_id,
            "outputMode": "Append",
        }
        assert record.num_files == len(adds) >= 1
        assert record.num_bytes == sum(a["size"] for a in adds)
        assert record.num_output_rows == sum(json.loads(a["stats"])["numRecords"] for a in adds)
        assert record.num_input_rows == record.num_output_rows
        assert record.sink_commit_ms == info["timestamp"]
        assert record.sink_uri is not None and record.sink_uri.endswith("dst_1")
        assert record.duration_ms > 0 and "addBatch" in record.durations_ms
    # The snapshot batch read version 1 (the table as the query started).
    assert [(s.first_version, s.last_version) for s in first.sources] == [(1, 1)]
    (read,) = second.sources
    assert (read.first_version, read.last_version) == (2, 2)
    assert read.table_uri is not None and read.table_uri.endswith("src_0")
    assert read.last_commit_ms == commit_info(source, 2)["timestamp"]
    assert second.latency_ms == second.sink_commit_ms - read.first_commit_ms
    # Appended after `started`, committed downstream before the query stopped.
    assert 0 <= second.latency_ms <= time.time() * 1000 - started
    assert any(
        f"batch {second.batch_id}: 7 rows read" in r.getMessage() and "latency" in r.getMessage()
        for r in caplog.records
    )
    assert DeltaTable(sink).version() == second.sink_version


def test_a_stopped_query_still_gets_its_records(spark, table_path, progress) -> None:
    source, sink, checkpoint = table_path("src"), table_path("dst"), table_path("chk")
    append(source, 0, 4)
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(sink)
    )
    query.awaitTermination(TIMEOUT_S)
    # The listener bus may deliver the event after termination: wait for it.
    progress.wait_until(query, lambda batches: len(batches) >= 1, TIMEOUT_S)
    (record,) = progress.batches(query)
    assert (record.num_output_rows, record.num_files) == (4, 1)
    assert record.sink_version == 0
    assert record.latency_ms is not None and record.latency_ms >= 0


@pytest.mark.parametrize("native", ["auto", "false"], ids=["jvm_sink", "python_writer"])
def test_a_stream_writing_under_another_identity_is_still_tracked(
    spark, table_path, progress, native: str
) -> None:
    """A pipeline flow's sink keys its app transaction by the flow's identity, not the
    query id; the commit still names the query, so its batches are paired with their
    commits (delta-spark's operationParameters.queryId is the query's id too)."""
    from deltaflow.spark.stream._writer import FLOW_IDENTITY_OPTION

    source, sink, checkpoint = table_path("src"), table_path("dst"), table_path("chk")
    append(source, 0, 6)
    before = spark.conf.get("deltaflow.write.nativeWrite", None)
    spark.conf.set("deltaflow.write.nativeWrite", native)
    try:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .option(FLOW_IDENTITY_OPTION, "flow-identity-1")
            .trigger(availableNow=True)
            .start(sink)
        )
        query.awaitTermination(TIMEOUT_S)
    finally:
        if before is None:
            spark.conf.unset("deltaflow.write.nativeWrite")
        else:
            spark.conf.set("deltaflow.write.nativeWrite", before)
    progress.wait_until(query, lambda batches: len(batches) >= 1, TIMEOUT_S)
    (record,) = progress.batches(query)
    assert (record.sink_version, record.num_output_rows) == (0, 6)
    info = commit_info(sink, 0)
    assert info["deltaflow.stream"]["queryId"] == str(query.id)
    assert info["operationParameters"]["queryId"] == str(query.id)
    assert DeltaTable(sink).transaction_version("flow-identity-1") == 0
