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
    with pytest.raises(Exception) as info:
        spark.sql(f"CREATE TABLE {_fresh_name()} USING delta LOCATION '{missing}'")
    assert "TableNotFoundError" in str(info.value)
    assert missing in str(info.value)
