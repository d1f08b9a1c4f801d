"""deltaflow.tables against delta-spark's ``delta.tables``: names, signatures, argument
checks, protocol methods, convertToDelta / generate, and history as delta-spark writes it."""

from __future__ import annotations

import inspect
import json
import os
import textwrap

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

import deltaflow.exceptions as dx
from deltaflow import InvalidOptionError, UnsupportedFeatureError
from deltaflow.spark.dml import _delete_update
from deltaflow.tables import (
    DeltaColumnBuilder,
    DeltaMergeBuilder,
    DeltaOptimizeBuilder,
    DeltaTable,
    DeltaTableBuilder,
    IdentityGenerator,
)

# delta-spark 4's public methods and their parameter names (python/delta/tables.py).
DELTA_SPARK_SIGNATURES = {
    DeltaTable: {
        "toDF": [],
        "alias": ["aliasName"],
        "generate": ["mode"],
        "delete": ["condition"],
        "update": ["condition", "set"],
        "merge": ["source", "condition"],
        "vacuum": ["retentionHours"],
        "history": ["limit"],
        "detail": [],
        "convertToDelta": ["sparkSession", "identifier", "partitionSchema"],
        "forPath": ["sparkSession", "path", "hadoopConf"],
        "forName": ["sparkOrSQLContext", "tableOrViewName"],
        "create": ["sparkSession"],
        "createIfNotExists": ["sparkSession"],
        "replace": ["sparkSession"],
        "createOrReplace": ["sparkSession"],
        "isDeltaTable": ["sparkSession", "identifier"],
        "upgradeTableProtocol": ["readerVersion", "writerVersion"],
        "addFeatureSupport": ["featureName"],
        "dropFeatureSupport": ["featureName", "truncateHistory"],
        "restoreToVersion": ["version"],
        "restoreToTimestamp": ["timestamp"],
        "optimize": [],
    },
    DeltaMergeBuilder: {
        "whenMatchedUpdate": ["condition", "set"],
        "whenMatchedUpdateAll": ["condition"],
        "whenMatchedDelete": ["condition"],
        "whenNotMatchedInsert": ["condition", "values"],
        "whenNotMatchedInsertAll": ["condition"],
        "whenNotMatchedBySourceUpdate": ["condition", "set"],
        "whenNotMatchedBySourceDelete": ["condition"],
        "withSchemaEvolution": [],
        "execute": [],
    },
    DeltaTableBuilder: {
        "tableName": ["identifier"],
        "location": ["location"],
        "comment": ["comment"],
        "addColumn": [
            "colName",
            "dataType",
            "nullable",
            "generatedAlwaysAs",
            "generatedByDefaultAs",
            "comment",
        ],
        "addColumns": ["cols"],
        "partitionedBy": ["cols"],
        "clusterBy": ["cols"],
        "property": ["key", "value"],
        "execute": [],
    },
    DeltaOptimizeBuilder: {
        "where": ["partitionFilter"],
        "executeCompaction": [],
        "executeZOrderBy": ["cols"],
    },
}


@pytest.mark.parametrize("cls", list(DELTA_SPARK_SIGNATURES), ids=lambda c: c.__name__)
def test_classes_have_delta_spark_methods_and_parameter_names(cls):
    for method, expected in DELTA_SPARK_SIGNATURES[cls].items():
        parameters = list(inspect.signature(getattr(cls, method)).parameters)
        if parameters and parameters[0] in ("self", "cls"):
            parameters = parameters[1:]
        assert parameters == expected, f"{cls.__name__}.{method}"


def test_identity_generator_and_column_builder(spark):
    assert IdentityGenerator() == IdentityGenerator(start=1, step=1)
    with pytest.raises(TypeError):
        IdentityGenerator(start="1")  # type: ignore[arg-type]
    field = DeltaColumnBuilder(spark, "id").dataType("bigint").nullable(False).comment("key")
    built = field.build()
    assert (built.name, built.dataType.simpleString(), built.nullable) == ("id", "bigint", False)
    assert built.metadata["comment"] == "key"
    identity = DeltaColumnBuilder(spark, "id").dataType("bigint").generatedAlwaysAsIdentity(5, 2)
    assert identity.build().metadata["delta.identity.start"] == 5
    with pytest.raises(ValueError, match="dataType"):
        DeltaColumnBuilder(spark, "x").build()


