"""A complete recompute of a view the driver can fold runs there too (``_mv_arrow.
recompute``): the first refresh writes what Spark's recompute writes, in one commit, and
says so in ``planning_information``; a definition that changes the view's columns, a
view whose helper columns are not in its table yet, and a sum leaving BIGINT go to
Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltaflow import pipelines as dp
from tests.pipelines.test_mv_driver_fold import (
    SCHEMA,
    _database,
    _graph,
    _planned,
    _query,
    _sorted,
    _source,
    _update,
)


def _recompute_method(settings: Any, update_id: str, flow: str = "sums") -> str | None:
    for event in dp.read_events(f"{settings.storage}/system/events"):
        origin = event["origin"]
        if event["event_type"] == "planning_information" and (
            origin["update_id"] == update_id and origin["flow_name"] == flow
        ):
            info = event["details"]["planning_information"]["technique_information"]
            chosen = next(t["maintenance_type"] for t in info if t.get("is_chosen"))
            assert chosen == "MAINTENANCE_TYPE_COMPLETE_RECOMPUTE", info
            return next((t["recompute_method"] for t in info if "recompute_method" in t), None)
    raise AssertionError("no planning_information event")


def test_a_first_refresh_recomputed_on_the_driver_equals_spark(spark: Any, tmp_path: Path) -> None:
    """NULL keys and inputs, count / sum / avg: the driver's view equals the query, and
    the same view recomputed by Spark (foldOnDriver=false), row for row and column type
    for column type."""
    rows = [
        (i, f"k{i % 7}" if i % 13 else None, i % 5, None if i % 4 == 0 else i) for i in range(3000)
    ]
    source = _source(spark, tmp_path / "ints", rows)
    query = _query(spark, source)
    graph = _graph(query)

    settings, report = _update(spark, graph, tmp_path / "driver")
    assert _recompute_method(settings, report.update_id) == "RECOMPUTE_ON_DRIVER"
    assert report.flows["sums"].rows_written == query().count()
    driver = spark.read.format("delta").load(f"{settings.storage}/tables/sums")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{settings.storage}/tables/sums`").collect()
    assert len(history) == 2  # created, then the recompute's one commit

    off = {"pipelines.incrementalRefresh.foldOnDriver": "false"}
    by_spark, report = _update(spark, graph, tmp_path / "spark", **off)
    assert _recompute_method(by_spark, report.update_id) is None
    spark_view = spark.read.format("delta").load(f"{by_spark.storage}/tables/sums")
    assert driver.schema == spark_view.schema, (driver.schema, spark_view.schema)
    assert _sorted(driver.collect()) == _sorted(spark_view.collect())
    assert _sorted(driver.collect()) == _sorted(query().collect())

    # The record it leaves lets the next refresh fold.
    spark.createDataFrame([(9999, "k1", 1, 5)], SCHEMA).write.format("delta").mode("append").save(
        source
    )
    settings, report = _update(spark, graph, tmp_path / "driver")
    assert _planned(settings, report.update_id)["method"] == "FOLD_CHANGE_ROWS_ON_DRIVER"
    assert _sorted(
        spark.read.format("delta").load(f"{settings.storage}/tables/sums").collect()
    ) == _sorted(query().collect())


def test_what_the_driver_cannot_write_is_recomputed_by_spark(spark: Any, tmp_path: Path) -> None:
    """A sum without a count keeps helper columns its new table does not have yet, and a
    definition that adds a column changes the table's schema: both recomputed by Spark,
    which replaces the schema; once the table has them, recomputes run on the driver."""
    from pyspark.sql import functions as F

    source = _source(spark, tmp_path / "ints")
    shape = {"columns": 1}

    def sums() -> Any:
        aggregates = [
            F.sum("amount").alias("total"),
            F.count("amount").alias("counted"),
            F.count("*").alias("n"),
        ]
        grouped = spark.read.format("delta").load(source).groupBy("kind")
        return grouped.agg(*aggregates[: shape["columns"]])

    graph = _graph(sums)
    settings, report = _update(spark, graph, tmp_path)
    assert _recompute_method(settings, report.update_id) is None
    view = f"{settings.storage}/tables/sums"
    assert "__deltaflow_mv_rows" in spark.read.format("delta").load(view).columns

    shape["columns"] = 3  # new columns (which give every helper: the table keeps none)
    settings, report = _update(spark, graph, tmp_path)
    assert _recompute_method(settings, report.update_id) is None
    table = spark.read.format("delta").load(view)
    assert table.columns == ["kind", "total", "counted", "n"]
    assert _sorted(table.collect()) == _sorted(sums().collect())

    # A full refresh empties the table with the same columns: the driver recomputes.
    again = dp.PipelineSettings(name="mv", storage=settings.storage, database=_database(tmp_path))
    report = dp.run_update(spark, graph, again, full_refresh_all=True)
    report.raise_for_failure()
    assert _recompute_method(again, report.update_id) == "RECOMPUTE_ON_DRIVER"
    assert _sorted(spark.read.format("delta").load(view).collect()) == _sorted(sums().collect())


def test_a_recomputed_sum_leaving_bigint_fails_as_spark_does(spark: Any, tmp_path: Path) -> None:
    """The driver stops at a total outside BIGINT and Spark's recompute raises its
    overflow error (ANSI): the flow fails and nothing wrapped is stored."""
    source = str(tmp_path / "big")
    big = 2**62
    spark.createDataFrame(
        [(1, "a", big), (2, "a", big)], "id BIGINT, kind STRING, amount BIGINT"
    ).write.format("delta").save(source)

    def sums() -> Any:
        grouped = spark.read.format("delta").load(source).groupBy("kind")
        return grouped.agg({"amount": "sum", "*": "count"})

    settings = dp.PipelineSettings(
        name="mv", storage=str(tmp_path / "storage"), database=_database(tmp_path), development=True
    )
    report = dp.run_update(spark, _graph(sums), settings)
    assert report.state == "FAILED", report
    assert "overflow" in str(report.flows["sums"].error).lower(), report.flows["sums"]
    assert spark.read.format("delta").load(f"{settings.storage}/tables/sums").count() == 0


def test_any_source_table_is_read_as_spark_reads_it(spark: Any, tmp_path: Path) -> None:
    """The recompute reads the source through deltaflow's file reader: partition values,
    column mapping (renamed columns) and deletion vectors (deleted rows skipped) give the
    rows a Spark scan gives."""
    source = str(tmp_path / "mapped")
    rows = [(i, f"k{i % 5}", i % 3, i % 7) for i in range(500)]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").partitionBy("region").save(source)
    table = f"delta.`{source}`"
    spark.sql(
        f"ALTER TABLE {table} SET TBLPROPERTIES"
        " ('delta.columnMapping.mode' = 'name', 'delta.enableDeletionVectors' = 'true')"
    )
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN amount TO qty")
    spark.sql(f"DELETE FROM {table} WHERE id % 10 = 3")
    from deltaflow.table._snapshot import load_snapshot

    assert load_snapshot(source).deleted_rows()  # the DELETE wrote deletion vectors

    def sums() -> Any:
        grouped = spark.read.format("delta").load(source).groupBy("kind", "region")
        return grouped.agg({"qty": "sum", "*": "count"})

    graph = _graph(sums)
    settings, report = _update(spark, graph, tmp_path / "driver")
    assert _recompute_method(settings, report.update_id) == "RECOMPUTE_ON_DRIVER"
    got = spark.read.format("delta").load(f"{settings.storage}/tables/sums")
    assert _sorted(got.collect()) == _sorted(sums().collect())
    assert sum(r["count(1)"] for r in got.collect()) == 450
