"""Writes into a catalog table that bring new columns: ``saveAsTable`` / ``writeTo`` with
``mergeSchema``, and SQL ``INSERT`` / ``insertInto`` under delta-spark's
``spark.databricks.delta.schema.autoMerge.enabled``, evolve the table's schema as the same
write by path does; without either they are refused and the table is left as it was."""

from __future__ import annotations

import uuid
from typing import Any

import pyspark
import pytest
from deltalake import DeltaTable as DeltaRsTable

from tests.spark._conf import conf_set

AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"


@pytest.fixture
def table_name(spark: Any) -> Any:
    names: list[str] = []

    def make() -> str:
        names.append("evolve_" + uuid.uuid4().hex[:8])
        return names[-1]

    yield make
    for name in names:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def _state(spark: Any, name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    table = spark.table(name)
    return table.columns, sorted(tuple(r) for r in table.collect())


def _history_length(spark: Any, name: str) -> int:
    return spark.sql(f"DESCRIBE HISTORY {name}").count()


def test_save_as_table_and_write_to_add_columns_with_merge_schema(spark, table_name):
    name = table_name()
    spark.createDataFrame([(1, "a")], "id long, v string").write.format("delta").saveAsTable(name)
    wider = spark.createDataFrame([(2, "b", 2.5)], "id long, v string, x double")

    with pytest.raises(Exception, match="INSERT_COLUMN_ARITY_MISMATCH"):
        wider.write.format("delta").mode("append").saveAsTable(name)
    assert _state(spark, name) == (["id", "v"], [(1, "a")])
    assert _history_length(spark, name) == 1

    wider.write.format("delta").mode("append").option("mergeSchema", "true").saveAsTable(name)
    assert _state(spark, name) == (["id", "v", "x"], [(1, "a", None), (2, "b", 2.5)])

    # By name: reordered columns, one more new one.
    spark.createDataFrame([("c", "t", 3, 3.5)], "v string, y string, id long, x double").writeTo(
        name
    ).option("mergeSchema", "true").append()
    assert _state(spark, name) == (
        ["id", "v", "x", "y"],
        [(1, "a", None, None), (2, "b", 2.5, None), (3, "c", 3.5, "t")],
    )
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE {name}").collect()}
    assert (described["x"], described["y"]) == ("double", "string")


def test_the_sessions_auto_merge_evolves_sql_inserts_and_insert_into(spark, table_name):
    name = table_name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, v STRING) USING delta")

    with pytest.raises(Exception, match="INSERT_COLUMN_ARITY_MISMATCH"):
        spark.sql(f"INSERT INTO {name} SELECT 1, 'a', 1.5D")
    assert _state(spark, name) == (["id", "v"], [])

    with conf_set(spark, AUTO_MERGE, "true"):
        # By position: the trailing column is new and keeps the query's name.
        spark.sql(f"INSERT INTO {name} SELECT 1 AS id, 'a' AS v, 1.5D AS x")
        # By name (every column, reordered; Spark 4.0 fills no missing one) and one new.
        spark.sql(f"INSERT INTO {name} BY NAME SELECT 2.5D AS x, 'b' AS v, 'w2' AS w, 2 AS id")
        spark.createDataFrame(
            [(3, "c", 3.5, "w3", True)], "id long, v string, x double, w string, z boolean"
        ).write.insertInto(name)
        assert _state(spark, name) == (
            ["id", "v", "x", "w", "z"],
            [
                (1, "a", 1.5, None, None),
                (2, "b", 2.5, "w2", None),
                (3, "c", 3.5, "w3", True),
            ],
        )
        spark.sql(f"INSERT OVERWRITE {name} SELECT 4, 'd', 4.5D, 'w4', false, 40 AS n")
        assert _state(spark, name) == (
            ["id", "v", "x", "w", "z", "n"],
            [(4, "d", 4.5, "w4", False, 40)],
        )
        # An explicit mergeSchema=false wins over the session's setting.
        extra = spark.table(name).selectExpr("*", "1 AS m")
        with pytest.raises(Exception, match=r"TOO_MANY_DATA_COLUMNS|EXTRA_COLUMNS"):
            extra.write.format("delta").mode("append").option("mergeSchema", "false").saveAsTable(
                name
            )
    assert _state(spark, name)[0] == ["id", "v", "x", "w", "z", "n"]


