"""A declarative pipeline whose storage is on S3 (SeaweedFS, see ``tests/_object_store.py``):
bronze -> silver (expectations) -> gold (materialized view), tables and event log on the
object store, checkpoints under ``pipelines.checkpointRoot`` on local disk."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt

pytestmark = pytest.mark.slow

SCHEMA = "id BIGINT, kind STRING, amount DOUBLE"


def land(spark: Any, uri: str, rows: list[tuple[Any, ...]]) -> None:
    spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(uri)


def declare(spark: Any, source: str) -> dp.Graph:
    from pyspark.sql import functions as F

    with dp.collect() as declared:

        @dlt.table
        def bronze() -> Any:
            return spark.readStream.format("delta").load(source)

        @dlt.table
        @dlt.expect_or_drop("positive", "amount > 0")
        def silver() -> Any:
            return dlt.read_stream("bronze").withColumn("amount2", F.col("amount") * 2)

        @dp.materialized_view
        def gold() -> Any:
            return spark.read.table("silver").groupBy("kind").agg(F.sum("amount").alias("total"))

    return declared.graph()


def table_rows(store: Any, uri: str) -> list[dict[str, Any]]:
    return DeltaTable(uri, storage_options=store.storage_options).to_pyarrow_table().to_pylist()


def test_a_pipeline_stored_on_s3_runs_and_updates_incrementally(
    spark, object_store, tmp_path: Path
) -> None:
    source, storage = object_store.uri("orders"), object_store.uri("pipeline")
    land(spark, source, [(1, "a", 10.0), (2, "b", -1.0), (3, "a", 5.0)])
    settings = dp.PipelineSettings(
        name="shop",
        storage=storage,
        database=f"p_{uuid.uuid4().hex[:8]}",
        configuration={"pipelines.checkpointRoot": str(tmp_path / "checkpoints")},
    )
    graph = declare(spark, source)

    report = dp.run_update(spark, graph, settings)
    assert report.state == "COMPLETED", report
    silver = sorted(
        (r["id"], r["amount2"]) for r in table_rows(object_store, f"{storage}/tables/silver")
    )
    assert silver == [(1, 20.0), (3, 10.0)]
    gold = {r["kind"]: r["total"] for r in table_rows(object_store, f"{storage}/tables/gold")}
    assert gold == {"a": 15.0}
    counts = {
        e.name: (e.passed_records, e.failed_records) for e in report.flows["silver"].expectations
    }
    assert counts == {"positive": (2, 1)}
    # The checkpoints are local, one per streaming flow; nothing of them on the store.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["bronze", "silver"]

    land(spark, source, [(4, "b", 7.0)])
    again = dp.run_update(spark, graph, settings)
    assert again.state == "COMPLETED", again
    assert again.flows["bronze"].rows_written == 1  # only what arrived since
    assert again.flows["silver"].rows_written == 1
    assert sorted(r["id"] for r in table_rows(object_store, f"{storage}/tables/silver")) == [
        1,
        3,
        4,
    ]
    gold = {r["kind"]: r["total"] for r in table_rows(object_store, f"{storage}/tables/gold")}
    assert gold == {"a": 15.0, "b": 7.0}

    # The event log is a Delta table on the object store too.
    events = dp.read_events(f"{storage}/system/events")
    assert [e["event_type"] for e in events].count("create_update") == 2
    assert all(e["origin"]["pipeline_name"] == "shop" for e in events)


def test_a_pipeline_on_s3_without_a_checkpoint_root_is_refused(spark, object_store) -> None:
    storage = object_store.uri("pipeline")
    settings = dp.PipelineSettings(name="shop", storage=storage, database="default")
    with pytest.raises(dp.PipelineStorageError) as caught:
        dp.run_update(spark, declare(spark, object_store.uri("orders")), settings)
    assert caught.value.storage == storage
    assert caught.value.setting == "pipelines.checkpointRoot"
    assert (
        DeltaTable.is_deltatable(
            f"{storage}/system/events", storage_options=object_store.storage_options
        )
        is False
    )  # refused before anything was written


def test_checkpoint_root_places_each_flows_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from deltaflow.pipelines._storage import Storage

    monkeypatch.chdir(tmp_path)
    local = Storage.of(str(tmp_path / "s"), "db", {})
    assert local.checkpoint("Silver") == str(tmp_path / "s" / "checkpoints" / "silver")
    moved = Storage.of("s3://b/p", "db", {"pipelines.checkpointRoot": "chk"})
    assert moved.checkpoint("Silver") == str(tmp_path / "chk" / "silver")
    from deltaflow.pipelines._declarations import SourceLocation

    gold = dp.Dataset(name="gold", kind="materialized_view", location=SourceLocation(None, None))
    assert moved.table_path(gold) == "s3://b/p/tables/gold"
    assert moved.event_log == "s3://b/p/system/events"


def test_a_specs_checkpoint_root_is_relative_to_the_spec(tmp_path: Path) -> None:
    from deltaflow.pipelines._commands import settings_of
    from deltaflow.pipelines._spec import load_spec

    spec_file = tmp_path / "spark-pipeline.yml"
    spec_file.write_text(
        "name: shop\nstorage: s3://bucket/pipelines/shop\n"
        "configuration:\n  pipelines.checkpointRoot: state/checkpoints\n"
    )
    settings = settings_of(load_spec(spec_file))
    assert settings.storage == "s3://bucket/pipelines/shop"
    assert settings.configuration["pipelines.checkpointRoot"] == str(tmp_path / "state/checkpoints")