# ---- fixtures ---------------------------------------------------------------------------


def _table(spark, table_path) -> tuple[str, DeltaTable]:
    path = table_path()
    spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "key string, value int").write.format(
        "delta"
    ).save(path)
    return path, DeltaTable.forPath(spark, path)


# ---- argument checks --------------------------------------------------------------------


def test_delta_table_argument_checks_raise_delta_spark_types(spark, table_path):
    path, dt = _table(spark, table_path)
    source = spark.createDataFrame([("a", 9)], "k string, v int")
    cases = [
        (TypeError, lambda: DeltaTable.forPath(spark, 1)),
        (TypeError, lambda: DeltaTable.forName(spark, 1)),
        (TypeError, lambda: dt.delete(condition=1)),
        (ValueError, lambda: dt.update({"value": "200"})),  # set missing
        (ValueError, lambda: dt.update(condition="key = 'a'")),
        (TypeError, lambda: dt.update(set=1)),
        (TypeError, lambda: dt.update(1, {"value": "1"})),
        (TypeError, lambda: dt.update(set={"value": 1})),
        (TypeError, lambda: dt.update(set={1: "1"})),
        (TypeError, lambda: dt.merge(1, "key = k")),
        (ValueError, lambda: dt.merge(None, "key = k")),
        (ValueError, lambda: dt.merge(source, None)),
        (TypeError, lambda: dt.merge(source, 1)),
        (ValueError, lambda: dt.history(limit="x")),
        (ValueError, lambda: dt.vacuum("x")),
        (ValueError, lambda: dt.restoreToVersion("x")),
        (ValueError, lambda: dt.restoreToTimestamp(5)),
        (ValueError, lambda: dt.upgradeTableProtocol("abc", 3)),
        (ValueError, lambda: dt.upgradeTableProtocol([1], 3)),
        (ValueError, lambda: dt.upgradeTableProtocol(1, {})),
        (ValueError, lambda: dt.addFeatureSupport(12345)),
        (ValueError, lambda: dt.dropFeatureSupport([])),
        (ValueError, lambda: dt.dropFeatureSupport("appendOnly", "yes")),
        (ValueError, lambda: dt.generate(1)),
        (TypeError, lambda: DeltaTable.convertToDelta(spark, 1)),
        (TypeError, lambda: DeltaTable.convertToDelta(spark, f"parquet.`{path}`", 5)),
    ]
    for expected, call in cases:
        with pytest.raises(expected):
            call()
    assert RsTable(path).version() == 0  # nothing was committed by any of them


def test_merge_builder_argument_checks_raise_delta_spark_types(spark, table_path):
    _, dt = _table(spark, table_path)
    merge = dt.merge(spark.createDataFrame([("a", 9)], "k string, v int"), "key = k")
    cases = [
        (ValueError, lambda: merge.whenMatchedUpdate({"value": "v"})),
        (ValueError, lambda: merge.whenMatchedUpdate(1)),
        (ValueError, lambda: merge.whenMatchedUpdate(condition="key = 'a'")),
        (TypeError, lambda: merge.whenMatchedUpdate(1, {"value": "v"})),
        (TypeError, lambda: merge.whenMatchedUpdate("k = 'a'", 1)),
        (TypeError, lambda: merge.whenMatchedUpdate(set={"value": 1})),
        (TypeError, lambda: merge.whenMatchedUpdate(set={1: ""})),
        (TypeError, lambda: merge.whenMatchedUpdate(set="k = 'a'", condition={"value": 1})),
        (TypeError, lambda: merge.whenMatchedDelete(1)),
        (TypeError, lambda: merge.whenMatchedUpdateAll(1)),
        (ValueError, lambda: merge.whenNotMatchedInsert({"value": "v"})),
        (ValueError, lambda: merge.whenNotMatchedInsert(condition="key = 'a'")),
        (TypeError, lambda: merge.whenNotMatchedInsert(1, {"value": "v"})),
        (TypeError, lambda: merge.whenNotMatchedInsert("k = 'a'", 1)),
        (TypeError, lambda: merge.whenNotMatchedInsert(values={"value": 1})),
        (TypeError, lambda: merge.whenNotMatchedInsert(values={1: "value"})),
        (TypeError, lambda: merge.whenNotMatchedInsertAll(1)),
        (ValueError, lambda: merge.whenNotMatchedBySourceUpdate({"value": "value"})),
        (ValueError, lambda: merge.whenNotMatchedBySourceUpdate(condition="key = 'a'")),
        (TypeError, lambda: merge.whenNotMatchedBySourceUpdate(1, {"value": "value"})),
        (TypeError, lambda: merge.whenNotMatchedBySourceUpdate("key = 'a'", 1)),
        (TypeError, lambda: merge.whenNotMatchedBySourceUpdate(set={"value": 1})),
        (TypeError, lambda: merge.whenNotMatchedBySourceDelete(1)),
    ]
    for expected, call in cases:
        with pytest.raises(expected):
            call()


