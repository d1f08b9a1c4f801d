"""ALTER TABLE on Delta tables through spark.sql: every form changes the Delta log in one
commit (read back by delta-rs and by deltaflow's readers) or refuses typed with the table
unchanged; CHECK constraints and NOT NULL columns hold on every write path."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as DeltaRsTable
from deltalake import write_deltalake

import deltaflow
from deltaflow import (
    ConstraintViolationError,
    InvalidConstraintError,
    InvalidOptionError,
    SchemaMismatchError,
    UnsupportedFeatureError,
)

MAPPING_HINT = "SET TBLPROPERTIES ('delta.columnMapping.mode'='name')"


def typed(spark: Any, statement: str) -> deltaflow.DeltaflowError:
    """The typed deltaflow error ``statement`` fails with."""
    with pytest.raises(Exception) as info:  # any Spark wrapper, then typed
        spark.sql(statement).collect()
    error = deltaflow.typed_error(info.value)
    assert error is not None, f"no deltaflow error in: {info.value}"
    return error


def version(path: str) -> int:
    return int(DeltaRsTable(path).version())


def last_commit(path: str) -> dict[str, Any]:
    log = os.path.join(path, "_delta_log")
    newest = max(n for n in os.listdir(log) if n.endswith(".json"))
    with open(os.path.join(log, newest)) as f:
        actions = [json.loads(line) for line in f if line.strip()]
    return {k: v for a in actions for k, v in a.items()}


def rows(spark: Any, table: str, order: str = "id") -> list[tuple[Any, ...]]:
    return [tuple(r) for r in spark.sql(f"SELECT * FROM {table} ORDER BY {order}").collect()]


def python_rows(spark: Any, path: str) -> list[dict[str, Any]]:
    """The table read by the Python data path (deltaflow.read.nativeScan=false)."""
    spark.conf.set("deltaflow.read.nativeScan", "false")
    try:
        df = spark.read.format("delta").load(path)
        return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["id"])
    finally:
        spark.conf.unset("deltaflow.read.nativeScan")


@pytest.fixture
def table(spark: Any, table_path: Any) -> Any:
    """A factory: a catalog table ``CREATE TABLE <name> (<columns>) USING delta LOCATION``
    with ``rows`` inserted; returns (name, path)."""
    made: list[str] = []

    def make(columns: str, values: str | None = None, properties: str = "") -> tuple[str, str]:
        name = "alter_" + uuid.uuid4().hex[:8]
        path = table_path(name)
        extra = f" TBLPROPERTIES ({properties})" if properties else ""
        spark.sql(f"CREATE TABLE {name} ({columns}) USING delta LOCATION '{path}'{extra}")
        made.append(name)
        if values:
            spark.sql(f"INSERT INTO {name} VALUES {values}")
        return name, path

    yield make
    for name in made:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


# ---- columns ------------------------------------------------------------------------------


def test_add_columns_nested_with_position_and_comment(spark: Any, table: Any) -> None:
    name, path = table(
        "id BIGINT, s STRUCT<a: INT, b: STRING>", "(1, named_struct('a', 1, 'b', 'x'))"
    )
    spark.sql(
        f"ALTER TABLE {name} ADD COLUMNS (first_col INT COMMENT 'hi' FIRST, s.c DOUBLE AFTER a)"
    )
    assert version(path) == 2
    commit = last_commit(path)
    assert commit["commitInfo"]["operation"] == "ADD COLUMNS"
    logged = json.loads(commit["commitInfo"]["operationParameters"]["columns"])
    assert [c["column"]["name"] for c in logged] == ["first_col", "s.c"]
    assert [c.get("position") for c in logged] == ["FIRST", "AFTER a"]
    schema = json.loads(DeltaRsTable(path).schema().to_json())
    assert [f["name"] for f in schema["fields"]] == ["first_col", "id", "s"]
    assert schema["fields"][0]["metadata"]["comment"] == "hi"
    assert [f["name"] for f in schema["fields"][2]["type"]["fields"]] == ["a", "c", "b"]
    assert rows(spark, name) == [(None, 1, (1, None, "x"))]
    assert DeltaRsTable(path).to_pyarrow_table().to_pylist() == [
        {"first_col": None, "id": 1, "s": {"a": 1, "c": None, "b": "x"}}
    ]
    spark.sql(f"INSERT INTO {name} VALUES (7, 2, named_struct('a', 2, 'c', 2.5, 'b', 'y'))")
    assert rows(spark, name) == [(None, 1, (1, None, "x")), (7, 2, (2, 2.5, "y"))]


def test_add_column_not_null_or_existing_is_refused_unchanged(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT", "(1)")
    error = typed(spark, f"ALTER TABLE {name} ADD COLUMNS (x INT NOT NULL)")
    assert isinstance(error, UnsupportedFeatureError)
    assert error.feature == "addNotNullColumn"
    assert version(path) == 1
    assert [f.name for f in spark.table(name).schema.fields] == ["id"]


def test_rename_and_drop_need_column_mapping(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, v STRING", "(1, 'a')")
    for statement in (
        f"ALTER TABLE {name} RENAME COLUMN v TO w",
        f"ALTER TABLE {name} DROP COLUMN v",
    ):
        error = typed(spark, statement)
        assert isinstance(error, UnsupportedFeatureError)
        assert error.feature == "columnMapping"
        assert MAPPING_HINT in error.message
    assert version(path) == 1


def test_column_mapping_upgrade_then_rename_and_drop_nested(spark: Any, table_path: Any) -> None:
    path = table_path("mapped")
    write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array([1, 2], pa.int64()),
                "v": ["a", "b"],
                "s": pa.array(
                    [{"x": 1, "y": "p"}, {"x": 2, "y": "q"}],
                    pa.struct([("x", pa.int32()), ("y", pa.string())]),
                ),
                "gone": [True, False],
            }
        ),
    )
    table = f"delta.`{path}`"
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.columnMapping.mode'='name')")
    protocol = DeltaRsTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (2, 5)
    schema = json.loads(DeltaRsTable(path).schema().to_json())
    assert schema["fields"][1]["metadata"]["delta.columnMapping.physicalName"] == "v"
    assert DeltaRsTable(path).metadata().configuration["delta.columnMapping.maxColumnId"] == "6"

    spark.sql(f"ALTER TABLE {table} RENAME COLUMN v TO w")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN s.y TO why")
    spark.sql(f"ALTER TABLE {table} DROP COLUMN gone")
    assert version(path) == 4
    commit = last_commit(path)["commitInfo"]
    assert commit["operation"] == "DROP COLUMNS"
    assert json.loads(commit["operationParameters"]["columns"]) == ["gone"]
    names = [f["name"] for f in json.loads(DeltaRsTable(path).schema().to_json())["fields"]]
    assert names == ["id", "w", "s"]

    expected = [(1, "a", (1, "p")), (2, "b", (2, "q"))]
    assert rows(spark, table) == expected
    assert python_rows(spark, path) == [
        {"id": 1, "w": "a", "s": {"x": 1, "why": "p"}},
        {"id": 2, "w": "b", "s": {"x": 2, "why": "q"}},
    ]
    spark.sql(f"INSERT INTO {table} VALUES (3, 'c', named_struct('x', 3, 'why', 'r'))")
    assert rows(spark, table) == [*expected, (3, "c", (3, "r"))]


def test_type_widening_turned_on_then_writes_and_dml(spark: Any, table: Any) -> None:
    """Widening needs delta.enableTypeWidening; turning it on adds the typeWidening feature
    (reader 3 / writer 7, as delta-spark), and the table stays writable: appends and DML
    commit through deltaflow's log writer (delta-rs 1.6 refuses such tables), and rows of
    files written before the widening read at the new type (issue 27)."""
    name, path = table("id BIGINT, n INT", "(1, 5)")
    error = typed(spark, f"ALTER TABLE {name} ALTER COLUMN n TYPE BIGINT")
    assert isinstance(error, UnsupportedFeatureError)
    assert error.feature == "typeWidening"
    assert "delta.enableTypeWidening" in error.message
    assert version(path) == 1
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.enableTypeWidening'='true')")
    protocol = last_commit(path)["protocol"]
    assert (protocol["minReaderVersion"], protocol["minWriterVersion"]) == (3, 7)
    assert "typeWidening" in protocol["readerFeatures"]
    assert "typeWidening" in protocol["writerFeatures"]
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN n TYPE BIGINT")
    spark.sql(f"INSERT INTO {name} VALUES (2, {2**40})")
    assert last_commit(path)["commitInfo"]["engineInfo"].startswith("deltaflow/")
    spark.sql(f"UPDATE {name} SET n = n + 1 WHERE id = 1")
    assert rows(spark, name) == [(1, 6), (2, 2**40)]
    assert python_rows(spark, path) == [{"id": 1, "n": 6}, {"id": 2, "n": 2**40}]
    assert spark.sql(f"SELECT n FROM {name} VERSION AS OF 1").collect()[0][0] == 5
    assert version(path) == 5


def test_checkpoint_policy_v2_adds_the_feature(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT", "(1)")
    error = typed(spark, f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.checkpointPolicy'='v3')")
    assert isinstance(error, InvalidOptionError) and "classic, v2" in error.message
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.checkpointPolicy'='v2')")
    protocol = last_commit(path)["protocol"]
    assert (protocol["minReaderVersion"], protocol["minWriterVersion"]) == (3, 7)
    assert "v2Checkpoint" in protocol["readerFeatures"]
    assert "v2Checkpoint" in protocol["writerFeatures"]
    spark.sql(f"INSERT INTO {name} VALUES (2)")
    assert rows(spark, name) == [(1,), (2,)]


def test_narrowing_type_is_refused(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, v STRING", "(1, 'a')")
    error = typed(spark, f"ALTER TABLE {name} ALTER COLUMN v TYPE INT")
    assert isinstance(error, UnsupportedFeatureError)
    assert error.feature == "typeChange"
    assert version(path) == 1


def test_comment_and_position(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, a STRING, b STRING", "(1, 'x', 'y')")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN b COMMENT 'the b'")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN b FIRST")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN id AFTER a")
    fields = json.loads(DeltaRsTable(path).schema().to_json())["fields"]
    assert [f["name"] for f in fields] == ["b", "a", "id"]
    assert fields[0]["metadata"]["comment"] == "the b"
    assert rows(spark, name) == [("y", "x", 1)]
    assert DeltaRsTable(path).to_pyarrow_table().to_pylist() == [{"b": "y", "a": "x", "id": 1}]


def test_set_not_null_checks_rows_then_holds_on_writes(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, v STRING", "(1, 'a'), (2, NULL)")
    error = typed(spark, f"ALTER TABLE {name} ALTER COLUMN v SET NOT NULL")
    assert isinstance(error, ConstraintViolationError)
    assert (error.kind, error.constraint, int(error.rows)) == ("notNull", "v", 1)
    assert version(path) == 1
    spark.sql(f"INSERT OVERWRITE {name} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN v SET NOT NULL")
    assert json.loads(DeltaRsTable(path).schema().to_json())["fields"][1]["nullable"] is False
    before = version(path)
    # SQL INSERT into a catalog table meets Spark's own NOT NULL assertion first (untyped).
    with pytest.raises(Exception, match=r"NOT_NULL_ASSERT_VIOLATION|NOT NULL constraint"):
        spark.sql(f"INSERT INTO {name} VALUES (3, NULL)").collect()
    with pytest.raises(Exception) as info:
        spark.createDataFrame([(3, None)], "id long, v string").write.format("delta").mode(
            "append"
        ).save(path)
    error = deltaflow.typed_error(info.value)
    assert isinstance(error, ConstraintViolationError)
    assert isinstance(error, SchemaMismatchError)  # what NOT NULL violations always were
    assert (error.constraint, error.values) == ("v", "v = null")
    assert version(path) == before
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN v DROP NOT NULL")
    spark.sql(f"INSERT INTO {name} VALUES (3, NULL)")
    assert rows(spark, name) == [(1, "a"), (2, "b"), (3, None)]


def test_set_not_null_scans_when_stats_cannot_tell(spark: Any, table: Any) -> None:
    name, path = table(
        "id BIGINT, s STRUCT<a: INT>",
        "(1, named_struct('a', 1)), (2, NULL), (3, named_struct('a', NULL))",
        "'delta.dataSkippingNumIndexedCols'='0'",
    )
    error = typed(spark, f"ALTER TABLE {name} ALTER COLUMN s.a SET NOT NULL")
    assert isinstance(error, ConstraintViolationError)
    assert int(error.rows) == 1  # the row whose struct is null does not count
    assert version(path) == 1
    spark.sql(f"INSERT OVERWRITE {name} VALUES (1, named_struct('a', 1)), (2, NULL)")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN s.a SET NOT NULL")
    inner = json.loads(DeltaRsTable(path).schema().to_json())["fields"][1]["type"]["fields"][0]
    assert inner["nullable"] is False


# ---- properties and the protocol ----------------------------------------------------------


def test_set_and_unset_properties(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT", "(1)")
    spark.sql(
        f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.appendonly'='false', 'owner.team'='x')"
    )
    commit = last_commit(path)["commitInfo"]
    assert commit["operation"] == "SET TBLPROPERTIES"
    config = DeltaRsTable(path).metadata().configuration
    assert config["delta.appendOnly"] == "false" and config["owner.team"] == "x"
    error = typed(spark, f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.nonsense'='1')")
    assert isinstance(error, InvalidOptionError)
    before = version(path)
    error = typed(spark, f"ALTER TABLE {name} UNSET TBLPROPERTIES ('missing.key')")
    assert isinstance(error, InvalidOptionError)
    assert version(path) == before
    spark.sql(f"ALTER TABLE {name} UNSET TBLPROPERTIES IF EXISTS ('missing.key')")
    spark.sql(f"ALTER TABLE {name} UNSET TBLPROPERTIES ('owner.team')")
    assert last_commit(path)["commitInfo"]["operation"] == "UNSET TBLPROPERTIES"
    assert "owner.team" not in DeltaRsTable(path).metadata().configuration
    assert rows(spark, name) == [(1,)]


def test_feature_properties_upgrade_the_protocol_minimally(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT", "(1)")
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.enableChangeDataFeed'='true')")
    protocol = DeltaRsTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 4)
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.enableDeletionVectors'='true')")
    protocol = DeltaRsTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"]
    assert set(protocol.writer_features or []) == {
        "appendOnly",
        "invariants",
        "changeDataFeed",
        "deletionVectors",
    }
    error = typed(spark, f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.enableRowTracking'='true')")
    assert isinstance(error, UnsupportedFeatureError) and error.feature == "rowTracking"
    spark.sql(
        f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.feature.checkConstraints'='supported')"
    )
    assert "checkConstraints" in (DeltaRsTable(path).protocol().writer_features or [])
    assert "delta.feature.checkConstraints" not in DeltaRsTable(path).metadata().configuration
    spark.sql(f"INSERT INTO {name} VALUES (2)")
    assert rows(spark, name) == [(1,), (2,)]
    assert [r["id"] for r in python_rows(spark, path)] == [1, 2]


def test_unsupported_forms_are_refused_typed(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, v STRING", "(1, 'a')")
    error = typed(spark, f"ALTER TABLE {name} ALTER COLUMN v SET DEFAULT 'x'")
    assert isinstance(error, UnsupportedFeatureError) and error.feature == "allowColumnDefaults"
    assert version(path) == 1


# ---- CHECK constraints --------------------------------------------------------------------


def test_add_constraint_checks_existing_rows(spark: Any, table: Any) -> None:
    name, path = table("id BIGINT, v STRING", "(1, 'a'), (-2, 'b'), (-3, NULL)")
    error = typed(spark, f"ALTER TABLE {name} ADD CONSTRAINT positive CHECK (id > 0)")
    assert isinstance(error, ConstraintViolationError)
    assert (error.constraint, int(error.rows)) == ("positive", 2)
    assert error.values.startswith("id = -")
    error = typed(
        spark, f"ALTER TABLE {name} ADD CONSTRAINT named CHECK (v IS NOT NULL AND v <> '')"
    )
    assert isinstance(error, ConstraintViolationError) and int(error.rows) == 1
    error = typed(spark, f"ALTER TABLE {name} ADD CONSTRAINT bad CHECK (nope > 0)")
    assert isinstance(error, InvalidConstraintError)
    error = typed(spark, f"ALTER TABLE {name} ADD CONSTRAINT bad CHECK (id + 1)")
    assert isinstance(error, InvalidConstraintError)
    assert version(path) == 1

    spark.sql(f"ALTER TABLE {name} ADD CONSTRAINT small CHECK (id < 10)")
    commit = last_commit(path)
    assert commit["commitInfo"]["operation"] == "ADD CONSTRAINT"
    assert commit["commitInfo"]["operationParameters"] == {"name": "small", "expr": "id < 10"}
    assert commit["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 3}
    assert DeltaRsTable(path).metadata().configuration["delta.constraints.small"] == "id < 10"
    error = typed(spark, f"ALTER TABLE {name} ADD CONSTRAINT SMALL CHECK (id < 5)")
    assert isinstance(error, InvalidConstraintError)
    error = typed(spark, f"ALTER TABLE {name} RENAME COLUMN id TO key")
    assert isinstance(error, UnsupportedFeatureError)  # no column mapping: named first

    spark.sql(f"ALTER TABLE {name} DROP CONSTRAINT small")
    commit = last_commit(path)["commitInfo"]
    assert commit["operation"] == "DROP CONSTRAINT"
    assert commit["operationParameters"]["existed"] == "true"
    assert "delta.constraints.small" not in DeltaRsTable(path).metadata().configuration
    error = typed(spark, f"ALTER TABLE {name} DROP CONSTRAINT small")
    assert isinstance(error, InvalidConstraintError)
    spark.sql(f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS small")
    assert rows(spark, name) == [(-3, None), (-2, "b"), (1, "a")]


def test_constraints_hold_on_every_write_path(spark: Any, table: Any, table_path: Any) -> None:
    from deltaflow.spark.dml._delta_table import DeltaTable

    name, path = table("id BIGINT, v STRING", "(1, 'a'), (2, 'b')")
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (id > 0)")
    start = version(path)

    def refused(write: Any) -> ConstraintViolationError:
        with pytest.raises(Exception) as info:
            write()
        error = deltaflow.typed_error(info.value)
        assert isinstance(error, ConstraintViolationError), info.value
        assert error.constraint == "positive"
        assert version(path) == start
        return error

    bad = spark.createDataFrame([(5, "ok"), (-1, "no")], "id long, v string")
    error = refused(lambda: bad.write.format("delta").mode("append").save(path))
    assert error.values == "id = -1"
    refused(lambda: spark.sql(f"INSERT INTO {name} VALUES (-4, 'x')").collect())
    spark.conf.set("deltaflow.write.nativeWrite", "false")  # the Python data source
    try:
        refused(lambda: bad.write.format("delta").mode("append").save(path))
    finally:
        spark.conf.unset("deltaflow.write.nativeWrite")
    refused(lambda: DeltaTable.forPath(spark, path).update("id = 2", {"id": "-2"}))
    source = spark.createDataFrame([(1, "m")], "id long, v string")
    refused(
        lambda: (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"id": "-s.id"})
            .execute()
        )
    )

    feed = table_path("feed")
    spark.createDataFrame([(-9, "s")], "id long, v string").write.format("delta").save(feed)
    query = (
        spark.readStream.format("delta")
        .load(feed)
        .writeStream.format("delta")
        .option("checkpointLocation", table_path("checkpoint"))
        .trigger(availableNow=True)
        .start(path)
    )
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    assert isinstance(deltaflow.typed_error(info.value), ConstraintViolationError)
    assert version(path) == start

    spark.createDataFrame([(3, "c")], "id long, v string").write.format("delta").mode(
        "append"
    ).save(path)
    DeltaTable.forPath(spark, path).update("id = 3", {"v": "'cc'"})
    assert rows(spark, name) == [(1, "a"), (2, "b"), (3, "cc")]
