"""Triggered updates of real pipelines on a real Spark session and real Delta tables."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt


def _settings(tmp_path: Path, **extra: Any) -> dp.PipelineSettings:
    database = f"p_{uuid.uuid4().hex[:8]}"
    return dp.PipelineSettings(
        name="shop",
        storage=str(tmp_path / "storage"),
        database=database,
        configuration={"pipelines.flowRetryBackoffSeconds": "0.01", **extra},
    )


def _land(spark: Any, landing: Path, rows: list[tuple[Any, ...]]) -> None:
    spark.createDataFrame(rows, "id BIGINT, kind STRING, amount DOUBLE").write.mode("append").json(
        str(landing)
    )


def _declare(spark: Any, landing: Path) -> dp.Graph:
    schema = "id BIGINT, kind STRING, amount DOUBLE"
    with dp.collect() as declared:

        @dlt.table(comment="raw orders")
        def bronze() -> Any:
            return spark.readStream.schema(schema).json(str(landing))

        @dlt.table
        @dlt.expect_or_drop("positive", "amount > 0")
        @dlt.expect("known_kind", "kind IN ('a', 'b')")
        def silver() -> Any:
            return dlt.read_stream("bronze").withColumn("amount2", dlt_col("amount") * 2)

        @dp.materialized_view
        def gold() -> Any:
            return spark.read.table("silver").groupBy("kind").count()

    return declared.graph()


def _landed_table(spark: Any, landing: Path, name: str, **options: Any) -> None:
    """Declare (inside ``dp.collect()``) streaming table ``name`` fed by the JSON files
    landing in ``landing``."""
    schema = "id BIGINT, kind STRING, amount DOUBLE"
    dp.create_streaming_table(name, schema=schema, **options)

    @dp.append_flow(target=name)
    def live() -> Any:
        return spark.readStream.schema(schema).json(str(landing))


def dlt_col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col(name)


def _rows(path: str) -> list[dict[str, Any]]:
    return DeltaRsTable(path).to_pyarrow_table().to_pylist()


def test_triggered_update_runs_bronze_silver_gold_with_expectations(
    spark: Any, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _land(spark, landing, [(1, "a", 10.0), (2, "b", -1.0), (3, "c", 5.0)])
    graph = _declare(spark, landing)
    settings = _settings(tmp_path)

    resolution = dp.dry_run(spark, graph, settings)
    assert resolution.order == ("bronze", "silver", "gold")
    assert resolution.flows["silver"].inputs == ("bronze",)
    assert resolution.flows["gold"].inputs == ("silver",)
    assert resolution.datasets["bronze"].kind == "streaming_table"
    assert not (tmp_path / "storage").exists()  # the dry run wrote nothing

    report = dp.run_update(spark, graph, settings)
    assert report.state == "COMPLETED", report
    storage = tmp_path / "storage"
    silver = sorted((r["id"], r["amount2"]) for r in _rows(str(storage / "tables/silver")))
    assert silver == [(1, 20.0), (3, 10.0)]
    gold = {r["kind"]: r["count"] for r in _rows(str(storage / "tables/gold"))}
    assert gold == {"a": 1, "c": 1}
    counts = {
        e.name: (e.passed_records, e.failed_records) for e in report.flows["silver"].expectations
    }
    assert counts == {"positive": (2, 1), "known_kind": (2, 1)}
    assert report.flows["silver"].rows_written == 2
    assert report.flows["bronze"].rows_written == 3
    # Registered in the catalog under the pipeline's database; readable by name.
    assert spark.read.table(f"{settings.database}.silver").count() == 2
    # Interop: Polars reads the pipeline's tables.
    assert pl.read_delta(str(storage / "tables/gold")).height == 2

    # A second update processes only what arrived since; the view is recomputed.
    _land(spark, landing, [(4, "a", 1.0)])
    again = dp.run_update(spark, graph, settings)
    assert again.state == "COMPLETED"
    assert again.flows["bronze"].rows_written == 1
    assert sorted(r["id"] for r in _rows(str(storage / "tables/silver"))) == [1, 3, 4]
    gold = {r["kind"]: r["count"] for r in _rows(str(storage / "tables/gold"))}
    assert gold == {"a": 2, "c": 1}

    events = dp.read_events(str(storage / "system/events"))
    kinds = [e["event_type"] for e in events]
    assert kinds.count("create_update") == 2
    definitions = {
        e["origin"]["flow_name"]: e["details"]["flow_definition"]
        for e in events
        if e["event_type"] == "flow_definition"
    }
    assert definitions["silver"]["input_datasets"] == ["bronze"]
    quality = [
        e["details"]["flow_progress"]["data_quality"]
        for e in events
        if e["event_type"] == "flow_progress"
        and e["origin"]["flow_name"] == "silver"
        and "data_quality" in e["details"]["flow_progress"]
    ]
    assert quality[0]["expectations"][0] == {
        "name": "positive",
        "dataset": "silver",
        "passed_records": 2,
        "failed_records": 1,
    }
    states = [
        e["details"]["update_progress"]["state"]
        for e in events
        if e["event_type"] == "update_progress"
    ]
    assert states[-1] == "COMPLETED"
    sequences = [json.loads(e["sequence"])["control_plane_seq_no"] for e in events]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_expect_or_fail_fails_only_its_flow_and_skips_downstream(
    spark: Any, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _land(spark, landing, [(1, "a", 10.0), (2, "b", -5.0)])
    schema = "id BIGINT, kind STRING, amount DOUBLE"
    with dp.collect() as declared:

        @dp.table
        @dp.expect_or_fail("positive", "amount > 0")
        def strict() -> Any:
            return spark.readStream.schema(schema).json(str(landing))

        @dp.materialized_view
        def after_strict() -> Any:
            return spark.read.table("strict")

        @dp.table
        def lenient() -> Any:
            return spark.readStream.schema(schema).json(str(landing))

    report = dp.run_update(spark, declared.graph(), _settings(tmp_path))
    assert report.state == "FAILED"
    assert report.flows["strict"].status == "FAILED"
    assert report.flows["strict"].attempts == 1  # an expectation failure is not retried
    assert '"amount": -5.0' in (report.flows["strict"].error or "")
    assert report.flows["after_strict"].status == "SKIPPED"
    assert report.flows["lenient"].status == "COMPLETED"
    assert _rows(str(tmp_path / "storage/tables/strict")) == []  # nothing of the batch written
    with pytest.raises(dp.FlowFailedError) as failed:
        report.raise_for_failure()
    assert set(failed.value.failed) == {"strict"}  # type: ignore[attr-defined]


def test_dry_run_finds_cycles_missing_inputs_and_bad_expectations(
    spark: Any, tmp_path: Path
) -> None:
    with dp.collect() as cyclic:

        @dp.materialized_view
        def a() -> Any:
            return spark.read.table("b")

        @dp.materialized_view
        def b() -> Any:
            return dlt.read("a")

    with pytest.raises(dp.GraphValidationError) as cycle:
        dp.dry_run(spark, cyclic.graph(), _settings(tmp_path))
    assert cycle.value.problem == "cycle"  # type: ignore[attr-defined]
    assert "a -> b -> a" in str(cycle.value) or "b -> a -> b" in str(cycle.value)

    with dp.collect() as missing:

        @dp.materialized_view
        def reads_nothing() -> Any:
            return spark.read.table("no_such_table_anywhere")

    with pytest.raises(dp.GraphValidationError) as lost:
        dp.dry_run(spark, missing.graph(), _settings(tmp_path))
    assert lost.value.problem == "missing_input"  # type: ignore[attr-defined]

    with dp.collect() as typo:

        @dp.materialized_view
        @dp.expect("bad", "no_such_column > 1")
        def numbers() -> Any:
            return spark.range(3)

    with pytest.raises(dp.GraphValidationError) as bad:
        dp.dry_run(spark, typo.graph(), _settings(tmp_path))
    assert bad.value.problem == "bad_expectation"  # type: ignore[attr-defined]


def test_full_refresh_reprocesses_from_scratch_and_once_flows_run_once(
    spark: Any, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _land(spark, landing, [(1, "a", 1.0), (2, "a", 2.0)])
    schema = "id BIGINT, kind STRING, amount DOUBLE"
    with dp.collect() as declared:
        _landed_table(spark, landing, "events")

        @dp.append_flow(target="events", once=True)
        def backfill() -> Any:
            return spark.createDataFrame([(100, "old", 9.0)], schema)

    graph = declared.graph()
    settings = _settings(tmp_path)
    table = str(tmp_path / "storage/tables/events")
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    assert sorted(r["id"] for r in _rows(table)) == [1, 2, 100]
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    assert sorted(r["id"] for r in _rows(table)) == [1, 2, 100]  # nothing twice

    report = dp.run_update(spark, graph, settings, full_refresh=["events"])
    assert report.state == "COMPLETED"
    assert sorted(r["id"] for r in _rows(table)) == [1, 2, 100]  # emptied, then refilled
    history = DeltaRsTable(table).history()
    assert any(
        h["operation"] == "WRITE" and h["operationParameters"].get("mode") == "Overwrite"
        for h in history
    )


def test_a_table_that_cannot_be_created_fails_the_update_with_its_error(spark, tmp_path):
    """Tables are created in the background while the flows start: a creation that fails
    still fails the update (its error raised, the update FAILED in the event log); the
    flow into that table fails, an independent flow still completes."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    with dp.collect() as declared:

        @dp.materialized_view(path=str(blocker / "broken"))
        def broken() -> Any:
            return spark.range(3)

        @dp.materialized_view
        def fine() -> Any:
            return spark.range(5)

    settings = _settings(tmp_path)
    with pytest.raises(dp.PipelineStorageError) as caught:
        dp.run_update(spark, declared.graph(), settings)
    assert caught.value.setting == "path"
    assert caught.value.storage == str(blocker / "broken")
    events = dp.read_events(str(tmp_path / "storage" / "system" / "events"))
    states = [
        e["details"]["update_progress"]["state"]
        for e in events
        if e["event_type"] == "update_progress"
    ]
    assert states[-1] == "FAILED"
    flows = {
        e["origin"]["flow_name"]: e["details"]["flow_progress"]["status"]
        for e in events
        if e["event_type"] == "flow_progress"
    }
    assert flows == {"broken": "FAILED", "fine": "COMPLETED"}
    fine = sorted(r["id"] for r in _rows(str(tmp_path / "storage" / "tables" / "fine")))
    assert fine == list(range(5))


