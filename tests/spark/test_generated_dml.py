"""Generated and identity columns in UPDATE and MERGE (SQL and DeltaTable): generated
columns computed again from the new values, explicit values checked, identity columns
never updated, identity values generated for MERGE inserts (delta-spark's rules)."""

from __future__ import annotations

import json
import os

import pytest

from deltaflow import DeltaTable, typed_error
from deltaflow.table.errors import ConstraintViolationError, GeneratedColumnError


def _versions(path: str) -> int:
    log = os.path.join(path, "_delta_log")
    return len([n for n in os.listdir(log) if n.endswith(".json") and n[0].isdigit()])


def _raises_typed(exc_type, call):
    with pytest.raises(Exception) as info:
        call()
    error = info.value if isinstance(info.value, exc_type) else typed_error(info.value)
    assert isinstance(error, exc_type), repr(info.value)
    return error


def _rows(spark, path: str, *columns: str) -> list[tuple]:
    df = spark.read.format("delta").load(path)
    return sorted(tuple(r) for r in df.select(*columns).collect())


def _high_water_mark(path: str, column: str) -> int:
    log = os.path.join(path, "_delta_log")
    mark = None
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json") and n[0].isdigit()):
        with open(os.path.join(log, name)) as f:
            for line in f:
                action = json.loads(line)
                if "metaData" in action:
                    fields = json.loads(action["metaData"]["schemaString"])["fields"]
                    meta = next(x for x in fields if x["name"] == column)["metadata"]
                    mark = meta.get("delta.identity.highWaterMark", mark)
    assert mark is not None
    return int(mark)


def _generated_table(spark, path: str, properties: str = "") -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k INT, a INT, b INT GENERATED ALWAYS AS (a * 2),"
        f" s STRING GENERATED ALWAYS AS (CONCAT('k', CAST(k AS STRING)))) USING delta"
        f" {properties}"
    )
    spark.createDataFrame([(1, 1), (2, 2), (3, 3)], "k INT, a INT").write.format("delta").mode(
        "append"
    ).save(path)


@pytest.mark.parametrize(
    "properties",
    ["", "TBLPROPERTIES (delta.enableDeletionVectors = true, delta.enableChangeDataFeed = true)"],
    ids=["rewrite", "dv-cdf"],
)
def test_update_recomputes_generated_columns_from_new_values(spark, table_path, properties):
    path = table_path("upd")
    _generated_table(spark, path, properties)
    spark.sql(f"UPDATE delta.`{path}` SET a = a + 10, k = k * 10 WHERE k = 1")
    DeltaTable.forPath(spark, path).update("k = 2", {"a": "a + 100"})
    assert _rows(spark, path, "k", "a", "b", "s") == [
        (2, 102, 204, "k2"),
        (3, 3, 6, "k3"),
        (10, 11, 22, "k10"),
    ]
    if properties:
        changes = spark.read.format("delta").option("readChangeFeed", "true")
        feed = changes.option("startingVersion", 2).load(path)
        images = sorted(
            (r["_change_type"], r["a"], r["b"], r["s"])
            for r in feed.where("_change_type LIKE 'update%'").collect()
        )
        assert images == [
            ("update_postimage", 11, 22, "k10"),
            ("update_postimage", 102, 204, "k2"),
            ("update_preimage", 1, 2, "k1"),
            ("update_preimage", 2, 4, "k2"),
        ]


def test_update_explicit_generated_value_is_checked(spark, table_path):
    path = table_path("updexplicit")
    _generated_table(spark, path)
    before = _versions(path)
    error = _raises_typed(
        ConstraintViolationError,
        lambda: spark.sql(f"UPDATE delta.`{path}` SET a = 5, b = 7 WHERE k = 1"),
    )
    assert error.kind == "generated" and error.constraint == "b"
    assert _versions(path) == before
    spark.sql(f"UPDATE delta.`{path}` SET a = 5, b = 10 WHERE k = 1")
    assert (1, 5, 10) in _rows(spark, path, "k", "a", "b")


def _identity_table(spark, path: str, kind: str) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k INT, v STRING,"
        f" id BIGINT GENERATED {kind} AS IDENTITY (START WITH 100 INCREMENT BY 10)) USING delta"
    )
    spark.createDataFrame([(1, "a"), (2, "b")], "k INT, v STRING").coalesce(1).write.format(
        "delta"
    ).mode("append").save(path)


