"""DELETE / UPDATE / MERGE on tables with ``delta.enableDeletionVectors=true``.

Rows are marked deleted in deletion vectors instead of files being rewritten. Each
test checks the rows (deltaflow, delta-rs and Polars readers), the log (adds carry a
``deletionVector``, file counts), and where it applies the change data feed.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import QueryBuilder
from deltalake.exceptions import DeltaProtocolError

from deltaflow import ConcurrentWriteError, DeltaTable
from deltaflow.spark.dml import _delete_update, _target_scan

DV = {"delta.enableDeletionVectors": "true"}
CDF = {"delta.enableChangeDataFeed": "true"}


def _make(spark: Any, path: str, *, conf: dict[str, str] | None = None, files: int = 2) -> str:
    """ids 0..19, kind 'a' (even) / 'b' (odd), value = id * 10, in ``files`` files."""
    df = spark.createDataFrame(
        [(i, "a" if i % 2 == 0 else "b", i * 10) for i in range(20)],
        "id long, kind string, value long",
    ).repartition(files, "id")
    writer = df.write.format("delta")
    for key, value in (conf or DV).items():
        writer = writer.option(key, value)
    writer.save(path)
    return path


def _actions(path: str, version: int) -> list[dict[str, Any]]:
    name = os.path.join(path, "_delta_log", f"{version:020d}.json")
    with open(name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _rows(spark: Any, path: str, **options: Any) -> list[tuple[Any, ...]]:
    reader = spark.read.format("delta")
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted(tuple(r) for r in reader.load(path).select("id", "kind", "value").collect())


def _rs_rows(path: str) -> list[tuple[Any, ...]]:
    """The rows as delta-rs's DataFusion reader (QueryBuilder) sees them: it applies
    deletion vectors; ``to_pyarrow_table`` refuses such tables instead."""
    result = QueryBuilder().register("t", RsTable(path)).execute("SELECT id, kind, value FROM t")
    table = pa.table(result.read_all())
    return sorted(zip(*(table.column(c).to_pylist() for c in ("id", "kind", "value")), strict=True))


def _expected(keep: Callable[[int], bool], change: Callable[[int], int] | None = None) -> list:
    out = []
    for i in range(20):
        if not keep(i):
            continue
        value = change(i) if change is not None else i * 10
        out.append((i, "a" if i % 2 == 0 else "b", value))
    return sorted(out)


def test_new_table_protocol_lists_exactly_deletion_vectors(spark, table_path) -> None:
    path = _make(spark, table_path())
    protocol = next(a["protocol"] for a in _actions(path, 0) if "protocol" in a)
    assert protocol == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors"],
    }
    assert len(_rows(spark, path)) == 20


def test_catalog_create_protocol_lists_exactly_deletion_vectors(spark, table_path) -> None:
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, kind STRING) USING delta"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    protocol = next(a["protocol"] for a in _actions(path, 0) if "protocol" in a)
    assert protocol["readerFeatures"] == ["deletionVectors"]
    assert protocol["writerFeatures"] == ["deletionVectors"]


def test_delete_marks_rows_in_deletion_vectors(spark, table_path) -> None:
    path = _make(spark, table_path())
    before = len(RsTable(path).file_uris())
    DeltaTable.forPath(spark, path).delete("id % 5 = 0")

    expected = _expected(lambda i: i % 5 != 0)
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected
    polars = pl.read_delta(path).select("id", "kind", "value").sort("id").rows()
    assert sorted(polars) == expected
    assert len(RsTable(path).file_uris()) == before  # no file rewritten
    actions = _actions(path, 1)
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert adds and len(adds) == len(removes)
    assert {a["path"] for a in adds} == {r["path"] for r in removes}
    for add in adds:
        assert add["deletionVector"]["storageType"] == "u"
        stats = json.loads(add["stats"])
        assert stats["numRecords"] > add["deletionVector"]["cardinality"]
    assert glob.glob(os.path.join(path, "deletion_vector_*.bin"))
    with pytest.raises(DeltaProtocolError):  # delta-rs's pyarrow reader refuses DVs
        RsTable(path).to_pyarrow_table()
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operationMetrics"]["numDeletedRows"] == "4"
    assert int(info["operationMetrics"]["numDeletionVectorsAdded"]) == len(adds)
    # Time travel to before the delete still sees every row.
    assert len(_rows(spark, path, versionAsOf=0)) == 20


def test_second_delete_merges_with_the_existing_vector(spark, table_path) -> None:
    path = _make(spark, table_path(), files=1)
    table = DeltaTable.forPath(spark, path)
    table.delete("id < 3")
    table.delete("id > 16")
    assert _rows(spark, path) == _expected(lambda i: 3 <= i <= 16)
    assert _rs_rows(path) == _expected(lambda i: 3 <= i <= 16)
    add = next(a["add"] for a in _actions(path, 2) if "add" in a)
    remove = next(a["remove"] for a in _actions(path, 2) if "remove" in a)
    assert add["deletionVector"]["cardinality"] == 6
    assert remove["deletionVector"]["cardinality"] == 3
    # A delete of every remaining row removes the file outright.
    table.delete("id >= 0")
    actions = _actions(path, 3)
    assert not [a for a in actions if "add" in a]
    assert len([a for a in actions if "remove" in a]) == 1
    assert _rows(spark, path) == []


def test_delete_with_python_scan(spark, table_path) -> None:
    path = _make(spark, table_path(), files=1)
    spark.conf.set(_target_scan.NATIVE_SCAN_CONF, "false")
    try:
        table = DeltaTable.forPath(spark, path)
        table.delete("id = 4")
        table.delete("kind = 'b' AND id < 10")
    finally:
        spark.conf.unset(_target_scan.NATIVE_SCAN_CONF)
    expected = _expected(lambda i: i != 4 and not (i % 2 == 1 and i < 10))
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected


def test_update_marks_old_rows_and_adds_only_new_ones(spark, table_path) -> None:
    path = _make(spark, table_path(), files=1)
    DeltaTable.forPath(spark, path).update("id < 4", {"value": "value + 1"})
    expected = _expected(lambda i: True, lambda i: i * 10 + (1 if i < 4 else 0))
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected
    actions = _actions(path, 1)
    adds = [a["add"] for a in actions if "add" in a]
    with_dv = [a for a in adds if "deletionVector" in a]
    new = [a for a in adds if "deletionVector" not in a]
    assert len(with_dv) == 1 and with_dv[0]["deletionVector"]["cardinality"] == 4
    assert sum(json.loads(a["stats"])["numRecords"] for a in new) == 4  # nothing copied
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operationMetrics"]["numCopiedRows"] == "0"


def test_change_data_feed_of_dv_delete_and_update(spark, table_path) -> None:
    path = _make(spark, table_path(), conf={**DV, **CDF}, files=1)
    table = DeltaTable.forPath(spark, path)
    table.delete("id IN (1, 2)")
    table.update("id = 3", {"value": "0"})
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(path)
        .select("id", "value", "_change_type", "_commit_version")
        .collect()
    )
    assert sorted(tuple(r) for r in changes) == [
        (1, 10, "delete", 1),
        (2, 20, "delete", 1),
        (3, 0, "update_postimage", 2),
        (3, 30, "update_preimage", 2),
    ]
    assert [a for a in _actions(path, 1) if "cdc" in a]


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the delta-rs route rewrites files instead
def test_merge_with_deletion_vectors(spark, table_path) -> None:
    path = _make(spark, table_path(), files=1)
    source = spark.createDataFrame(
        [(2, "a", -2), (3, "b", None), (100, "c", 1000)], "id long, kind string, value long"
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.value IS NULL")
        .whenMatchedUpdate(set={"value": "s.value"})
        .whenNotMatchedInsertAll()
        .execute()
    )
    expected = sorted(
        [r for r in _expected(lambda i: i != 3, lambda i: -2 if i == 2 else i * 10)]
        + [(100, "c", 1000)]
    )
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected
    adds = [a["add"] for a in _actions(path, 1) if "add" in a]
    marked = [a for a in adds if "deletionVector" in a]
    assert len(marked) == 1 and marked[0]["deletionVector"]["cardinality"] == 2
    new_rows = sum(json.loads(a["stats"])["numRecords"] for a in adds if a not in marked)
    assert new_rows == 2  # the updated row and the inserted one


def test_concurrent_deletes_of_one_file_conflict(spark, table_path, monkeypatch) -> None:
    path = _make(spark, table_path(), files=1)
    table = DeltaTable.forPath(spark, path)
    real_commit = _delete_update.commit
    raced = []

    def racing(request):  # another DELETE of the same file lands first
        if not raced:
            raced.append(True)
            monkeypatch.setattr(_delete_update, "commit", real_commit)
            table.delete("id = 7")
        return real_commit(request)

    monkeypatch.setattr(_delete_update, "commit", racing)
    with pytest.raises(ConcurrentWriteError) as caught:
        table.delete("id = 8")
    # The winner re-added the file with its new DV (dataChange=true): delta-spark's order
    # of checks finds that add first, in the unpartitioned table this DELETE read.
    assert caught.value.kind == "ConcurrentAppend"
    assert _rows(spark, path) == _expected(lambda i: i != 7)


def test_optimize_compacts_files_with_deletion_vectors(spark, table_path) -> None:
    # delta-rs 1.6's compaction, which OPTIMIZE runs, drops deleted rows when it
    # rewrites a file and names the DVs in its removes.
    path = _make(spark, table_path(), files=2)
    table = DeltaTable.forPath(spark, path)
    table.delete("id % 5 = 0")
    table.optimize().executeCompaction()
    expected = _expected(lambda i: i % 5 != 0)
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected
    live = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pydict()
    assert len(live["path"]) == 1
    assert sum(live["num_records"]) == len(expected)  # the new file holds live rows only


def test_stream_source_fails_on_dv_delete_unless_told(spark, table_path, tmp_path) -> None:
    from pyspark.errors import StreamingQueryException

    from deltaflow import typed_error
    from deltaflow.spark.errors import ChangeCommitError

    path = _make(spark, table_path(), files=1)
    DeltaTable.forPath(spark, path).delete("id = 1")

    def run(**options: str) -> tuple[Any, str]:
        reader = spark.readStream.format("delta")
        for k, v in options.items():
            reader = reader.option(k, v)
        name = "dv_" + "_".join(options) if options else "dv_plain"
        query = (
            reader.load(path)
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        return query, name

    # Starting after the delete: the initial snapshot already lacks the row.
    query, name = run()
    assert query.awaitTermination(120)
    assert spark.table(name).count() == 19
    # Reading from version 0 meets the DV delete (a data change), as delta-spark does.
    query, _ = run(startingVersion="0")
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    assert isinstance(typed_error(caught.value), ChangeCommitError)
    query, name = run(startingVersion="0", skipChangeCommits="true")
    assert query.awaitTermination(120)
    assert spark.table(name).count() == 20


def test_reorg_purge_rewrites_files_without_deleted_rows(spark, table_path) -> None:
    path = _make(spark, table_path(), files=2)
    DeltaTable.forPath(spark, path).delete("id % 3 = 0")
    row = spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)").collect()[0]
    assert row["metrics"]["numFilesRemoved"] == 2
    expected = _expected(lambda i: i % 3 != 0)
    assert _rows(spark, path) == expected
    assert _rs_rows(path) == expected
    actions = _actions(path, 2)
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert adds and all(not a["dataChange"] and "deletionVector" not in a for a in adds)
    assert len(removes) == 2 and all(r["deletionVector"] for r in removes)
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == len(expected)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "REORG"
    # Nothing left to purge: no commit.
    spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)").collect()
    assert RsTable(path).version() == 2


def test_reorg_where_names_partition_columns_only(spark, table_path) -> None:
    from deltaflow import InvalidOptionError

    path = _make(spark, table_path(), files=1)
    DeltaTable.forPath(spark, path).delete("id = 1")
    with pytest.raises(InvalidOptionError) as caught:
        spark.sql(f"REORG TABLE delta.`{path}` WHERE id > 3 APPLY (PURGE)").collect()
    assert caught.value.option == "where"
    assert RsTable(path).version() == 1


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("REORG TABLE t", "APPLY"),
        ("REORG TABLE t APPLY (UPGRADE UNIFORM(ICEBERG_COMPAT_VERSION=2))", "PURGE"),
        ("REORG TABLE t WHERE APPLY (PURGE)", "a partition predicate"),
    ],
)
def test_reorg_syntax_errors(spark, statement, expected) -> None:
    from deltaflow import typed_error
    from deltaflow.spark.errors import SqlSyntaxError

    with pytest.raises(Exception) as caught:
        spark.sql(statement)
    error = typed_error(caught.value)
    assert isinstance(error, SqlSyntaxError), caught.value
    assert error.expected == expected
