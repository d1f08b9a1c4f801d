"""SQL statements that name an ``s3://`` table by path (``delta.`s3://...```), against a
real S3 server (SeaweedFS, ``tests/_object_store.py``): INSERT INTO ... VALUES / SELECT,
INSERT OVERWRITE (whole table, static and dynamic partitions), SELECT and DESCRIBE HISTORY
work as they do on local paths."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

pytestmark = pytest.mark.slow


def _rows(spark: Any, uri: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM delta.`{uri}`").collect())


def test_insert_into_an_s3_table_by_path(spark, object_store):
    uri = object_store.uri()
    spark.createDataFrame([(1, "a")], "id long, name string").write.format("delta").save(uri)

    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (2, 'b'), (3, 'c')")
    spark.createDataFrame([(4, "d")], "id long, name string").createOrReplaceTempView("s3_src")
    spark.sql(f"INSERT INTO delta.`{uri}` SELECT * FROM s3_src")

    expected = [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert _rows(spark, uri) == expected
    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert sorted(tuple(r.values()) for r in rs.to_pyarrow_table().to_pylist()) == expected
    assert rs.version() == 2
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    assert [r["version"] for r in history] == [2, 1, 0]


def test_ctas_with_custom_properties_on_s3_is_one_commit(spark, object_store):
    uri = object_store.uri()
    spark.sql(
        f"CREATE TABLE delta.`{uri}` USING delta TBLPROPERTIES ('owner.team' = 'data')"
        " AS SELECT id FROM range(3)"
    )
    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert rs.version() == 0
    assert rs.metadata().configuration["owner.team"] == "data"
    assert sorted(r["id"] for r in rs.to_pyarrow_table().to_pylist()) == [0, 1, 2]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    assert [r["operation"] for r in history] == ["CREATE TABLE AS SELECT"]
    # A replace's properties are the statement's (the log writer, put-if-absent on S3).
    spark.sql(
        f"REPLACE TABLE delta.`{uri}` USING delta"
        " TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true') AS SELECT id FROM range(2)"
    )
    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert (rs.version(), rs.metadata().configuration) == (
        1,
        {"delta.enableChangeDataFeed": "true"},
    )
    assert rs.protocol().min_writer_version == 4


def test_insert_overwrite_an_s3_table_by_path(spark, object_store):
    uri = object_store.uri()
    rows = [(1, "a"), (2, "a"), (3, "b")]
    spark.createDataFrame(rows, "id long, name string").write.format("delta").save(uri)

    spark.sql(f"INSERT OVERWRITE delta.`{uri}` VALUES (7, 'c'), (8, 'b')")

    expected = [(7, "c"), (8, "b")]
    assert _rows(spark, uri) == expected
    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert sorted(tuple(r.values()) for r in rs.to_pyarrow_table().to_pylist()) == expected
    assert rs.version() == 1
    assert [h["operation"] for h in rs.history()] == ["WRITE", "CREATE TABLE"]


def test_insert_overwrite_a_partition_of_an_s3_table_by_path(spark, object_store):
    uri = object_store.uri()
    rows = [(1, "a"), (2, "a"), (3, "b")]
    frame = spark.createDataFrame(rows, "id long, name string")
    frame.write.format("delta").partitionBy("name").save(uri)

    spark.sql(f"INSERT OVERWRITE delta.`{uri}` PARTITION (name = 'a') VALUES (10)")
    assert _rows(spark, uri) == [(3, "b"), (10, "a")]

    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:  # replaces the partitions the new rows fall in: b, not a
        spark.sql(f"INSERT OVERWRITE delta.`{uri}` VALUES (20, 'b'), (21, 'c')")
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")

    expected = [(10, "a"), (20, "b"), (21, "c")]
    assert _rows(spark, uri) == expected
    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert sorted(tuple(r.values()) for r in rs.to_pyarrow_table().to_pylist()) == expected
    assert rs.metadata().partition_columns == ["name"]


def test_column_mapped_table_on_s3_created_written_and_read(spark, object_store):
    uri = object_store.uri()
    spark.sql(
        f"CREATE TABLE delta.`{uri}` (id BIGINT, kind STRING) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (1, 'a'), (2, 'b')")
    ctas = object_store.uri()
    spark.sql(
        f"CREATE TABLE delta.`{ctas}` USING delta TBLPROPERTIES"
        " ('delta.columnMapping.mode' = 'name') AS SELECT 3L AS id, 'c' AS kind"
    )
    for table, expected in ((uri, [(1, "a"), (2, "b")]), (ctas, [(3, "c")])):
        assert _rows(spark, table) == expected
        rs = DeltaTable(table, storage_options=object_store.storage_options)
        assert rs.metadata().configuration["delta.columnMapping.maxColumnId"] == "2"
        found = QueryBuilder().register("t", rs).execute("SELECT * FROM t").read_all()
        assert sorted(tuple(r.values()) for r in pa.table(found).to_pylist()) == expected


def test_inserts_add_columns_to_an_s3_table_under_schema_evolution(spark, object_store):
    """The Python route's table (an object store) evolves as a local one: SQL INSERT under
    the session's autoMerge, writeTo with mergeSchema."""
    from tests.spark._conf import conf_set

    uri = object_store.uri()
    spark.createDataFrame([(1, "a")], "id long, name string").write.format("delta").save(uri)
    with conf_set(spark, "spark.databricks.delta.schema.autoMerge.enabled", "true"):
        spark.sql(f"INSERT INTO delta.`{uri}` SELECT 2 AS id, 'b' AS name, 2.5D AS score")
    spark.createDataFrame([("c", 3, "x")], "name string, id long, tag string").writeTo(
        f"delta.`{uri}`"
    ).option("mergeSchema", "true").append()

    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    data = rs.to_pyarrow_table()
    assert data.column_names == ["id", "name", "score", "tag"]
    assert sorted(tuple(r.values()) for r in data.to_pylist()) == [
        (1, "a", None, None), (2, "b", 2.5, None), (3, "c", None, "x")
    ]  # fmt: skip