@pytest.mark.parametrize("kind", ["ALWAYS", "BY DEFAULT"])
def test_update_of_identity_column_is_refused(spark, table_path, kind):
    path = table_path("updid")
    _identity_table(spark, path, kind)
    before = _versions(path)
    for call in (
        lambda: spark.sql(f"UPDATE delta.`{path}` SET id = 1 WHERE k = 1"),
        lambda: DeltaTable.forPath(spark, path).update("k = 1", {"id": "id + 1"}),
        lambda: (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(
                spark.createDataFrame([(1, "q", 5)], "k INT, v STRING, id BIGINT").alias("s"),
                "t.k = s.k",
            )
            .whenMatchedUpdateAll()
            .execute()
        ),
    ):
        error = _raises_typed(GeneratedColumnError, call)
        assert error.error_class == "DELTA_IDENTITY_COLUMNS_UPDATE_NOT_SUPPORTED"
        assert error.column == "id" and error.reason == "identityUpdate"
    assert _versions(path) == before
    # Other columns of an identity table update as usual; the ids stay.
    spark.sql(f"UPDATE delta.`{path}` SET v = 'z' WHERE k = 1")
    assert _rows(spark, path, "k", "v", "id") == [(1, "z", 100), (2, "b", 110)]


def test_merge_computes_generated_columns_in_updates_and_inserts(spark, table_path):
    path = table_path("merge")
    _generated_table(spark, path)
    source = spark.createDataFrame([(1, 50), (4, 40)], "k INT, a INT")
    target = DeltaTable.forPath(spark, path)
    (
        target.alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenMatchedUpdate(set={"a": "s.a"})
        .whenNotMatchedInsert(values={"k": "s.k", "a": "s.a"})
        .execute()
    )
    assert _rows(spark, path, "k", "a", "b", "s") == [
        (1, 50, 100, "k1"),
        (2, 2, 4, "k2"),
        (3, 3, 6, "k3"),
        (4, 40, 80, "k4"),
    ]
    # updateAll / insertAll with a source that lacks the generated columns (delta-spark
    # needs them in the source: delta-io/delta#3318), and SQL.
    spark.createDataFrame([(2, 7), (5, 9)], "k INT, a INT").createOrReplaceTempView("gen_src")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING gen_src s ON t.k = s.k"
        " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    rows = _rows(spark, path, "k", "a", "b", "s")
    assert (2, 7, 14, "k2") in rows and (5, 9, 18, "k5") in rows
    # Schema evolution: a new source column is added, generated columns still computed.
    evolved = spark.createDataFrame([(3, 30, "x"), (6, 60, "y")], "k INT, a INT, note STRING")
    (
        target.alias("t")
        .merge(evolved.alias("s"), "t.k = s.k")
        .withSchemaEvolution()
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    rows = _rows(spark, path, "k", "a", "b", "s", "note")
    assert (3, 30, 60, "k3", "x") in rows and (6, 60, 120, "k6", "y") in rows
    assert (1, 50, 100, "k1", None) in rows


def test_merge_explicit_generated_value_is_checked(spark, table_path):
    path = table_path("mergeexplicit")
    _generated_table(spark, path)
    before = _versions(path)
    source = spark.createDataFrame([(9, 1, 5)], "k INT, a INT, b INT")
    merge = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenNotMatchedInsertAll()
    )
    error = _raises_typed(ConstraintViolationError, merge.execute)
    assert error.kind == "generated" and error.constraint == "b"
    assert _versions(path) == before


