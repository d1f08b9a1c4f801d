"""Materialized views refreshed from their source's change data feed: the result equals a
recompute, the technique and the reasons are in the event log, crashes are harmless."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from deltaflow import pipelines as dp
from deltaflow.pipelines import _incremental

ROWS = [
    (1, "a", 5.0),
    (2, "a", 15.0),
    (3, "b", 20.0),
    (4, "b", 20.0),  # same (kind, amount) as 3: duplicates in a projection
    (5, None, 30.0),  # a NULL group
    (6, "c", 40.0),
    (7, "d", 50.0),
]


def _source(spark: Any, tmp_path: Path, *, cdf: bool = True) -> str:
    path = str(tmp_path / f"source_{uuid.uuid4().hex[:6]}")
    (
        spark.createDataFrame(ROWS, "id BIGINT, kind STRING, amount DOUBLE")
        .write.format("delta")
        .option("delta.enableChangeDataFeed", str(cdf).lower())
        .save(path)
    )
    return path


def _settings(tmp_path: Path) -> dp.PipelineSettings:
    return dp.PipelineSettings(
        name="mv",
        storage=str(tmp_path / "storage"),
        database=f"mv_{uuid.uuid4().hex[:8]}",
        # The tables are tiny: a few changes are most of the bytes.
        configuration={"pipelines.incrementalRefresh.maxChangeFraction": "100"},
        development=True,  # a failure is final: no retries
    )


def _queries(spark: Any, source: str, threshold: float = 10.0) -> dict[str, Any]:
    from pyspark.sql import functions as F

    def filtered() -> Any:
        return (
            spark.read.format("delta")
            .load(source)
            .where(F.col("amount") > threshold)
            .select("kind", (F.col("amount") * 2).alias("double"))
        )

    def by_kind() -> Any:
        return (
            spark.read.format("delta")
            .load(source)
            .where("id > 1")
            .groupBy("kind")
            .agg(
                F.count("*").alias("n"),
                F.sum("amount").alias("total"),
                F.avg("amount").alias("mean"),
                F.min("id").alias("low"),
                F.max("amount").alias("high"),
            )
        )

    return {"filtered": filtered, "by_kind": by_kind}


def _graph(queries: dict[str, Any]) -> dp.Graph:
    with dp.collect() as declared:
        for name, query in queries.items():
            dp.materialized_view(name=name)(query)
    return declared.graph()


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(
        (tuple(r) for r in spark.read.format("delta").load(path).collect()),
        key=lambda r: tuple((v is None, v) for v in r),
    )


def _expected(query: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (tuple(r) for r in query().collect()), key=lambda r: tuple((v is None, v) for v in r)
    )


def _plans(settings: dp.PipelineSettings, update_id: str) -> dict[str, dict[str, Any]]:
    """The planning_information of each view in one update: technique, issue types."""
    found = {}
    for event in dp.read_events(f"{settings.storage}/system/events"):
        if event["event_type"] != "planning_information":
            continue
        if event["origin"]["update_id"] != update_id:
            continue
        info = event["details"]["planning_information"]["technique_information"]
        chosen = next(t["maintenance_type"] for t in info if t.get("is_chosen"))
        issues = [i["issue_type"] for t in info for i in t.get("incrementalization_issues", [])]
        found[event["origin"]["flow_name"]] = {
            "technique": chosen.removeprefix("MAINTENANCE_TYPE_"),
            "issues": issues,
            "message": event["message"],
        }
    return found


def _change(spark: Any, source: str) -> None:
    table = f"delta.`{source}`"
    spark.createDataFrame(
        [(8, "a", 60.0), (9, "e", 70.0), (10, None, 1.0)], "id BIGINT, kind STRING, amount DOUBLE"
    ).write.format("delta").mode("append").save(source)
    spark.sql(f"UPDATE {table} SET amount = amount + 100 WHERE id IN (2, 5)")
    spark.sql(f"UPDATE {table} SET kind = 'c' WHERE id = 7")  # moves a row between groups
    spark.sql(f"DELETE FROM {table} WHERE id IN (4, 6)")  # one duplicate; all of group 'c'


def test_incremental_refresh_equals_recompute_and_is_recorded(spark: Any, tmp_path: Path) -> None:
    source = _source(spark, tmp_path)
    queries = _queries(spark, source)
    graph, settings = _graph(queries), _settings(tmp_path)
    tables = {n: f"{settings.storage}/tables/{n}" for n in queries}

    first = dp.run_update(spark, graph, settings)
    first.raise_for_failure()
    plans = _plans(settings, first.update_id)
    assert plans["filtered"]["technique"] == "COMPLETE_RECOMPUTE"
    assert plans["filtered"]["issues"] == ["NO_PREVIOUS_REFRESH"]

    _change(spark, source)
    second = dp.run_update(spark, graph, settings)
    second.raise_for_failure()
    plans = _plans(settings, second.update_id)
    assert plans["filtered"]["technique"] == "ROW_BASED", plans
    assert plans["by_kind"]["technique"] == "GROUP_AGGREGATE", plans
    assert plans["by_kind"]["issues"] == []
    for name, query in queries.items():
        assert _rows(spark, tables[name]) == _expected(query), name
    # One commit per refresh: created, recomputed, refreshed.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tables['by_kind']}`").collect()
    assert len(history) == 3

    third = dp.run_update(spark, graph, settings)
    plans = _plans(settings, third.update_id)
    assert {p["technique"] for p in plans.values()} == {"NO_OP"}
    assert third.flows["by_kind"].rows_written == 0
    assert spark.sql(f"DESCRIBE HISTORY delta.`{tables['by_kind']}`").count() == len(history)


def test_fallbacks_recompute_and_say_why(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = _source(spark, tmp_path)
    plain = _source(spark, tmp_path, cdf=False)
    queries = {
        "no_feed": _queries(spark, plain)["by_kind"],
        "joined": lambda: (
            spark.read.format("delta")
            .load(source)
            .join(spark.read.format("delta").load(plain).select("id"), "id")
        ),
        "global": lambda: spark.read.format("delta").load(source).agg(F.sum("amount")),
        **_queries(spark, source),
    }
    settings = _settings(tmp_path)
    dp.run_update(spark, _graph(queries), settings).raise_for_failure()
    _change(spark, source)
    _change(spark, plain)

    # The filter of one view changed: its definition is not the one recorded.
    changed = {**queries, "filtered": _queries(spark, source, threshold=12.0)["filtered"]}
    report = dp.run_update(spark, _graph(changed), settings)
    report.raise_for_failure()
    plans = _plans(settings, report.update_id)
    assert plans["no_feed"]["issues"] == ["CDF_NOT_ENABLED"]
    assert plans["joined"]["issues"] == ["OPERATOR_NOT_INCREMENTALIZABLE"]
    assert plans["global"]["issues"] == ["OPERATOR_NOT_INCREMENTALIZABLE"]
    assert plans["filtered"]["issues"] == ["DEFINITION_CHANGED"]
    assert plans["by_kind"]["technique"] == "GROUP_AGGREGATE"
    for name, plan in plans.items():
        if name != "by_kind":
            assert plan["technique"] == "COMPLETE_RECOMPUTE", (name, plan)
    storage = settings.storage
    for name in ("no_feed", "filtered"):
        assert _rows(spark, f"{storage}/tables/{name}") == _expected(changed[name])

    # A full refresh starts the record over.
    again = dp.run_update(spark, _graph(changed), settings, full_refresh=["by_kind"])
    assert _plans(settings, again.update_id)["by_kind"]["issues"] == ["NO_PREVIOUS_REFRESH"]


def test_merge_refresh_and_a_refresh_killed_after_its_commit(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Views above this size are MERGEd rather than rewritten: every view here.
    monkeypatch.setattr(_incremental, "REWRITE_LIMIT_BYTES", 0)
    source = _source(spark, tmp_path)
    queries = _queries(spark, source)
    graph, settings = _graph(queries), _settings(tmp_path)
    views = {n: f"{settings.storage}/tables/{n}" for n in queries}
    dp.run_update(spark, graph, settings).raise_for_failure()
    _change(spark, source)
    merged = dp.run_update(spark, graph, settings)
    merged.raise_for_failure()
    assert {p["technique"] for p in _plans(settings, merged.update_id).values()} == {
        "ROW_BASED",
        "GROUP_AGGREGATE",
    }
    for name, query in queries.items():
        assert spark.sql(f"DESCRIBE HISTORY delta.`{views[name]}`").first()["operation"] == "MERGE"
        assert _rows(spark, views[name]) == _expected(query), name

    spark.sql(f"DELETE FROM delta.`{source}` WHERE kind = 'a'")

    def crash(self: Any, shape: Any) -> None:
        raise KeyboardInterrupt("killed between the view's commit and the record")

    with monkeypatch.context() as patch:
        patch.setattr(_incremental.ViewRefresh, "_save_state", crash)
        with pytest.raises(KeyboardInterrupt):
            dp.run_update(spark, _graph({"by_kind": queries["by_kind"]}), settings)
    # The MERGE landed; the record still names the view's previous version.
    assert spark.sql(f"DESCRIBE HISTORY delta.`{views['by_kind']}`").count() == 4

    report = dp.run_update(spark, graph, settings)
    report.raise_for_failure()
    plans = _plans(settings, report.update_id)
    assert plans["by_kind"]["technique"] == "COMPLETE_RECOMPUTE"
    assert plans["by_kind"]["issues"] == ["TARGET_CHANGED"]
    assert plans["filtered"]["technique"] == "ROW_BASED"
    repeat = dp.run_update(spark, graph, settings)
    assert {p["technique"] for p in _plans(settings, repeat.update_id).values()} == {"NO_OP"}
    for name, query in queries.items():
        assert _rows(spark, views[name]) == _expected(query), name


def test_streaming_table_gets_a_change_feed_and_its_view_refreshes_incrementally(
    spark: Any, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    schema = "id BIGINT, kind STRING, amount DOUBLE"
    spark.createDataFrame(ROWS[:3], schema).write.json(str(landing), mode="append")
    with dp.collect() as declared:

        @dp.table
        def orders() -> Any:
            return spark.readStream.schema(schema).json(str(landing))

        @dp.materialized_view
        def totals() -> Any:
            return spark.read.table("orders").groupBy("kind").sum("amount")

    graph, settings = declared.graph(), _settings(tmp_path)
    dp.run_update(spark, graph, settings).raise_for_failure()
    orders = f"{settings.storage}/tables/orders"
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{orders}`").collect()
    assert {r["key"]: r["value"] for r in properties}["delta.enableChangeDataFeed"] == "true"

    spark.createDataFrame(ROWS[3:], schema).write.json(str(landing), mode="append")
    report = dp.run_update(spark, graph, settings)
    report.raise_for_failure()
    assert _plans(settings, report.update_id)["totals"]["technique"] == "GROUP_AGGREGATE"
    expected = _expected(
        lambda: spark.read.format("delta").load(orders).groupBy("kind").sum("amount")
    )
    assert _rows(spark, f"{settings.storage}/tables/totals") == expected


@pytest.mark.parametrize("commit", ["WRITE", "MERGE"])
def test_decomposable_aggregates_fold_from_the_change_rows(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit: str
) -> None:
    """count / sum / avg over integers: the refresh folds the change rows' deltas into the
    view's helper columns (no source scan); deletes, group moves, NULL keys and values and
    a vanishing group end up exactly as a recompute. A small view is rewritten (WRITE),
    a large one MERGEd (forced here by the size limit)."""
    from pyspark.sql import functions as F

    if commit == "MERGE":
        monkeypatch.setattr(_incremental, "REWRITE_LIMIT_BYTES", -1)

    source = str(tmp_path / "ints")
    rows = [(1, "a", 5), (2, "a", None), (3, "b", 7), (4, None, 1), (5, "c", 9), (6, "d", None)]
    schema = "id BIGINT, kind STRING, amount INT"
    spark.createDataFrame(rows, schema).write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(source)

    def sums() -> Any:
        return (
            spark.read.format("delta")
            .load(source)
            .where("id <> 99")
            .groupBy("kind")
            .agg(
                F.count("*").alias("n"),
                F.count("amount").alias("counted"),
                F.sum("amount").alias("total"),
                F.avg("amount").alias("mean"),
            )
        )

    graph, settings = _graph({"sums": sums}), _settings(tmp_path)
    table = f"{settings.storage}/tables/sums"
    dp.run_update(spark, graph, settings).raise_for_failure()

    spark.createDataFrame([(7, None, None), (8, "e", 3), (99, "a", 1000)], schema).write.format(
        "delta"
    ).mode("append").save(source)
    spark.sql(f"UPDATE delta.`{source}` SET amount = NULL WHERE id = 1")  # 'a': only NULLs
    spark.sql(f"UPDATE delta.`{source}` SET kind = 'b', amount = 2 WHERE id = 5")  # 'c' moves
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id = 6")  # 'd' vanishes
    spark.sql(f"UPDATE delta.`{source}` SET amount = 4 WHERE id = 4")  # NULL key, new value

    second = dp.run_update(spark, graph, settings)
    second.raise_for_failure()
    plan = _plans(settings, second.update_id)["sums"]
    assert plan["technique"] == "GROUP_AGGREGATE", plan
    visible = spark.read.format("delta").load(table).select(*sums().columns)
    expected = _expected(sums)
    got = sorted(
        (tuple(r) for r in visible.collect()), key=lambda r: tuple((v is None, v) for v in r)
    )
    assert got == expected
    assert [r for r in got if r[0] == "a"] == [("a", 2, 0, None, None)]
    assert not [r for r in got if r[0] in ("c", "d")]
    events = [
        e
        for e in dp.read_events(f"{settings.storage}/system/events")
        if e["event_type"] == "planning_information"
        and e["origin"]["update_id"] == second.update_id
    ]
    info = events[0]["details"]["planning_information"]["technique_information"]
    assert {"group_aggregate_method": "FOLD_CHANGE_ROWS"} in info
    # The fold is one commit (after the table's creation and first recompute).
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert len(history) == 3
    assert history[0]["operation"] == commit

    # A full refresh writes the same table (helper columns included).
    folded = sorted(map(tuple, spark.read.format("delta").load(table).collect()), key=str)
    dp.run_update(spark, graph, settings, full_refresh_all=True).raise_for_failure()
    again = sorted(map(tuple, spark.read.format("delta").load(table).collect()), key=str)
    assert folded == again


def test_cost_model_rejects_a_large_change(spark: Any, tmp_path: Path) -> None:
    """A decomposable view is refreshed incrementally only while the change files are a
    small part of the source; a large change is recomputed, and the event log says why."""
    from pyspark.sql import functions as F

    source = str(tmp_path / "ints")
    spark.range(0, 50).selectExpr("id", "id % 5 AS kind", "CAST(id AS INT) AS amount").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(source)

    def sums() -> Any:
        return (
            spark.read.format("delta").load(source).groupBy("kind").agg(F.sum("amount").alias("t"))
        )

    settings = dp.PipelineSettings(
        name="mv",
        storage=str(tmp_path / "storage"),
        database=f"mv_{uuid.uuid4().hex[:8]}",
        configuration={"pipelines.incrementalRefresh.maxChangeFraction": "0.05"},
        development=True,
    )
    graph = _graph({"sums": sums})
    dp.run_update(spark, graph, settings).raise_for_failure()
    spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 1")  # every row: a large change
    second = dp.run_update(spark, graph, settings)
    second.raise_for_failure()
    plan = _plans(settings, second.update_id)["sums"]
    assert plan["technique"] == "COMPLETE_RECOMPUTE"
    assert plan["issues"] == ["INCREMENTAL_PLAN_REJECTED_BY_COST_MODEL"]
    assert "CHANGESET_SIZE_THRESHOLD_EXCEEDED" in plan["message"]
    got = spark.read.format("delta").load(f"{settings.storage}/tables/sums").select("kind", "t")
    assert sorted(map(tuple, got.collect())) == sorted(map(tuple, sums().collect()))
