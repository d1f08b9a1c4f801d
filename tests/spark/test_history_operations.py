"""The operation names and parameters each write route records, as delta-spark records
them (DeltaOperations.scala): DESCRIBE HISTORY and the log's own commitInfo agree."""

from __future__ import annotations

import json
import os
import uuid

from deltalake import DeltaTable as DeltaRsTable

from deltaflow import DeltaTable

CREATE_KEYS = ["clusterBy", "description", "isManaged", "partitionBy", "properties"]


def _history(spark, path: str) -> list[tuple[int, str, dict[str, str]]]:
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    return sorted((r["version"], r["operation"], dict(r["operationParameters"])) for r in rows)


def _log(path: str, version: int) -> list[dict]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _logged_operations(path: str) -> list[str]:
    names = sorted(n for n in os.listdir(os.path.join(path, "_delta_log")) if n.endswith(".json"))
    return [
        next(a["commitInfo"]["operation"] for a in _log(path, int(n[:20])) if "commitInfo" in a)
        for n in names
    ]


def _location(spark, name: str) -> str:
    location = DeltaTable.forName(spark, name).detail().collect()[0]["location"]
    return location.replace("file://", "").replace("file:", "")


def test_first_save_is_a_write_with_mode_and_partitioning(spark, table_path):
    df = spark.createDataFrame([(1, "a")], "x INT, y STRING")
    jvm, python = table_path("jvm"), table_path("python")
    df.write.format("delta").partitionBy("y").save(jvm)
    df.write.format("delta").mode("append").save(jvm)
    spark.conf.set("deltaflow.write.nativeWrite", "false")
    try:
        df.write.format("delta").mode("overwrite").save(python)
    finally:
        spark.conf.unset("deltaflow.write.nativeWrite")
    history = _history(spark, jvm)
    assert [(v, op) for v, op, _ in history] == [(0, "WRITE"), (1, "WRITE")]
    assert history[0][2] == {"mode": "ErrorIfExists", "partitionBy": '["y"]'}
    assert history[1][2]["mode"] == "Append"
    assert _history(spark, python)[0][1:] == ("WRITE", {"mode": "Overwrite", "partitionBy": "[]"})
    assert _logged_operations(jvm) == ["WRITE", "WRITE"]


def test_stream_batches_are_streaming_updates(spark, table_path, tmp_path):
    source, sink = table_path("src"), table_path("sink")
    spark.createDataFrame([(1,)], "x INT").write.format("delta").save(source)

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start(sink)
        )
        query.awaitTermination(120)

    run()
    spark.createDataFrame([(2,)], "x INT").write.format("delta").mode("append").save(source)
    run()
    history = _history(spark, sink)
    assert [op for _, op, _ in history] == ["STREAMING UPDATE", "STREAMING UPDATE"]
    assert [p["epochId"] for _, _, p in history] == ["0", "1"]
    assert sorted(history[0][2]) == ["epochId", "outputMode", "queryId"]
    assert history[0][2]["outputMode"] == "Append"
    assert _logged_operations(sink) == ["STREAMING UPDATE", "STREAMING UPDATE"]
    # The batch that created the table records its app transaction (replays are skipped).
    assert any(a.get("txn", {}).get("version") == 0 for a in _log(sink, 0))


def test_sql_create_and_replace_as_select(spark, table_path):
    path = table_path("ctas")
    spark.sql(f"CREATE TABLE delta.`{path}` USING delta AS SELECT 1 AS x")
    spark.sql(f"REPLACE TABLE delta.`{path}` USING delta AS SELECT 2 AS x")
    spark.sql(f"CREATE OR REPLACE TABLE delta.`{path}` USING delta AS SELECT 3 AS x")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (4)")
    history = _history(spark, path)
    assert [op for _, op, _ in history] == [
        "CREATE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
        "CREATE OR REPLACE TABLE AS SELECT",
        "WRITE",
    ]
    assert all(sorted(p) == CREATE_KEYS for _, _, p in history[:3])
    assert history[0][2]["isManaged"] == "false"
    assert history[3][2]["mode"] == "Append"
    assert sorted(r["x"] for r in spark.read.format("delta").load(path).collect()) == [3, 4]
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()[-1]["operationMetrics"]
    assert metrics["numOutputRows"] == "1"


def test_catalog_writers_record_create_and_replace_as_select(spark):
    name = "hist_" + uuid.uuid4().hex[:8]
    df = spark.createDataFrame([(1, "a")], "x INT, y STRING")
    try:
        df.write.format("delta").saveAsTable(name)
        df.write.format("delta").mode("overwrite").saveAsTable(name)
        df.writeTo(name).using("delta").replace()
        df.writeTo(name).append()
        path = _location(spark, name)
        history = _history(spark, path)
        assert [op for _, op, _ in history] == [
            "CREATE TABLE AS SELECT",
            "CREATE OR REPLACE TABLE AS SELECT",
            "REPLACE TABLE AS SELECT",
            "WRITE",
        ]
        assert history[0][2]["isManaged"] == "true"
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_create_and_replace_table_parameters(spark, table_path):
    path = table_path("ddl")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (x INT, p STRING) USING delta PARTITIONED BY (p)"
        " COMMENT 'first' TBLPROPERTIES ('owner.team' = 'a')"
    )
    spark.sql(f"REPLACE TABLE delta.`{path}` (x INT) USING delta")
    spark.sql(f"CREATE OR REPLACE TABLE delta.`{path}` (x INT) USING delta")
    history = _history(spark, path)
    assert [op for _, op, _ in history] == [
        "CREATE TABLE",
        "REPLACE TABLE",
        "CREATE OR REPLACE TABLE",
    ]
    first = history[0][2]
    assert sorted(first) == CREATE_KEYS
    assert first["partitionBy"] == '["p"]' and first["description"] == "first"
    assert json.loads(first["properties"]) == {"owner.team": "a"}
    assert _logged_operations(path)[1] == "REPLACE TABLE"


def test_ctas_with_custom_properties_is_one_commit(spark, table_path):
    path = table_path("ctas_props")
    spark.sql(
        f"CREATE TABLE delta.`{path}` USING delta TBLPROPERTIES ('owner.team' = 'a')"
        " AS SELECT id FROM range(4)"
    )
    history = _history(spark, path)
    assert [op for _, op, _ in history] == ["CREATE TABLE AS SELECT"]
    assert json.loads(history[0][2]["properties"]) == {"owner.team": "a"}
    table = DeltaRsTable(path)
    assert table.version() == 0 and table.metadata().configuration == {"owner.team": "a"}
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [0, 1, 2, 3]
