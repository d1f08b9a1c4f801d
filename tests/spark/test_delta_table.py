"""deltaflow.DeltaTable: every operation checked against expectations computed in Python."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F

import deltaflow
from deltaflow import ConcurrentWriteError, DeltaTable, TableNotFoundError
from deltaflow.spark.commands import _vacuum
from deltaflow.spark.dml import _delete_update
from deltaflow.spark.errors import RetentionTooShortError
from deltaflow.table.errors import UnsupportedFeatureError

COLUMNS = ("id", "kind", "value", "note")
# Three writes -> files: kind=a (ids 0-3), kind=b (ids 4-7), then kind=a (ids 8-9).
BATCHES = (
    [(0, "a", 1, "x"), (1, "a", None, "y"), (2, "a", 7, None), (3, "a", 9, "x")],
    [(4, "b", 2, "x"), (5, "b", 8, "y"), (6, "b", None, "z"), (7, "b", 3, "x")],
    [(8, "a", 5, "q"), (9, "a", 6, "r")],
)
ALL_ROWS = [r for batch in BATCHES for r in batch]


def _arrow(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "kind": pa.array([r[1] for r in rows], pa.string()),
            "value": pa.array([r[2] for r in rows], pa.int32()),
            "note": pa.array([r[3] for r in rows], pa.string()),
        }
    )


def _make(path: str, partitioned: bool = True) -> str:
    for batch in BATCHES:
        write_deltalake(
            path, _arrow(batch), mode="append", partition_by=["kind"] if partitioned else None
        )
    return path


def _rows(spark, path: str) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(path)
    return sorted(tuple(r) for r in df.select(*COLUMNS).collect())


def _file_paths(path: str) -> set[str]:
    return set(RsTable(path).file_uris())


def _last_commit(spark, path: str) -> dict[str, Any]:
    return DeltaTable.forPath(spark, path).history(1).collect()[0].asDict()


def _sort(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows)


# ---- construction and inspection -------------------------------------------------------


def test_for_path_for_name_and_is_delta_table(spark, table_path):
    path = _make(table_path())
    assert DeltaTable.isDeltaTable(spark, path)
    assert not DeltaTable.isDeltaTable(spark, table_path("missing"))
    with pytest.raises(TableNotFoundError):
        DeltaTable.forPath(spark, table_path("missing"))

    table = DeltaTable.forPath(spark, path)
    assert sorted(tuple(r) for r in table.toDF().select(*COLUMNS).collect()) == _sort(ALL_ROWS)
    aliased = table.alias("t").toDF().where("t.id < 2").select("t.id").collect()
    assert sorted(r.id for r in aliased) == [0, 1]

    spark.sql(f"CREATE TABLE dt_by_name USING delta LOCATION '{path}'")
    try:
        by_name = DeltaTable.forName(spark, "dt_by_name")
        assert by_name.toDF().count() == len(ALL_ROWS)
        # delta-spark names a catalog table by its qualified name
        assert by_name.detail().collect()[0].name == "spark_catalog.default.dt_by_name"
    finally:
        spark.sql("DROP TABLE dt_by_name")
    with pytest.raises(TableNotFoundError):
        DeltaTable.forName(spark, "no_such_table")


def test_history_and_detail(spark, table_path):
    path = _make(table_path())
    table = DeltaTable.forPath(spark, path)
    history = table.history().collect()
    assert [h.version for h in history] == [2, 1, 0]
    assert {h.operation for h in history} == {"WRITE"}
    assert history[0].operationParameters["mode"] == "Append"
    assert history[0].engineInfo.startswith("delta-rs")
    assert isinstance(history[0].timestamp, dt.datetime)
    assert [h.version for h in table.history(1).collect()] == [2]
    expected_columns = [
        "version", "timestamp", "userId", "userName", "operation", "operationParameters",
        "job", "notebook", "clusterId", "readVersion", "isolationLevel", "isBlindAppend",
        "operationMetrics", "userMetadata", "engineInfo",
    ]  # fmt: skip
    assert table.history().columns == expected_columns

    detail = table.detail().collect()[0]
    rs = RsTable(path)
    adds = pa.table(rs.get_add_actions(flatten=True)).to_pylist()
    assert detail.format == "delta"
    assert detail.id == rs.metadata().id
    assert detail.location == deltaflow_uri(path)
    assert detail.partitionColumns == ["kind"]
    assert detail.numFiles == len(adds) == 3
    assert detail.sizeInBytes == sum(a["size_bytes"] for a in adds)
    assert detail.minReaderVersion == rs.protocol().min_reader_version
    assert detail.minWriterVersion == rs.protocol().min_writer_version
    assert detail.lastModified >= detail.createdAt


def deltaflow_uri(path: str) -> str:
    return "file://" + os.path.abspath(path)


# ---- DELETE --------------------------------------------------------------------------


def test_delete_rewrites_only_touched_files(spark, table_path):
    path = _make(table_path())
    before = _file_paths(path)
    b_file = next(p for p in before if "kind=b" in p)
    DeltaTable.forPath(spark, path).delete("value > 6 AND kind = 'a'")

    expected = [r for r in ALL_ROWS if not (r[2] is not None and r[2] > 6 and r[1] == "a")]
    assert _rows(spark, path) == _sort(expected)
    after = _file_paths(path)
    assert b_file in after  # pruned by partition value: untouched
    # The kind=a file with ids 8-9 has max value 6: skipped by stats, untouched.
    assert len(before & after) == 2 and len(after - before) == 1

    commit = _last_commit(spark, path)
    assert commit["operation"] == "DELETE"
    assert commit["readVersion"] == 2
    metrics = commit["operationMetrics"]
    assert metrics["numDeletedRows"] == "2"
    assert metrics["numCopiedRows"] == "2"
    assert metrics["numRemovedFiles"] == "1"
    assert metrics["numAddedFiles"] == "1"
    assert json.loads(commit["operationParameters"]["predicate"]) == ["value > 6 AND kind = 'a'"]


def test_delete_null_semantics_column_condition_and_whole_files(spark, table_path):
    path = _make(table_path(), partitioned=False)
    table = DeltaTable.forPath(spark, path)
    table.delete(F.col("value") < 3)  # a Column; NULL values do not match
    expected = [r for r in ALL_ROWS if not (r[2] is not None and r[2] < 3)]
    assert _rows(spark, path) == _sort(expected)

    version = RsTable(path).version()
    table.delete("value > 100")  # matches nothing: no commit
    assert RsTable(path).version() == version

    files_before = _file_paths(path)
    table.delete("id >= 8")  # every row of the third file: removed without a rewrite
    expected = [r for r in expected if r[0] < 8]
    assert _rows(spark, path) == _sort(expected)
    assert _file_paths(path) < files_before
    metrics = _last_commit(spark, path)["operationMetrics"]
    assert (metrics["numDeletedRows"], metrics["numAddedFiles"]) == ("2", "0")

    table.delete()
    assert _rows(spark, path) == []
    assert _last_commit(spark, path)["operationMetrics"]["numDeletedRows"] == str(len(expected))


def test_delete_with_alias_and_sql_function(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).alias("t").delete("t.note = 'x' OR upper(t.note) = 'Y'")
    expected = [r for r in ALL_ROWS if r[3] not in ("x", "y")]
    assert _rows(spark, path) == _sort(expected)


# ---- UPDATE --------------------------------------------------------------------------


def test_update_sets_strings_and_columns_with_null_semantics(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).update(
        condition="value >= 5",
        set={"value": "value * 10", "note": F.concat(F.col("note"), F.lit("!"))},
    )
    expected = []
    for id_, kind, value, note in ALL_ROWS:
        if value is not None and value >= 5:
            value, note = value * 10, (None if note is None else note + "!")
        expected.append((id_, kind, value, note))
    assert _rows(spark, path) == _sort(expected)
    metrics = _last_commit(spark, path)["operationMetrics"]
    updated = sum(1 for r in ALL_ROWS if r[2] is not None and r[2] >= 5)
    assert metrics["numUpdatedRows"] == str(updated)
    # All three files hold a match: every other row of them is copied.
    assert metrics["numCopiedRows"] == str(len(ALL_ROWS) - updated)
    assert _last_commit(spark, path)["operation"] == "UPDATE"

    DeltaTable.forPath(spark, path).update(set={"note": "'all'"})  # no condition: every row
    assert _rows(spark, path) == _sort([(r[0], r[1], r[2], "all") for r in expected])


def test_update_partition_column_moves_rows(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).alias("t").update("t.id IN (0, 1, 9)", {"t.kind": "'c'"})
    expected = [(r[0], "c" if r[0] in (0, 1, 9) else r[1], r[2], r[3]) for r in ALL_ROWS]
    assert _rows(spark, path) == _sort(expected)
    adds = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    c_files = [a for a in adds if a["partition.kind"] == "c"]
    assert sum(a["num_records"] for a in c_files) == 3
    assert all("kind=c/" in a["path"] for a in c_files)
    # Partition pruning on the moved rows reads them from their new partition.
    moved = spark.read.format("delta").load(path).where("kind = 'c'").select("id").collect()
    assert sorted(r.id for r in moved) == [0, 1, 9]


def test_update_refuses_unknown_column_and_append_only(spark, table_path):
    path = _make(table_path())
    table = DeltaTable.forPath(spark, path)
    with pytest.raises(deltaflow.SchemaMismatchError) as info:
        table.update("id = 1", {"nope": "1"})
    assert info.value.columns == ("nope",)
    table.setProperties({"delta.appendonly": "true"})
    assert RsTable(path).metadata().configuration["delta.appendOnly"] == "true"
    with pytest.raises(UnsupportedFeatureError) as refused:
        table.delete("id = 1")
    assert refused.value.feature == "appendOnly"
    assert _rows(spark, path) == _sort(ALL_ROWS)


def test_dml_on_deltaflow_written_table_with_typed_columns(spark, table_path):
    path = table_path()
    rows = [
        (1, dt.datetime(2024, 1, 1, 12), dt.date(2024, 1, 1), decimal.Decimal("1.50")),
        (2, dt.datetime(2024, 1, 2, 12), dt.date(2024, 1, 2), decimal.Decimal("2.50")),
        (3, None, dt.date(2024, 1, 1), None),
    ]
    schema = "id long, ts timestamp, d date, amt decimal(10,2)"
    spark.createDataFrame(rows, schema).write.format("delta").partitionBy("d").save(path)
    table = DeltaTable.forPath(spark, path)
    table.update(
        "ts > '2024-01-01 13:00:00'",
        {"amt": "amt + 1", "ts": "ts + interval 1 day", "d": "date'2025-01-01'"},
    )
    table.delete("amt IS NULL")
    expected = [
        rows[0],
        (2, dt.datetime(2024, 1, 3, 12), dt.date(2025, 1, 1), decimal.Decimal("3.50")),
    ]
    got = sorted(tuple(r) for r in table.toDF().select("id", "ts", "d", "amt").collect())
    assert got == expected
    # Rewritten files carry stats, so other engines (and our pruning) can skip them.
    adds = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    moved = next(a for a in adds if a["partition.d"] == dt.date(2025, 1, 1))
    assert (moved["num_records"], moved["min.id"], moved["max.amt"]) == (
        1,
        2,
        decimal.Decimal("3.50"),
    )
    assert sorted(r["id"] for r in RsTable(path).to_pyarrow_table().to_pylist()) == [1, 2]


# ---- conflicts -----------------------------------------------------------------------


def _interleave(monkeypatch, concurrent) -> None:
    """Run ``concurrent`` (another writer) right before the DML commits."""
    original = _delete_update.commit

    def commit_after_concurrent_writer(request):
        concurrent()
        return original(request)

    monkeypatch.setattr(_delete_update, "commit", commit_after_concurrent_writer)


def test_delete_conflicts_with_concurrent_delete_of_a_file_it_read(spark, table_path, monkeypatch):
    path = _make(table_path())
    _interleave(monkeypatch, lambda: RsTable(path).delete("id <= 3"))  # the ids 0-3 file, whole
    with pytest.raises(ConcurrentWriteError) as info:
        DeltaTable.forPath(spark, path).delete("id = 3")
    assert info.value.kind == "ConcurrentDeleteRead"
    assert info.value.read_version == 2
    monkeypatch.undo()
    # The DELETE committed nothing and left no files behind in the log.
    assert _rows(spark, path) == _sort([r for r in ALL_ROWS if r[0] > 3])


def test_concurrent_rewrite_in_the_partition_read_is_concurrent_append(
    spark, table_path, monkeypatch
):
    # As delta-spark: new (non-blind) files in the partitions a DML reads are checked
    # before removed ones, so a concurrent partial DELETE reports ConcurrentAppend.
    path = _make(table_path())
    _interleave(monkeypatch, lambda: RsTable(path).delete("id = 0"))  # rewrites ids 0-3
    with pytest.raises(ConcurrentWriteError) as info:
        DeltaTable.forPath(spark, path).delete("kind = 'a' AND id = 3")
    assert info.value.kind == "ConcurrentAppend"
    monkeypatch.undo()
    assert _rows(spark, path) == _sort([r for r in ALL_ROWS if r[0] != 0])


def test_concurrent_rewrite_in_another_partition_does_not_fail_delete(
    spark, table_path, monkeypatch
):
    path = _make(table_path())
    _interleave(monkeypatch, lambda: RsTable(path).delete("id = 4"))  # rewrites kind=b
    DeltaTable.forPath(spark, path).delete("kind = 'a' AND id = 3")
    monkeypatch.undo()
    assert _rows(spark, path) == _sort([r for r in ALL_ROWS if r[0] not in (3, 4)])


def test_concurrent_blind_append_does_not_fail_delete(spark, table_path, monkeypatch):
    path = _make(table_path())
    appended = [(10, "b", 1, "new")]
    _interleave(
        monkeypatch,
        lambda: write_deltalake(path, _arrow(appended), mode="append", partition_by=["kind"]),
    )
    DeltaTable.forPath(spark, path).delete("id = 3")
    expected = [r for r in ALL_ROWS if r[0] != 3] + appended
    assert _rows(spark, path) == _sort(expected)


# ---- maintenance ---------------------------------------------------------------------


def test_vacuum_retention_check(spark, table_path):
    path = _make(table_path(), partitioned=False)
    table = DeltaTable.forPath(spark, path)
    table.delete("id < 4")  # removes the first file whole
    removed = {p for p in Path(path).glob("*.parquet")} - {
        Path(u.removeprefix("file://")) for u in RsTable(path).file_uris()
    }
    assert len(removed) == 1
    with pytest.raises(RetentionTooShortError) as info:
        table.vacuum(0)
    assert (info.value.retention_hours, info.value.minimum_hours) == (0.0, 168.0)
    table.vacuum()  # default retention: the file removed just now stays
    assert all(p.exists() for p in removed)

    spark.conf.set(_vacuum.RETENTION_CHECK_CONF, "false")
    try:
        result = table.vacuum(0)
    finally:
        spark.conf.unset(_vacuum.RETENTION_CHECK_CONF)
    assert result.columns == ["path"]
    assert not any(p.exists() for p in removed)
    assert _rows(spark, path) == _sort([r for r in ALL_ROWS if r[0] >= 4])


def test_restore_to_version_and_timestamp(spark, table_path):
    path = _make(table_path())
    table = DeltaTable.forPath(spark, path)
    table.delete("kind = 'b'")  # version 3
    result = table.restoreToVersion(1).collect()[0]
    assert _rows(spark, path) == _sort(BATCHES[0] + BATCHES[1])
    assert (result.num_of_files_after_restore, result.num_restored_files) == (2, 1)
    assert result.num_removed_files == 1  # the ids 8-9 file of version 2

    v2_time = next(h.timestamp for h in table.history().collect() if h.version == 2)
    table.restoreToTimestamp(v2_time.isoformat())
    assert _rows(spark, path) == _sort(ALL_ROWS)
    assert table.history(1).collect()[0].operation == "RESTORE"
    with pytest.raises(deltaflow.VersionNotFoundError):
        table.restoreToVersion(RsTable(path).version())


def test_optimize_compaction_with_partition_filter(spark, table_path):
    path = _make(table_path())
    b_file = next(p for p in _file_paths(path) if "kind=b" in p)
    metrics = DeltaTable.forPath(spark, path).optimize().where("kind = 'a'").executeCompaction()
    row = metrics.collect()[0].metrics
    assert (row.numFilesAdded, row.numFilesRemoved) == (1, 2)
    assert row.filesRemoved.totalFiles == 2
    assert _rows(spark, path) == _sort(ALL_ROWS)
    files = _file_paths(path)
    assert b_file in files and len(files) == 2
    log = Path(path) / "_delta_log" / f"{RsTable(path).version():020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    data_changes = [a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a]
    assert data_changes and not any(data_changes)  # streams ignore compaction

    with pytest.raises(deltaflow.InvalidOptionError):
        DeltaTable.forPath(spark, path).optimize().where("value > 1").executeCompaction()


def test_optimize_z_order(spark, table_path):
    path = _make(table_path(), partitioned=False)
    result = DeltaTable.forPath(spark, path).optimize().executeZOrderBy("value", "id")
    metrics = result.collect()[0].metrics
    assert (metrics.numFilesAdded, metrics.numFilesRemoved) == (1, 3)
    assert _rows(spark, path) == _sort(ALL_ROWS)
    assert len(_file_paths(path)) == 1


def test_set_properties(spark, table_path):
    path = _make(table_path())
    table = DeltaTable.forPath(spark, path)
    table.setProperties({"delta.logretentionduration": "interval 60 days", "team.owner": "ops"})
    properties = table.detail().collect()[0].properties
    assert properties["delta.logRetentionDuration"] == "interval 60 days"
    assert properties["team.owner"] == "ops"
    assert table.history(1).collect()[0].operation == "SET TBLPROPERTIES"


def test_retention_hours_parsing():
    assert _vacuum.retention_hours_of({}) == 168.0
    assert (
        _vacuum.retention_hours_of({"delta.deletedFileRetentionDuration": "interval 2 days"})
        == 48.0
    )
    assert (
        _vacuum.retention_hours_of({"delta.deletedFileRetentionDuration": "interval 1 week"})
        == 168.0
    )
