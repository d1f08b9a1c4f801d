"""Table operations on ``s3://`` tables against a real S3 server (SeaweedFS): time travel,
DML with the change data feed and deletion vectors, change feed reads, maintenance, and
the SQL forms. One Spark session and one server for the module (tests/conftest.py).

Every table written here must read back the same through delta-rs with the same settings.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import QueryBuilder

from deltaflow.tables import DeltaTable

pytestmark = pytest.mark.slow

DV = {"delta.enableDeletionVectors": "true"}
CDF = {"delta.enableChangeDataFeed": "true"}


def _make(spark: Any, uri: str, conf: dict[str, str] | None = None, files: int = 1) -> str:
    """ids 0..9, kind 'a' (even) / 'b' (odd), value = id * 10."""
    df = spark.createDataFrame(
        [(i, "a" if i % 2 == 0 else "b", i * 10) for i in range(10)],
        "id long, kind string, value long",
    ).repartition(files, "id")
    writer = df.write.format("delta")
    for key, value in (conf or {}).items():
        writer = writer.option(key, value)
    writer.save(uri)
    return uri


def _rows(spark: Any, uri: str, **options: Any) -> list[tuple[Any, ...]]:
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted(tuple(r) for r in reader.load(uri).select("id", "kind", "value").collect())


def _rs_rows(store: Any, uri: str) -> list[tuple[Any, ...]]:
    """The rows as delta-rs's DataFusion reader sees them (it applies deletion vectors)."""
    table = RsTable(uri, storage_options=store.storage_options)
    result = QueryBuilder().register("t", table).execute("SELECT id, kind, value FROM t")
    data = pa.table(result.read_all())
    return sorted(zip(*(data.column(c).to_pylist() for c in ("id", "kind", "value")), strict=True))


def _actions(store: Any, uri: str, version: int) -> list[dict[str, Any]]:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=store.env["AWS_ACCESS_KEY_ID"],
        secret_key=store.env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=store.endpoint,
        region=store.env["AWS_REGION"],
    )
    with fs.open_input_stream(f"{uri.removeprefix('s3://')}/_delta_log/{version:020d}.json") as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def _expected(keep: Any = lambda i: True, change: Any = None) -> list[tuple[Any, ...]]:
    rows = []
    for i in range(10):
        if keep(i):
            rows.append((i, "a" if i % 2 == 0 else "b", change(i) if change else i * 10))
    return sorted(rows)


def test_time_travel_by_version_and_timestamp(spark, object_store):
    uri = _make(spark, object_store.uri())
    spark.createDataFrame([(10, "a", 100)], "id long, kind string, value long").write.format(
        "delta"
    ).mode("append").save(uri)
    DeltaTable.forPath(spark, uri).delete("id < 5")
    assert _rows(spark, uri, versionAsOf=0) == _expected()
    assert _rows(spark, uri, versionAsOf=1) == [*_expected(), (10, "a", 100)]
    history = RsTable(uri, storage_options=object_store.storage_options).history()
    at_one = next(h for h in history if h["version"] == 1)["timestamp"]
    stamp = spark.sql(f"SELECT timestamp_millis({at_one}) AS t").first()["t"]
    assert _rows(spark, uri, timestampAsOf=str(stamp)) == [*_expected(), (10, "a", 100)]
    versioned = spark.sql(f"SELECT id, kind, value FROM delta.`{uri}` VERSION AS OF 0").collect()
    assert sorted(tuple(r) for r in versioned) == _expected()
    assert (
        _rows(spark, uri)
        == _rs_rows(object_store, uri)
        == [
            *_expected(lambda i: i >= 5),
            (10, "a", 100),
        ]
    )


def test_dml_with_the_change_data_feed(spark, object_store):
    uri = _make(spark, object_store.uri(), CDF)
    table = DeltaTable.forPath(spark, uri)
    table.delete("id IN (1, 2)")
    table.update("id = 3", {"value": "0"})
    source = spark.createDataFrame(
        [(4, "a", 44), (20, "b", 200)], "id long, kind string, value long"
    )
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    kept = _expected(lambda i: i not in (1, 2))
    expected = sorted([*((i, k, {3: 0, 4: 44}.get(i, v)) for i, k, v in kept), (20, "b", 200)])
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == expected
    assert [a for a in _actions(object_store, uri, 1) if "cdc" in a]  # _change_data files
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(uri)
        .select("id", "value", "_change_type", "_commit_version")
        .collect()
    )
    assert sorted(tuple(r) for r in changes) == [
        (1, 10, "delete", 1),
        (2, 20, "delete", 1),
        (3, 0, "update_postimage", 2),
        (3, 30, "update_preimage", 2),
        (4, 40, "update_preimage", 3),
        (4, 44, "update_postimage", 3),
        (20, 200, "insert", 3),
    ]
    # delta-rs reads the same change feed from the same files.
    rs = RsTable(uri, storage_options=object_store.storage_options)
    feed = pa.table(rs.load_cdf(starting_version=1).read_all())
    assert sorted(
        zip(feed.column("id").to_pylist(), feed.column("_change_type").to_pylist(), strict=True)
    ) == sorted((r[0], r[2]) for r in changes)


