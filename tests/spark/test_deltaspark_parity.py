"""delta-spark's answers where its own Python test suite found deltaflow's different
(issue 27): table schemas as reads see them, the builder's errors, `_metadata` file
columns, OPTIMIZE's metrics, history parameters and errors, feature and timestamp errors,
ALTER TABLE SET LOCATION, and OPTIMIZE losing a race as a typed conflict."""

from __future__ import annotations

import json
import os
import uuid

import deltalake
import pyarrow as pa
import pytest
from pyspark.errors.exceptions.base import UnsupportedOperationException
from pyspark.sql.functions import col, floor
from pyspark.sql.types import IntegerType, LongType, StructField, StructType
from pyspark.sql.utils import AnalysisException, ParseException

from deltaflow import DeltaTable, typed_error
from deltaflow.exceptions import ConcurrentDeleteReadException
from deltaflow.spark.catalog._columns import IdentityGenerator
from deltaflow.spark.commands import _maintenance
from deltaflow.table.errors import (
    ConcurrentWriteError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)


def _name() -> str:
    return "parity_" + uuid.uuid4().hex[:8]


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_a_read_shows_the_schema_without_generation_expressions(spark, table_path):
    # delta-spark's table schema drops writer-only metadata (generation expressions,
    # identity keys); the comment stays, and the log keeps the expression.
    path, name = table_path("gen"), _name()
    table = (
        DeltaTable.create(spark)
        .tableName(name)
        .location(path)
        .addColumn("col1", "int", comment="foo", nullable=False)
        .addColumn("col2", IntegerType(), generatedAlwaysAs="col1 + 10")
        .addColumn("id", LongType(), generatedAlwaysAs=IdentityGenerator())
        .execute()
    )
    expected = StructType(
        [
            StructField("col1", IntegerType(), False, {"comment": "foo"}),
            StructField("col2", IntegerType(), True, {}),
            StructField("id", LongType(), True, {}),
        ]
    )
    assert table.toDF().schema == expected
    assert spark.table(name).schema == expected
    logged = json.loads(deltalake.DeltaTable(path).schema().to_json())["fields"][1]
    assert logged["metadata"] == {"delta.generationExpression": "col1 + 10"}
    spark.sql(f"INSERT INTO {name} (col1) VALUES (1)")
    assert [tuple(r) for r in spark.table(name).collect()] == [(1, 11, 1)]


def test_the_builders_catalog_errors_are_analysis_exceptions(spark, table_path):
    name = _name()
    spark.sql(f"CREATE TABLE {name} (c1 INT) USING delta")
    exists = _raised(
        lambda: DeltaTable.create(spark).tableName(name).addColumn("a", "INT").execute()
    )
    # Both delta-spark's type and deltaflow's, with its fields.
    assert isinstance(exists, AnalysisException) and isinstance(exists, TableAlreadyExistsError)
    assert name in str(exists) and "already exists" in str(exists)
    assert exists.table_uri == name

    missing = _name()
    gone = _raised(
        lambda: DeltaTable.replace(spark).tableName(missing).addColumn("a", "INT").execute()
    )
    assert isinstance(gone, AnalysisException) and isinstance(gone, TableNotFoundError)
    assert missing in str(gone) and "did not exist" in str(gone)
    assert not spark.catalog.tableExists(missing)


def test_the_builders_argument_errors_are_pysparks(spark, table_path):
    builder = DeltaTable.create(spark).location(table_path("bad"))
    bad_type = _raised(lambda: builder.addColumn("a", "1"))
    assert isinstance(bad_type, ParseException) and isinstance(bad_type, ValueError)
    assert bad_type.option == "dataType"
    not_long = _raised(lambda: builder.addColumn("a", "int", generatedAlwaysAs=IdentityGenerator()))
    assert isinstance(not_long, UnsupportedOperationException)
    assert not_long.column == "a" and not_long.reason == "identityType"
    assert not_long.getCondition() == "DELTA_IDENTITY_COLUMNS_UNSUPPORTED_DATA_TYPE"
    assert builder.spec.columns == ()  # a refused column is not added


def test_metadata_columns_name_each_rows_file(spark, table_path):
    path = table_path("meta")
    (
        spark.range(100)
        .withColumn("p", col("id") % 4)
        .repartition(3)
        .write.partitionBy("p")
        .format("delta")
        .save(path)
    )
    files = {f"file://{f}": os.path.getsize(f) for f in deltalake.DeltaTable(path).file_uris()}
    df = spark.read.format("delta").load(path)
    rows = df.select("id", "_metadata").collect()
    assert len(rows) == 100
    assert {r._metadata.file_path for r in rows} == set(files)
    for r in rows:
        meta = r._metadata
        assert meta.file_size == files[meta.file_path]
        assert meta.file_name == os.path.basename(meta.file_path)
        assert meta.file_block_start == 0 and meta.file_block_length == meta.file_size
        assert meta.file_modification_time.year >= 2024
    in_p2 = df.filter("p = 2").select("_metadata.file_path").distinct().count()
    assert in_p2 == sum("/p=2/" in f for f in files)
    # The schema itself has no such column.
    assert "_metadata" not in df.columns