def test_reads_by_path_of_a_pipeline_table_wait_for_it_and_order_the_flows(
    spark: Any, tmp_path: Path
) -> None:
    """Flows reading a dataset's table by path (batch and stream), declared before it:
    analysed once the table exists (not failed because it did not yet, or was still being
    created in the background), counted as its inputs, and run after its flow."""
    landing = tmp_path / "landing"
    _land(spark, landing, [(1, "a", 10.0), (2, "b", 3.0)])
    source = str(tmp_path / "storage" / "tables" / "orders")
    with dp.collect() as declared:

        @dp.materialized_view
        def per_kind() -> Any:
            return spark.read.format("delta").load(source).groupBy("kind").count()

        @dp.table
        def mirrored() -> Any:
            return spark.readStream.format("delta").load(source)

        @dp.table
        def orders() -> Any:
            return spark.readStream.schema("id BIGINT, kind STRING, amount DOUBLE").json(
                str(landing)
            )

    graph = declared.graph()
    settings = _settings(tmp_path)
    report = dp.run_update(spark, graph, settings)
    assert report.state == "COMPLETED", report
    events = dp.read_events(str(tmp_path / "storage" / "system" / "events"))
    inputs = {
        e["origin"]["flow_name"]: e["details"]["flow_definition"]["input_datasets"]
        for e in events
        if e["event_type"] == "flow_definition"
    }
    assert inputs == {"per_kind": ["orders"], "mirrored": ["orders"], "orders": []}
    storage = tmp_path / "storage" / "tables"
    assert {r["kind"]: r["count"] for r in _rows(str(storage / "per_kind"))} == {"a": 1, "b": 1}
    assert sorted(r["id"] for r in _rows(str(storage / "mirrored"))) == [1, 2]


