"""deltaflow's session catalog (``DeltaCatalog``): Delta tables created, written, read and
dropped through SQL and the DataFrame APIs, with the Delta log as the only truth."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse

import deltalake
import polars as pl
import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.table.errors import TableNotFoundError, UnsupportedFeatureError


def _name() -> str:
    return "cat_" + uuid.uuid4().hex[:8]


def _location(spark, name: str) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    return next(r.data_type for r in rows if r.col_name == "Location")


def _local(uri: str) -> str:
    return urlparse(uri).path


def _rows(path: str, *columns: str) -> list[tuple]:
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def test_create_table_writes_the_log_and_the_catalog_keeps_only_a_pointer(spark):
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT NOT NULL, day STRING, v DOUBLE COMMENT 'value')"
        " USING delta PARTITIONED BY (day) COMMENT 'managed one'"
        " TBLPROPERTIES ('delta.appendOnly' = 'false', 'team' = 'ingest')"
    )
    location = _local(_location(spark, name))
    log = deltalake.DeltaTable(location)
    assert log.version() == 0
    assert log.metadata().partition_columns == ["day"]
    assert log.metadata().description == "managed one"
    assert log.metadata().configuration == {"delta.appendOnly": "false", "team": "ingest"}
    fields = {f.name: f for f in log.schema().fields}
    assert fields["id"].nullable is False
    assert fields["v"].metadata.get("comment") == "value"

    props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
    assert props["team"] == "ingest"
    assert props["delta.minReaderVersion"] == "1"
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE EXTENDED {name}").collect()}
    assert described["Provider"] == "delta"
    assert described["Type"] == "MANAGED"
    # The schema comes from the log: a commit by another writer shows up in the catalog.
    deltalake.write_deltalake(
        location,
        pa.table({"id": [1], "day": ["mon"], "v": [0.5], "extra": ["x"]}),
        mode="append",
        schema_mode="merge",
    )
    assert sorted(spark.table(name).columns) == ["day", "extra", "id", "v"]


def test_ctas_is_one_commit_with_the_data_and_reads_back_everywhere(spark, table_path):
    name, path = _name(), table_path("ctas")
    spark.sql(
        f"CREATE TABLE {name} USING delta PARTITIONED BY (part) LOCATION '{path}'"
        " COMMENT 'ctas' TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', 'k' = 'v')"
        " AS SELECT id, id % 2 AS part, CAST(id AS STRING) AS s FROM range(6)"
    )
    log = deltalake.DeltaTable(path)
    # The table and its data in one commit, the user's own property 'k' included.
    assert log.version() == 0
    assert log.metadata().partition_columns == ["part"]
    assert log.metadata().description == "ctas"
    assert log.metadata().configuration["k"] == "v"
    assert log.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    expected = [(i, i % 2, str(i)) for i in range(6)]
    assert _rows(path, "id", "part", "s") == expected
    polars_rows = pl.read_delta(path).sort("id").rows()
    assert polars_rows == expected
    assert sorted(tuple(r) for r in spark.table(name).collect()) == expected
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE EXTENDED {name}").collect()}
    assert described["Type"] == "EXTERNAL"


def test_replace_table_as_select_keeps_history_and_replaces_schema(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} USING delta AS SELECT id FROM range(3)")
    location = _local(_location(spark, name))
    assert deltalake.DeltaTable(location).version() == 0  # table and data: one commit
    spark.sql(f"CREATE OR REPLACE TABLE {name} USING delta AS SELECT 'x' AS s, 1.5 AS d")
    log = deltalake.DeltaTable(location)
    assert log.version() == 1
    assert [f.name for f in log.schema().fields] == ["s", "d"]
    assert [tuple(r) for r in spark.table(name).collect()] == [("x", 1.5)]
    # The old version is still there for time travel.
    assert sorted(r.id for r in spark.sql(f"SELECT * FROM {name} VERSION AS OF 0").collect()) == [
        0,
        1,
        2,
    ]
    spark.sql(f"REPLACE TABLE {name} (a INT) USING delta")
    assert deltalake.DeltaTable(location).version() == 2
    assert spark.table(name).count() == 0
    with pytest.raises(AnalysisException, match=r"TABLE_OR_VIEW_NOT_FOUND|CANNOT_REPLACE_MISSING"):
        spark.sql(f"REPLACE TABLE {_name()} (a INT) USING delta")


def test_create_table_if_not_exists_and_on_an_existing_location(spark, table_path):
    path, name = table_path("existing"), _name()
    deltalake.write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64())}))
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{path}'")
    assert deltalake.DeltaTable(path).version() == 0  # registering does not commit
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} (x INT) USING delta")
    assert spark.table(name).columns == ["id"]
    with pytest.raises(TableNotFoundError, match="declares no columns"):
        spark.sql(f"CREATE TABLE {_name()} USING delta LOCATION '{table_path('nothing')}'")


def test_bad_create_statements_are_refused_typed_and_create_nothing(spark, table_path):
    path = table_path("bad")
    with pytest.raises(InvalidOptionError, match=r"delta\.appendOnlyy"):
        spark.sql(
            f"CREATE TABLE {_name()} (id INT) USING delta LOCATION '{path}'"
            " TBLPROPERTIES ('delta.appendOnlyy' = 'true')"
        )
    with pytest.raises(UnsupportedFeatureError, match="transforms"):
        spark.sql(
            f"CREATE TABLE {_name()} (id INT, ts TIMESTAMP) USING delta"
            f" PARTITIONED BY (days(ts)) LOCATION '{path}'"
        )
    assert not os.path.exists(os.path.join(path, "_delta_log"))


def test_save_as_table_write_to_and_insert_into(spark):
    name = _name()
    df = spark.range(4).selectExpr("id", "id % 2 AS part")
    df.write.format("delta").partitionBy("part").saveAsTable(name)
    location = _local(_location(spark, name))
    assert deltalake.DeltaTable(location).metadata().partition_columns == ["part"]
    spark.range(4, 6).selectExpr("id", "id % 2 AS part").write.format("delta").mode(
        "append"
    ).saveAsTable(name)
    spark.range(1).selectExpr("100 AS id", "7 AS part").write.insertInto(name)
    assert spark.table(name).count() == 7
    spark.range(2).selectExpr("id", "0 AS part").write.format("delta").mode(
        "overwrite"
    ).saveAsTable(name)
    assert _rows(location, "id", "part") == [(0, 0), (1, 0)]

    other = _name()
    spark.range(3).writeTo(other).using("delta").tableProperty("k", "v").create()
    spark.range(3, 5).writeTo(other).append()
    assert spark.table(other).count() == 5
    spark.range(2).writeTo(other).overwrite(F.expr("id >= 0"))
    assert spark.table(other).count() == 2
    spark.range(9, 10).writeTo(other).using("delta").replace()
    assert [r.id for r in spark.table(other).collect()] == [9]
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_ALREADY_EXISTS"):
        spark.range(1).writeTo(other).using("delta").create()


def test_partition_overwrites_static_and_dynamic(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, part STRING) USING delta PARTITIONED BY (part)")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    location = _local(_location(spark, name))

    spark.sql(f"INSERT OVERWRITE {name} PARTITION (part = 'a') SELECT 10")
    assert _rows(location, "id", "part") == [(2, "b"), (3, "c"), (10, "a")]

    spark.createDataFrame([(20, "b"), (40, "d")], "id BIGINT, part STRING").writeTo(
        name
    ).overwritePartitions()
    assert _rows(location, "id", "part") == [(3, "c"), (10, "a"), (20, "b"), (40, "d")]

    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        spark.sql(f"INSERT OVERWRITE {name} VALUES (30, 'c')")
    finally:
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", "static")
    assert _rows(location, "id", "part") == [(10, "a"), (20, "b"), (30, "c"), (40, "d")]

    # The option on a path write, as delta-spark has it.
    spark.createDataFrame([(11, "a")], "id BIGINT, part STRING").write.format("delta").mode(
        "overwrite"
    ).option("partitionOverwriteMode", "dynamic").save(location)
    assert _rows(location, "id", "part") == [(11, "a"), (20, "b"), (30, "c"), (40, "d")]
    # History names it as delta-spark does (the raw log keeps delta-rs's mode Append).
    entry = spark.sql(f"DESCRIBE HISTORY delta.`{location}` LIMIT 1").collect()[0]
    assert entry["operation"] == "WRITE"
    assert entry["operationParameters"] == {
        "mode": "Overwrite",
        "partitionBy": '["part"]',
        "isDynamicPartitionOverwrite": "true",
    }
    with pytest.raises(InvalidOptionError, match="partitionOverwriteMode"):
        spark.range(1).write.format("delta").mode("overwrite").option(
            "partitionOverwriteMode", "sometimes"
        ).save(location)


def test_path_identifiers_work_where_table_names_go(spark, table_path):
    path = table_path("by_path")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, s STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2, 'b')")
    assert _rows(path, "id", "s") == [(1, "a"), (2, "b")]
    at_one = spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF 1").collect()
    assert [tuple(r) for r in at_one] == [(1, "a")]
    latest = spark.sql(f"SELECT count(*) AS n FROM delta.`{path}`").first()
    assert latest.n == 2
    props = {r.key for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    assert "delta.minWriterVersion" in props
    with pytest.raises(UnsupportedFeatureError, match="not in the catalog"):
        spark.sql(f"DROP TABLE delta.`{path}`")
    assert os.path.isdir(os.path.join(path, "_delta_log"))


def test_time_travel_by_timestamp_through_the_catalog(spark):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id INT) USING delta")
    spark.sql(f"INSERT INTO {name} VALUES (1)")
    location = _local(_location(spark, name))
    history = deltalake.DeltaTable(location).history()
    committed_ms = next(h["timestamp"] for h in history if h["version"] == 1)
    spark.sql(f"INSERT INTO {name} VALUES (2)")
    import datetime as dt

    at = dt.datetime.fromtimestamp(committed_ms / 1000, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S.%f"
    )
    rows = spark.sql(f"SELECT id FROM {name} TIMESTAMP AS OF '{at}'").collect()
    assert [r.id for r in rows] == [1]
    read = spark.read.option("versionAsOf", 0).table(name)
    assert read.count() == 0


def test_read_change_feed_option_on_a_catalog_table(spark):
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, v STRING) USING delta"
        " TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(f"INSERT INTO {name} VALUES (1, 'x'), (2, 'y')")
    changes = spark.read.option("readChangeFeed", "true").option("startingVersion", 1).table(name)
    assert "_change_type" in changes.columns
    got = sorted((r.id, r._change_type, r._commit_version) for r in changes.collect())
    assert got == [(1, "insert", 1), (2, "insert", 1)]


def test_drop_deletes_a_managed_tables_data_and_keeps_an_external_one(spark, table_path):
    managed = _name()
    spark.sql(f"CREATE TABLE {managed} USING delta AS SELECT 1 AS id")
    managed_dir = _local(_location(spark, managed))
    assert os.path.isdir(os.path.join(managed_dir, "_delta_log"))
    spark.sql(f"DROP TABLE {managed}")
    assert not os.path.exists(managed_dir)

    external, path = _name(), table_path("external")
    spark.sql(f"CREATE TABLE {external} USING delta LOCATION '{path}' AS SELECT 1 AS id")
    spark.sql(f"DROP TABLE {external}")
    assert _rows(path, "id") == [(1,)]


def test_session_defaults_apply_to_new_tables_only(spark, table_path):
    key = "spark.databricks.delta.properties.defaults.appendOnly"
    spark.conf.set(key, "true")
    try:
        name = _name()
        spark.sql(f"CREATE TABLE {name} (id INT) USING delta")
        path = table_path("defaults")
        spark.range(1).write.format("delta").save(path)
        explicit = _name()
        spark.sql(
            f"CREATE TABLE {explicit} (id INT) USING delta"
            " TBLPROPERTIES ('delta.appendOnly' = 'false')"
        )
    finally:
        spark.conf.unset(key)
    config = deltalake.DeltaTable(_local(_location(spark, name))).metadata().configuration
    assert config == {"delta.appendOnly": "true"}
    assert deltalake.DeltaTable(path).metadata().configuration == {"delta.appendOnly": "true"}
    explicit_config = deltalake.DeltaTable(_local(_location(spark, explicit))).metadata()
    assert explicit_config.configuration == {"delta.appendOnly": "false"}


def test_at_version_names(spark, table_path):
    """delta-spark's ``t@v<version>`` and ``t@<yyyyMMddHHmmssSSS>`` names (UTC)."""
    path = table_path("at")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2)")
    assert [r.id for r in spark.sql(f"SELECT * FROM delta.`{path}@v1`").collect()] == [1]
    assert spark.sql(f"SELECT * FROM delta.`{path}@v0`").count() == 0

    name = _name()
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{path}'")
    assert sorted(r.id for r in spark.sql(f"SELECT * FROM `{name}@v2`").collect()) == [1, 2]
    import datetime as dt

    committed = next(
        h["timestamp"] for h in deltalake.DeltaTable(path).history() if h["version"] == 1
    )
    stamp = dt.datetime.fromtimestamp(committed / 1000, dt.timezone.utc)
    at = stamp.strftime("%Y%m%d%H%M%S") + f"{stamp.microsecond // 1000:03d}"
    assert [r.id for r in spark.sql(f"SELECT * FROM `{name}@{at}`").collect()] == [1]
    with pytest.raises(deltaflow.VersionNotFoundError):
        spark.sql(f"SELECT * FROM delta.`{path}@v9`").collect()

    # The DataFrame reader's path, as delta-spark's load("/path@v1").
    reader = spark.read.format("delta")
    assert [r.id for r in reader.load(f"{path}@v1").collect()] == [1]
    assert [r.id for r in reader.load(f"{path}@{at}").collect()] == [1]
    with pytest.raises(deltaflow.TableNotFoundError):
        reader.load(f"{path}-missing@v1").collect()
    # A table whose own path ends so is read as it is named.
    literal = table_path("named@v1")
    spark.range(3).write.format("delta").save(literal)
    assert reader.load(literal).count() == 3


