"""The real-time Delta source over a table with a row log (``docs/notes/rowlog.md``): the
log's rows go out before any commit holds them, and the commits' tagged files that hold
them are skipped, so each position is emitted once, across restarts and retention.

The writer is simulated in Python, as the real-time sink with ``realTimeRowLog`` writes:
frames with ``_rowlog.SegmentWriter``, then the same rows committed as a Parquet file
tagged with their positions, with the partition's app transaction, by deltaflow's log
writer. The query runs as in ``test_realtime_source.py`` (a foreach sink, one file per
attempt at an epoch's rows).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltaflow.errors import typed_error
from deltaflow.spark.errors import SourceSchemaChangedError
from deltaflow.table import _commit, _log_commit, _rowlog
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark.test_realtime_source import (
    HAS_REAL_TIME,
    MIN_EPOCH_CONF,
    WAIT,
    FileSink,
    append,
    end_offsets,
    real_time,
    received,
    start,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_REAL_TIME, reason="Spark's real-time mode came with Spark 4.1"),
]

APP = "sink app"  # a space, encoded in the writer's directory name
WRITER = _rowlog.encode_writer(APP)
KEY = f"{WRITER}/p0"


@pytest.fixture(scope="module", autouse=True)
def short_epochs(spark: Any) -> Iterator[None]:
    """Spark's floor on the epoch length (5 s) lowered for this module, then restored."""
    with conf_set(spark, MIN_EPOCH_CONF, "1000"):
        yield


class SimulatedSink:
    """A real-time sink's partition 0 with a row log: frames, then tagged commits."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.directory = _rowlog.partition_dir(table, WRITER, 0)

    def attempt(self, epoch: int, from_row: int) -> _rowlog.SegmentWriter:
        """A task attempt's new segment of ``epoch`` from ``from_row``."""
        return _rowlog.SegmentWriter(self.directory, epoch, from_row)

    def commit(self, epoch: int, from_row: int, ids: list[int]) -> int:
        """``ids`` (positions ``from_row``...) committed as one tagged file, with the app
        transaction at the epoch's rows so far; the new version."""
        from deltalake import DeltaTable

        name = f"part-{uuid.uuid4().hex}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), os.path.join(self.table, name))
        to_row = from_row + len(ids)
        table = DeltaTable(self.table)
        added = _commit.AddedFile(
            name,
            os.path.getsize(os.path.join(self.table, name)),
            {},
            int(time.time() * 1000),
            json.dumps({"numRecords": len(ids)}),
            tags={_rowlog.TAG: _rowlog.tag(WRITER, 0, epoch, from_row, to_row)},
        )
        result = _commit.commit(
            _commit.CommitRequest(
                table_uri=self.table,
                schema=json.loads(table.schema().to_json()),
                partition_columns=(),
                adds=[added],
                read_version=table.version(),
                app_id=f"{APP}/rtm-p0",
                app_version=epoch << 32 | to_row,
                read=_log_commit.ReadSet(blind_append=True),
            )
        )
        assert result.version is not None
        return result.version


def batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


def arrived(out: Path, ids: list[int], query: Any) -> None:
    """Until the sink holds ``ids`` (it may hold more)."""

    def there() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        return set(ids) <= set(received(out))

    wait_until(there, WAIT, f"{len(ids)} logged rows in the foreach sink")


def wait_for_log_position(checkpoint: str, position: list[int]) -> None:
    """Until an epoch whose end offset has the writer's row log at ``position``."""

    def recorded() -> bool:
        return any(end.get("rowLog", {}).get(KEY) == position for end in end_offsets(checkpoint))

    wait_until(recorded, WAIT, f"an epoch checkpointed at row log position {position}")


