"""``CREATE TABLE t SHALLOW CLONE s``, as delta-spark's: version 0 of the clone references
the source version's files by absolute URI, under a new table id, with the statement's
properties; the clone then lives its own life (DML, VACUUM) and never touches the source's
files. Also ``DeltaTable.clone`` / ``cloneAtVersion`` / ``cloneAtTimestamp``, and ``CREATE OR
REPLACE`` over an existing table (an empty one only, as delta-spark 4.4)."""

from __future__ import annotations

import glob
import json
import os
import uuid
from typing import Any
from urllib.parse import urlparse

import deltalake
import pyarrow as pa
import pytest

from deltaflow import DeltaTable
from deltaflow.errors import typed_error
from deltaflow.table.errors import TableAlreadyExistsError, UnsupportedFeatureError
from tests.spark._conf import conf_set

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


@pytest.fixture
def names(spark: Any) -> Any:
    made: list[str] = []

    def make() -> str:
        made.append("clone_" + uuid.uuid4().hex[:8])
        return made[-1]

    yield make
    for name in made:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def _ids(spark: Any, table: str) -> list[int]:
    return sorted(r.id for r in spark.table(table).collect())


def _location(spark: Any, table: str) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    return urlparse(next(r.data_type for r in rows if r.col_name == "Location")).path


def _version_zero(path: str, version: int = 0) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _refused(call: Any) -> Exception:
    with pytest.raises(Exception) as caught:
        call()
    error = typed_error(caught.value)
    assert error is not None, caught.value
    return error


def test_a_clone_references_the_source_files_and_lives_its_own_life(spark, names):
    source, clone = names(), names()
    spark.range(10).selectExpr("id", "id % 2 AS p").write.format("delta").partitionBy(
        "p"
    ).saveAsTable(source)
    spark.sql(f"DELETE FROM {source} WHERE id = 3")
    source_dir = _location(spark, source)
    source_files = sorted(glob.glob(f"{source_dir}/**/*.parquet", recursive=True))

    [row] = spark.sql(f"CREATE TABLE {clone} SHALLOW CLONE {source}").collect()
    live = pa.table(deltalake.DeltaTable(source_dir).get_add_actions(flatten=True)).to_pydict()
    assert row.asDict() == {
        "source_table_size": sum(live["size_bytes"]),
        "source_num_of_files": len(live["path"]),
        "num_removed_files": 0,
        "num_copied_files": 0,
        "removed_files_size": 0,
        "copied_files_size": 0,
    }
    assert _ids(spark, clone) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    clone_dir = _location(spark, clone)
    assert clone_dir != source_dir
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE EXTENDED {clone}").collect()}
    assert described["Type"] == "MANAGED"
    actions = _version_zero(clone_dir)
    adds = [a["add"] for a in actions if "add" in a]
    assert adds and all(a["path"].startswith("file:///") for a in adds)
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    source_metadata = deltalake.DeltaTable(source_dir).metadata()
    assert metadata["id"] != source_metadata.id
    assert metadata["partitionColumns"] == ["p"]
    [entry] = spark.sql(f"DESCRIBE HISTORY {clone}").collect()
    assert entry.operation == "CLONE"
    assert entry.operationParameters["sourceVersion"] == "1"
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    # delta-spark records readVersion -1 too, which delta-rs cannot read: left out.
    assert info["isBlindAppend"] is False and "readVersion" not in info
    assert metadata["createdTime"] == source_metadata.created_time

    # The clone changes alone; the source and its files stay as they were.
    spark.sql(f"DELETE FROM {clone} WHERE id < 5")
    spark.sql(f"INSERT INTO {clone} VALUES (20, 0)")
    with conf_set(spark, RETENTION_CHECK, "false"):
        spark.sql(f"VACUUM {clone} RETAIN 0 HOURS")
    assert _ids(spark, clone) == [5, 6, 7, 8, 9, 20]
    assert _ids(spark, source) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert sorted(glob.glob(f"{source_dir}/**/*.parquet", recursive=True)) == source_files

    # An existing target: IF NOT EXISTS does nothing, the rest are refused typed.
    assert spark.sql(f"CREATE TABLE IF NOT EXISTS {clone} SHALLOW CLONE {source}").collect() == []
    error = _refused(lambda: spark.sql(f"CREATE TABLE {clone} SHALLOW CLONE {source}"))
    assert isinstance(error, TableAlreadyExistsError)
    # Replacing a table that holds rows by a clone: refused, as delta-spark 4.4 refuses it.
    error = _refused(lambda: spark.sql(f"CREATE OR REPLACE TABLE {clone} SHALLOW CLONE {source}"))
    assert isinstance(error, TableAlreadyExistsError)
    error = _refused(lambda: spark.sql(f"CREATE TABLE {names()} DEEP CLONE {source}"))
    assert isinstance(error, UnsupportedFeatureError) and error.feature == "deepClone"
    assert _ids(spark, clone) == [5, 6, 7, 8, 9, 20]