def test_merge_schema_adds_struct_fields_on_s3(spark, object_store):
    uri = object_store.uri()
    spark.createDataFrame([(1, (1,))], "id long, s struct<a:int>").write.format("delta").save(uri)
    spark.createDataFrame([(2, (2, "z"))], "id long, s struct<a:int, b:string>").write.format(
        "delta"
    ).mode("append").option("mergeSchema", "true").save(uri)

    rs = DeltaTable(uri, storage_options=object_store.storage_options)
    assert rs.version() == 1
    assert sorted(rs.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "s": {"a": 1, "b": None}},
        {"id": 2, "s": {"a": 2, "b": "z"}},
    ]


def test_a_shallow_clone_on_s3_compacts_and_vacuums_without_touching_its_source(
    spark, object_store
):
    """On S3 delta-rs's VACUUM runs in its lite mode, which deletes the files the log
    removed wherever they are: a clone's DML removes its source's files, which VACUUM of
    the clone must leave be. OPTIMIZE rewrites them under the clone's own prefix."""
    from tests.spark._conf import conf_set

    source, clone = object_store.uri(), object_store.uri()
    spark.range(8).repartition(4).write.format("delta").save(source)
    spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{source}`")
    assert spark.sql(f"OPTIMIZE delta.`{clone}`").collect()[0].metrics.numFilesAdded == 1
    rs = DeltaTable(clone, storage_options=object_store.storage_options)
    assert [u.startswith(clone + "/") for u in rs.file_uris()] == [True]
    spark.sql(f"DELETE FROM delta.`{clone}` WHERE id < 4")
    with conf_set(spark, "spark.databricks.delta.retentionDurationCheck.enabled", "false"):
        spark.sql(f"VACUUM delta.`{clone}` RETAIN 0 HOURS")
    assert _rows(spark, source) == [(i,) for i in range(8)]
    assert _rows(spark, clone) == [(i,) for i in range(4, 8)]
