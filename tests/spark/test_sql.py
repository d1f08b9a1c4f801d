"""SQL over Delta tables: CREATE TABLE ... USING delta LOCATION, SELECT, INSERT."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake


def _fresh_name() -> str:
    return "t_" + uuid.uuid4().hex[:8]


@pytest.fixture
def seeded(table_path):
    path = table_path("sql")
    write_deltalake(
        path,
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", None]}),
        partition_by=["name"],
    )
    return path


def test_create_table_location_then_select(spark, seeded):
    name = _fresh_name()
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{seeded}'")
    rows = spark.sql(f"SELECT id, name FROM {name} ORDER BY id").collect()
    assert [(r.id, r.name) for r in rows] == [(1, "a"), (2, "b"), (3, None)]
    assert spark.sql(f"SELECT count(*) AS n FROM {name} WHERE name = 'b'").first().n == 1


def test_insert_into_and_overwrite(spark, seeded):
    name = _fresh_name()
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{seeded}'")
    spark.sql(f"INSERT INTO {name} VALUES (4, 'd'), (5, NULL)")
    assert DeltaTable(seeded).version() == 1
    ids = sorted(DeltaTable(seeded).to_pyarrow_table().column("id").to_pylist())
    assert ids == [1, 2, 3, 4, 5]

    spark.sql(f"INSERT OVERWRITE {name} SELECT 9 AS id, 'z' AS name")
    table = DeltaTable(seeded).to_pyarrow_table()
    assert table.to_pylist() == [{"id": 9, "name": "z"}]
    assert spark.sql(f"SELECT * FROM {name}").collect()[0].asDict() == {"id": 9, "name": "z"}


def test_insert_select_from_another_delta_table(spark, seeded, table_path):
    target = table_path("target")
    write_deltalake(
        target, pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())})
    )
    src, dst = _fresh_name(), _fresh_name()
    spark.sql(f"CREATE TABLE {src} USING delta LOCATION '{seeded}'")
    spark.sql(f"CREATE TABLE {dst} USING delta LOCATION '{target}'")
    spark.sql(f"INSERT INTO {dst} SELECT id * 10, name FROM {src} WHERE id > 1")
    rows = sorted(DeltaTable(target).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 20, "name": "b"}, {"id": 30, "name": None}]


def test_sql_reads_the_log_at_query_time(spark, seeded):
    """A catalog table follows new commits: each query reads the latest snapshot."""
    name = _fresh_name()
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{seeded}'")
    assert spark.sql(f"SELECT count(*) AS n FROM {name}").first().n == 3
    write_deltalake(
        seeded, pa.table({"id": pa.array([7], pa.int64()), "name": ["x"]}), mode="append"
    )
    assert spark.sql(f"SELECT count(*) AS n FROM {name}").first().n == 4


def test_create_table_on_missing_location_fails_clearly(spark, table_path):
    missing = table_path("missing")
    from deltaflow.table.errors import TableNotFoundError

    with pytest.raises(TableNotFoundError) as info:
        spark.sql(f"CREATE TABLE {_fresh_name()} USING delta LOCATION '{missing}'")
    assert info.value.table_uri.endswith(missing)
    assert missing in str(info.value)


def test_insert_select_between_catalog_tables_writes_the_named_table(spark, table_path):
    """The query's columns carry the SOURCE table's location metadata: the row must still
    land in the table INSERT names, and nothing may be written to the source."""
    src_path, dst_path = table_path("src"), table_path("dst")
    write_deltalake(src_path, pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    write_deltalake(dst_path, pa.table({"id": pa.array([9], pa.int64()), "name": ["z"]}))
    src, dst = _fresh_name(), _fresh_name()
    spark.sql(f"CREATE TABLE {src} USING delta LOCATION '{src_path}'")
    spark.sql(f"CREATE TABLE {dst} USING delta LOCATION '{dst_path}'")

    spark.sql(f"INSERT INTO {dst} SELECT * FROM {src}")
    spark.sql(f"INSERT INTO {dst} SELECT id + 100, 'r' FROM range(2)")  # no location metadata
    spark.sql(f"INSERT INTO {dst} (name, id) SELECT 'c', 7")
    spark.sql(f"INSERT INTO {dst} BY NAME SELECT 'n' AS name, 8 AS id")
    spark.range(1).selectExpr("42 AS id", "'w' AS name").write.insertInto(dst)

    assert DeltaTable(src_path).version() == 0  # untouched
    got = sorted((r["id"], r["name"]) for r in DeltaTable(dst_path).to_pyarrow_table().to_pylist())
    expected = [(1, "a"), (2, "b"), (7, "c"), (8, "n"), (9, "z"), (42, "w"), (100, "r"), (101, "r")]
    assert got == sorted(expected)

    spark.sql(f"INSERT OVERWRITE {dst} SELECT * FROM {src} WHERE id = 1")
    assert DeltaTable(dst_path).to_pyarrow_table().to_pylist() == [{"id": 1, "name": "a"}]


def test_bad_insert_commits_nothing_and_partition_insert_writes_the_partition(spark, table_path):
    from pyspark.errors import AnalysisException

    src_path = table_path("src")
    write_deltalake(
        src_path,
        pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}),
        partition_by=["name"],
    )
    src = _fresh_name()
    spark.sql(f"CREATE TABLE {src} USING delta LOCATION '{src_path}'")

    with pytest.raises(AnalysisException, match="INSERT_COLUMN_ARITY_MISMATCH"):
        spark.sql(f"INSERT INTO {src} SELECT 5, 'x', 7")
    assert DeltaTable(src_path).version() == 0
    spark.sql(f"INSERT INTO {src} PARTITION (name='x') SELECT 5")
    rows = DeltaTable(src_path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "a"), (5, "x")]
    # saveAsTable appends to an existing table: the connector's table knows its location.
    spark.table(src).where("id = 1").write.format("delta").mode("append").saveAsTable(src)
    assert DeltaTable(src_path).version() == 2
    assert sorted(DeltaTable(src_path).to_pyarrow_table().column("id").to_pylist()) == [1, 1, 5]


def test_copy_of_a_catalog_table_does_not_inherit_its_location_marker(spark, seeded, table_path):
    name = _fresh_name()
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{seeded}'")
    copy = table_path("copy")
    spark.table(name).write.format("delta").save(copy)
    fields = DeltaTable(copy).schema().to_arrow()
    assert all(not (f.metadata or {}) for f in fields), [f.metadata for f in fields]
    assert sorted(DeltaTable(copy).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]