# ---- REPLACE: the statement's properties are the table's -------------------------------


def _config(path: str) -> dict[str, str]:
    return dict(deltalake.DeltaTable(path).metadata().configuration)


def _writer_version(path: str) -> int:
    return deltalake.DeltaTable(path).protocol().min_writer_version


def test_replace_as_select_sets_the_statements_properties_and_keeps_history(spark, table_path):
    path = table_path("ras")
    table = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {table} USING delta"
        " TBLPROPERTIES ('delta.appendOnly' = 'false', 'owner.team' = 'a') AS SELECT 1 AS id"
    )
    spark.sql(
        f"REPLACE TABLE {table} USING delta TBLPROPERTIES"
        " ('delta.enableChangeDataFeed' = 'true', 'owner.team' = 'b') AS SELECT 2 AS id"
    )
    # The statement's properties, not a merge with the old ones (delta-spark).
    assert _config(path) == {"delta.enableChangeDataFeed": "true", "owner.team": "b"}
    assert _writer_version(path) == 4  # change data feed needs writer version 4
    shown = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}
    assert shown["owner.team"] == "b" and "delta.appendOnly" not in shown

    # The change feed the REPLACE turned on records the next UPDATE.
    spark.sql(f"UPDATE {table} SET id = 20 WHERE id = 2")
    changes = spark.sql(f"SELECT id, _change_type FROM table_changes('{table}', 2)").collect()
    assert sorted(tuple(r) for r in changes) == [(2, "update_preimage"), (20, "update_postimage")]

    spark.sql(
        f"CREATE OR REPLACE TABLE {table} USING delta"
        " TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 3 days') AS SELECT 3 AS id"
    )
    assert _config(path) == {"delta.logRetentionDuration": "interval 3 days"}
    assert _writer_version(path) == 4  # the protocol is never downgraded
    history = spark.sql(f"DESCRIBE HISTORY {table}").collect()
    assert [r.operation for r in reversed(history)] == [
        "CREATE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
        "UPDATE",
        "CREATE OR REPLACE TABLE AS SELECT",
    ]
    assert [r.id for r in spark.sql(f"SELECT * FROM {table} VERSION AS OF 0").collect()] == [1]
    assert [r.id for r in spark.table(table).collect()] == [3]


