"""The real-time Delta sink's row log (``realTimeRowLog``, ``docs/notes/rowlog.md``): each
burst of rows is appended, synced, to ``<table>/_deltaflow_rowlog`` before the same rows are
committed to the table, whose adds carry their log positions; the log holds exactly the
table's rows, position by position, across a restart; wrong settings are refused typed; no
VACUUM and no table reader is troubled by the log.

The log is read with the format's reference reader (``deltaflow.table._rowlog``); the
table with delta-rs while the query runs (the epoch's tasks hold the session's cores).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.spark.bridge import _realtime
from deltaflow.table import _rowlog
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark.test_realtime_sink import (
    ALLOWLIST,
    MemoryStream,
    ids,
    new_table,
    real_time,
    start,
    wait_for_rows,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

# Auto compaction would replace the tagged adds by untagged ones (dataChange=false, which
# no stream reads): off, so the current snapshot shows every tag.
NO_COMPACTION = "TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'false')"
ROW_LOG = {"realTimeRowLog": "true"}


@pytest.fixture(scope="module", autouse=True)
def real_time_session(spark) -> Any:
    with conf_set(spark, ALLOWLIST, "false"):
        yield


class _PositionedTail(_rowlog.PartitionTail):
    """The reference reader, noting each row's position as it emits it."""

    def __init__(self, directory: str, position: _rowlog.Position) -> None:
        super().__init__(directory, position)
        self.rows: dict[tuple[int, int], Any] = {}

    def _read_current(self) -> list[pa.RecordBatch]:
        epoch, row = self.position  # a read stays in its epoch
        out = super()._read_current()
        for batch in out:
            for value in batch.column("id").to_pylist():
                self.rows[(epoch, row)] = value
                row += 1
        return out


def positioned_log(location: str) -> dict[tuple[int, int, int], Any]:
    """Every row in the table's row log, ``(partition, epoch, row) -> id``, as a reader
    from each partition's first epoch gets it (epochs start at the checkpoint's batch id,
    not at 0)."""
    found: dict[tuple[int, int, int], Any] = {}
    for part in Path(location, _rowlog.DIRECTORY).glob("*/p*"):
        segments = _rowlog.segments(str(part))
        if segments:
            tail = _PositionedTail(str(part), _rowlog.Position(segments[0].epoch, 0))
            tail.poll()
            found.update({(int(part.name[1:]), *k): v for k, v in tail.rows.items()})
    return found


