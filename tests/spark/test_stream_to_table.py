"""Streams into Delta catalog tables by name (``writeStream.toTable``): the table's own
DataSource V2 streaming write, exactly once, and ``TRUNCATE TABLE``. The same from a
Spark Connect client is in ``test_hosts.py``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.table.errors import UnsupportedFeatureError
from tests.spark._checkpoints import forget_batch

_names = itertools.count()


def append(path: str, ids: list[int]) -> None:
    data = pa.table({"id": pa.array(ids, pa.int64()), "p": [str(i % 2) for i in ids]})
    write_deltalake(path, data, mode="append")


def fresh_table(spark: Any, columns: str = "id BIGINT, p STRING", extra: str = "") -> str:
    name = f"to_table_{next(_names)}"
    spark.sql(f"CREATE TABLE {name} ({columns}) USING delta {extra}")
    return name


def location(spark: Any, name: str) -> str:
    return str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"]).removeprefix(
        "file://"
    )


def to_table(
    df: Any, name: str, checkpoint: str, mode: str = "append", ok: bool = True, **options: str
) -> Any:
    query = (
        df.writeStream.outputMode(mode)
        .options(checkpointLocation=checkpoint, **options)
        .trigger(availableNow=True)
        .toTable(name)
    )
    try:
        query.awaitTermination(300)
    except Exception:
        if ok:
            raise
    assert (query.exception() is None) == ok, query.exception()
    return query


def source_stream(spark: Any, path: str) -> Any:
    return spark.readStream.format("delta").load(path)


def test_a_stream_into_a_catalog_table_commits_once_per_batch(spark, table_path) -> None:
    source, checkpoint = table_path("src"), table_path("ck")
    append(source, [1, 2, 3])
    name = fresh_table(spark, extra="PARTITIONED BY (p)")
    query = to_table(source_stream(spark, source), name, checkpoint)

    # The catalog table's streaming write, not the path's V1 sink.
    target = location(spark, name)
    assert query.lastProgress["sink"]["description"] == f"DeltaTable[file://{target}]"
    assert query.lastProgress["sink"]["numOutputRows"] == 3
    assert sorted(r.id for r in spark.table(name).collect()) == [1, 2, 3]
    table = DeltaTable(target)
    assert table.metadata().partition_columns == ["p"]
    assert {f.split("/")[-2] for f in table.file_uris()} == {"p=0", "p=1"}
    info = table.history(1)[0]
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert info["operation"] == "STREAMING UPDATE"
    assert info["deltaflow.stream"] == {"queryId": app_id, "batchId": 0, "outputMode": "Append"}
    assert table.transaction_version(app_id) == 0

    # Restarted from its checkpoint: only the new rows, in one more commit.
    append(source, [4, 5])
    to_table(source_stream(spark, source), name, checkpoint)
    assert sorted(r.id for r in spark.table(name).collect()) == [1, 2, 3, 4, 5]
    assert DeltaTable(target).version() == table.version() + 1
    assert DeltaTable(target).transaction_version(app_id) == 1


def test_a_replayed_batch_is_not_written_twice(spark, table_path) -> None:
    source, checkpoint = table_path("src"), table_path("ck")
    append(source, [1])
    name = fresh_table(spark)
    to_table(source_stream(spark, source), name, checkpoint)
    append(source, [2])
    to_table(source_stream(spark, source), name, checkpoint)
    target = location(spark, name)
    before = DeltaTable(target)

    # As after a crash between the Delta commit and Spark's commit log: batch 1 again.
    last = forget_batch(checkpoint)
    to_table(source_stream(spark, source), name, checkpoint)

    after = DeltaTable(target)
    assert sorted(r.id for r in spark.table(name).collect()) == [1, 2]
    assert after.version() == before.version()
    assert set(after.file_uris()) == set(before.file_uris())
    assert len(list(Path(target).rglob("*.parquet"))) == len(before.file_uris())
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert after.transaction_version(app_id) == last


def test_complete_mode_overwrites_the_table_each_batch(spark, table_path) -> None:
    source, checkpoint = table_path("src"), table_path("ck")
    append(source, [1, 2, 3])
    name = fresh_table(spark, "p STRING, n BIGINT")
    counts = source_stream(spark, source).groupBy("p").count().withColumnRenamed("count", "n")
    to_table(counts, name, checkpoint, "complete")
    assert sorted(spark.table(name).collect()) == [("0", 1), ("1", 2)]
    append(source, [4, 5, 6])
    to_table(counts, name, checkpoint, "complete")
    assert sorted(spark.table(name).collect()) == [("0", 3), ("1", 3)]
    info = DeltaTable(location(spark, name)).history(1)[0]
    assert info["deltaflow.stream"]["outputMode"] == "Complete"


def test_update_mode_is_refused_typed_when_the_stream_starts(spark, table_path) -> None:
    source = table_path("src")
    append(source, [1])
    name = fresh_table(spark, "p STRING, n BIGINT")
    counts = source_stream(spark, source).groupBy("p").count().withColumnRenamed("count", "n")
    with pytest.raises(InvalidOptionError) as error:
        counts.writeStream.outputMode("update").option(
            "checkpointLocation", table_path("ck")
        ).toTable(name)
    assert error.value.option == "outputMode"
    assert spark.streams.active == []


def test_merge_schema_and_generated_columns_on_the_streaming_write(spark, table_path) -> None:
    source, checkpoint = table_path("src"), table_path("ck")
    append(source, [1, 2])
    name = fresh_table(spark, "id BIGINT, twice BIGINT GENERATED ALWAYS AS (id * 2)")
    wider = source_stream(spark, source).selectExpr("id", "p")
    # A new column without mergeSchema is the brain's typed error, in the query.
    failed = to_table(wider, name, checkpoint, ok=False)
    assert deltaflow.typed_error(failed.exception()) is not None
    assert spark.table(name).count() == 0
    to_table(wider, name, table_path("ck"), mergeSchema="true")
    assert sorted(spark.table(name).collect()) == [(1, 2, "1"), (2, 4, "0")]


def test_a_table_the_file_write_cannot_take_is_refused_typed(spark, table_path) -> None:
    source = table_path("src")
    append(source, [1])
    if PYSPARK_MINOR >= (4, 1):
        name = fresh_table(spark, "id BIGINT, p STRING")
        spark.sql(f"ALTER TABLE {name} ADD CONSTRAINT small CHECK (id < 10)")
    else:  # Spark 4.0's parser has no ADD CONSTRAINT; a NOT NULL column takes that route too
        name = fresh_table(spark, "id BIGINT NOT NULL, p STRING")
    failed = to_table(source_stream(spark, source), name, table_path("ck"), ok=False)
    error = deltaflow.typed_error(failed.exception())
    assert isinstance(error, UnsupportedFeatureError)
    assert error.feature == "streamingWritePythonRoute"
    assert spark.table(name).count() == 0


def test_a_stream_reading_a_catalog_table_uses_the_jvm_source(spark, table_path) -> None:
    name = fresh_table(spark)
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")
    query = (
        spark.readStream.table(name)
        .writeStream.format("memory")
        .queryName(f"{name}_read")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    described = query.lastProgress["sources"][0]["description"]
    assert described == f"DeltaSource[file://{location(spark, name)}]"
    assert spark.table(f"{name}_read").count() == 2


def test_truncate_table_empties_it_in_one_commit(spark) -> None:
    name = fresh_table(spark, extra="PARTITIONED BY (p) TBLPROPERTIES ('x.kept' = 'yes')")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")
    target = location(spark, name)
    before = DeltaTable(target).version()
    spark.sql(f"TRUNCATE TABLE {name}")
    table = DeltaTable(target)
    assert spark.table(name).count() == 0
    assert table.version() == before + 1
    assert table.file_uris() == []
    assert table.metadata().partition_columns == ["p"]
    assert table.metadata().configuration["x.kept"] == "yes"
    assert [f.name for f in table.schema().fields] == ["id", "p"]