def test_a_query_failing_for_its_own_reason_still_fails_with_its_error(
    spark: Any, tmp_path: Path
) -> None:
    """Put back behind the other flows and analysed again, a broken query still fails
    the update with its own error, not a cycle."""
    with dp.collect() as declared:

        @dp.materialized_view
        def broken() -> Any:
            raise ValueError("no such thing")

        @dp.materialized_view
        def fine() -> Any:
            return spark.range(2)

    with pytest.raises(dp.UserQueryError) as caught:
        dp.run_update(spark, declared.graph(), _settings(tmp_path))
    assert caught.value.flow == "broken"
    assert isinstance(caught.value.__cause__, ValueError)


def test_query_functions_run_once_to_analyse_and_again_only_when_needed(
    spark: Any, tmp_path: Path
) -> None:
    """A stream reading only sources outside the update starts from the DataFrame its
    analysis produced (its function is not run again); a retry runs the function again;
    a flow reading a dataset the update writes runs it again (the input may have changed
    since). Reads by name of a table created in the background wait for it instead of
    failing first (no extra analysis)."""
    from pyspark.sql import functions as F

    source = str(tmp_path / "source")
    spark.range(5).write.format("delta").save(source)
    calls: dict[str, int] = {}

    def called(name: str) -> int:
        calls[name] = calls.get(name, 0) + 1
        return calls[name]

    with dp.collect() as declared:

        @dp.table
        def plain() -> Any:
            called("plain")
            return spark.readStream.format("delta").load(source)

        @dp.table
        def downstream() -> Any:
            called("downstream")
            return spark.readStream.table("plain")

        @dp.materialized_view
        def total() -> Any:
            called("total")
            return spark.sql("SELECT count(*) AS n FROM downstream")

        @dp.table
        def flaky() -> Any:
            stream = spark.readStream.format("delta").load(source)
            if called("flaky") > 1:
                return stream
            # The DataFrame analysed first fails when it runs; a new call does not.
            failing = F.when(F.col("id") >= 0, F.raise_error(F.lit("first attempt")))
            return stream.filter(failing.otherwise(F.lit(True)))

    report = dp.run_update(spark, declared.graph(), _settings(tmp_path))
    assert report.state == "COMPLETED", report
    assert report.flows["flaky"].attempts == 2
    assert report.flows["plain"].attempts == 1
    assert calls == {"plain": 1, "flaky": 2, "downstream": 2, "total": 2}
    tables = tmp_path / "storage" / "tables"
    for name in ("plain", "flaky", "downstream"):
        assert sorted(r["id"] for r in _rows(str(tables / name))) == [0, 1, 2, 3, 4]
    assert _rows(str(tables / "total")) == [{"n": 5}]


def test_refreshes_and_full_refreshes_keep_a_partitioned_datasets_partitioning(
    spark: Any, tmp_path: Path
) -> None:
    # Both overwrite with overwriteSchema, which takes the partitioning from partitionBy.
    landing = tmp_path / "landing"
    _land(spark, landing, [(1, "a", 1.0), (2, "b", 2.0)])
    with dp.collect() as declared:
        _landed_table(spark, landing, "orders", partition_cols=["kind"])

        @dp.materialized_view(partition_cols=["kind"])
        def totals() -> Any:
            return spark.read.table("orders").groupBy("kind").count()

    graph = declared.graph()
    settings = _settings(tmp_path)
    tables = {name: str(tmp_path / f"storage/tables/{name}") for name in ("orders", "totals")}
    for full_refresh in (None, None, ["orders", "totals"]):
        report = dp.run_update(spark, graph, settings, full_refresh=full_refresh)
        assert report.state == "COMPLETED"
        for path in tables.values():
            assert DeltaRsTable(path).metadata().partition_columns == ["kind"], path
        assert sorted((r["kind"], r["count"]) for r in _rows(tables["totals"])) == [
            ("a", 1),
            ("b", 1),
        ]
