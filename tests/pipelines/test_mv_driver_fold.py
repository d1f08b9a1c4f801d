"""A decomposable GROUP BY over plain source columns folded on the driver with Arrow
(``_mv_arrow``): the view equals a recompute after inserts, updates, deletes, groups
moving and vanishing, NULL keys and inputs; it is the default where the cost model says
it pays; a crash between the view's commit and the record is repaired."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from deltaflow import pipelines as dp
from deltaflow.pipelines import _incremental

SCHEMA = "id BIGINT, kind STRING, region INT, amount INT"
ROWS = [
    (1, "a", 1, 5),
    (2, "a", 1, None),
    (3, "b", 2, 7),
    (4, None, 1, 1),
    (5, "c", None, 9),
    (6, "d", 2, None),
]


def _source(spark: Any, path: Path, rows: list[tuple[Any, ...]] = ROWS) -> str:
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(str(path))
    return str(path)


def _query(spark: Any, source: str) -> Any:
    from pyspark.sql import functions as F

    def sums() -> Any:
        return (
            spark.read.format("delta")
            .load(source)
            .groupBy("kind", F.col("region").alias("area"))
            .agg(
                F.count("*").alias("n"),
                F.count("amount").alias("counted"),
                F.sum("amount").alias("total"),
                F.avg("amount").alias("mean"),
            )
        )

    return sums


def _update(spark: Any, graph: dp.Graph, tmp_path: Path, **configuration: str) -> tuple[Any, Any]:
    settings = dp.PipelineSettings(
        name="mv",
        storage=str(tmp_path / "storage"),
        database=_database(tmp_path),
        configuration=configuration,
        development=True,
    )
    report = dp.run_update(spark, graph, settings)
    report.raise_for_failure()
    return settings, report


def _database(tmp_path: Path) -> str:
    return f"mv_{uuid.uuid5(uuid.NAMESPACE_URL, str(tmp_path)).hex[:8]}"


def _planned(settings: Any, update_id: str, flow: str = "sums") -> dict[str, Any]:
    for event in dp.read_events(f"{settings.storage}/system/events"):
        origin = event["origin"]
        if event["event_type"] == "planning_information" and (
            origin["update_id"] == update_id and origin["flow_name"] == flow
        ):
            info = event["details"]["planning_information"]["technique_information"]
            return {
                "technique": next(t["maintenance_type"] for t in info if t.get("is_chosen")),
                "method": next(
                    (
                        t["group_aggregate_method"]
                        for t in info
                        if len(t) == 1 and "group_aggregate_method" in t
                    ),
                    None,
                ),
                "issues": [
                    i["issue_type"] for t in info for i in t.get("incrementalization_issues", [])
                ],
            }
    raise AssertionError("no planning_information event")


def _sorted(rows: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in rows), key=lambda r: tuple((v is None, v) for v in r))


def _graph(query: Any) -> dp.Graph:
    with dp.collect() as declared:
        dp.materialized_view(name="sums")(query)
    return declared.graph()


def _change(spark: Any, source: str) -> None:
    spark.createDataFrame(
        [(7, None, None, None), (8, "e", 3, 3), (9, "a", 1, 4)], SCHEMA
    ).write.format("delta").mode("append").save(source)
    table = f"delta.`{source}`"
    # 'a' left with only NULLs (two statements: see the report of this change).
    spark.sql(f"UPDATE {table} SET amount = NULL WHERE id = 1")
    spark.sql(f"UPDATE {table} SET amount = NULL WHERE id = 9")
    spark.sql(f"UPDATE {table} SET kind = 'b', region = 2, amount = 2 WHERE id = 5")  # moves
    spark.sql(f"DELETE FROM {table} WHERE id = 6")  # 'd' vanishes
    spark.sql(f"UPDATE {table} SET amount = 4 WHERE id = 4")  # NULL key, new value


@pytest.mark.parametrize("on_driver", ["true", "false"])
def test_fold_on_driver_equals_a_recompute(spark: Any, tmp_path: Path, on_driver: str) -> None:
    from pyspark.sql import functions as F

    source = _source(spark, tmp_path / "ints")
    query = _query(spark, source)

    def mixed() -> Any:  # helpers partly in the view (the sum), partly stored
        return (
            spark.read.format("delta")
            .load(source)
            .groupBy("kind")
            .agg(
                F.sum("amount").alias("total"),
                F.avg("region").alias("area"),
                F.count("kind").alias("kinds"),  # a count of strings
            )
        )

    with dp.collect() as declared:
        dp.materialized_view(name="sums")(query)
        dp.materialized_view(name="mixed")(mixed)
    graph = declared.graph()
    # The tables are tiny: a few changes are most of the bytes.
    config = {
        "pipelines.incrementalRefresh.maxChangeFraction": "100",
        "pipelines.incrementalRefresh.foldOnDriver": on_driver,
    }
    settings, _ = _update(spark, graph, tmp_path, **config)
    view = f"{settings.storage}/tables/sums"
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{view}`").collect()
    _change(spark, source)

    settings, report = _update(spark, graph, tmp_path, **config)
    plan = _planned(settings, report.update_id)
    assert plan["technique"] == "MAINTENANCE_TYPE_GROUP_AGGREGATE", plan
    table = spark.read.format("delta").load(f"{settings.storage}/tables/mixed")
    extra = [c for c in table.columns if c not in mixed().columns]
    assert extra == [f"__deltaflow_mv_{h}" for h in ("rows", "cnt_0", "cnt_1", "sum_1")]
    assert _sorted(table.select(*mixed().columns).collect()) == _sorted(mixed().collect())
    assert _planned(settings, report.update_id, "mixed")["method"] == plan["method"]
    expected_method = "FOLD_CHANGE_ROWS_ON_DRIVER" if on_driver == "true" else "FOLD_CHANGE_ROWS"
    assert plan["method"] == expected_method
    got = _sorted(spark.read.format("delta").load(view).select(*query().columns).collect())
    assert got == _sorted(query().collect())
    assert [r for r in got if r[0] == "a"] == [("a", 1, 3, 0, None, None)]
    assert not [r for r in got if r[0] in ("c", "d")]
    assert [r for r in got if r[0] is None and r[1] is None] == [(None, None, 1, 0, None, None)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{view}`").collect()
    assert len(history) == 3  # created, recomputed, one fold commit
    assert spark.sql(f"SHOW TBLPROPERTIES delta.`{view}`").collect() == properties

    # A full refresh writes the same table, helper columns included.
    folded = _sorted(spark.read.format("delta").load(view).collect())
    settings = dp.PipelineSettings(
        name="mv", storage=settings.storage, database=_database(tmp_path), configuration=config
    )
    dp.run_update(spark, graph, settings, full_refresh_all=True).raise_for_failure()
    assert _sorted(spark.read.format("delta").load(view).collect()) == folded


def test_fold_on_driver_is_the_default_for_a_small_change(spark: Any, tmp_path: Path) -> None:
    """No configuration: a small change to a foldable view over plain columns is folded;
    a view the driver cannot fold (a filter below the GROUP BY) is recomputed, and keeps
    no helper columns."""
    rows = [(i, f"k{i % 50}", i % 7, i % 11) for i in range(20_000)]
    source = _source(spark, tmp_path / "ints", rows)
    query = _query(spark, source)

    def filtered() -> Any:
        return _filtered(spark, source)

    def counts() -> Any:
        return spark.read.format("delta").load(source).groupBy("kind").count()

    with dp.collect() as declared:
        dp.materialized_view(name="sums")(query)
        dp.materialized_view(name="filtered")(filtered)
        dp.materialized_view(name="counts")(counts)
    graph = declared.graph()
    settings, _ = _update(spark, graph, tmp_path)
    spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 1 WHERE id < 20")
    settings, report = _update(spark, graph, tmp_path)
    plans = {
        e["origin"]["flow_name"]: e["details"]["planning_information"]["technique_information"]
        for e in dp.read_events(f"{settings.storage}/system/events")
        if e["event_type"] == "planning_information"
        and e["origin"]["update_id"] == report.update_id
    }
    chosen = {
        n: next(t["maintenance_type"] for t in info if t.get("is_chosen"))
        for n, info in plans.items()
    }
    assert chosen == {
        "sums": "MAINTENANCE_TYPE_GROUP_AGGREGATE",
        "counts": "MAINTENANCE_TYPE_GROUP_AGGREGATE",
        "filtered": "MAINTENANCE_TYPE_COMPLETE_RECOMPUTE",
    }
    assert {"group_aggregate_method": "FOLD_CHANGE_ROWS_ON_DRIVER"} in plans["sums"]
    issues = [
        i["issue_type"] for t in plans["filtered"] for i in t.get("incrementalization_issues", [])
    ]
    assert issues == ["INCREMENTAL_PLAN_REJECTED_BY_COST_MODEL"]
    storage = settings.storage
    got = spark.read.format("delta").load(f"{storage}/tables/sums").select(*query().columns)
    assert _sorted(got.collect()) == _sorted(query().collect())
    columns = spark.read.format("delta").load(f"{storage}/tables/filtered").columns
    assert columns == _filtered(spark, source).columns
    # Helpers a view column gives are not stored: counts alone keep none, nor do the
    # sums (count(*), count(amount) and sum(amount) give the row count, the non-NULL
    # count and the sum that avg(amount) needs).
    counted = spark.read.format("delta").load(f"{storage}/tables/counts")
    assert counted.columns == ["kind", "count"]
    assert _sorted(counted.collect()) == _sorted(counts().collect())
    helpers = [
        c
        for c in spark.read.format("delta").load(f"{storage}/tables/sums").columns
        if c not in query().columns
    ]
    assert helpers == []


def _filtered(spark: Any, source: str) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.read.format("delta")
        .load(source)
        .where("id > 3")
        .groupBy("kind")
        .agg(F.sum("amount").alias("total"))
    )


def test_a_fold_killed_after_its_commit_is_repaired(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(spark, tmp_path / "ints")
    query = _query(spark, source)
    graph = _graph(query)
    config = {"pipelines.incrementalRefresh.maxChangeFraction": "100"}
    settings, _ = _update(spark, graph, tmp_path, **config)
    _change(spark, source)

    def crash(self: Any, shape: Any) -> None:
        raise KeyboardInterrupt("killed between the view's commit and the record")

    with monkeypatch.context() as patch:
        patch.setattr(_incremental.ViewRefresh, "_save_state", crash)
        with pytest.raises(KeyboardInterrupt):
            _update(spark, graph, tmp_path, **config)
    settings, report = _update(spark, graph, tmp_path, **config)
    plan = _planned(settings, report.update_id)
    assert plan["technique"] == "MAINTENANCE_TYPE_COMPLETE_RECOMPUTE"
    assert plan["issues"] == ["TARGET_CHANGED"]
    view = f"{settings.storage}/tables/sums"
    got = spark.read.format("delta").load(view).select(*query().columns)
    assert _sorted(got.collect()) == _sorted(query().collect())
    spark.sql(f"DELETE FROM delta.`{source}` WHERE kind = 'b'")  # a group vanishes
    settings, report = _update(spark, graph, tmp_path, **config)
    assert _planned(settings, report.update_id)["method"] == "FOLD_CHANGE_ROWS_ON_DRIVER"
    got = spark.read.format("delta").load(view).select(*query().columns)
    assert _sorted(got.collect()) == _sorted(query().collect())

    spark.sql(f"DELETE FROM delta.`{source}`")  # every group vanishes: an empty view
    settings, report = _update(spark, graph, tmp_path, **config)
    assert _planned(settings, report.update_id)["method"] == "FOLD_CHANGE_ROWS_ON_DRIVER"
    assert spark.read.format("delta").load(view).count() == 0


def test_only_plain_columns_and_exact_key_types_fold_on_the_driver(
    spark: Any, tmp_path: Path
) -> None:
    """Keys pyarrow would group differently from Spark (floats: NaN, -0.0), computed keys
    or inputs, and filters below the GROUP BY are left to Spark."""
    from pyspark.sql import functions as F

    from deltaflow.pipelines import _mv_arrow, _mv_fold, _mv_plan

    source = str(tmp_path / "typed")
    spark.createDataFrame(
        [(1, "a", 1.5, 2)], "id BIGINT, kind STRING, ratio DOUBLE, amount INT"
    ).write.format("delta").save(source)
    table = spark.read.format("delta").load(source)

    def driver(df: Any) -> Any:
        shape = _mv_plan.analyse(df)
        folding = _mv_fold.folding(shape, df.columns)
        assert folding is not None
        return _mv_arrow.driver_fold(shape, folding)

    plain = driver(table.groupBy("kind", "id").agg(F.sum("amount").alias("t")))
    assert plain is not None and plain.key_columns == ("kind", "id")
    assert plain.input_columns == ("amount",)
    assert driver(table.groupBy("ratio").agg(F.sum("amount").alias("t"))) is None
    assert driver(table.groupBy(F.upper("kind")).agg(F.count("*").alias("n"))) is None
    assert driver(table.groupBy("kind").agg(F.sum(F.col("amount") + 1).alias("t"))) is None
    assert driver(table.where("id > 0").groupBy("kind").agg(F.count("*").alias("n"))) is None


def test_a_sum_leaving_bigint_fails_as_spark_does_and_stores_nothing_wrapped(
    spark: Any, tmp_path: Path
) -> None:
    """pyarrow's BIGINT sums wrap around; the driver fold adds up in DECIMAL(38, 0) and
    hands a total outside BIGINT to Spark's fold, whose overflow error (ANSI) fails the
    flow as a recompute would, with the view as it was."""
    source = str(tmp_path / "big")
    big = 2**62
    spark.createDataFrame([(1, "a", big)], "id BIGINT, kind STRING, amount BIGINT").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(source)

    def sums() -> Any:
        return spark.read.format("delta").load(source).groupBy("kind").sum("amount")

    graph = _graph(sums)
    config = {"pipelines.incrementalRefresh.maxChangeFraction": "100"}
    settings, _ = _update(spark, graph, tmp_path, **config)
    view = f"{settings.storage}/tables/sums"
    spark.createDataFrame([(2, "a", big)], "id BIGINT, kind STRING, amount BIGINT").write.format(
        "delta"
    ).mode("append").save(source)
    settings = dp.PipelineSettings(
        name="mv",
        storage=settings.storage,
        database=_database(tmp_path),
        configuration=config,
        development=True,
    )
    report = dp.run_update(spark, graph, settings)
    assert report.state == "FAILED", report
    assert "overflow" in str(report.flows["sums"].error).lower(), report.flows["sums"]
    stored = spark.read.format("delta").load(view).collect()
    assert [r["sum(amount)"] for r in stored] == [big]