def test_table_builder_argument_checks_raise_delta_spark_types(spark, table_path):
    location = table_path()
    builder = DeltaTable.create(spark).location(location)
    gen = IdentityGenerator
    cases = [
        (TypeError, lambda: builder.tableName(1)),
        (TypeError, lambda: builder.location(1)),
        (TypeError, lambda: builder.comment(1)),
        (TypeError, lambda: builder.addColumn(1, "int")),
        (TypeError, lambda: builder.addColumn("a", 1)),
        (TypeError, lambda: builder.addColumn("a", "int", comment=1)),
        (TypeError, lambda: builder.addColumn("a", "int", nullable=1)),
        (TypeError, lambda: builder.addColumn("a", "int", generatedAlwaysAs=1)),
        (ValueError, lambda: builder.addColumn("a", "bigint", generatedAlwaysAs=gen(step=0))),
        (ValueError, lambda: builder.addColumn("a", "bigint", True, "", gen())),  # both set
        (TypeError, lambda: builder.addColumn("a", "bigint", generatedByDefaultAs="")),
        (ValueError, lambda: builder.addColumn("a", "bigint", generatedByDefaultAs=gen(step=0))),
        (TypeError, lambda: builder.addColumns(1)),
        (TypeError, lambda: builder.addColumns([StructField("1", IntegerType()), 1])),
        (TypeError, lambda: builder.partitionedBy(1)),
        (TypeError, lambda: builder.partitionedBy(1, "1")),
        (TypeError, lambda: builder.partitionedBy([1])),
        (TypeError, lambda: builder.clusterBy(1)),
        (TypeError, lambda: builder.clusterBy([1])),
        (TypeError, lambda: builder.property(1, "1")),
        (TypeError, lambda: builder.property("1", 1)),
        (TypeError, lambda: builder.addColumns((StructField("a", StringType()),))),
    ]  # fmt: skip
    for expected, call in cases:
        with pytest.raises(expected):
            call()
    assert not os.path.exists(os.path.join(location, "_delta_log"))


def test_optimize_builder_checks_zorder_column_types(spark, table_path):
    _, dt = _table(spark, table_path)
    with pytest.raises(TypeError):
        dt.optimize().executeZOrderBy(1)
    with pytest.raises(TypeError):
        dt.optimize().where(1)


# ---- protocol ---------------------------------------------------------------------------


def _protocol(dt: DeltaTable) -> tuple[int, int, list[str]]:
    row = dt.detail().collect()[0]
    return row.minReaderVersion, row.minWriterVersion, sorted(row.tableFeatures)


def test_upgrade_table_protocol_only_goes_up(spark, table_path):
    path, dt = _table(spark, table_path)
    assert _protocol(dt)[:2] == (1, 2)
    dt.upgradeTableProtocol(1, 3)
    assert _protocol(dt)[:2] == (1, 3)
    version = RsTable(path).version()
    dt.upgradeTableProtocol(1, 2)  # a downgrade: kept as it is, nothing committed
    assert _protocol(dt)[:2] == (1, 3)
    assert RsTable(path).version() == version
    assert sorted(pl.read_delta(path)["value"].to_list()) == [1, 2, 3]


