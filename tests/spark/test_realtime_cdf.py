"""The change data feed as a real-time stream (``readChangeFeed`` + ``trigger(realTime=...)``,
Spark 4.1+): the JVM's real-time reader emits every change of every commit with the same
``_change_type``, ``_commit_version`` and ``_commit_timestamp`` the micro-batch feed gives.

Commits are made with delta-rs while a real-time query runs (its long-running task holds
one of the session's two cores); the reference is the micro-batch feed of the same table,
read after the real-time query stopped. Waits are on conditions with deadlines.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import typed_error
from deltaflow.spark.errors import RealTimeModeError, SourceSchemaChangedError
from deltaflow.table.errors import ChangeDataFilesMissingError, ChangeDataNotRecordedError
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark.test_cdf_read import CDF, people
from tests.spark.test_realtime_source import (
    HAS_REAL_TIME,
    MIN_EPOCH_CONF,
    end_offsets,
    real_time,
)
from tests.table.dv_fixtures import add_deletion_vectors

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_REAL_TIME, reason="Spark's real-time mode came with Spark 4.1"),
]

EPOCH = "2 seconds"
WAIT = 120.0
Change = tuple[Any, ...]


@pytest.fixture(scope="module", autouse=True)
def short_epochs(spark: Any) -> Iterator[None]:
    with conf_set(spark, MIN_EPOCH_CONF, "1000"):
        yield


class ChangeSink:
    """A foreach writer: each attempt at an epoch's rows of a partition as JSON lines in a
    file of its own (timestamps as text), named so that the latest attempt sorts last."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def open(self, partition_id: int, epoch_id: int) -> bool:
        name = f"{epoch_id:08d}-{partition_id}-{time.time_ns()}-{uuid.uuid4().hex}.jsonl"
        self.out = open(os.path.join(self.folder, name), "a")  # noqa: SIM115
        return True

    def process(self, row: Any) -> None:
        self.out.write(json.dumps(as_change(row)) + "\n")
        self.out.flush()

    def close(self, error: BaseException | None) -> None:
        self.out.close()


def as_change(row: Any) -> list[Any]:
    """A row as comparable values (the timestamp as the text Python makes of it)."""
    return [str(v) if hasattr(v, "isoformat") else v for v in row]


def received(folder: Path) -> list[Change]:
    """The rows of the last attempt at each (epoch, partition), sorted."""
    latest: dict[tuple[str, str], str] = {}
    for name in sorted(os.listdir(folder)):
        epoch, partition, _ = name.split("-", 2)
        latest[(epoch, partition)] = name
    rows: list[Change] = []
    for name in latest.values():
        with open(folder / name) as f:
            rows += [tuple(json.loads(line)) for line in f if line.strip()]
    return sorted(rows, key=repr)


def start(spark: Any, source: str, checkpoint: str, out: Path, **options: str) -> Any:
    out.mkdir(exist_ok=True)
    writer = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .options(**options)
        .load(source)
        .writeStream.foreach(ChangeSink(str(out)))
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
    )
    return real_time(writer, EPOCH).start()