def tagged_adds(location: str) -> list[tuple[int, dict[str, Any]]]:
    """``(version, add)`` of every add in the table's log that carries a row log tag."""
    adds = []
    for path in sorted(Path(location, "_delta_log").glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action and (action["add"].get("tags") or {}).get(_rowlog.TAG):
                adds.append((int(path.stem), action["add"]))
    return adds


def table_positions(location: str) -> dict[tuple[int, int, int], Any]:
    """The table's rows by their tags: ``(partition, epoch, row) -> id``, each tagged
    file's rows at its positions in file order."""
    found: dict[tuple[int, int, int], Any] = {}
    for _, add in tagged_adds(location):
        _, p, epoch, start_at, end = _rowlog.parse_tag(add["tags"][_rowlog.TAG])
        values = pq.read_table(Path(location, add["path"])).column("id").to_pylist()
        assert len(values) == end - start_at, add
        for offset, value in enumerate(values):
            assert (p, epoch, start_at + offset) not in found, ("position twice", add)
            found[(p, epoch, start_at + offset)] = value
    return found


def test_frames_hold_the_table_s_rows_position_by_position_before_their_commit(
    spark, table_path
) -> None:
    # Delta -> Delta, several upstream commits, each a burst.
    source = table_path("src")
    write_deltalake(source, pa.table({"id": pa.array([0], pa.int32())}))
    name, location = new_table(spark, NO_COMPACTION)
    query = start(
        spark.readStream.format("delta").load(source),
        name,
        table_path("ck"),
        realTimeCommitIntervalMs="20",
        **ROW_LOG,
    )
    # Each commit the sink makes is checked as soon as it is seen: the log already holds
    # every position its adds are tagged with (the sink syncs a roll's frames before it
    # hands the roll over).
    seen: set[int] = set()
    problems: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.005):
            adds = [(v, a) for v, a in tagged_adds(location) if v not in seen]
            if not adds:
                continue
            logged = positioned_log(location)
            for version, add in adds:
                _, p, epoch, start_at, end = _rowlog.parse_tag(add["tags"][_rowlog.TAG])
                missing = [r for r in range(start_at, end) if (p, epoch, r) not in logged]
                if missing:
                    problems.append(f"v{version} p{p} e{epoch}: rows {missing} not logged")
                seen.add(version)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait_for_rows(location, query, 1)
        for i in range(1, 6):
            rows = list(range(10 * i, 10 * i + 10))
            write_deltalake(source, pa.table({"id": pa.array(rows, pa.int32())}), mode="append")
            wait_for_rows(location, query, 1 + 10 * i)
        assert query.lastProgress is None  # all inside the first epoch
    finally:
        stop.set()
        watcher.join(10)
        query.stop()
    expected = [0, *range(10, 60)]
    assert ids(location) == expected
    assert problems == [], problems
    assert seen, "no tagged commit was seen"

    logged, committed = positioned_log(location), table_positions(location)
    assert logged == committed
    assert sorted(committed.values()) == expected
    # One writer (the query's id), one partition (the Delta source's), epoch 0.
    writers = list(Path(location, _rowlog.DIRECTORY).iterdir())
    assert len(writers) == 1
    assert {(p, e) for p, e, _ in committed} == {(0, 0)}
    # The frames' own schema: the table's logical columns.
    segment = _rowlog.segments(str(writers[0] / "p0"))[0]
    frame = next(_rowlog.decode_frames(Path(segment.path).read_bytes()))
    assert frame.batch.schema.names == ["id"]
    assert frame.batch.schema.field("id").type == pa.int32()


def contiguous(location: str) -> dict[tuple[int, int], int]:
    """Each partition's epoch's tagged ranges, checked contiguous from row 0: the rows."""
    ranges: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for _, add in tagged_adds(location):
        _, p, epoch, start_at, end = _rowlog.parse_tag(add["tags"][_rowlog.TAG])
        ranges.setdefault((p, epoch), []).append((start_at, end))
    ends = {}
    for key, spans in ranges.items():
        spans.sort()
        assert spans[0][0] == 0, (key, spans)
        for (_, end), (start_at, _) in itertools.pairwise(spans):
            assert start_at == end, (key, spans)
        ends[key] = spans[-1][1]
    return ends


def test_tags_are_contiguous_per_partition_and_restart_keeps_each_row_once(
    spark, table_path
) -> None:
    name, location = new_table(spark, NO_COMPACTION)
    checkpoint = table_path("ck")
    source = MemoryStream(spark)
    query = start(source.frame(), name, checkpoint, realTimeCommitIntervalMs="20", **ROW_LOG)
    try:
        for start_at in range(0, 30, 10):
            source.add(list(range(start_at, start_at + 10)))
            wait_for_rows(location, query, start_at + 10)
    finally:
        query.stop()
    first = contiguous(location)
    assert {p for p, _ in first} == {0, 1}
    assert sum(first.values()) == 30

    # The restart replays epoch 0 from its start offsets: the rows the table holds are
    # skipped, in the table and in the log (a new segment from the first row it writes).
    again = MemoryStream(spark)
    for start_at in range(0, 30, 10):
        again.add(list(range(start_at, start_at + 10)))
    again.add(list(range(30, 50)))
    query = start(again.frame(), name, checkpoint, realTimeCommitIntervalMs="20", **ROW_LOG)
    try:
        wait_for_rows(location, query, 50)
    finally:
        query.stop()
    assert ids(location) == list(range(50))
    assert sum(contiguous(location).values()) == 50
    logged, committed = positioned_log(location), table_positions(location)
    assert logged == committed
    assert sorted(committed.values()) == list(range(50))
    # The replayed epoch has segments of both runs; the second starts past row 0 (it
    # skipped what the first committed) or in a later epoch.
    segments = [
        s
        for part in Path(location, _rowlog.DIRECTORY).glob("*/p*")
        for s in _rowlog.segments(str(part))
    ]
    assert len(segments) >= 3, segments


