"""SQL's UPDATE, DELETE FROM and MERGE INTO on Delta tables: the DeltaTable API's
semantics, results and history, from a statement."""

from __future__ import annotations

import uuid

import deltalake
import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException

import deltaflow


def _name() -> str:
    return "dml_" + uuid.uuid4().hex[:8]


def _rows(spark, name: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.table(name).collect())


@pytest.fixture
def people(spark):
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, name STRING, age INT) USING delta"
        " TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(f"INSERT INTO {name} VALUES (1, 'ann', 30), (2, 'bob', 40), (3, 'cid', 50)")
    return name


def test_update_and_delete_return_counts_and_write_history(spark, people):
    updated = spark.sql(f"UPDATE {people} SET age = age + 1, name = upper(name) WHERE id >= 2")
    assert [tuple(r) for r in updated.collect()] == [(2,)]
    assert updated.columns == ["num_affected_rows"]
    deleted = spark.sql(f"DELETE FROM {people} AS p WHERE p.name = 'BOB'")
    assert [tuple(r) for r in deleted.collect()] == [(1,)]
    assert _rows(spark, people) == [(1, "ann", 30), (3, "CID", 51)]
    # Unqualified by an alias, a column may still be named by the table.
    spark.sql(f"UPDATE {people} SET age = 0 WHERE {people}.id = 1")
    assert _rows(spark, people)[0] == (1, "ann", 0)

    changes = spark.read.option("readChangeFeed", "true").option("startingVersion", 2).table(people)
    kinds = sorted((r._commit_version, r._change_type, r.id) for r in changes.collect())
    assert (2, "update_postimage", 3) in kinds
    assert (3, "delete", 2) in kinds
    history = spark.sql(f"SELECT * FROM {people} VERSION AS OF 1").count()
    assert history == 3


def test_a_bare_predicate_is_the_whole_condition(spark, people):
    """IN, NOT IN, BETWEEN, LIKE and IS [NOT] NULL alone as a condition or a value: the
    parser places them at their operator, yet the left operand is part of the text."""
    spark.sql(f"INSERT INTO {people} VALUES (4, NULL, 60)")
    counts = [
        spark.sql(statement).collect()[0][0]
        for statement in (
            f"UPDATE {people} SET age = age + 1 WHERE id IN (1, 3)",
            f"UPDATE {people} SET age = age + 10 WHERE id NOT IN (1, 2, 3)",
            f"UPDATE {people} SET age = 0 WHERE age BETWEEN 39 AND 41",
            f"UPDATE {people} SET name = 'x' || name WHERE name LIKE 'a%'",
            f"UPDATE {people} SET name = 'none' WHERE name IS NULL",
            f"UPDATE {people} SET name = CAST(id IN (3) AS STRING) WHERE id = 3",
        )
    ]
    assert counts == [2, 1, 1, 1, 1, 1]
    assert _rows(spark, people) == [
        (1, "xann", 31),
        (2, "bob", 0),
        (3, "true", 51),
        (4, "none", 70),
    ]
    assert spark.sql(f"DELETE FROM {people} WHERE id IN (2, 4)").collect()[0][0] == 2
    source = _name()
    spark.sql(f"CREATE TABLE {source} (id BIGINT, name STRING) USING delta")
    spark.sql(f"INSERT INTO {source} VALUES (1, NULL), (3, 'c')")
    merged = spark.sql(
        f"MERGE INTO {people} AS t USING {source} AS s ON t.id = s.id"
        " WHEN MATCHED AND s.name IS NULL THEN DELETE"
    ).collect()[0]
    assert merged["num_deleted_rows"] == 1
    assert _rows(spark, people) == [(3, "true", 51)]


def test_merge_with_every_clause_kind(spark, people):
    source = _name()
    spark.sql(f"CREATE TABLE {source} (id BIGINT, name STRING, age INT) USING delta")
    spark.sql(f"INSERT INTO {source} VALUES (1, 'ann2', 31), (2, 'gone', -1), (4, 'dan', 20)")
    result = spark.sql(
        f"MERGE INTO {people} AS t USING {source} AS s ON t.id = s.id"
        " WHEN MATCHED AND s.age < 0 THEN DELETE"
        " WHEN MATCHED THEN UPDATE SET t.name = s.name, age = s.age"
        " WHEN NOT MATCHED THEN INSERT *"
        " WHEN NOT MATCHED BY SOURCE THEN UPDATE SET age = 99"
    )
    assert result.columns == [
        "num_affected_rows",
        "num_updated_rows",
        "num_deleted_rows",
        "num_inserted_rows",
    ]
    assert [tuple(r) for r in result.collect()] == [(4, 2, 1, 1)]
    assert _rows(spark, people) == [(1, "ann2", 31), (3, "cid", 99), (4, "dan", 20)]

    # A subquery source, an unaliased target, explicit INSERT columns.
    spark.sql(
        f"MERGE INTO {people} USING (SELECT 5 AS id, 'eve' AS name) u ON {people}.id = u.id"
        " WHEN NOT MATCHED THEN INSERT (id, name) VALUES (u.id, u.name)"
    )
    assert (5, "eve", None) in _rows(spark, people)