def micro_batch_feed(
    spark: Any, source: str, table: str | None = None, **options: str
) -> list[Change]:
    """The same feed through the micro-batch stream (the Python data source's); by the
    catalog name ``table`` when given."""
    name = f"cdf_mb_{uuid.uuid4().hex[:8]}"
    reader = spark.readStream.format("delta").option("readChangeFeed", "true").options(**options)
    query = (
        (reader.table(table) if table else reader.load(source))
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(WAIT)
    assert query.exception() is None, query.exception()
    rows = [tuple(as_change(r)) for r in spark.table(name).collect()]
    spark.sql(f"DROP VIEW IF EXISTS {name}")
    return sorted(rows, key=repr)


def wait_past(checkpoint: str, version: int, query: Any) -> None:
    """Until an epoch whose end offset is past commit ``version`` is checkpointed."""

    def past() -> bool:
        assert query.exception() is None, query.exception()
        return any(
            end.get("reservoirVersion", -1) > version and "rowsOfNextFile" not in end
            for end in end_offsets(checkpoint)
        )

    wait_until(past, WAIT, f"an epoch checkpointed past version {version}")


def latest(path: str) -> int:
    return DeltaTable(path).version()


def test_inserts_updates_deletes_merges_overwrites_match_the_micro_batch_feed(
    spark, table_path, tmp_path, stopping
) -> None:
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    write_deltalake(source, people([1, 2, 3, 4], ["a", "a", "b", "b"]), partition_by=["p"],
                    configuration=CDF)  # fmt: skip
    query = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(query)
    table = DeltaTable(source)
    table.delete("id = 1")  # cdc files: delete
    table.update(predicate="id = 3", updates={"v": "33"})  # cdc: pre/post images
    merge_source = people([2, 5], ["a", "b"], [22, 50])
    (
        table.merge(merge_source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(source, people([6, 7], ["a", "b"]), mode="append")  # adds only
    write_deltalake(source, people([9], ["a"], [90]), mode="overwrite")  # removes + add
    wait_past(checkpoint, latest(source), query)
    query.stop()
    expected = micro_batch_feed(spark, source, startingVersion="0")
    got = received(out)
    assert got == expected
    kinds = {row[3] for row in got}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    assert {row[4] for row in got} == set(range(latest(source) + 1))


def test_deletion_vectors_match_the_micro_batch_feed(spark, table_path, tmp_path, stopping):
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    write_deltalake(source, people(list(range(10))), configuration=CDF)
    data_file = pa.table(DeltaTable(source).get_add_actions(flatten=True)).column("path")[0]
    # No startingVersion: the snapshot arrives as inserts at its version first (the same
    # rows as version 0's inserts).
    query = start(spark, source, checkpoint, out)
    stopping.append(query)
    wait_until(lambda: len(received(out)) >= 10, WAIT, "the snapshot")
    add_deletion_vectors(source, {data_file.as_py(): [1, 3]})  # v1: remove + add with a DV
    add_deletion_vectors(source, {data_file.as_py(): [3, 4, 8]})  # v2: two DVs, 4 and 8 new
    write_deltalake(source, people([99]), mode="overwrite")  # v3: the live rows deleted
    wait_past(checkpoint, latest(source), query)
    query.stop()
    got = received(out)
    assert got == micro_batch_feed(spark, source, startingVersion="0")
    deleted = sorted((row[0], row[4]) for row in got if row[3] == "delete")
    alive = [i for i in range(10) if i not in (1, 3, 4, 8)]
    assert deleted == sorted([(1, 1), (3, 1), (4, 2), (8, 2)] + [(i, 3) for i in alive])


def test_restart_from_the_checkpoint_loses_and_repeats_no_change(
    spark, table_path, tmp_path, stopping
) -> None:
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    write_deltalake(source, people([1, 2]), configuration=CDF)
    first = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(first)
    DeltaTable(source).update(predicate="id = 1", updates={"v": "11"})
    wait_past(checkpoint, latest(source), first)
    first.stop()
    DeltaTable(source).delete("id = 2")  # while the query is down
    write_deltalake(source, people([3]), mode="append")
    again = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(again)
    write_deltalake(source, people([4]), mode="append")
    wait_past(checkpoint, latest(source), again)
    again.stop()
    assert received(out) == micro_batch_feed(spark, source, startingVersion="0")


def test_change_feed_into_a_delta_table_exactly_once_across_a_restart(
    spark, table_path, tmp_path, stopping
) -> None:
    # Spark's sink allowlist names only its own sinks (docs/realtime.md).
    with conf_set(spark, "spark.sql.streaming.realTimeMode.allowlistCheck", "false"):
        feed_into_delta(spark, table_path, tmp_path, stopping)


def feed_into_delta(spark: Any, table_path: Any, tmp_path: Path, stopping: list[Any]) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), str(tmp_path / "ck")
    write_deltalake(source, people([1, 2, 3]), configuration=CDF)

    def run() -> Any:
        writer = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(source)
            .writeStream.format("delta")
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
        )
        query = real_time(writer, EPOCH).toTable(f"delta.`{target}`")
        stopping.append(query)
        return query

    first = run()
    DeltaTable(source).update(predicate="id = 2", updates={"v": "22"})
    wait_until(lambda: os.path.isdir(os.path.join(target, "_delta_log")), WAIT, "the target")
    wait_past(checkpoint, latest(source), first)
    first.stop()
    DeltaTable(source).delete("id = 3")
    again = run()
    write_deltalake(source, people([4]), mode="append")
    wait_past(checkpoint, latest(source), again)
    again.stop()
    landed = DeltaTable(target).to_pyarrow_table()
    names = ("id", "p", "v", "_change_type", "_commit_version")
    got = sorted(zip(*(landed.column(n).to_pylist() for n in names), strict=True))
    expected = sorted(row[:5] for row in micro_batch_feed(spark, source, startingVersion="0"))
    assert got == expected  # every change once, none twice


def test_a_catalog_table_s_change_feed(spark, table_path, tmp_path, stopping) -> None:
    source, out = table_path("src"), tmp_path / "out"
    write_deltalake(source, people([1]), configuration=CDF)
    name = f"cdf_rt_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{source}'")
    out.mkdir()
    checkpoint = str(tmp_path / "ck")
    writer = (
        spark.readStream.option("readChangeFeed", "true")
        .option("startingVersion", "1")
        .table(name)
        .writeStream.foreach(ChangeSink(str(out)))
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
    )
    query = real_time(writer, EPOCH).start()
    stopping.append(query)
    write_deltalake(source, people([2]), mode="append")
    DeltaTable(source).delete("id = 1")
    wait_past(checkpoint, latest(source), query)
    query.stop()
    got = received(out)
    assert sorted((row[0], row[3], row[4]) for row in got) == [(1, "delete", 2), (2, "insert", 1)]
    # The micro-batch feed by name has the change columns too (it had the table's own).
    assert got == micro_batch_feed(spark, source, table=name, startingVersion="1")