def commits(location: str) -> int:
    return sum(
        1 for h in DeltaTable(location).history() if h.get("operation") == "STREAMING UPDATE"
    )


def test_the_commit_interval_defaults_to_a_second_with_the_log(spark, table_path) -> None:
    assert _realtime.commit_interval_ms(ROW_LOG) == 1000
    assert _realtime.commit_interval_ms({}) == 50
    assert _realtime.commit_interval_ms({**ROW_LOG, "realTimeCommitIntervalMs": "20"}) == 20
    # Twelve bursts, each sent once the log has the last: at one commit a second (after
    # a burst of 3) the query makes few commits; with the option at 20 ms, about one per
    # burst. The log has every row as it comes either way.
    few = bursts_and_commits(spark, table_path)
    many = bursts_and_commits(spark, table_path, realTimeCommitIntervalMs="20")
    assert few <= 8 and many > few, (few, many)


def bursts_and_commits(spark: Any, table_path: Any, **options: str) -> int:
    name, location = new_table(spark, NO_COMPACTION)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), **ROW_LOG, **options)
    try:
        for i in range(12):
            source.add(list(range(10 * i, 10 * i + 10)))
            wait_until(
                lambda i=i: len(positioned_log(location)) >= 10 * i + 10,
                60,
                f"{10 * i + 10} rows in the row log",
            )
        wait_for_rows(location, query, 120)
    finally:
        query.stop()
    assert ids(location) == list(range(120))
    return commits(location)


def test_wrong_settings_are_refused_typed(spark, table_path) -> None:
    with pytest.raises(InvalidOptionError) as raised:
        _realtime.row_log({"realTimeRowLog": "yes"})
    assert raised.value.option == "realTimeRowLog"
    with pytest.raises(InvalidOptionError) as raised:
        _realtime.check_row_log({**ROW_LOG, "realTimeRowLogRetentionMs": "-1"}, "/tmp/t")
    assert raised.value.option == "realTimeRowLogRetentionMs"
    with pytest.raises(InvalidOptionError) as raised:
        _realtime.check_row_log(ROW_LOG, "s3://bucket/table")
    assert raised.value.option == "realTimeRowLog"
    assert not _realtime.check_row_log({"realTimeRowLog": "false"}, "s3://bucket/table")
    # deltaflow's Python stream writer runs micro-batches only.
    from pyspark.sql.types import IntegerType, StructField, StructType

    from deltaflow.spark.stream._writer import stream_writer

    with pytest.raises(InvalidOptionError) as raised:
        stream_writer(
            {**ROW_LOG, "path": table_path("p")},
            StructType([StructField("id", IntegerType())]),
            False,
        )
    assert raised.value.option == "realTimeRowLog"

    # In a real-time query: the first epoch fails typed.
    name, location = new_table(spark)
    query = start(MemoryStream(spark).frame(), name, table_path("ck"), realTimeRowLog="maybe")
    try:
        wait_until(lambda: query.exception() is not None, 120, "the query to fail")
    finally:
        query.stop()
    error = deltaflow.typed_error(query.exception())
    assert isinstance(error, InvalidOptionError), query.exception()
    assert error.option == "realTimeRowLog"

    # A micro-batch query: refused, not ignored (readers would wait for a log nobody
    # writes). The table's streaming write at its first batch; start(path) at start().
    source = table_path("src")
    write_deltalake(source, pa.table({"id": pa.array([1], pa.int32())}))
    frame = spark.readStream.format("delta").load(source)
    writer = (
        frame.writeStream.format("delta")
        .option("checkpointLocation", table_path("ck"))
        .options(**ROW_LOG)
        .trigger(availableNow=True)
    )
    query = writer.toTable(name)
    with pytest.raises(Exception) as failed:
        query.awaitTermination(120)
    error = deltaflow.typed_error(failed.value)
    assert isinstance(error, InvalidOptionError), failed.value
    assert error.option == "realTimeRowLog"
    with pytest.raises(Exception) as failed:
        writer.option("checkpointLocation", table_path("ck")).start(table_path("t"))
    error = deltaflow.typed_error(failed.value)
    assert isinstance(error, InvalidOptionError), failed.value
    assert error.option == "realTimeRowLog"
    assert ids(location) == []


