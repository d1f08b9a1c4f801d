"""Delta's SQL statements through deltaflow's parser extension: DESCRIBE HISTORY / DETAIL,
OPTIMIZE, VACUUM, RESTORE, CONVERT TO DELTA and GENERATE, on real tables, with
delta-spark's output columns and typed errors."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable

import deltaflow
from deltaflow import InvalidOptionError, TableNotFoundError, VersionNotFoundError
from deltaflow.spark.commands import _describe, _maintenance, _vacuum
from deltaflow.spark.errors import RestoreFilesMissingError, RetentionTooShortError, SqlSyntaxError
from deltaflow.table._uri import normalize_uri

ROWS = [(i, "a" if i % 2 else "b", float(i)) for i in range(8)]


def _make(spark: Any, path: str, *, partitioned: bool = True) -> str:
    """Three appends (versions 0-2) of one file each (a file per ``kind`` when partitioned
    by it, the default): 6 files partitioned, 3 not."""
    for chunk in (ROWS[:3], ROWS[3:6], ROWS[6:]):
        df = spark.createDataFrame(chunk, "id long, kind string, value double").coalesce(1)
        writer = df.write
        if partitioned:
            writer = writer.partitionBy("kind")
        writer.format("delta").mode("append").save(path)
    return path


def _raises(spark: Any, statement: str, error: type[Exception]) -> Any:
    with pytest.raises(Exception) as caught:
        spark.sql(statement)
    typed = deltaflow.typed_error(caught.value)
    assert isinstance(typed, error), caught.value
    return typed


def _ids(spark: Any, path: str) -> list[int]:
    return sorted(r.id for r in spark.read.format("delta").load(path).collect())


def _adds(path: str, version: int | None = None) -> dict[str, list[Any]]:
    table = RsTable(path) if version is None else RsTable(path, version=version)
    return pa.table(table.get_add_actions(flatten=True)).to_pydict()


def _schema(spark: Any, ddl: str) -> Any:
    return spark.createDataFrame([], ddl).schema


@pytest.fixture
def catalog_table(spark: Any, table_path: Any) -> Iterator[tuple[str, str]]:
    path = _make(spark, table_path())
    spark.sql(f"CREATE TABLE sqlcmd_t USING delta LOCATION '{path}'")
    try:
        yield "sqlcmd_t", path
    finally:
        spark.sql("DROP TABLE IF EXISTS sqlcmd_t")


# ---- DESCRIBE HISTORY / DETAIL ------------------------------------------------------------


def test_describe_history_newest_first_with_limit_by_path_name_and_quoted_path(
    spark, catalog_table
):
    name, path = catalog_table
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
    assert history.schema == _schema(spark, _describe.HISTORY_SCHEMA)
    assert history.columns[:5] == ["version", "timestamp", "userId", "userName", "operation"]
    rows = history.collect()
    assert [r.version for r in rows] == [2, 1, 0]
    assert rows[0].operationParameters["mode"] == "Append"
    assert rows[0].timestamp >= rows[2].timestamp
    assert [r.version for r in spark.sql(f"DESC HISTORY {name} LIMIT 1").collect()] == [2]
    assert [r.version for r in spark.sql(f"describe history '{path}' limit 2;").collect()] == [2, 1]
    assert [r.version for r in spark.sql(f"DESCRIBE HISTORY default.{name}").collect()] == [2, 1, 0]


def test_describe_detail_of_a_catalog_table_and_a_path(spark, catalog_table):
    name, path = catalog_table
    detail = spark.sql(f"DESCRIBE DETAIL {name}")
    assert detail.schema == _schema(spark, _describe.DETAIL_SCHEMA)
    row = detail.collect()[0]
    adds = _adds(path)
    assert (row.format, row.name) == ("delta", "spark_catalog.default.sqlcmd_t")
    assert row.location == normalize_uri(path)
    assert row.id == RsTable(path).metadata().id
    assert row.partitionColumns == ["kind"] and row.clusteringColumns == []
    assert (row.numFiles, row.sizeInBytes) == (len(adds["path"]), sum(adds["size_bytes"]))
    assert row.lastModified >= row.createdAt
    assert "appendOnly" in row.tableFeatures
    by_path = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    assert (by_path.name, by_path.numFiles) == (None, row.numFiles)


def test_describe_of_other_things_stays_spark(spark, catalog_table):
    name, _ = catalog_table
    columns = {r.col_name for r in spark.sql(f"DESCRIBE TABLE {name}").collect()}
    assert {"id", "kind", "value"} <= columns
    spark.sql("CREATE OR REPLACE TEMPORARY VIEW history AS SELECT 1 AS detail")
    try:  # `DESCRIBE history` alone describes a view named history: Spark's statement
        assert [r.col_name for r in spark.sql("DESCRIBE history").collect()] == ["detail"]
    finally:
        spark.sql("DROP VIEW history")
    assert spark.sql("SELECT :x AS x", args={"x": 7}).collect()[0].x == 7


# ---- OPTIMIZE --------------------------------------------------------------------------


def test_optimize_where_partition_compacts_only_that_partition(spark, table_path):
    path = _make(spark, table_path())
    b_files = {p for p in RsTable(path).file_uris() if "kind=b" in p}
    result = spark.sql(f"OPTIMIZE '{path}' WHERE kind = 'a'")
    assert result.schema == _schema(spark, _maintenance.OPTIMIZE_SCHEMA)
    row = result.collect()[0]
    assert row.path == normalize_uri(path)
    assert (row.metrics.numFilesAdded, row.metrics.numFilesRemoved) == (1, 3)
    assert row.metrics.filesRemoved.totalFiles == 3 and row.metrics.zOrderStats is None
    assert b_files <= set(RsTable(path).file_uris())
    assert _ids(spark, path) == list(range(8))
    log = Path(path) / "_delta_log" / f"{RsTable(path).version():020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    assert not any(a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a)
    latest = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    assert latest.operation == "OPTIMIZE"


def test_optimize_zorder_by(spark, table_path):
    path = _make(spark, table_path(), partitioned=False)
    row = spark.sql(f"OPTIMIZE delta.`{path}` ZORDER BY (value, id)").collect()[0]
    assert (row.metrics.numFilesAdded, row.metrics.numFilesRemoved) == (1, 3)
    assert row.metrics.zOrderStats.strategyName == "all"  # delta-spark's first Z-order
    assert row.metrics.zOrderStats.numOutputCubes == 1
    assert row.metrics.zOrderStats.mergedFiles.num == 3
    assert len(RsTable(path).file_uris()) == 1
    assert _ids(spark, path) == list(range(8))


def test_optimize_bad_predicate_and_columns_are_typed(spark, table_path):
    path = _make(spark, table_path())
    version = RsTable(path).version()
    error = _raises(spark, f"OPTIMIZE delta.`{path}` WHERE value > 1", InvalidOptionError)
    assert error.option == "partitionFilter" and "non-partition column 'value'" in str(error)
    error = _raises(spark, f"OPTIMIZE delta.`{path}` ZORDER BY kind", InvalidOptionError)
    assert error.option == "zOrderBy" and "partition column" in str(error)
    error = _raises(spark, f"OPTIMIZE delta.`{path}` ZORDER BY (nope)", InvalidOptionError)
    assert "no such column" in str(error)
    assert RsTable(path).version() == version


# ---- VACUUM ----------------------------------------------------------------------------


def test_vacuum_retention_check_dry_run_and_real_run(spark, table_path):
    path = _make(spark, table_path(), partitioned=False)
    deltaflow.DeltaTable.forPath(spark, path).delete("id < 3")  # removes the first file
    live = {Path(u.removeprefix("file://")) for u in RsTable(path).file_uris()}
    removed = set(Path(path).glob("*.parquet")) - live
    assert len(removed) == 1

    error = _raises(spark, f"VACUUM delta.`{path}` RETAIN 0 HOURS", RetentionTooShortError)
    assert (error.retention_hours, error.minimum_hours) == (0.0, 168.0)
    assert _vacuum.RETENTION_CHECK_CONF in str(error)
    kept = spark.sql(f"VACUUM delta.`{path}` DRY RUN").collect()  # table's 7 days
    assert kept == []

    spark.conf.set(_vacuum.RETENTION_CHECK_CONF, "false")
    try:
        dry = spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS DRY RUN")
        assert dry.columns == ["path"]
        assert [r.path for r in dry.collect()] == [normalize_uri(str(p)) for p in removed]
        assert all(p.exists() for p in removed)  # a dry run deletes nothing
        real = spark.sql(f"VACUUM '{path}' RETAIN 0 HOURS").collect()
    finally:
        spark.conf.unset(_vacuum.RETENTION_CHECK_CONF)
    assert [r.path for r in real] == [normalize_uri(path)]
    assert not any(p.exists() for p in removed)
    assert _ids(spark, path) == list(range(3, 8))


# ---- RESTORE ---------------------------------------------------------------------------


def test_restore_version_and_timestamp_with_metrics(spark, catalog_table):
    name, path = catalog_table
    result = spark.sql(f"RESTORE TABLE {name} TO VERSION AS OF 0")
    assert result.schema == _schema(spark, _maintenance.RESTORE_SCHEMA)
    row = result.collect()[0]
    assert _ids(spark, path) == [0, 1, 2]
    version_0 = _adds(path, 0)
    assert row.num_of_files_after_restore == len(version_0["path"]) == 2
    assert row.table_size_after_restore == sum(version_0["size_bytes"])
    assert (row.num_removed_files, row.num_restored_files, row.restored_files_size) == (4, 0, 0)
    assert row.removed_files_size > 0

    v2_ms = next(c["timestamp"] for c in RsTable(path).history() if c["version"] == 2)
    spark.sql(f"RESTORE delta.`{path}` TIMESTAMP AS OF timestamp_millis({v2_ms})")
    assert _ids(spark, path) == list(range(8))
    history = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0]
    assert history.operation == "RESTORE"

    error = _raises(spark, f"RESTORE {name} TO VERSION AS OF 99", VersionNotFoundError)
    assert error.version == 99
    error = _raises(spark, f"RESTORE {name} TIMESTAMP AS OF 'not a time'", InvalidOptionError)
    assert error.option == "timestampAsOf"


def test_restore_after_vacuum_names_the_missing_file_and_commits_nothing(spark, table_path):
    path = _make(spark, table_path(), partitioned=False)
    deltaflow.DeltaTable.forPath(spark, path).delete("id < 3")  # version 3
    spark.conf.set(_vacuum.RETENTION_CHECK_CONF, "false")
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset(_vacuum.RETENTION_CHECK_CONF)
    before = RsTable(path).version()  # VACUUM committed its start and end too
    error = _raises(spark, f"RESTORE delta.`{path}` VERSION AS OF 1", RestoreFilesMissingError)
    assert (error.version, error.missing) == (1, 1)
    assert error.path.endswith(".parquet") and error.path in str(error)
    assert not (Path(path) / error.path).exists()
    assert RsTable(path).version() == before
    assert _ids(spark, path) == list(range(3, 8))


# ---- CONVERT TO DELTA / GENERATE -------------------------------------------------------


def test_convert_a_partitioned_parquet_directory(spark, table_path):
    path = table_path("pq")
    spark.createDataFrame(ROWS, "id long, kind string, value double").write.partitionBy(
        "kind"
    ).parquet(path)
    error = _raises(spark, f"CONVERT TO DELTA parquet.`{path}`", InvalidOptionError)
    assert error.option == "partitionedBy" and "PARTITIONED BY" in str(error)
    assert not (Path(path) / "_delta_log").exists()

    result = spark.sql(
        f"CONVERT TO DELTA parquet.`{path}` NO STATISTICS PARTITIONED BY (kind string)"
    )
    assert result.columns == [] and result.collect() == []
    assert RsTable(path).metadata().partition_columns == ["kind"]
    assert _ids(spark, path) == list(range(8))
    spark.sql(f"CONVERT TO DELTA parquet.`{path}` PARTITIONED BY (kind string)")  # a no-op
    assert RsTable(path).version() == 0
    _raises(spark, f"CONVERT TO DELTA parquet.`{path}_missing`", TableNotFoundError)


def test_convert_a_catalog_parquet_table(spark, tmp_path):
    location = tmp_path / "catalog_pq"
    spark.sql(
        f"CREATE TABLE sqlcmd_pq (id long, kind string) USING parquet PARTITIONED BY (kind)"
        f" LOCATION '{location}'"
    )
    try:
        spark.sql("INSERT INTO sqlcmd_pq VALUES (1, 'a'), (2, 'b')")
        error = _raises(spark, "DESCRIBE HISTORY sqlcmd_pq", TableNotFoundError)
        assert "CONVERT TO DELTA" in str(error) and "parquet table" in str(error)
        spark.sql("CONVERT TO DELTA sqlcmd_pq")
        detail = spark.sql("DESCRIBE DETAIL sqlcmd_pq").collect()[0]
        assert (detail.format, detail.partitionColumns) == ("delta", ["kind"])
        assert sorted(r.id for r in spark.table("sqlcmd_pq").collect()) == [1, 2]
        spark.sql("INSERT INTO sqlcmd_pq VALUES (3, 'a')")
        assert RsTable(str(location)).version() == 1
    finally:
        spark.sql("DROP TABLE IF EXISTS sqlcmd_pq")


def test_generate_symlink_manifest(spark, catalog_table):
    name, path = catalog_table
    result = spark.sql(f"GENERATE symlink_format_manifest FOR TABLE {name}")
    assert result.collect() == []
    manifests = sorted(Path(path, "_symlink_format_manifest").rglob("manifest"))
    assert [m.parent.name for m in manifests] == ["kind=a", "kind=b"]
    listed = {line for m in manifests for line in m.read_text().split()}
    assert {u.removeprefix("file://") for u in listed} == {
        u.removeprefix("file://") for u in RsTable(path).file_uris()
    }
    error = _raises(spark, f"GENERATE other_mode FOR TABLE {name}", InvalidOptionError)
    assert error.option == "mode"


# ---- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("VACUUM t RETAIN x HOURS", "a number of hours"),
        ("VACUUM t DRY", "RUN"),
        ("OPTIMIZE t ZORDER (a)", "BY"),
        ("OPTIMIZE t WHERE", "a partition predicate"),
        ("RESTORE TABLE t", "VERSION AS OF or TIMESTAMP AS OF"),
        ("DESCRIBE HISTORY t LIMIT ten", "a number of commits"),
        ("DESCRIBE DETAIL t extra", "the end of the statement"),
        ("CONVERT TO DELTA parquet.`/x` PARTITIONED BY (k nosuchtype)", "<col> <type>, ..."),
        ("GENERATE symlink_format_manifest FOR t", "TABLE"),
    ],
)
def test_syntax_errors_say_where_and_what_was_expected(spark, statement, expected):
    error = _raises(spark, statement, SqlSyntaxError)
    assert error.expected == expected
    assert error.statement == statement
    assert "Syntax: " in str(error) and f"position {error.position}" in str(error)


def test_tables_that_are_not_delta_are_typed_errors(spark, table_path):
    error = _raises(spark, "DESCRIBE DETAIL sqlcmd_no_such_table", TableNotFoundError)
    assert error.table_uri == "`sqlcmd_no_such_table`" and "SHOW TABLES" in str(error)
    missing = table_path("missing")
    error = _raises(spark, f"VACUUM delta.`{missing}`", TableNotFoundError)
    assert error.table_uri == normalize_uri(missing)
    spark.sql("CREATE OR REPLACE TEMPORARY VIEW sqlcmd_view AS SELECT 1 AS id")
    try:
        error = _raises(spark, "OPTIMIZE sqlcmd_view", TableNotFoundError)
        assert "temporary view" in str(error)
    finally:
        spark.sql("DROP VIEW sqlcmd_view")
    error = _raises(spark, "DESCRIBE HISTORY other_catalog.db.t", deltaflow.UnsupportedFeatureError)
    assert error.feature == "otherCatalogs"


# ---- hosts -----------------------------------------------------------------------------


@pytest.mark.slow
def test_statements_from_the_spark_sql_cli(spark, table_path, tmp_path):
    from tests.spark.test_hosts import SPARK_HOME, conf_args, spark_env

    path = _make(spark, table_path())
    statements = (
        f"DESCRIBE HISTORY delta.`{path}` LIMIT 1; VACUUM '{path}' DRY RUN;"
        f" OPTIMIZE delta.`{path}` WHERE kind = 'b';"
    )
    command = [str(SPARK_HOME / "bin" / "spark-sql"), "--master", "local[1]", *conf_args()]
    result = subprocess.run(
        [*command, "-e", statements],
        cwd=tmp_path,
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("2\t") and "\tWRITE\t" in line for line in lines), result.stdout
    assert any(
        line.startswith(f'{normalize_uri(path)}\t{{"numFilesAdded":1,"numFilesRemoved":3,')
        for line in lines
    ), result.stdout
    assert RsTable(path).history(1)[0]["operation"] == "OPTIMIZE"


# ---- table_changes -------------------------------------------------------------------


def test_table_changes_by_name_and_by_path(spark, table_path):
    path = table_path()
    spark.range(3).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    spark.sql(f"CREATE TABLE sqlcmd_cdf USING delta LOCATION '{path}'")
    try:
        rows = spark.sql("SELECT * FROM table_changes('sqlcmd_cdf', 1) ORDER BY id").collect()
        assert [(r.id, r._change_type, r._commit_version) for r in rows] == [
            (3, "insert", 1),
            (4, "insert", 1),
        ]
        by_path = spark.sql(
            f"SELECT id, _commit_version FROM table_changes_by_path('{path}', 0, 0) ORDER BY id"
        ).collect()
        assert [(r.id, r._commit_version) for r in by_path] == [(0, 0), (1, 0), (2, 0)]
        error = _raises(spark, "SELECT * FROM table_changes('sqlcmd_cdf')", InvalidOptionError)
        assert "takes 2 or 3 arguments" in str(error)
        error = _raises(spark, "SELECT * FROM table_changes('sqlcmd_none', 0)", TableNotFoundError)
        assert error.table_uri == "`sqlcmd_none`"
    finally:
        spark.sql("DROP TABLE IF EXISTS sqlcmd_cdf")