def test_logged_rows_go_out_before_their_commit_and_once_after_it(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    append(spark, source, [0, 1])
    sink = SimulatedSink(source)
    query = start(spark, source, str(tmp_path / "ck"), out)
    stopping.append(query)
    wait_for(out, [0, 1], query)
    segment = sink.attempt(epoch=1, from_row=0)
    logged = time.monotonic()
    segment.append(batch([100, 101, 102]))
    segment.append(batch([103, 104]))
    arrived(out, [100, 101, 102, 103, 104], query)  # no commit holds them yet
    print(f"logged rows in the foreach sink after {time.monotonic() - logged:.3f} s")
    sink.commit(1, 0, [100, 101, 102, 103, 104])
    append(spark, source, [7])  # another writer's untagged commit, after the tagged one
    wait_for(out, [0, 1, 7, 100, 101, 102, 103, 104], query)
    segment.append(batch([105]))  # the log goes on after its commit
    wait_for(out, [0, 1, 7, 100, 101, 102, 103, 104, 105], query)


def test_a_restart_between_log_and_commit_emits_each_position_once(
    spark, table_path, tmp_path, stopping
) -> None:
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    append(spark, source, [0])
    sink = SimulatedSink(source)
    first = start(spark, source, checkpoint, out)
    stopping.append(first)
    segment = sink.attempt(epoch=1, from_row=0)
    segment.append(batch([100, 101, 102]))
    wait_for(out, [0, 100, 101, 102], first)
    wait_for_log_position(checkpoint, [1, 3])
    first.stop()  # logged, not committed
    segment.append(batch([103, 104]))  # while the query is down
    again = start(spark, source, checkpoint, out)
    stopping.append(again)
    sink.commit(1, 0, [100, 101, 102, 103, 104])
    append(spark, source, [7])
    wait_for(out, [0, 7, 100, 101, 102, 103, 104], again, checkpoint)


def test_segments_deleted_by_retention_are_read_from_their_tagged_files(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    append(spark, source, [0])
    sink = SimulatedSink(source)
    old = sink.attempt(epoch=1, from_row=0)
    old.append(batch([100, 101, 102]))
    first_tagged = sink.commit(1, 0, [100, 101, 102])
    later = sink.attempt(epoch=2, from_row=0)
    later.append(batch([200, 201]))
    sink.commit(2, 0, [200, 201])
    later.append(batch([202]))  # logged, not committed
    os.remove(old.path)  # retention: epoch 1 is committed and old
    query = start(spark, source, str(tmp_path / "ck"), out, startingVersion=str(first_tagged))
    stopping.append(query)
    append(spark, source, [7])
    wait_for(out, [7, 100, 101, 102, 200, 201, 202], query)


def test_a_successor_segment_supersedes_a_torn_one_each_position_once(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    append(spark, source, [0])
    sink = SimulatedSink(source)
    query = start(spark, source, str(tmp_path / "ck"), out)
    stopping.append(query)
    wait_for(out, [0], query)
    failed = sink.attempt(epoch=1, from_row=0)
    failed.append(batch([100, 101]))
    failed.append(batch([102, 103, 104]))
    with open(failed.path, "ab") as f:  # the attempt died inside its next frame
        f.write(_rowlog.encode_frame(batch([105, 106]), 5)[:30])
    arrived(out, [100, 101, 102, 103, 104], query)
    sink.commit(1, 0, [100, 101, 102])  # what the failed attempt committed
    successor = sink.attempt(epoch=1, from_row=3)  # from the first row the table lacks
    successor.append(batch([103, 104, 105]))
    successor.append(batch([106, 107]))
    sink.commit(1, 3, [103, 104, 105, 106, 107])
    append(spark, source, [7])
    wait_for(out, [0, 7, 100, 101, 102, 103, 104, 105, 106, 107], query)


def test_a_fresh_query_reads_the_snapshot_then_the_log_after_its_app_transaction(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    append(spark, source, [0])
    sink = SimulatedSink(source)
    segment = sink.attempt(epoch=1, from_row=0)
    segment.append(batch([100, 101, 102]))
    sink.commit(1, 0, [100, 101])  # in the snapshot the query starts with
    segment.append(batch([103]))  # logged only
    query = start(spark, source, str(tmp_path / "ck"), out)
    stopping.append(query)
    wait_for(out, [0, 100, 101, 102, 103], query)
    sink.commit(1, 2, [102, 103])
    append(spark, source, [7])
    wait_for(out, [0, 7, 100, 101, 102, 103], query)


def test_frames_match_columns_by_name_with_partitions_and_timestamps(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    first = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    spark.createDataFrame([(0, first, "x")], "id long, ts timestamp, p string").write.format(
        "delta"
    ).partitionBy("p").save(source)
    where = f"ts = timestamp'{first.isoformat()}' AND p = 'x'"  # read back exactly
    out.mkdir()
    writer = (
        spark.readStream.format("delta")
        .load(source)
        .where(where)
        .select("id")
        .writeStream.foreach(FileSink(str(out)))
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck"))
    )
    query = real_time(writer, "2 seconds").start()
    stopping.append(query)
    wait_for(out, [0], query)
    segment = SimulatedSink(source).attempt(epoch=1, from_row=0)
    segment.append(  # the table's columns, in another order: matched by name
        pa.record_batch(
            {
                "p": pa.array(["x", "x"]),
                "ts": pa.array([first, first], pa.timestamp("us", tz="UTC")),
                "id": pa.array([1, 2], pa.int64()),
            }
        )
    )
    wait_for(out, [0, 1, 2], query)


def test_a_frame_of_another_schema_fails_the_query_typed(
    spark, table_path, tmp_path, stopping
) -> None:
    source, out = table_path("src"), tmp_path / "out"
    append(spark, source, [0])
    query = start(spark, source, str(tmp_path / "ck"), out)
    stopping.append(query)
    wait_for(out, [0], query)
    segment = SimulatedSink(source).attempt(epoch=1, from_row=0)
    segment.append(pa.record_batch({"id": pa.array(["x"])}))
    wait_until(lambda: not query.isActive, WAIT, "the query to fail")
    error = typed_error(query.exception())
    assert isinstance(error, SourceSchemaChangedError), query.exception()
    assert error.table_uri and not error.additive


def test_micro_batch_and_batch_reads_see_each_row_once_from_delta(
    spark, table_path, tmp_path
) -> None:
    source = table_path("src")
    append(spark, source, [0])
    sink = SimulatedSink(source)
    segment = sink.attempt(epoch=1, from_row=0)
    segment.append(batch([100, 101]))
    sink.commit(1, 0, [100, 101])
    segment.append(batch([102]))  # logged only: not the table's yet
    expected = [0, 100, 101]
    assert sorted(r.id for r in spark.read.format("delta").load(source).collect()) == expected
    name = f"rowlog_{uuid.uuid4().hex}"
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(WAIT)
    assert sorted(r.id for r in spark.table(name).collect()) == expected
    assert all("rowLog" not in end for end in end_offsets(str(tmp_path / "ck")))
