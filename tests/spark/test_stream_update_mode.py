"""Update output mode into a Delta sink: an append when the query emits each row once
(a stateless query, the mode Spark's real-time mode runs in), refused typed at
``start()`` when the query keeps per-key state (an aggregation), on both sinks: a path's
(``start(path)``) and a catalog table's (``toTable(name)``)."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import InvalidOptionError

_names = itertools.count()


def append(path: str, ids: list[int]) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64()), "p": [str(i % 2) for i in ids]})
    write_deltalake(path, data, mode="append")


def stateless(spark: Any, source: str) -> Any:
    return spark.readStream.format("delta").load(source).selectExpr("id", "id * 10 AS tens")


def run_update(df: Any, checkpoint: str, *, path: str | None = None, table: str | None = None):
    writer = (
        df.writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    query = writer.start(path) if path is not None else writer.toTable(table)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def ids(spark: Any, frame: Any) -> list[int]:
    return sorted(r["id"] for r in frame.collect())


def test_stateless_update_appends_exactly_once_to_a_path(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3])
    run_update(stateless(spark, source), checkpoint, path=target)
    append(source, [4])
    run_update(stateless(spark, source), checkpoint, path=target)  # a restart: no repeats
    assert ids(spark, spark.read.format("delta").load(target)) == [1, 2, 3, 4]
    history = DeltaTable(target).history()
    streamed = [h for h in history if h.get("operation") == "STREAMING UPDATE"]
    assert len(streamed) == 2
    assert {h["deltaflow.stream"]["outputMode"] for h in streamed} == {"Append"}


def test_stateless_update_appends_to_a_catalog_table(spark, table_path) -> None:
    source = table_path("src")
    append(source, [5, 6])
    name = f"update_mode_{next(_names)}"
    spark.sql(f"CREATE TABLE {name} (id BIGINT, tens BIGINT) USING delta")
    run_update(stateless(spark, source), table_path("ck"), table=name)
    assert sorted(tuple(r) for r in spark.table(name).collect()) == [(5, 50), (6, 60)]


@pytest.mark.parametrize("sink", ["path", "table"])
def test_update_mode_with_an_aggregation_is_refused_at_start(spark, table_path, sink) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1, 2, 3])
    counts = spark.readStream.format("delta").load(source).groupBy("p").count()
    writer = (
        counts.writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", table_path("ck"))
    )
    with pytest.raises(InvalidOptionError) as caught:
        if sink == "path":
            writer.start(target)
        else:
            name = f"update_mode_{next(_names)}"
            spark.sql(f"CREATE TABLE {name} (p STRING, count BIGINT) USING delta")
            writer.toTable(name)
    assert caught.value.option == "outputMode"
    assert "aggregation" in str(caught.value)
    assert spark.streams.active == []