def test_a_clone_of_a_version_with_properties_at_a_location(spark, names, tmp_path):
    source, clone = names(), names()
    spark.range(3).write.format("delta").saveAsTable(source)
    spark.sql(f"ALTER TABLE {source} SET TBLPROPERTIES ('team' = 'ingest')")
    spark.range(3, 6).write.format("delta").mode("append").saveAsTable(source)
    location = str(tmp_path / "clone")

    spark.sql(
        f"CREATE TABLE {clone} SHALLOW CLONE {source} VERSION AS OF 0"
        f" TBLPROPERTIES ('owner.note' = 'copy', delta.logRetentionDuration = 'interval 2 days')"
        f" LOCATION '{location}'"
    )
    assert _ids(spark, clone) == [0, 1, 2]
    properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {clone}").collect()}
    assert properties["owner.note"] == "copy"
    assert properties["delta.logRetentionDuration"] == "interval 2 days"
    assert "team" not in properties  # version 0 had none
    described = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE EXTENDED {clone}").collect()}
    assert (described["Type"], urlparse(described["Location"]).path) == ("EXTERNAL", location)


def test_a_clone_of_a_table_with_deletion_vectors_by_path(spark, table_path):
    source, clone = table_path(), table_path()
    spark.range(20).write.format("delta").option("delta.enableDeletionVectors", "true").save(source)
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id % 3 = 0")
    source_files = sorted(glob.glob(f"{source}/*"))

    spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{source}`")
    expected = [i for i in range(20) if i % 3]
    assert sorted(r.id for r in spark.read.format("delta").load(clone).collect()) == expected
    vectors = [a["add"]["deletionVector"] for a in _version_zero(clone) if "add" in a]
    assert vectors and all(v["storageType"] == "p" for v in vectors if v)
    found = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(clone))
    assert pa.table(found.execute("SELECT id FROM t").read_all())["id"].to_pylist() == expected

    spark.sql(f"DELETE FROM delta.`{clone}` WHERE id = 1")
    # OPTIMIZE rewrites the source's files, their deleted rows left out, under the clone.
    assert spark.sql(f"OPTIMIZE delta.`{clone}`").collect()[0].metrics.numFilesAdded == 1
    assert not [a for a in _log_adds(clone) if "deletionVector" in a or ":" in a["path"]]
    with conf_set(spark, RETENTION_CHECK, "false"):
        spark.sql(f"VACUUM delta.`{clone}` RETAIN 0 HOURS")
    assert sorted(r.id for r in spark.read.format("delta").load(clone).collect()) == expected[1:]
    assert sorted(glob.glob(f"{source}/*")) == source_files


def test_vacuum_of_a_clone_never_deletes_its_sources_files(spark, table_path):
    """A clone's DELETE that removes whole source files leaves tombstones naming them;
    VACUUM (delta-rs's lite mode on a deletion-vector table) must leave them be."""
    source, clone = table_path(), table_path()
    spark.range(6).write.format("delta").option("delta.enableDeletionVectors", "true").save(source)
    source_files = sorted(glob.glob(f"{source}/*.parquet"))
    spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{source}`")
    spark.sql(f"DELETE FROM delta.`{clone}` WHERE id >= 0")
    with conf_set(spark, RETENTION_CHECK, "false"):
        listed = spark.sql(f"VACUUM delta.`{clone}` RETAIN 0 HOURS DRY RUN").collect()
        spark.sql(f"VACUUM delta.`{clone}` RETAIN 0 HOURS")
    assert not [r for r in listed if source in r[0]]
    assert sorted(glob.glob(f"{source}/*.parquet")) == source_files
    assert sorted(r.id for r in spark.read.format("delta").load(source).collect()) == list(range(6))
    assert spark.read.format("delta").load(clone).count() == 0


def _log_adds(path: str) -> list[dict]:
    adds = deltalake.DeltaTable(path).get_add_actions(flatten=True)
    return pa.table(adds).select(["path"]).to_pylist()