def test_metadata_columns_with_deleted_rows(spark, table_path):
    # Files with deletion vectors are read row by row: _metadata comes along there too.
    path = table_path("meta_dv")
    spark.range(20).coalesce(1).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 5")
    rows = spark.read.format("delta").load(path).select("id", "_metadata.file_path").collect()
    assert sorted(r.id for r in rows) == list(range(5, 20))
    (only,) = deltalake.DeltaTable(path).file_uris()
    assert {r.file_path for r in rows} == {f"file://{only}"}


def test_optimize_records_and_answers_as_delta_spark(spark, table_path):
    path = table_path("opt")
    for key, values in (("a", (1, 2)), ("a", (3, 4)), ("b", (1, 2))):
        spark.createDataFrame([(key, v) for v in values], ["key", "value"]).repartition(
            1
        ).write.partitionBy("key").format("delta").mode("append").save(path)
    table = DeltaTable.forPath(spark, path)
    result = table.optimize().where("key = 'a'").executeCompaction().first()
    assert (result.metrics.numFilesAdded, result.metrics.numFilesRemoved) == (1, 2)
    # delta-spark records the parsed predicate's simpleString.
    assert table.history(1).first().operationParameters["predicate"] == '["(\'key = a)"]'

    error = _raised(lambda: table.optimize().where("value = 1").executeCompaction())
    assert (
        "Predicate references non-partition column 'value'. Only the partition columns may be"
        " referenced: [key]" in str(error)
    )
    assert typed_error(error).option == "partitionFilter"


def test_zorder_metrics_are_delta_sparks(spark, table_path):
    path = table_path("zorder")
    (
        spark.createDataFrame(list(range(100)), IntegerType())
        .withColumn("col1", floor(col("value") % 7))
        .withColumn("p", floor(col("value") % 5))
        .repartition(3)
        .write.partitionBy("p")
        .format("delta")
        .save(path)
    )
    before = len(deltalake.DeltaTable(path).file_uris())
    table = DeltaTable.forPath(spark, path)
    metrics = table.optimize().executeZOrderBy(["col1"]).select("metrics.*").head()
    assert (metrics.numFilesAdded, metrics.numFilesRemoved) == (5, before)
    assert (metrics.totalConsideredFiles, metrics.totalFilesSkipped) == (before, 0)
    assert metrics.zOrderStats.strategyName == "all"
    assert metrics.zOrderStats.numOutputCubes == 5  # one per partition
    assert metrics.zOrderStats.mergedFiles.num == before
    error = _raised(lambda: table.optimize().executeZOrderBy(["p"]))
    assert "p is a partition column. Z-Ordering can only be performed on data columns" in str(error)


def test_unknown_feature_and_bad_timestamp_carry_delta_sparks_error(spark, table_path):
    path = table_path("errors")
    spark.range(3).write.format("delta").save(path)
    table = DeltaTable.forPath(spark, path)
    unknown = _raised(lambda: table.addFeatureSupport("abc"))
    assert "DELTA_UNSUPPORTED_FEATURES_IN_CONFIG" in str(unknown)
    assert isinstance(typed_error(unknown), UnsupportedFeatureError)
    assert typed_error(unknown).feature == "abc"
    bad = _raised(lambda: table.restoreToTimestamp("05/04/1999"))
    assert "The provided timestamp ('05/04/1999') cannot be converted to a valid timestamp" in str(
        bad
    )
    assert isinstance(typed_error(bad) or bad, VersionNotFoundError)


def test_set_location_moves_the_catalog_entry(spark, table_path):
    name, first, second = _name(), table_path("first"), table_path("second")
    spark.sql(f"CREATE TABLE {name} (a LONG) USING delta LOCATION '{first}'")
    spark.range(2).toDF("a").write.format("delta").save(second)
    spark.sql(f"ALTER TABLE {name} SET LOCATION '{second}'")
    assert spark.table(name).count() == 2
    assert DeltaTable.forName(spark, name).detail().first().location == f"file://{second}"
    assert "location" not in deltalake.DeltaTable(first).metadata().configuration
    missing = table_path("nowhere")
    error = _raised(lambda: spark.sql(f"ALTER TABLE {name} SET LOCATION '{missing}'"))
    assert isinstance(typed_error(error), TableNotFoundError)


def test_optimize_losing_to_a_concurrent_delete_is_concurrent_delete_read(tmp_path):
    # No Spark needed: OPTIMIZE's delta-rs table read before a concurrent DELETE commits.
    path = str(tmp_path / "race")
    for i in range(3):
        deltalake.write_deltalake(path, pa.table({"id": pa.array([i], pa.int64())}), mode="append")
    stale = deltalake.DeltaTable(path)
    deltalake.DeltaTable(path).delete("id = 1")  # a MERGE / DELETE deleting a file it read
    with pytest.raises(ConcurrentDeleteReadException) as info:
        _maintenance._compact(f"file://{path}", None, [], {}, table=stale)
    assert isinstance(info.value, ConcurrentWriteError) and info.value.retryable
    assert info.value.kind == "ConcurrentDeleteRead" and info.value.read_version == 2
    assert deltalake.DeltaTable(path).version() == 3  # nothing committed