def test_merge_insert_generates_identity_values(spark, table_path):
    path = table_path("mergeid")
    _identity_table(spark, path, "ALWAYS")
    source = spark.range(0, 30, numPartitions=3).selectExpr(
        "CAST(id + 10 AS INT) AS k", "CAST(id AS STRING) AS v"
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.union(spark.createDataFrame([(1, "new")])).alias("s"), "t.k = s.k")
        .whenMatchedUpdate(set={"v": "s.v"})
        .whenNotMatchedInsert(values={"k": "s.k", "v": "s.v"})
        .execute()
    )
    rows = {r["k"]: (r["v"], r["id"]) for r in spark.read.format("delta").load(path).collect()}
    assert rows[1] == ("new", 100) and rows[2] == ("b", 110)  # updated rows keep their ids
    inserted = [rows[k][1] for k in range(10, 40)]
    assert len(set(inserted)) == 30
    assert all(i > 110 and (i - 100) % 10 == 0 for i in inserted)
    assert _high_water_mark(path, "id") == max(inserted)
    # An explicit value for a GENERATED ALWAYS column is refused, nothing committed.
    before = _versions(path)
    explicit = spark.createDataFrame([(99, "x", 5)], "k INT, v STRING, id BIGINT")
    for merge in (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(explicit.alias("s"), "t.k = s.k")
        .whenNotMatchedInsertAll(),
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(explicit.alias("s"), "t.k = s.k")
        .whenNotMatchedInsert(values={"k": "s.k", "id": "s.id"}),
    ):
        error = _raises_typed(GeneratedColumnError, merge.execute)
        assert error.error_class == "DELTA_IDENTITY_COLUMNS_EXPLICIT_INSERT_NOT_SUPPORTED"
    assert _versions(path) == before


def test_merge_insert_by_default_identity_takes_explicit_values(spark, table_path):
    path = table_path("mergebydefault")
    _identity_table(spark, path, "BY DEFAULT")
    spark.createDataFrame([(5, "e", 7), (6, "f", None)], "k INT, v STRING, id BIGINT").where(
        "k = 5"
    ).createOrReplaceTempView("byd_explicit")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING byd_explicit s ON t.k = s.k"
        " WHEN NOT MATCHED THEN INSERT *"
    )
    spark.createDataFrame([(6, "f")], "k INT, v STRING").createOrReplaceTempView("byd_missing")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING byd_missing s ON t.k = s.k"
        " WHEN NOT MATCHED THEN INSERT (k, v) VALUES (s.k, s.v)"
    )
    rows = {r["k"]: r["id"] for r in spark.read.format("delta").load(path).collect()}
    assert rows[5] == 7
    assert rows[6] > 110 and (rows[6] - 100) % 10 == 0


def test_filter_on_base_column_prunes_generated_partitions(spark, table_path):
    import deltaflow.spark

    path = table_path("pruned")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (ts TIMESTAMP, v INT,"
        " day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))) USING delta PARTITIONED BY (day)"
        # no min/max stats: only partition values can skip a file
        " TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '0')"
    )
    rows = [(f"2024-01-{n:02d} 12:00:00", n) for n in range(1, 11)]
    spark.createDataFrame(rows, "ts STRING, v INT").selectExpr(
        "CAST(ts AS TIMESTAMP) AS ts", "v"
    ).write.format("delta").mode("append").save(path)
    table = spark.read.format("delta").load(path)
    assert sorted(r.v for r in table.where("ts >= '2024-01-08'").collect()) == [8, 9, 10]
    report = deltaflow.spark.scan_reports(spark, path)[-1]
    # Days 8-10 and, for the time zone slack, day 7: never a matching file skipped.
    assert (report.files_scanned, report.skipped_by_partition) == (4, 6)
    assert [r.v for r in table.where("ts = '2024-01-05 12:00:00'").collect()] == [5]
    assert deltaflow.spark.scan_reports(spark, path)[-1].files_scanned == 3


def test_month_format_and_trunc_partitions_prune_filters_on_the_base_column(spark, table_path):
    import deltaflow.spark

    path = table_path("by_month")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (ts TIMESTAMP, v INT,"
        " ym STRING GENERATED ALWAYS AS (DATE_FORMAT(ts, 'yyyy-MM')),"
        " mo INT GENERATED ALWAYS AS (MONTH(ts))) USING delta PARTITIONED BY (ym, mo)"
        " TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '0')"
    )
    rows = [(f"2024-{n:02d}-15 12:00:00", n) for n in range(1, 13)]  # one file a month
    spark.createDataFrame(rows, "ts STRING, v INT").selectExpr(
        "CAST(ts AS TIMESTAMP) AS ts", "v"
    ).write.format("delta").mode("append").save(path)
    table = spark.read.format("delta").load(path)
    assert sorted(r.v for r in table.where("ts >= '2024-10-01'").collect()) == [10, 11, 12]
    # October to December, and September for the time zone slack.
    assert deltaflow.spark.scan_reports(spark, path)[-1].files_scanned == 4
    assert [r.v for r in table.where("ts = '2024-06-15 12:00:00'").collect()] == [6]
    assert deltaflow.spark.scan_reports(spark, path)[-1].files_scanned == 1
