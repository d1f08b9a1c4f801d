"""Stateful streams between Delta tables on S3 (SeaweedFS, see ``tests/_object_store.py``):
aggregations in complete mode and windowed appends with a watermark, availableNow,
restarts from the (local) checkpoint and a replayed batch committing nothing twice; a
checkpoint on the object store refused with a typed error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

import deltaflow
from deltaflow.spark.errors import CheckpointLocationError
from tests.spark._checkpoints import forget_batch

pytestmark = pytest.mark.slow


def append(spark: Any, uri: str, rows: list[tuple[Any, ...]], schema: str) -> None:
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(uri)


def run(writer: Any, target: str) -> Any:
    query = writer.trigger(availableNow=True).start(target)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def rows(store: Any, uri: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, storage_options=store.storage_options)
    return sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())


def version(store: Any, uri: str) -> int:
    return DeltaTable(uri, storage_options=store.storage_options).version()


def test_counts_in_complete_mode_from_s3_to_s3_restart_exactly_once(
    spark, object_store, tmp_path: Path
) -> None:
    source, target = object_store.uri("orders"), object_store.uri("counts")
    checkpoint = str(tmp_path / "checkpoint")
    append(spark, source, [(1, "a"), (2, "b"), (3, "a")], "id long, kind string")

    def counts() -> Any:
        df = spark.readStream.format("delta").load(source).groupBy("kind").count()
        return (
            df.writeStream.format("delta")
            .outputMode("complete")
            .option("checkpointLocation", checkpoint)
        )

    run(counts(), target)
    assert rows(object_store, target) == [("a", 2), ("b", 1)]

    append(spark, source, [(4, "b"), (5, "c")], "id long, kind string")
    run(counts(), target)  # a restart: the state comes back from the checkpoint
    assert rows(object_store, target) == [("a", 2), ("b", 2), ("c", 1)]
    settled = version(object_store, target)

    forget_batch(checkpoint)  # died between the sink's commit and Spark's
    run(counts(), target)
    assert version(object_store, target) == settled  # the replay committed nothing
    assert rows(object_store, target) == [("a", 2), ("b", 2), ("c", 1)]
    table = DeltaTable(target, storage_options=object_store.storage_options)
    assert table.history(1)[0]["operation"] in ("WRITE", "STREAMING UPDATE")


def test_windowed_append_with_a_watermark_on_s3_emits_each_window_once(
    spark, object_store, tmp_path: Path
) -> None:
    source, target = object_store.uri("clicks"), object_store.uri("per_minute")
    checkpoint = str(tmp_path / "checkpoint")
    schema = "user string, ts timestamp"

    def at(minute: int, second: int = 0) -> Any:
        import datetime as dt

        return dt.datetime(2026, 11, 26, 10, minute, second, tzinfo=dt.UTC)

    def windows() -> Any:
        from pyspark.sql import functions as F

        df = (
            spark.readStream.format("delta")
            .load(source)
            .withWatermark("ts", "1 minute")
            .groupBy(F.window("ts", "1 minute"))
            .count()
            .select(F.col("window.start").alias("minute"), "count")
        )
        return df.writeStream.format("delta").option("checkpointLocation", checkpoint)

    append(spark, source, [("u1", at(0, 5)), ("u2", at(0, 40)), ("u1", at(1, 10))], schema)
    run(windows(), target)
    append(spark, source, [("u3", at(1, 50)), ("u1", at(5))], schema)  # moves the watermark
    run(windows(), target)
    # Windows 10:00 and 10:01 are final once the watermark (10:04) passed them; 10:05 is open.
    assert rows(object_store, target) == [(at(0), 2), (at(1), 2)]
    settled = version(object_store, target)

    forget_batch(checkpoint)
    run(windows(), target)
    assert rows(object_store, target) == [(at(0), 2), (at(1), 2)]  # not emitted twice
    assert version(object_store, target) == settled


def test_a_checkpoint_on_s3_is_refused_with_a_typed_error(spark, object_store) -> None:
    source, target = object_store.uri("src"), object_store.uri("dst")
    append(spark, source, [(1, "a")], "id long, kind string")
    checkpoint = object_store.uri("checkpoint")
    with pytest.raises(CheckpointLocationError) as caught:
        (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(target)
        )
    assert caught.value.checkpoint_location == checkpoint
    assert caught.value.scheme == "s3"
    assert "checkpointLocation" in str(caught.value)
    assert deltaflow.typed_error(caught.value) is caught.value
    assert object_store.env["AWS_SECRET_ACCESS_KEY"] not in str(caught.value)


def test_update_mode_into_an_s3_table_is_refused_naming_the_way_to_upsert(
    spark, object_store, tmp_path: Path
) -> None:
    from deltaflow.errors import InvalidOptionError

    source, target = object_store.uri("src"), object_store.uri("dst")
    append(spark, source, [(1, "a")], "id long, kind string")
    counts = spark.readStream.format("delta").load(source).groupBy("kind").count()
    with pytest.raises(InvalidOptionError) as caught:
        (
            counts.writeStream.format("delta")
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start(target)
        )
    assert caught.value.option == "outputMode"
    assert "foreachBatch" in str(caught.value)  # as delta-spark: upsert with MERGE there