def test_a_schema_change_mid_stream_fails_typed_and_a_restart_reads_on(
    spark, table_path, tmp_path, stopping
) -> None:
    # As micro-batch (and delta-spark's DELTA_SCHEMA_CHANGED_WITH_VERSION): the query
    # stops at the commit that added a column; a restart reads on with the new schema.
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    write_deltalake(source, people([1, 2]), configuration=CDF)
    first = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(first)
    DeltaTable(source).delete("id = 1")
    wait_past(checkpoint, latest(source), first)
    spark.sql(f"ALTER TABLE delta.`{source}` ADD COLUMNS (w STRING)")
    changed = latest(source)
    spark.sql(f"INSERT INTO delta.`{source}` VALUES (3, 'a', 30, 'x')")
    DeltaTable(source).delete("id = 2")
    wait_until(lambda: not first.isActive, WAIT, "the query to fail")
    error = typed_error(first.exception())
    assert isinstance(error, SourceSchemaChangedError), first.exception()
    assert (error.version, error.additive) == (changed, True)
    assert f"Version {changed}" in str(error) and "Restart the query" in str(error)
    again = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(again)
    wait_past(checkpoint, latest(source), again)
    again.stop()
    # Rows before the change have 6 fields, after it 7 (w after v): the change columns
    # are the last three either way. Each change once:
    got = sorted((row[0], row[-3], row[-2]) for row in received(out))
    assert got == [
        (1, "delete", 1),
        (1, "insert", 0),
        (2, "delete", changed + 2),
        (2, "insert", 0),
        (3, "insert", changed + 1),
    ]
    assert [row[3] for row in received(out) if row[0] == 3] == ["x"]


def test_a_vacuumed_change_file_fails_typed(spark, table_path, tmp_path, stopping) -> None:
    source, out = table_path("src"), tmp_path / "out"
    write_deltalake(source, people([1, 2]), configuration=CDF)
    DeltaTable(source).delete("id = 1")  # v1: a cdc file
    for name in os.listdir(os.path.join(source, "_change_data")):
        os.remove(os.path.join(source, "_change_data", name))
    query = start(spark, source, str(tmp_path / "ck"), out, startingVersion="1")
    stopping.append(query)
    wait_until(lambda: not query.isActive, WAIT, "the query to fail")
    error = typed_error(query.exception())
    assert isinstance(error, ChangeDataFilesMissingError), query.exception()
    assert error.version == 1