def test_retention_deletes_only_earlier_epochs_past_their_age(tmp_path) -> None:
    directory = str(tmp_path / "w")
    for epoch in (3, 4, 5):
        writer = _rowlog.SegmentWriter(f"{directory}/p0", epoch, 0, fsync=False)
        writer.append(pa.record_batch({"id": pa.array([epoch])}))
        writer.close()
    assert _realtime.expire_row_log(directory, 5, 3_600_000) == []  # young
    deleted = _realtime.expire_row_log(directory, 5, 0)
    assert sorted(Path(p).name[:20] for p in deleted) == [f"{3:020d}", f"{4:020d}"]
    assert [s.epoch for s in _rowlog.segments(f"{directory}/p0")] == [5]  # the current one


def test_vacuum_and_every_reader_leave_the_log_alone(spark, table_path) -> None:
    name, location = new_table(spark, NO_COMPACTION)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="20", **ROW_LOG)
    try:
        source.add(list(range(20)))
        wait_for_rows(location, query, 20)
    finally:
        query.stop()
    spark.sql(f"DELETE FROM {name} WHERE id < 5")  # files for VACUUM to delete
    root = Path(location, _rowlog.DIRECTORY)
    before = sorted((p, p.stat().st_size) for p in root.rglob("*") if p.is_file())
    assert before
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    with conf_set(spark, key, "false"):
        spark.sql(f"VACUUM {name} RETAIN 0 HOURS")
        from deltaflow import DeltaTable as FlowTable

        FlowTable.forName(spark, name).vacuum(0)
    assert sorted((p, p.stat().st_size) for p in root.rglob("*") if p.is_file()) == before
    expected = list(range(5, 20))
    assert sorted(DeltaTable(location).to_pyarrow_table().column("id").to_pylist()) == expected
    read = spark.read.format("delta").load(location)
    assert read.columns == ["id"]
    assert sorted(r.id for r in read.collect()) == expected


@pytest.mark.chaos
def test_sigkill_of_the_driver_mid_epoch_keeps_the_log_and_the_table_in_step(tmp_path) -> None:
    # test_realtime_chaos.py's job with the row log on: the driver killed mid-epoch after
    # some rows were committed (and more logged), then a run to the end. Each row is in
    # the table once, and the log, read as a reader reads it (a successor's segment
    # supersedes its predecessor's torn tail), holds the table's rows at their positions.
    import os
    import random

    from tests.spark.test_chaos import START_TIMEOUT, Child, chaos_seed
    from tests.spark.test_realtime_chaos import JOB, wait_until_rows_landed

    rows = 1000
    rng = random.Random(chaos_seed())
    location, checkpoint = str(tmp_path / "table"), str(tmp_path / "ck")
    args = [location, checkpoint, str(rows)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "DELTAFLOW_TEST_ROW_LOG": "true"}
    child = Child(args, tmp_path / "run0.log", job=JOB, env=env)
    try:
        wait_until_rows_landed(child)
        child.run_for(rng.uniform(0.0, 1.0))
    finally:
        child.kill()
    final = Child(args, tmp_path / "final.log", job=JOB, env=env)
    try:
        final.wait_for("DONE", START_TIMEOUT + 120)
    finally:
        final.kill()
    landed = DeltaTable(location).to_pyarrow_table().column("id").to_pylist()
    assert sorted(landed) == list(range(rows))
    committed = table_positions(location)
    assert sorted(committed.values()) == list(range(rows))
    assert positioned_log(location) == committed
    # The killed epoch was replayed: a successor's segment starts past row 0, after the
    # rows the table held (the killed run's logged-but-uncommitted rows logged again).
    segments = [
        s
        for part in Path(location, _rowlog.DIRECTORY).glob("*/p*")
        for s in _rowlog.segments(str(part))
    ]
    assert any(s.from_row > 0 for s in segments), segments