def test_add_feature_support(spark, table_path):
    path, dt = _table(spark, table_path)
    dt.addFeatureSupport("appendOnly")  # implied by writer 2: no change
    assert _protocol(dt) == (1, 2, ["appendOnly", "invariants"])
    dt.addFeatureSupport("deletionVectors")
    reader, writer, features = _protocol(dt)
    assert (reader, writer) == (3, 7)
    assert {"appendOnly", "deletionVectors", "invariants"} <= set(features)
    protocol = RsTable(path).protocol()
    assert "deletionVectors" in (protocol.reader_features or [])
    assert sorted(pl.read_delta(path)["value"].to_list()) == [1, 2, 3]  # still readable
    version = RsTable(path).version()
    with pytest.raises(UnsupportedFeatureError):
        dt.addFeatureSupport("abc")
    assert RsTable(path).version() == version


def test_drop_feature_support_refuses_with_the_reason(spark, table_path):
    path, dt = _table(spark, table_path)
    with pytest.raises(InvalidOptionError) as unknown:
        dt.dropFeatureSupport("__invalid_feature__")
    assert unknown.value.option == "featureName"
    with pytest.raises(InvalidOptionError) as absent:
        dt.dropFeatureSupport("deletionVectors")
    assert "does not have" in str(absent.value)
    with pytest.raises(UnsupportedFeatureError) as legacy:
        dt.dropFeatureSupport("appendOnly")
    assert legacy.value.feature == "appendOnly"
    dt.addFeatureSupport("deletionVectors")
    version = RsTable(path).version()
    with pytest.raises(UnsupportedFeatureError) as present:
        dt.dropFeatureSupport("deletionVectors", truncateHistory=True)
    assert present.value.feature == "dropFeature"
    assert "DROP FEATURE deletionVectors" in str(present.value)
    assert RsTable(path).version() == version


def test_drop_check_constraints_feature_once_unused(spark, table_path):
    path, dt = _table(spark, table_path)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (value > 0)")
    assert _protocol(dt) == (1, 3, ["appendOnly", "checkConstraints", "invariants"])
    with pytest.raises(UnsupportedFeatureError) as in_use:
        dt.dropFeatureSupport("checkConstraints")
    assert in_use.value.feature == "checkConstraints" and "DROP CONSTRAINT" in str(in_use.value)
    spark.sql(f"ALTER TABLE delta.`{path}` DROP CONSTRAINT positive")
    with pytest.raises(InvalidOptionError) as truncate:
        dt.dropFeatureSupport("checkConstraints", True)
    assert truncate.value.option == "truncateHistory"
    version = RsTable(path).version()
    dt.dropFeatureSupport("checkConstraints")
    assert _protocol(dt) == (1, 2, ["appendOnly", "invariants"])  # normalized to legacy
    table = RsTable(path)
    assert table.version() == version + 1
    assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == (1, 2)
    info = _commit_info(path, version + 1)
    assert info["operation"] == "DROP FEATURE"
    assert info["operationParameters"]["featureName"] == "checkConstraints"
    assert sorted(pl.read_delta(path)["value"].to_list()) == [1, 2, 3]
    spark.createDataFrame([("d", -1)], "key string, value int").write.format("delta").mode(
        "append"
    ).save(path)  # no constraint left: accepted
    assert dt.toDF().count() == 4
    with pytest.raises(InvalidOptionError):
        dt.dropFeatureSupport("checkConstraints")  # not present any more


# ---- convertToDelta / generate ----------------------------------------------------------


def test_convert_to_delta_with_ddl_and_struct_partition_schema(spark, table_path):
    for schema in ("part int", StructType([StructField("part", IntegerType())])):
        path = table_path()
        df = spark.createDataFrame([(1, 10), (2, 20), (3, 10)], "id long, part int")
        df.write.partitionBy("part").parquet(path)
        dt = DeltaTable.convertToDelta(spark, f"parquet.`{path}`", schema)
        assert sorted((r.id, r.part) for r in dt.toDF().collect()) == [(1, 10), (2, 20), (3, 10)]
        assert RsTable(path).metadata().partition_columns == ["part"]
        assert sorted(pl.read_delta(path)["id"].to_list()) == [1, 2, 3]

    plain = table_path()
    spark.range(4).write.parquet(plain)
    dt = DeltaTable.convertToDelta(spark, f"parquet.`{plain}`")
    assert dt.toDF().count() == 4
    assert DeltaTable.isDeltaTable(spark, plain)