def commit_bare_remove(path: str) -> int:
    """Remove the table's first file as a writer without ``extendedFileMetadata`` does (no
    partition values, no size); the new version."""
    table = DeltaTable(path)
    removed = pa.table(table.get_add_actions(flatten=True)).column("path")[0].as_py()
    version, now = table.version() + 1, int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE"}},
        {"remove": {"path": removed, "dataChange": True, "deletionTimestamp": now}},
    ]
    log = Path(path, "_delta_log", f"{version:020d}.json")
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return version


def test_a_remove_without_partition_values_is_refused_on_both_paths(
    spark, table_path, tmp_path, stopping
) -> None:
    # Its deletes' partition columns are unknown: delta-spark refuses the commit
    # (DELTA_REMOVE_FILE_CDC_MISSING_EXTENDED_METADATA) rather than emit nulls; so does
    # the batch / micro-batch feed and the real-time one.
    source = table_path("src")
    write_deltalake(source, people([1, 2], ["a", "b"]), partition_by=["p"], configuration=CDF)
    version = commit_bare_remove(source)
    with pytest.raises(Exception) as caught:
        spark.read.format("delta").option("readChangeFeed", "true").option(
            "startingVersion", "0"
        ).load(source).collect()
    error = typed_error(caught.value)
    assert isinstance(error, ChangeDataNotRecordedError), caught.value
    assert error.version == version and "partition values" in str(error)
    query = start(spark, source, str(tmp_path / "ck"), tmp_path / "out", startingVersion="0")
    stopping.append(query)
    wait_until(lambda: not query.isActive, WAIT, "the query to fail")
    error = typed_error(query.exception())
    assert isinstance(error, ChangeDataNotRecordedError), query.exception()
    assert error.version == version
    assert all(row[1] is not None for row in received(tmp_path / "out"))  # no null p
    # Without partition columns nothing is missing: the removed file's rows are deletes.
    plain = table_path("plain")
    write_deltalake(plain, people([1, 2]), configuration=CDF)
    version = commit_bare_remove(plain)
    rows = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", str(version))
        .load(plain)
        .collect()
    )
    assert sorted((r.id, r.p, r._change_type) for r in rows) == [
        (1, "a", "delete"),
        (2, "a", "delete"),
    ]


def test_the_change_feed_without_the_native_scan_is_refused(
    spark, table_path, tmp_path, stopping
) -> None:
    source = table_path("src")
    write_deltalake(source, people([1]), configuration=CDF)
    with conf_set(spark, "deltaflow.read.nativeScan", "false"), pytest.raises(Exception) as caught:
        stopping.append(start(spark, source, str(tmp_path / "ck"), tmp_path / "out"))
    error = typed_error(caught.value)
    assert isinstance(error, RealTimeModeError), caught.value
    assert error.feature == "readChangeFeed"


def test_the_change_feed_on_a_store_hadoop_does_not_open_is_refused(
    spark, object_store, tmp_path, stopping
) -> None:
    # s3:// without S3A: the feed is read by the Python data source only, which real-time
    # mode cannot run; start() says so, naming S3A and a processingTime trigger.
    source = object_store.uri(f"cdf_rt_{uuid.uuid4().hex[:8]}")
    write_deltalake(
        source, people([1]), configuration=CDF, storage_options=object_store.storage_options
    )
    with pytest.raises(Exception) as caught:
        stopping.append(start(spark, source, str(tmp_path / "ck"), tmp_path / "out"))
    error = typed_error(caught.value)
    assert isinstance(error, RealTimeModeError), caught.value
    assert (error.feature, error.table_uri) == ("readChangeFeed", source)
    assert "S3A" in str(error) and "processingTime" in str(error)


def column_mapped(source: str, text_column: str) -> pa.Schema:
    """A new change-feed table at ``source`` with name column mapping: ``id`` and one
    string column; its Arrow schema."""
    from deltalake import Schema

    arrow_schema = pa.schema([("id", pa.int64()), (text_column, pa.string())])
    DeltaTable.create(
        source,
        schema=Schema.from_arrow(arrow_schema),
        configuration={**CDF, "delta.columnMapping.mode": "name"},
    )
    return arrow_schema