def test_frames_carry_the_table_s_logical_columns_and_types(spark, table_path) -> None:
    # A partitioned table whose partition column takes the empty string (the Parquet path
    # writes it escaped; Delta reads it as null): the frames hold every column, partition
    # column included, in table order, with the values a reader of the table gets;
    # timestamps are UTC, TIMESTAMP_NTZ without a zone.
    name = "realtime_rowlog_types"
    spark.sql(
        f"CREATE TABLE {name} (id INT, kind STRING, ts TIMESTAMP, ntz TIMESTAMP_NTZ,"
        f" amount DECIMAL(10,2)) USING delta PARTITIONED BY (kind) {NO_COMPACTION}"
    )
    location = str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"])
    location = location.removeprefix("file:")
    source = MemoryStream(spark)
    frame = source.frame().selectExpr(
        "id",
        "CASE WHEN id % 3 = 0 THEN '' ELSE CAST(id % 2 AS STRING) END AS kind",
        "TIMESTAMP_SECONDS(id) AS ts",
        "CAST(TIMESTAMP_SECONDS(id) AS TIMESTAMP_NTZ) AS ntz",
        "CAST(id AS DECIMAL(10,2)) AS amount",
    )
    query = start(frame, name, table_path("ck"), realTimeCommitIntervalMs="20", **ROW_LOG)
    try:
        source.add(list(range(30)))
        wait_for_rows(location, query, 30)
    finally:
        query.stop()
    batches = [
        f.batch
        for part in Path(location, _rowlog.DIRECTORY).glob("*/p*")
        for s in _rowlog.segments(str(part))
        for f in _rowlog.decode_frames(Path(s.path).read_bytes())
    ]
    schema = batches[0].schema
    assert schema.names == ["id", "kind", "ts", "ntz", "amount"]
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("ntz").type == pa.timestamp("us")
    assert schema.field("amount").type == pa.decimal128(10, 2)
    logged = pa.Table.from_batches(batches).sort_by("id").to_pylist()
    # deltaflow's reader (delta-rs would show the escaped partition value): the same
    # rows; timestamps compare as instants whatever the zone each side carries.
    table = spark.read.format("delta").load(location).toArrow()
    assert logged == table.select(schema.names).sort_by("id").to_pylist()
    assert {r["kind"] for r in logged} == {None, "0", "1"}  # '' reads back as null


def test_segments_of_finished_epochs_expire_when_an_epoch_starts(spark, table_path) -> None:
    # Short epochs and no retention: once a later epoch starts, the first epoch's segments
    # go (every row of them is in the table by then); the table keeps every row.
    name, location = new_table(spark, NO_COMPACTION)
    source = MemoryStream(spark)
    writer = (
        source.frame()
        .writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", table_path("ck"))
        .options(**ROW_LOG, realTimeRowLogRetentionMs="0", realTimeCommitIntervalMs="20")
    )
    with conf_set(spark, "spark.sql.streaming.realTimeMode.minBatchDuration", "1s"):
        query = real_time(writer, "2 seconds").toTable(name)

    def epochs() -> set[int]:
        parts = Path(location, _rowlog.DIRECTORY).glob("*/p*")
        return {s.epoch for part in parts for s in _rowlog.segments(str(part))}

    try:
        source.add(list(range(20)))
        wait_for_rows(location, query, 20)
        # The first rows' epoch (0, unless the first epoch ended before they came).
        first = min(_rowlog.parse_tag(a["tags"][_rowlog.TAG])[2] for _, a in tagged_adds(location))
        wait_until(lambda: first not in epochs(), 60, f"epoch {first}'s segments to expire")
        source.add(list(range(20, 40)))
        wait_for_rows(location, query, 40)
    finally:
        query.stop()
    assert ids(location) == list(range(40))