def test_every_replace_path_applies_its_properties(spark):
    from deltaflow import DeltaTable

    name = _name()
    try:
        spark.sql(f"CREATE TABLE {name} USING delta TBLPROPERTIES ('k' = 'a') AS SELECT 1 AS id")
        location = _local(_location(spark, name))
        key = "spark.databricks.delta.properties.defaults.checkpointInterval"
        spark.conf.set(key, "7")
        try:  # a replace is a new table: the session's defaults apply (delta-spark)
            spark.sql(f"CREATE OR REPLACE TABLE {name} (id BIGINT) USING delta")
        finally:
            spark.conf.unset(key)
        assert _config(location) == {"delta.checkpointInterval": "7"}

        spark.range(2).writeTo(name).using("delta").tableProperty("k", "b").createOrReplace()
        assert _config(location) == {"k": "b"}
        spark.range(2).writeTo(name).using("delta").tableProperty(
            "delta.enableChangeDataFeed", "true"
        ).replace()
        assert _config(location) == {"delta.enableChangeDataFeed": "true"}
        # saveAsTable's overwrite keeps the table's properties (delta-spark's V1 writer).
        spark.range(3).write.format("delta").mode("overwrite").saveAsTable(name)
        assert _config(location) == {"delta.enableChangeDataFeed": "true"}
        assert spark.table(name).count() == 3

        DeltaTable.createOrReplace(spark).tableName(name).addColumn("id", "BIGINT").property(
            "k", "c"
        ).execute()
        assert _config(location) == {"k": "c"}
        DeltaTable.replace(spark).tableName(name).addColumn("id", "BIGINT").execute()
        assert _config(location) == {}
        spark.sql(f"REPLACE TABLE {name} (id INT) USING delta TBLPROPERTIES ('k' = 'd')")
        assert _config(location) == {"k": "d"}
        assert deltalake.DeltaTable(location).version() == 7  # every replace kept history
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_a_refused_replace_writes_nothing(spark, table_path):
    path = table_path("ras_refused")
    table = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {table} USING delta TBLPROPERTIES ('k' = 'a') AS SELECT 1 AS id")
    with pytest.raises(InvalidOptionError, match=r"delta\.bogus"):
        spark.sql(
            f"REPLACE TABLE {table} USING delta TBLPROPERTIES ('delta.bogus' = '1')"
            " AS SELECT 2 AS id"
        )
    with pytest.raises(UnsupportedFeatureError) as refused:
        spark.sql(
            f"REPLACE TABLE {table} USING delta"
            " TBLPROPERTIES ('delta.columnMapping.mode' = 'name') AS SELECT 2 AS id"
        )
    assert refused.value.feature == "columnMapping"
    with pytest.raises(Exception, match="boom"):
        spark.sql(
            f"REPLACE TABLE {table} USING delta TBLPROPERTIES ('k' = 'b')"
            " AS SELECT raise_error('boom') AS id"
        )
    assert deltalake.DeltaTable(path).version() == 0
    assert _config(path) == {"k": "a"}
    assert [r.id for r in spark.table(table).collect()] == [1]
    assert not [f for f in os.listdir(path) if f.endswith(".parquet")][1:]  # one file: v0's