def test_dml_with_deletion_vectors(spark, object_store):
    uri = _make(spark, object_store.uri(), {**DV, **CDF})
    table = DeltaTable.forPath(spark, uri)
    table.delete("id IN (1, 2)")
    added = [a["add"] for a in _actions(object_store, uri, 1) if "add" in a]
    assert added and all(a.get("deletionVector") for a in added)  # no file rewritten
    table.update("id = 3", {"value": "0"})
    source = spark.createDataFrame([(5, "b", 55)], "id long, kind string, value long")
    table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedDelete().execute()
    expected = sorted(
        (i, k, 0 if i == 3 else v) for i, k, v in _expected(lambda i: i not in (1, 2, 5))
    )
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == expected
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(uri)
        .select("id", "_change_type")
        .collect()
    )
    assert sorted(tuple(r) for r in changes) == [
        (1, "delete"),
        (2, "delete"),
        (3, "update_postimage"),
        (3, "update_preimage"),
        (5, "delete"),
    ]
    # OPTIMIZE purges the vectors: every live file is whole again.
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    live = RsTable(uri, storage_options=object_store.storage_options).get_add_actions(flatten=True)
    assert pa.table(live).num_rows == 1
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == expected

    # A new vector on the compacted file; VACUUM with no retention deletes every vector
    # before it (no version inside the retention uses them) and keeps this live one.
    before = {f for f in _list(object_store, uri) if "deletion_vector_" in f}
    table.delete("id = 4")
    live_dvs = {f for f in _list(object_store, uri) if "deletion_vector_" in f} - before
    assert before and len(live_dvs) == 1
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert {f for f in _list(object_store, uri) if "deletion_vector_" in f} == live_dvs
    expected = [r for r in expected if r[0] != 4]
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == expected


def test_sql_dml_forms(spark, object_store):
    uri = _make(spark, object_store.uri(), CDF)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 0")
    spark.sql(f"UPDATE delta.`{uri}` SET value = -1 WHERE id = 1")
    spark.createDataFrame(
        [(2, "a", 22), (30, "a", 300)], "id long, kind string, value long"
    ).createOrReplaceTempView("s3_merge_source")
    spark.sql(
        f"MERGE INTO delta.`{uri}` AS t USING s3_merge_source AS s ON t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    expected = sorted(
        [
            *((i, k, -1 if i == 1 else 22 if i == 2 else v) for i, k, v in _expected(lambda i: i)),
            (30, "a", 300),
        ]
    )
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == expected
    changes = spark.sql(f"SELECT id, _change_type FROM table_changes('delta.`{uri}`', 1)")
    assert sorted(tuple(r) for r in changes.collect()) == [
        (0, "delete"),
        (1, "update_postimage"),
        (1, "update_preimage"),
        (2, "update_postimage"),
        (2, "update_preimage"),
        (30, "insert"),
    ]
    operations = [r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()]
    assert operations == ["MERGE", "UPDATE", "DELETE", "WRITE"]


def test_optimize_zorder_vacuum_restore_and_history(spark, object_store):
    uri = _make(spark, object_store.uri(), files=3)
    table = DeltaTable.forPath(spark, uri)
    table.delete("id = 9")  # version 1
    metrics = table.optimize().executeZOrderBy("value").first()  # version 2
    assert metrics is not None
    rs = RsTable(uri, storage_options=object_store.storage_options)
    assert len(rs.file_uris()) == 1
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == _expected(lambda i: i != 9)

    table.restoreToVersion(0)  # version 3
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == _expected()
    history = table.history().collect()
    assert [h["operation"] for h in history] == ["RESTORE", "OPTIMIZE", "DELETE", "WRITE"]

    # Restore to the compacted version, then VACUUM with no retention removes the files
    # no live version needs; the table still reads the same.
    table.restoreToVersion(2)  # version 4
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    parquet = [
        f for f in _list(object_store, uri) if f.endswith(".parquet") and "/_delta_log/" not in f
    ]
    assert len(parquet) == 1
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == _expected(lambda i: i != 9)


def _list(store: Any, uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=store.env["AWS_ACCESS_KEY_ID"],
        secret_key=store.env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=store.endpoint,
        region=store.env["AWS_REGION"],
    )
    root = uri.removeprefix("s3://")
    return [i.path for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))]


def test_alter_table_and_clustered_tables(spark, object_store):
    uri = _make(spark, object_store.uri())
    spark.sql(
        f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS (note STRING)")
    DeltaTable.forPath(spark, uri).delete("id = 0")
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 3)
        .load(uri)
        .select("id", "note", "_change_type")
        .collect()
    )
    assert [tuple(r) for r in changes] == [(0, None, "delete")]
    assert _rows(spark, uri) == _rs_rows(object_store, uri) == _expected(lambda i: i != 0)

    clustered = object_store.uri("clustered")
    spark.sql(
        f"CREATE TABLE delta.`{clustered}` (id BIGINT, kind STRING) USING delta CLUSTER BY (id)"
    )
    # (SQL INSERT INTO delta.`s3://...` does not reach the Python data path yet.)
    for rows in ([(2, "b"), (1, "a")], [(3, "c")]):
        frame = spark.createDataFrame(rows, "id long, kind string")
        frame.write.format("delta").mode("append").save(clustered)
    spark.sql(f"OPTIMIZE delta.`{clustered}`")
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{clustered}`").first()
    assert list(detail["clusteringColumns"]) == ["id"]
    rs = RsTable(clustered, storage_options=object_store.storage_options)
    assert len(rs.file_uris()) == 1
    rows = spark.read.format("delta").load(clustered).collect()
    assert sorted(tuple(r) for r in rows) == [(1, "a"), (2, "b"), (3, "c")]