def test_delta_table_clone_methods(spark, names, tmp_path):
    source = names()
    spark.range(2).write.format("delta").saveAsTable(source)
    spark.range(2, 4).write.format("delta").mode("append").saveAsTable(source)
    table = DeltaTable.forName(spark, source)

    by_name = names()
    cloned = table.clone(by_name, isShallow=True, properties={"k": "v"})
    assert sorted(r.id for r in cloned.toDF().collect()) == [0, 1, 2, 3]
    assert cloned.detail().collect()[0].properties["k"] == "v"
    path = str(tmp_path / "at_version")
    at_version = table.cloneAtVersion(0, path, isShallow=True)
    assert sorted(r.id for r in at_version.toDF().collect()) == [0, 1]
    first = table.history().orderBy("version").collect()[0].timestamp
    at_time = table.cloneAtTimestamp(str(first), names(), isShallow=True)
    assert sorted(r.id for r in at_time.toDF().collect()) == [0, 1]
    error = _refused(lambda: table.clone(names(), isShallow=False))
    assert isinstance(error, UnsupportedFeatureError) and error.feature == "deepClone"


def test_an_empty_table_is_replaced_by_a_clone_in_one_commit(spark, names, table_path):
    source, target = table_path(), names()
    spark.range(12).write.format("delta").option("delta.enableDeletionVectors", "true").save(source)
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id % 3 = 0")
    spark.sql(
        f"CREATE TABLE {target} (id BIGINT, s STRING) USING delta PARTITIONED BY (s)"
        " TBLPROPERTIES ('team' = 'a', 'delta.enableChangeDataFeed' = 'true',"
        " 'delta.enableDeletionVectors' = 'true')"
    )
    spark.sql(f"INSERT INTO {target} VALUES (1, 'x')")
    location = _location(spark, target)
    table_id = deltalake.DeltaTable(location).metadata().id
    # A table with rows is refused (delta-spark: DELTA_UNSUPPORTED_NON_EMPTY_CLONE)...
    error = _refused(
        lambda: spark.sql(f"CREATE OR REPLACE TABLE {target} SHALLOW CLONE delta.`{source}`")
    )
    assert isinstance(error, TableAlreadyExistsError)
    assert deltalake.DeltaTable(location).version() == 1
    # ...an emptied one becomes the clone, in one commit on its own log.
    spark.sql(f"DELETE FROM {target}")
    [row] = spark.sql(
        f"CREATE OR REPLACE TABLE {target} SHALLOW CLONE delta.`{source}` TBLPROPERTIES ('k' = 'v')"
    ).collect()
    assert (row.num_removed_files, row.num_copied_files, row.source_num_of_files) == (0, 0, 2)
    assert _ids(spark, target) == [i for i in range(12) if i % 3]
    actions = _version_zero(location, 3)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "CLONE"
    assert info["operationParameters"] == {"source": f"delta.`{source}`", "sourceVersion": 1}
    assert (info["isBlindAppend"], info["readVersion"]) == (False, 2)
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    assert metadata["id"] == table_id
    assert metadata["partitionColumns"] == []
    assert metadata["configuration"] == {"delta.enableDeletionVectors": "true", "k": "v"}
    adds = [a["add"] for a in actions if "add" in a]
    assert len(adds) == 2 and all(a["path"].startswith("file:///") for a in adds)
    assert all(a["deletionVector"]["storageType"] == "p" for a in adds)
    # The protocol only grows: the target's change data feed feature stays listed.
    table = deltalake.DeltaTable(location)
    assert "changeDataFeed" in (table.protocol().writer_features or [])
    assert "deletionVectors" in (table.protocol().reader_features or [])
    assert deltalake.DeltaTable(source).version() == 1

    # DeltaTable.clone(replace=True): the same, from the Python API, by path.
    path = table_path()
    spark.range(3).write.format("delta").save(path)
    error = _refused(lambda: DeltaTable.forPath(spark, source).clone(path, True, replace=True))
    assert isinstance(error, TableAlreadyExistsError)
    spark.sql(f"DELETE FROM delta.`{path}`")
    cloned = DeltaTable.forPath(spark, source).clone(path, isShallow=True, replace=True)
    assert sorted(r.id for r in cloned.toDF().collect()) == [i for i in range(12) if i % 3]
    assert [h["operation"] for h in deltalake.DeltaTable(path).history(1)] == ["CLONE"]