def test_merge_with_schema_evolution(spark, people):
    spark.sql(
        f"MERGE WITH SCHEMA EVOLUTION INTO {people} t"
        " USING (SELECT 1 AS id, 'ann' AS name, 30 AS age, 'x' AS tag) s ON t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    assert "tag" in spark.table(people).columns
    assert [r.tag for r in spark.table(people).where("id = 1").collect()] == ["x"]


def test_merge_evolves_the_schema_under_the_sessions_auto_merge(spark, people):
    """delta-spark's spark.databricks.delta.schema.autoMerge.enabled: MERGE evolves the
    schema without WITH SCHEMA EVOLUTION, from SQL and from DeltaTable.merge."""
    from deltaflow import DeltaTable
    from tests.spark._conf import conf_set

    source = "SELECT 1 AS id, 'ann' AS name, 30 AS age, 'x' AS tag"
    statement = (
        f"MERGE INTO {people} t USING ({source}) s ON t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(statement)
    assert "tag" not in spark.table(people).columns  # the switch is off by default
    with conf_set(spark, "spark.databricks.delta.schema.autoMerge.enabled", "true"):
        spark.sql(statement)
        assert [r.tag for r in spark.table(people).where("id = 1").collect()] == ["x"]
        extra = spark.sql("SELECT 2 AS id, 'y' AS note")
        (
            DeltaTable.forName(spark, people)
            .alias("t")
            .merge(extra.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .execute()
        )
    assert [r.note for r in spark.table(people).where("id = 2").collect()] == ["y"]


def test_dml_by_path_and_on_tables_other_writers_see(spark, table_path):
    path = table_path("by_path")
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 2")
    assert sorted(deltalake.DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [1, 3]
    operations = [h["operation"] for h in deltalake.DeltaTable(path).history()]
    assert operations[0] == "DELETE"


def test_bad_statements_fail_typed_and_change_nothing(spark, people):
    described = spark.sql(f"DESCRIBE EXTENDED {people}").collect()
    location = next(r.data_type for r in described if r.col_name == "Location")
    before = deltalake.DeltaTable(location).version()
    with pytest.raises(deltaflow.DeltaflowError, match="nosuch"):
        spark.sql(f"DELETE FROM {people} WHERE nosuch = 1")
    with pytest.raises(deltaflow.DeltaflowError, match="nosuch"):
        spark.sql(f"UPDATE {people} SET nosuch = 1")
    assert deltalake.DeltaTable(location).version() == before


def test_dml_on_other_tables_is_sparks(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT) USING parquet")
    with pytest.raises(AnalysisException, match="does not support DELETE"):
        spark.sql(f"DELETE FROM {name} WHERE id = 1")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_host_scenario_in_a_classic_session(spark, tmp_path):
    """The scenario every host runs (tests/spark/_server_dml.py), here in a PySpark
    session: the same statements, results and checks as from Connect, spark-sql and
    beeline."""
    from tests.spark import _server_dml as scenario

    tables = scenario.Tables.under(tmp_path)
    results = {}
    try:
        for statement in scenario.script(tables):
            results[statement] = [tuple(r) for r in spark.sql(statement).collect()]
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    assert [results[s] for s in scenario.dml(tables.cdf)] == [[(1,)], [(1,)], [(3, 1, 1, 1)]]
    assert results[scenario.changes_query(tables.cdf)] == [("CDF", scenario.CHANGES)]
    history = results[f"DESCRIBE HISTORY delta.`{tables.cdf}`"]
    assert [row[4] for row in history] == scenario.HISTORY
    scenario.check_tables(tables)
    missing, ambiguous = scenario.bad(tables)
    with pytest.raises(deltaflow.DeltaflowError, match="nosuch") as caught:
        spark.sql(missing)
    assert type(caught.value).__name__ == "SchemaMismatchError"
    with pytest.raises(deltaflow.DeltaflowError, match="AMBIGUOUS_REFERENCE"):
        spark.sql(ambiguous)
    scenario.check_unchanged_by_bad(tables)