def test_a_column_mapped_table_s_feed(spark, table_path, tmp_path, stopping) -> None:
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    arrow_schema = column_mapped(source, "Mixed Case")
    query = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(query)
    data = pa.table({"id": [1, 2], "Mixed Case": ["x", "y"]}, schema=arrow_schema)
    write_deltalake(source, data, mode="append")  # adds: data read by physical names
    DeltaTable(source).delete("id = 1")  # a cdc file: _change_type by its own name
    wait_past(checkpoint, latest(source), query)
    query.stop()
    got = received(out)
    assert got == micro_batch_feed(spark, source, startingVersion="0")
    assert sorted(row[:4] for row in got) == [
        (1, "x", "delete", 2),
        (1, "x", "insert", 1),
        (2, "y", "insert", 1),
    ]


def test_a_column_rename_mid_stream_fails_typed(spark, table_path, tmp_path, stopping) -> None:
    # Not additive (delta-spark asks for a schemaTrackingLocation there): the query stops
    # at the rename and the error says to start again with a new checkpoint.
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    arrow_schema = column_mapped(source, "name")
    write_deltalake(
        source, pa.table({"id": [1], "name": ["x"]}, schema=arrow_schema), mode="append"
    )
    query = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(query)
    wait_past(checkpoint, latest(source), query)
    spark.sql(f"ALTER TABLE delta.`{source}` RENAME COLUMN name TO label")
    renamed = latest(source)
    wait_until(lambda: not query.isActive, WAIT, "the query to fail")
    error = typed_error(query.exception())
    assert isinstance(error, SourceSchemaChangedError), query.exception()
    assert (error.version, error.additive) == (renamed, False)
    assert "new checkpointLocation" in str(error)
    assert [row[:4] for row in received(out)] == [(1, "x", "insert", 1)]


def test_an_epoch_ending_inside_a_change_file_resumes_at_its_next_row(
    spark, table_path, tmp_path, stopping
) -> None:
    # One change file larger than a short epoch reads: epochs end inside it, and their
    # offsets count the rows of it already emitted (after its row selection).
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    rows = 200_000
    write_deltalake(source, people(list(range(rows))), configuration=CDF)
    spark.conf.set(MIN_EPOCH_CONF, "100")
    try:
        writer = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(source)
            .writeStream.foreach(ChangeSink(str(out)))
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
        )
        out.mkdir()
        first = real_time(writer, "200 milliseconds").start()
    finally:
        spark.conf.set(MIN_EPOCH_CONF, "1000")
    stopping.append(first)
    wait_until(
        lambda: any("rowsOfNextFile" in end for end in end_offsets(checkpoint)),
        WAIT,
        "an epoch checkpointed inside the file",
    )
    first.stop()  # inside the file: the restart goes on from the checkpointed row
    again = start(spark, source, checkpoint, out, startingVersion="0")
    stopping.append(again)
    wait_until(lambda: len(received(out)) >= rows, WAIT * 2, f"{rows} changes")
    got = received(out)
    assert sorted(row[0] for row in got) == list(range(rows))  # none lost, none twice
    assert {(row[3], row[4]) for row in got} == {("insert", 0)}


def test_the_feed_into_spark_s_memory_sink(spark, table_path, tmp_path, stopping) -> None:
    # Spark's allowlist refuses the memory sink in real-time mode unless told not to check.
    source, name = table_path("src"), f"cdf_rt_memory_{uuid.uuid4().hex[:8]}"
    write_deltalake(source, people([1, 2]), configuration=CDF)
    with conf_set(spark, "spark.sql.streaming.realTimeMode.allowlistCheck", "false"):
        writer = (
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "0")
            .load(source)
            .writeStream.format("memory")
            .queryName(name)
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "ck"))
        )
        query = real_time(writer, EPOCH).start()
    stopping.append(query)
    DeltaTable(source).delete("id = 2")

    def arrived() -> bool:
        assert query.exception() is None, query.exception()
        return spark.table(name).count() >= 3

    wait_until(arrived, WAIT, "3 changes in the memory sink")
    got = sorted((r.id, r._change_type, r._commit_version) for r in spark.table(name).collect())
    assert got == [(1, "insert", 0), (2, "delete", 1), (2, "insert", 0)]