def test_generate_symlink_manifest(spark, table_path):
    path = table_path()
    spark.range(40).repartition(4).write.format("delta").save(path)
    dt = DeltaTable.forPath(spark, path)
    assert dt.generate("symlink_format_manifest") is None
    with open(os.path.join(path, "_symlink_format_manifest", "manifest")) as f:
        lines = [line for line in f.read().splitlines() if line]
    assert len(lines) == len(RsTable(path).file_uris()) == 4
    with pytest.raises(InvalidOptionError):
        dt.generate("other_manifest")


# ---- conflicts through the API ---------------------------------------------------------


def test_delete_conflict_raises_delta_spark_class(spark, table_path, monkeypatch):
    path, dt = _table(spark, table_path)
    original = _delete_update.commit

    def commit_after_concurrent_delete(request):
        RsTable(path).delete("key = 'a' OR key = 'b' OR key = 'c'")  # a real other writer
        return original(request)

    monkeypatch.setattr(_delete_update, "commit", commit_after_concurrent_delete)
    with pytest.raises(dx.ConcurrentDeleteReadException) as info:
        dt.delete("key = 'a'")
    assert info.value.kind == "ConcurrentDeleteRead"


# ---- history ----------------------------------------------------------------------------


def _commit_info(path: str, version: int) -> dict:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
        for line in f:
            action = json.loads(line)
            if "commitInfo" in action:
                return action["commitInfo"]
    raise AssertionError(f"no commitInfo in version {version}")