def test_new_struct_fields_are_added_in_the_datas_commit(spark, table_name, tmp_path):
    """mergeSchema adds fields inside a struct column, matched by name at any depth, in the
    same commit as the rows; by path (the JVM's write, and the Python writer for fields out
    of the table's order) and into a catalog table. delta-rs reads the result alike."""
    path = str(tmp_path / "nested")
    spark.createDataFrame(
        [(1, (1, (1,)))], "id long, s struct<a:int, t:struct<p:int>>"
    ).write.format("delta").save(path)
    spark.createDataFrame(
        [(2, (2, (2, "q2"), "b2"))], "id long, s struct<a:int, t:struct<p:int, q:string>, b:string>"
    ).write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    spark.createDataFrame([(("b3", 3), 3)], "s struct<b:string, a:int>, id long").write.format(
        "delta"
    ).mode("append").option("mergeSchema", "true").save(path)

    table = spark.read.format("delta").load(path)
    assert table.schema.simpleString() == (
        "struct<id:bigint,s:struct<a:int,t:struct<p:int,q:string>,b:string>>"
    )
    assert sorted(tuple(r) for r in table.collect()) == [
        (1, (1, (1, None), None)), (2, (2, (2, "q2"), "b2")), (3, (3, None, "b3"))
    ]  # fmt: skip
    log = DeltaRsTable(path)
    assert log.version() == 2  # no separate schema commit
    assert [a["operation"] for a in log.history()] == ["WRITE", "WRITE", "WRITE"]
    assert sorted(log.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "s": {"a": 1, "t": {"p": 1, "q": None}, "b": None}},
        {"id": 2, "s": {"a": 2, "t": {"p": 2, "q": "q2"}, "b": "b2"}},
        {"id": 3, "s": {"a": 3, "t": None, "b": "b3"}},
    ]

    name = table_name()
    spark.createDataFrame([(1, (1,))], "id long, s struct<a:int>").write.format(
        "delta"
    ).saveAsTable(name)
    nested = spark.createDataFrame([(2, (2, "z"))], "id long, s struct<a:int, b:string>")
    with pytest.raises(Exception, match="EXTRA_STRUCT_FIELDS"):
        nested.write.format("delta").mode("append").saveAsTable(name)
    assert _history_length(spark, name) == 1
    nested.write.format("delta").mode("append").option("mergeSchema", "true").saveAsTable(name)
    assert _state(spark, name) == (["id", "s"], [(1, (1, None)), (2, (2, "z"))])
    assert _history_length(spark, name) == 2


def test_struct_fields_inside_arrays_and_maps_evolve(spark, tmp_path):
    path = str(tmp_path / "collections")
    spark.createDataFrame(
        [(1, [(1,)], {"k": (1,)})], "id long, a array<struct<x:int>>, m map<string, struct<p:int>>"
    ).write.format("delta").save(path)
    # In the table's field order (the JVM's write), then out of it (the Python writer's).
    spark.createDataFrame(
        [(2, [(2, "y2")], {"k": (2, 2.5)})],
        "id long, a array<struct<x:int, y:string>>, m map<string, struct<p:int, q:double>>",
    ).write.format("delta").mode("append").option("mergeSchema", "true").save(path)
    spark.createDataFrame(
        [(3, [("y3", 3)])], "id long, a array<struct<y:string, x:int>>"
    ).write.format("delta").mode("append").option("mergeSchema", "true").save(path)

    table = spark.read.format("delta").load(path)
    assert table.schema.simpleString() == (
        "struct<id:bigint,a:array<struct<x:int,y:string>>,m:map<string,struct<p:int,q:double>>>"
    )
    assert sorted(DeltaRsTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "a": [{"x": 1, "y": None}], "m": [("k", {"p": 1, "q": None})]},
        {"id": 2, "a": [{"x": 2, "y": "y2"}], "m": [("k", {"p": 2, "q": 2.5})]},
        {"id": 3, "a": [{"x": 3, "y": "y3"}], "m": None},
    ]
    assert sorted((r.id, [tuple(e) for e in r.a]) for r in table.collect()) == [
        (1, [(1, None)]), (2, [(2, "y2")]), (3, [(3, "y3")])
    ]  # fmt: skip


@pytest.mark.skipif(
    tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (4, 3),
    reason="INSERT WITH SCHEMA EVOLUTION is Spark 4.3's syntax",
)
def test_insert_with_schema_evolution_evolves_that_statement_only(spark, table_name):
    name = table_name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, v STRING) USING delta")
    spark.sql(f"INSERT WITH SCHEMA EVOLUTION INTO {name} SELECT 1 AS id, 'a' AS v, 1.5D AS x")
    with pytest.raises(Exception, match="INSERT_COLUMN_ARITY_MISMATCH"):
        spark.sql(f"INSERT INTO {name} SELECT 2, 'b', 2.5D, 'w'")
    assert _state(spark, name) == (["id", "v", "x"], [(1, "a", 1.5)])
