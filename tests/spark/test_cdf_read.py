"""The change data feed: ``option("readChangeFeed", "true")`` on read and readStream.

Change data is produced by delta-rs (its DELETE / UPDATE / MERGE write ``cdc`` files
when ``delta.enableChangeDataFeed`` is on), by our own writer (appends, overwrites),
and by hand-built commits laid out as delta-spark writes them. Every read is compared
row by row with an expectation written out in plain Python, and where delta-rs can
read the same range, with ``DeltaTable.load_cdf``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema, write_deltalake

from deltaflow.errors import InvalidOptionError, unpack_remote_error
from deltaflow.table.errors import (
    ChangeDataFilesMissingError,
    ChangeDataNotRecordedError,
    VersionNotFoundError,
)
from tests.table.dv_fixtures import add_deletion_vectors

CDF = {"delta.enableChangeDataFeed": "true"}
Row = tuple[Any, ...]

# ---- helpers ---------------------------------------------------------------------------


def people(ids: list[int], p: list[str] | None = None, v: list[int] | None = None) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array(p or ["a"] * len(ids), pa.string()),
            "v": pa.array(v or [i * 10 for i in ids], pa.int64()),
        }
    )


def changes(spark: Any, path: str, **options: Any) -> Any:
    reader = spark.read.format("delta").option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def change_rows(df: Any, *columns: str) -> list[Row]:
    names = columns or ("id", "p", "v", "_change_type", "_commit_version")
    return sorted(tuple(r[c] for c in names) for r in df.collect())


def delta_rs_rows(path: str, start: int, end: int | None = None) -> list[Row]:
    table = pa.table(DeltaTable(path).load_cdf(starting_version=start, ending_version=end))
    names = ("id", "p", "v", "_change_type", "_commit_version")
    return sorted(
        tuple(int(x) if n == "_commit_version" else x for n, x in zip(names, r, strict=True))
        for r in zip(*(table.column(n).to_pylist() for n in names), strict=True)
    )


def commit_file(path: str, version: int) -> str:
    return os.path.join(path, "_delta_log", f"{version:020d}.json")


def write_commit(path: str, version: int, actions: list[dict[str, Any]]) -> None:
    with open(commit_file(path, version), "x") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


def mtime_ms(path: str, version: int) -> int:
    return os.stat(commit_file(path, version)).st_mtime_ns // 1_000_000


def pin_commit_times(path: str, times: list[dt.datetime]) -> None:
    for version, when in enumerate(times):
        seconds = when.timestamp()
        os.utime(commit_file(path, version), (seconds, seconds))


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).replace(tzinfo=None)


def dml_history(path: str) -> None:
    """v0 create (4 rows, partitioned), v1 DELETE, v2 UPDATE, v3 MERGE, v4 overwrite."""
    write_deltalake(path, people([1, 2, 3, 4], ["a", "a", "b", "b"]), partition_by=["p"],
                    configuration=CDF)  # fmt: skip
    table = DeltaTable(path)
    table.delete("id = 1")
    table.update(predicate="id = 3", updates={"v": "33"})
    source = people([2, 5], ["a", "b"], [22, 50])
    (
        table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(path, people([9], ["a"], [90]), mode="overwrite")


DML_CHANGES: list[Row] = sorted(
    [
        (1, "a", 10, "insert", 0),
        (2, "a", 20, "insert", 0),
        (3, "b", 30, "insert", 0),
        (4, "b", 40, "insert", 0),
        (1, "a", 10, "delete", 1),
        (3, "b", 30, "update_preimage", 2),
        (3, "b", 33, "update_postimage", 2),
        (2, "a", 20, "update_preimage", 3),
        (2, "a", 22, "update_postimage", 3),
        (5, "b", 50, "insert", 3),
        # The overwrite has no cdc files: its removes are deletes, its add an insert.
        (2, "a", 22, "delete", 4),
        (3, "b", 33, "delete", 4),
        (4, "b", 40, "delete", 4),
        (5, "b", 50, "delete", 4),
        (9, "a", 90, "insert", 4),
    ]
)


# ---- batch -------------------------------------------------------------------------------


def test_delete_update_merge_overwrite_match_delta_rs(spark, table_path) -> None:
    path = table_path()
    dml_history(path)
    df = changes(spark, path, startingVersion=0)
    assert df.columns == ["id", "p", "v", "_change_type", "_commit_version", "_commit_timestamp"]
    assert dict(df.dtypes)["_commit_timestamp"] == "timestamp"
    assert change_rows(df) == DML_CHANGES
    assert change_rows(df) == delta_rs_rows(path, 0)

    # A sub-range, filters and projections (Spark applies them after the source).
    middle = changes(spark, path, startingVersion=1, endingVersion=3)
    assert change_rows(middle) == [r for r in DML_CHANGES if 1 <= r[4] <= 3]
    assert change_rows(middle) == delta_rs_rows(path, 1, 3)
    updates = middle.where("_change_type LIKE 'update%' AND p = 'b'").select("id", "v")
    assert sorted(tuple(r) for r in updates.collect()) == [(3, 30), (3, 33)]


def test_commit_timestamps_are_the_commit_files_times_made_increasing(spark, table_path) -> None:
    path = table_path()
    write_deltalake(path, people([1]), configuration=CDF)
    write_deltalake(path, people([2]), mode="append")
    write_deltalake(path, people([3]), mode="append")
    base = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    # Version 2's file time goes backwards: delta-spark reports previous + 1 ms.
    pin_commit_times(path, [base, base + dt.timedelta(seconds=5), base + dt.timedelta(seconds=1)])
    df = changes(spark, path, startingVersion=0)
    got = sorted((r.id, r._commit_version, r._commit_timestamp) for r in df.collect())
    first, second = int(base.timestamp() * 1000), int(base.timestamp() * 1000) + 5000
    assert got == [(1, 0, utc(first)), (2, 1, utc(second)), (3, 2, utc(second + 1))]


def test_timestamp_bounds_resolve_like_delta_spark(spark, table_path) -> None:
    path = table_path()
    for i in range(4):
        write_deltalake(path, people([i]), mode="append", configuration=CDF)
    base = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    pin_commit_times(path, [base + dt.timedelta(minutes=10 * v) for v in range(4)])

    def versions(**options: str) -> list[int]:
        return sorted({r._commit_version for r in changes(spark, path, **options).collect()})

    # Start: the first commit at or after; end: the last commit at or before.
    assert versions(startingTimestamp="2024-05-01 00:05:00") == [1, 2, 3]
    assert versions(startingTimestamp="2024-05-01 00:10:00") == [1, 2, 3]
    assert versions(startingVersion="0", endingTimestamp="2024-05-01T00:25:00Z") == [0, 1, 2]
    assert versions(startingTimestamp="2024-04-01", endingTimestamp="2024-05-01 00:00:00") == [0]
    # Both between the same two commits: empty, not an error.
    between = {"startingTimestamp": "2024-05-01 00:11:00", "endingTimestamp": "2024-05-01 00:12"}
    assert versions(**between) == []
    with pytest.raises(VersionNotFoundError) as caught:
        changes(spark, path, startingTimestamp="2024-05-02")
    assert caught.value.latest == 3
    with pytest.raises(VersionNotFoundError):
        changes(spark, path, startingVersion=0, endingTimestamp="2024-05-02")
    with pytest.raises(InvalidOptionError) as bad:
        changes(spark, path, startingTimestamp="yesterday-ish")
    assert bad.value.option == "startingTimestamp"


def test_range_errors(spark, table_path) -> None:
    path = table_path()
    write_deltalake(path, people([1, 2]))  # change data feed off
    write_deltalake(path, people([3]), mode="append")
    DeltaTable(path).alter.set_table_properties(CDF)  # version 2 turns it on
    write_deltalake(path, people([4]), mode="append")

    with pytest.raises(ChangeDataNotRecordedError) as caught:
        changes(spark, path, startingVersion=0)
    assert (caught.value.version, caught.value.start, caught.value.end) == (0, 0, 3)
    assert "change data was not recorded for version [0]" in str(caught.value)
    assert change_rows(changes(spark, path, startingVersion=2)) == [(4, "a", 40, "insert", 3)]

    with pytest.raises(VersionNotFoundError) as after:
        changes(spark, path, startingVersion=7)
    assert (after.value.version, after.value.latest) == (7, 3)
    # An ending version past the latest is clamped, as in delta-spark.
    assert change_rows(changes(spark, path, startingVersion=3, endingVersion=99)) == [
        (4, "a", 40, "insert", 3)
    ]
    for options, option in [
        ({}, "startingVersion"),
        ({"startingVersion": "3", "endingVersion": "2"}, "endingVersion"),
        ({"startingVersion": "-1"}, "startingVersion"),
        ({"startingVersion": "latest"}, "startingVersion"),
        ({"startingVersion": "0", "readChangeFeed": "yes"}, "readChangeFeed"),
    ]:
        with pytest.raises(InvalidOptionError) as bad:
            changes(spark, path, **options)
        assert bad.value.option == option


def test_feed_turned_off_inside_the_range(spark, table_path) -> None:
    path = table_path()
    write_deltalake(path, people([1]), configuration=CDF)
    DeltaTable(path).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})
    write_deltalake(path, people([2]), mode="append")
    with pytest.raises(ChangeDataNotRecordedError) as caught:
        changes(spark, path, startingVersion=0)
    assert caught.value.version == 1
    assert change_rows(changes(spark, path, startingVersion=0, endingVersion=0)) == [
        (1, "a", 10, "insert", 0)
    ]


def test_vacuumed_files_fail_typed_naming_the_version(spark, table_path) -> None:
    path = table_path()
    write_deltalake(path, people([1, 2]), configuration=CDF)
    write_deltalake(path, people([3]), mode="overwrite")  # removes without cdc files
    write_deltalake(path, people([4]), mode="append")
    removed = next(
        a["remove"]["path"]
        for a in map(json.loads, Path(commit_file(path, 1)).read_text().splitlines())
        if "remove" in a
    )
    # Planned while the file exists: the executor finds it gone and fails typed too.
    planned = changes(spark, path, startingVersion=1)
    os.remove(os.path.join(path, removed))
    with pytest.raises(Exception) as remote:
        planned.collect()
    error = unpack_remote_error(remote.value)
    assert isinstance(error, ChangeDataFilesMissingError)
    assert (error.version, error.path) == (1, removed)

    # Checked on the driver when the read is made: the first version needing the file.
    with pytest.raises(ChangeDataFilesMissingError) as caught:
        changes(spark, path, startingVersion=0)
    assert (caught.value.version, caught.value.path) == (0, removed)
    with pytest.raises(ChangeDataFilesMissingError) as caught:
        changes(spark, path, startingVersion=1)
    assert (caught.value.version, caught.value.path) == (1, removed)
    assert "VACUUM" in str(caught.value)
    # A later range does not need the file.
    assert change_rows(changes(spark, path, startingVersion=2)) == [(4, "a", 40, "insert", 2)]


def test_delta_spark_style_log(spark, table_path) -> None:
    """Commits as delta-spark writes them: cdc files under _change_data/<partition dirs>,
    _change_type inside the file, an OPTIMIZE (dataChange=false), a MERGE that changed
    nothing, and in-commit timestamps."""
    path = table_path()
    os.makedirs(os.path.join(path, "a=x"))
    os.makedirs(os.path.join(path, "_change_data", "a=x"))
    os.makedirs(os.path.join(path, "_delta_log"))
    schema = {
        "type": "struct",
        "fields": [
            {"name": "k", "type": "integer", "nullable": True, "metadata": {}},
            {"name": "a", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
    pq.write_table(pa.table({"k": pa.array([1, 2], pa.int32())}), f"{path}/a=x/f0.parquet")
    pq.write_table(pa.table({"k": pa.array([2], pa.int32())}), f"{path}/a=x/f1.parquet")
    pq.write_table(pa.table({"k": pa.array([2], pa.int32())}), f"{path}/a=x/f2.parquet")
    pq.write_table(
        pa.table(
            {
                "k": pa.array([1, 2, 2], pa.int32()),
                "_change_type": ["delete", "update_preimage", "update_postimage"],
            }
        ),
        f"{path}/_change_data/a=x/cdc-0.parquet",
    )

    def add(name: str, data_change: bool = True) -> dict[str, Any]:
        size = os.path.getsize(f"{path}/a=x/{name}")
        return {"add": {"path": f"a%3Dx/{name}".replace("%3D", "="), "size": size,
                        "partitionValues": {"a": "x"}, "modificationTime": 0,
                        "dataChange": data_change}}  # fmt: skip

    def remove(name: str, data_change: bool = True) -> dict[str, Any]:
        return {"remove": {"path": f"a=x/{name}", "dataChange": data_change,
                           "partitionValues": {"a": "x"}, "size": 1}}  # fmt: skip

    def info(operation: str, ict: int, **metrics: str) -> dict[str, Any]:
        return {"commitInfo": {"timestamp": 1, "inCommitTimestamp": ict, "operation": operation,
                               "operationMetrics": metrics}}  # fmt: skip

    write_commit(path, 0, [
        info("CREATE TABLE AS SELECT", 1_700_000_000_000),
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}},
        {"metaData": {"id": "tbl", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": ["a"],
                      "configuration": {**CDF, "delta.enableInCommitTimestamps": "true"}}},
        add("f0.parquet"),
    ])  # fmt: skip
    cdc_size = os.path.getsize(f"{path}/_change_data/a=x/cdc-0.parquet")
    write_commit(path, 1, [
        info("MERGE", 1_700_000_001_000, numTargetRowsUpdated="1", numTargetRowsDeleted="1",
             numTargetRowsInserted="0"),
        remove("f0.parquet"),
        add("f1.parquet"),
        {"cdc": {"path": "_change_data/a=x/cdc-0.parquet", "partitionValues": {"a": "x"},
                 "size": cdc_size, "dataChange": False}},
    ])  # fmt: skip
    write_commit(path, 2, [info("OPTIMIZE", 1_700_000_002_000), remove("f1.parquet", False),
                           add("f2.parquet", False)])  # fmt: skip
    write_commit(path, 3, [
        info("MERGE", 1_700_000_003_000, numTargetRowsUpdated="0", numTargetRowsDeleted="0",
             numTargetRowsInserted="0"),
        remove("f2.parquet"),
        add("f1.parquet"),
    ])  # fmt: skip

    df = changes(spark, path, startingVersion=0)
    got = sorted((r.k, r.a, r._change_type, r._commit_version, r._commit_timestamp)
                 for r in df.collect())  # fmt: skip
    t0, t1 = utc(1_700_000_000_000), utc(1_700_000_001_000)
    assert got == [
        (1, "x", "delete", 1, t1),
        (1, "x", "insert", 0, t0),
        (2, "x", "insert", 0, t0),
        (2, "x", "update_postimage", 1, t1),
        (2, "x", "update_preimage", 1, t1),
    ]


def test_deletion_vectors_give_only_the_newly_deleted_rows(spark, table_path) -> None:
    path = table_path()
    write_deltalake(path, people(list(range(10))), configuration=CDF)
    data_file = pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path")[0]
    add_deletion_vectors(path, {data_file.as_py(): [1, 3]})  # v1
    add_deletion_vectors(path, {data_file.as_py(): [3, 4, 8]})  # v2: 4 and 8 are new
    got = change_rows(changes(spark, path, startingVersion=1))
    assert got == [(1, "a", 10, "delete", 1), (3, "a", 30, "delete", 1),
                   (4, "a", 40, "delete", 2), (8, "a", 80, "delete", 2)]  # fmt: skip
    # An overwrite afterwards deletes exactly the rows still alive.
    write_deltalake(path, people([99]), mode="overwrite")
    got = change_rows(changes(spark, path, startingVersion=3))
    alive = [i for i in range(10) if i not in (1, 3, 4, 8)]
    assert got == sorted([(i, "a", i * 10, "delete", 3) for i in alive] +
                         [(99, "a", 990, "insert", 3)])  # fmt: skip


def test_column_mapped_table(spark, table_path) -> None:
    path = table_path()
    arrow_schema = pa.schema([("id", pa.int64()), ("Mixed Case", pa.string())])
    DeltaTable.create(
        path,
        schema=Schema.from_arrow(arrow_schema),
        configuration={**CDF, "delta.columnMapping.mode": "name"},
    )
    data = pa.table({"id": [1, 2], "Mixed Case": ["x", "y"]}, schema=arrow_schema)
    write_deltalake(path, data, mode="append")
    DeltaTable(path).delete("id = 1")
    df = changes(spark, path, startingVersion=0)
    assert df.columns[:2] == ["id", "Mixed Case"]
    got = sorted((r.id, r["Mixed Case"], r._change_type, r._commit_version) for r in df.collect())
    assert got == [(1, "x", "delete", 2), (1, "x", "insert", 1), (2, "y", "insert", 1)]


def test_appends_with_version_as_of_pin_the_latest(spark, table_path) -> None:
    path = table_path()
    schema = "id long, p string, v long"
    writer = spark.createDataFrame([(1, "a", 10)], schema).write.format("delta")
    writer.option("delta.enableChangeDataFeed", "true").save(path)
    for i in (2, 3):
        spark.createDataFrame([(i, "a", i * 10)], schema).write.format("delta").mode("append").save(
            path
        )
    assert change_rows(changes(spark, path, startingVersion=0, versionAsOf=1)) == [
        (1, "a", 10, "insert", 0),
        (2, "a", 20, "insert", 1),
    ]
    assert change_rows(changes(spark, path, startingVersion=0)) == delta_rs_rows(path, 0)


# ---- streaming ---------------------------------------------------------------------------


def run_stream(spark: Any, source: str, target: str, checkpoint: str, **options: str) -> Any:
    reader = spark.readStream.format("delta").option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return query


def target_rows(path: str) -> list[Row]:
    table = DeltaTable(path).to_pyarrow_table()
    names = ("id", "p", "v", "_change_type", "_commit_version")
    return sorted(zip(*(table.column(n).to_pylist() for n in names), strict=True))


@pytest.mark.slow
def test_stream_snapshot_then_changes_exactly_once_across_restart(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    write_deltalake(source, people([1, 2, 3, 4], ["a", "a", "b", "b"]), partition_by=["p"],
                    configuration=CDF)  # fmt: skip
    write_deltalake(source, people([5], ["b"]), mode="append")
    run_stream(spark, source, target, checkpoint)
    # The initial snapshot arrives as inserts at the snapshot's version.
    assert target_rows(target) == [(i, p, i * 10, "insert", 1)
                                   for i, p in [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "b")]]  # fmt: skip  # noqa: E501

    table = DeltaTable(source)
    table.delete("id = 1")  # v2
    table.update(predicate="id = 3", updates={"v": "33"})  # v3
    query = run_stream(spark, source, target, checkpoint)
    new = [r for r in target_rows(target) if r[4] > 1]
    assert new == [(1, "a", 10, "delete", 2), (3, "b", 30, "update_preimage", 3),
                   (3, "b", 33, "update_postimage", 3)]  # fmt: skip
    assert sum(p["numInputRows"] for p in query.recentProgress) == 3
    assert new == [r for r in delta_rs_rows(source, 2)]

    query = run_stream(spark, source, target, checkpoint)  # nothing new: nothing twice
    assert len(target_rows(target)) == 8


def test_stream_starting_version_and_max_files_admit_whole_commits(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    write_deltalake(source, people([1]), configuration=CDF)
    write_deltalake(source, people([2, 3]), mode="append")
    write_deltalake(source, people([4]), mode="overwrite")  # v2: 2 removes + 1 add, no cdc
    write_deltalake(source, people([5]), mode="append")  # v3
    query = run_stream(spark, source, target, checkpoint, startingVersion="1",
                       maxFilesPerTrigger="1")  # fmt: skip
    assert target_rows(target) == sorted([
        (2, "a", 20, "insert", 1), (3, "a", 30, "insert", 1),
        (1, "a", 10, "delete", 2), (2, "a", 20, "delete", 2), (3, "a", 30, "delete", 2),
        (4, "a", 40, "insert", 2), (5, "a", 50, "insert", 3),
    ])  # fmt: skip
    # One commit per batch: version 2's three files were not split.
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [2, 4, 1]


def test_stream_fails_typed_when_the_feed_is_off(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    write_deltalake(source, people([1]))
    with pytest.raises(Exception) as caught:
        run_stream(spark, source, target, checkpoint)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, ChangeDataNotRecordedError) and error.version == 0
    shutil.rmtree(checkpoint, ignore_errors=True)