def test_history_operations_and_parameters_as_delta_spark_writes_them(
    spark, table_path, merge_as_spark_jobs
):
    # The raw log, as delta-spark writes it: the MERGE here runs as Spark jobs. A MERGE on
    # the delta-rs route keeps delta-rs's own keys in the raw log (history() maps them;
    # tests/spark/test_merge_native.py compares the two routes' history entries).
    path = table_path()
    df = spark.createDataFrame([(i, str(i % 2)) for i in range(6)], "id long, k string")
    df.write.format("delta").partitionBy("k").save(path)
    df.write.format("delta").mode("append").save(path)
    df.where("k = '1'").write.format("delta").mode("overwrite").option(
        "replaceWhere", "k = '1'"
    ).save(path)
    dt = DeltaTable.forPath(spark, path)
    dt.delete("id = 1")
    dt.update("id = 2", {"id": "20"})
    dt.alias("t").merge(df.alias("s"), "t.id = s.id").whenMatchedUpdate(
        condition="s.id > 3", set={"id": "s.id"}
    ).whenNotMatchedInsertAll().whenNotMatchedBySourceDelete("t.id > 100").execute()
    dt.optimize().executeCompaction()
    dt.restoreToVersion(4)
    sql_name = f"delta.`{path}`"
    spark.sql(f"ALTER TABLE {sql_name} SET TBLPROPERTIES ('team'='x')")
    spark.sql(f"ALTER TABLE {sql_name} ADD COLUMNS (c int)")
    spark.sql(f"ALTER TABLE {sql_name} ALTER COLUMN c COMMENT 'x'")
    spark.sql(f"ALTER TABLE {sql_name} ADD CONSTRAINT pos CHECK (id >= 0)")
    dt.upgradeTableProtocol(1, 4)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        dt.vacuum(0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")

    # (version, operation, operationParameters keys delta-spark writes)
    expected = [
        (1, "WRITE", {"mode", "partitionBy"}),
        (2, "WRITE", {"mode", "partitionBy", "predicate"}),
        (3, "DELETE", {"predicate"}),
        (4, "UPDATE", {"predicate"}),
        (5, "MERGE", {"predicate", "matchedPredicates", "notMatchedPredicates",
                      "notMatchedBySourcePredicates"}),
        (6, "OPTIMIZE", {"predicate", "zOrderBy", "clusterBy", "auto"}),
        (7, "RESTORE", {"version", "timestamp"}),
        (8, "SET TBLPROPERTIES", {"properties"}),
        (9, "ADD COLUMNS", {"columns"}),
        (10, "CHANGE COLUMN", {"column"}),
        (11, "ADD CONSTRAINT", {"name", "expr"}),
        (12, "SET TBLPROPERTIES", {"properties"}),  # delta-spark: UPGRADE PROTOCOL
        (13, "VACUUM START", {"retentionCheckEnabled", "defaultRetentionMillis",
                              "specifiedRetentionMillis"}),
        (14, "VACUUM END", {"status"}),
    ]  # fmt: skip
    for version, operation, keys in expected:
        info = _commit_info(path, version)
        assert info["operation"] == operation, (version, info)
        assert keys <= set(info["operationParameters"]), (version, info["operationParameters"])
    assert json.loads(_commit_info(path, 2)["operationParameters"]["partitionBy"]) == ["k"]
    assert _commit_info(path, 2)["operationParameters"]["predicate"] == "k = '1'"
    # Version 0 is delta-rs's CREATE TABLE (delta-spark: WRITE), with the partition columns.
    assert json.loads(_commit_info(path, 0)["operationParameters"]["partitionBy"]) == ["k"]
    history = {r.version: r for r in dt.history().collect()}
    assert history[5].operation == "MERGE"
    assert set(history[5].operationParameters) >= {"matchedPredicates", "predicate"}
    assert sorted(pl.read_delta(path)["id"].to_list()) == sorted(r.id for r in dt.toDF().collect())


def test_streaming_commits_record_delta_spark_parameters(spark, table_path, tmp_path):
    source, sink = table_path("source"), table_path("sink")
    spark.range(3).write.format("delta").save(source)

    def run() -> str:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start(sink)
        )
        query.awaitTermination(timeout=120)
        return str(query.id)

    run()
    spark.range(3, 5).write.format("delta").mode("append").save(source)
    query_id = run()
    parameters = _commit_info(sink, 1)["operationParameters"]
    assert (parameters["outputMode"], parameters["queryId"], parameters["epochId"]) == (
        "Append",
        query_id,
        "1",
    )
    assert sorted(pl.read_delta(sink)["id"].to_list()) == [0, 1, 2, 3, 4]


# ---- Spark Connect -----------------------------------------------------------------------

CONNECT_CLIENT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from deltaflow.tables import DeltaTable

    port, path = sys.argv[1], sys.argv[2]
    spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    dt = DeltaTable.forPath(spark, path)
    print("HISTORY", [(r.version, r.operation) for r in dt.history().collect()])
    print("DETAIL", dt.detail().collect()[0].numFiles)
    print("VACUUM", dt.vacuum().count())
    dry = spark.sql(f"VACUUM delta.`{path}` DRY RUN").count()
    print("DRYRUN", dry)
    print("RESTORE", dt.restoreToVersion(0).collect()[0].num_of_files_after_restore)
    print("ROWS", sorted(r.id for r in dt.toDF().collect()))
    dt.upgradeTableProtocol(1, 3)
    print("PROTOCOL", dt.detail().collect()[0].minWriterVersion)
    spark.stop()
    """
)


@pytest.mark.slow
def test_delta_table_api_from_a_spark_connect_client(table_path, tmp_path):
    from tests.spark.test_hosts import run_connect_client

    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64())}))
    write_deltalake(path, pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    result, log = run_connect_client(tmp_path, CONNECT_CLIENT, path)
    assert result.returncode == 0, result.stderr[-3000:] + log
    out = result.stdout
    assert "HISTORY [(1, 'WRITE'), (0, 'WRITE')]" in out, out
    assert "DETAIL 2" in out and "RESTORE 1" in out and "ROWS [1, 2]" in out, out
    assert "PROTOCOL 3" in out, out
    table = RsTable(path)
    assert table.protocol().min_writer_version == 3
    operations = [c["operation"] for c in table.history()]
    assert operations[:2] == ["SET TBLPROPERTIES", "RESTORE"], operations