def test_a_replace_changing_properties_without_put_if_absent_is_refused():
    import json
    from types import SimpleNamespace

    from deltaflow.spark._options import CREATE_SPEC_OPTION, parse_write_options
    from deltaflow.spark.write._plan import _replaces_metadata

    def options(uri: str, properties: dict[str, str], replace: bool = True):
        spec = {"mode": "replace", "replaceMetadata": replace, "properties": properties}
        return parse_write_options({"path": uri, CREATE_SPEC_OPTION: json.dumps(spec)})

    table = SimpleNamespace(configuration={"k": "a"})
    hdfs = "hdfs://namenode/t"
    assert _replaces_metadata("file:///tmp/t", table, "overwrite", options("file:///tmp/t", {}))
    # saveAsTable's overwrite keeps the metadata wherever the table is.
    assert not _replaces_metadata(hdfs, table, "overwrite", options(hdfs, {}, replace=False))
    # Without put-if-absent: the same properties are an overwrite, new ones are refused.
    assert not _replaces_metadata(hdfs, table, "overwrite", options(hdfs, {"k": "a"}))
    with pytest.raises(UnsupportedFeatureError) as refused:
        _replaces_metadata(hdfs, table, "overwrite", options(hdfs, {"k": "b"}))
    assert refused.value.feature == "replaceTableProperties"
