"""CREATE paths with ``delta.columnMapping.mode``: each makes a real column-mapped table.

A column-mapped table's log gives every field (nested ones too) an id and a physical name
(``col-<uuid>``, as delta-spark names them), ``delta.columnMapping.maxColumnId`` and a
protocol with column mapping; the data files name columns by their physical names. A
refused CREATE leaves nothing behind: no log, no catalog entry.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import QueryBuilder

import deltaflow
from deltaflow import DeltaTable
from deltaflow.errors import InvalidOptionError
from deltaflow.table import _log_write
from deltaflow.table.errors import UnsupportedFeatureError

ROWS = [(1, "a", 1, 10), (2, "b", 2, 20), (3, "c", 1, 30)]


def _name() -> str:
    return "cm_" + uuid.uuid4().hex[:8]


def _first_metadata(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Version 0's protocol and metaData actions."""
    log = Path(path, "_delta_log", f"{0:020}.json").read_text()
    actions = [json.loads(line) for line in log.splitlines()]
    protocol = next(a["protocol"] for a in actions if "protocol" in a)
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    return protocol, metadata


def _all_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def visit(t: Any) -> None:
        if isinstance(t, dict) and t.get("type") == "struct":
            for f in t["fields"]:
                out.append(f)
                visit(f["type"])

    visit(schema)
    return out


def _assert_mapped(path: str, mode: str = "name") -> dict[str, Any]:
    """The table at ``path`` is column-mapped as delta-spark creates one; its latest
    metadata's schema."""
    table = deltalake.DeltaTable(path)
    configuration = table.metadata().configuration
    assert configuration["delta.columnMapping.mode"] == mode
    schema = json.loads(table.schema().to_json())
    fields = _all_fields(schema)
    ids = [f["metadata"]["delta.columnMapping.id"] for f in fields]
    assert sorted(ids) == list(range(1, len(fields) + 1))
    assert int(configuration["delta.columnMapping.maxColumnId"]) == len(fields)
    assert all(f["metadata"]["delta.columnMapping.physicalName"].startswith("col-") for f in fields)
    assert "columnMapping" in _features(table)
    return schema


def _features(table: deltalake.DeltaTable) -> set[str]:
    protocol = table.protocol()
    if protocol.min_reader_version >= 3:
        return set(protocol.reader_features or ())
    return {"columnMapping"} if protocol.min_reader_version == 2 else set()


def _by_delta_rs(path: str) -> list[tuple[Any, ...]]:
    """The table's rows as delta-rs reads them (its query engine resolves column mapping
    and deletion vectors; ``to_pyarrow_table`` does neither)."""
    found = QueryBuilder().register("t", deltalake.DeltaTable(path)).execute("SELECT * FROM t")
    return sorted(tuple(r.values()) for r in pa.table(found.read_all()).to_pylist())


def _file_columns(path: str) -> set[str]:
    files = glob.glob(f"{path}/**/*.parquet", recursive=True)
    assert files
    return {name for f in files for name in pq.read_schema(f).names}


def _physical_names(schema: dict[str, Any]) -> set[str]:
    return {f["metadata"]["delta.columnMapping.physicalName"] for f in schema["fields"]}


@pytest.mark.parametrize(
    ("mode", "partitioned", "dv"),
    [("name", True, True), ("name", False, False), ("id", True, False), ("id", False, True)],
)
def test_create_table_by_path_is_column_mapped(
    spark: Any, table_path: Any, mode: str, partitioned: bool, dv: bool
) -> None:
    path = table_path()
    dv_property = ", 'delta.enableDeletionVectors' = 'true'" if dv else ""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, kind STRING, region INT, amount INT) USING"
        f" delta {'PARTITIONED BY (region)' if partitioned else ''} TBLPROPERTIES"
        f" ('delta.columnMapping.mode' = '{mode}'{dv_property})"
    )
    protocol, _ = _first_metadata(path)
    if dv:  # table features, exactly the ones in use (as delta-spark)
        assert protocol["minReaderVersion"] == 3 and protocol["minWriterVersion"] == 7
        assert set(protocol["readerFeatures"]) == {"columnMapping", "deletionVectors"}
        assert set(protocol["writerFeatures"]) == {"columnMapping", "deletionVectors"}
    else:
        assert protocol == {"minReaderVersion": 2, "minWriterVersion": 5}
    schema = _assert_mapped(path, mode)

    spark.sql(f"INSERT INTO delta.`{path}` VALUES " + ", ".join(map(str, ROWS)))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
    expected = sorted(ROWS[:2])
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == expected
    assert _by_delta_rs(path) == expected
    # The files name the data columns by their physical names only.
    data_columns = _physical_names(schema) - (
        {f["metadata"]["delta.columnMapping.physicalName"] for f in schema["fields"]
         if f["name"] == "region"} if partitioned else set()
    )  # fmt: skip
    assert _file_columns(path) == data_columns


def test_create_table_by_name_then_rename_a_column(spark: Any) -> None:
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, kind STRING, region INT) USING delta"
        " PARTITIONED BY (region) TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    try:
        path = DeltaTable.forName(spark, name).detail().first()["location"]
        _assert_mapped(path)
        spark.sql(f"INSERT INTO {name} VALUES (1, 'a', 7)")
        spark.sql(f"ALTER TABLE {name} RENAME COLUMN kind TO category")
        spark.sql(f"INSERT INTO {name} (id, category, region) VALUES (2, 'b', 8)")
        rows = spark.table(name).orderBy("id").collect()
        assert [r.asDict() for r in rows] == [
            {"id": 1, "category": "a", "region": 7},
            {"id": 2, "category": "b", "region": 8},
        ]
        assert _by_delta_rs(path) == [(1, "a", 7), (2, "b", 8)]
    finally:
        spark.sql(f"DROP TABLE {name}")


def test_create_table_as_select_by_path_and_by_name(spark: Any, table_path: Any) -> None:
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` USING delta PARTITIONED BY (region) TBLPROPERTIES"
        " ('delta.columnMapping.mode' = 'name', 'delta.enableDeletionVectors' = 'true')"
        " AS SELECT 1L AS id, 'a' AS kind, 3 AS region"
    )
    schema = _assert_mapped(path)
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == [
        (1, "a", 3)
    ]
    assert _by_delta_rs(path) == [(1, "a", 3)]
    region = next(f for f in schema["fields"] if f["name"] == "region")
    assert _file_columns(path) == _physical_names(schema) - {
        region["metadata"]["delta.columnMapping.physicalName"]
    }

    name = _name()
    spark.sql(
        f"CREATE TABLE {name} USING delta TBLPROPERTIES ('delta.columnMapping.mode' = 'id')"
        " AS SELECT id, CAST(id AS STRING) AS label FROM range(3)"
    )
    try:
        location = DeltaTable.forName(spark, name).detail().first()["location"]
        _assert_mapped(location, "id")
        assert sorted(tuple(r) for r in spark.table(name).collect()) == [
            (0, "0"), (1, "1"), (2, "2")
        ]  # fmt: skip
    finally:
        spark.sql(f"DROP TABLE {name}")


def test_create_or_replace_table(spark: Any, table_path: Any) -> None:
    fresh = table_path()
    spark.sql(
        f"CREATE OR REPLACE TABLE delta.`{fresh}` (id BIGINT, kind STRING) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    _assert_mapped(fresh)

    # An unmapped table with rows, replaced by a mapped one: the old rows are gone, the
    # history stays, and the new table reads and writes by physical names.
    path = table_path()
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, kind STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'old')")
    spark.sql(
        f"CREATE OR REPLACE TABLE delta.`{path}` (id BIGINT, kind STRING, n INT) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    schema = _assert_mapped(path)
    assert deltalake.DeltaTable(path).protocol().min_reader_version == 2
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (2, 'new', 5)")
    assert [tuple(r) for r in spark.read.format("delta").load(path).collect()] == [(2, "new", 5)]
    assert _by_delta_rs(path) == [(2, "new", 5)]
    assert _file_columns(path) >= _physical_names(schema)
    assert spark.read.format("delta").option("versionAsOf", 1).load(path).count() == 1

    # Replacing a mapped table: the new columns' ids start above the old maxColumnId.
    spark.sql(
        f"CREATE OR REPLACE TABLE delta.`{path}` (x INT) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    replaced = deltalake.DeltaTable(path)
    (field,) = json.loads(replaced.schema().to_json())["fields"]
    assert field["metadata"]["delta.columnMapping.id"] == 4
    assert replaced.metadata().configuration["delta.columnMapping.maxColumnId"] == "4"


def test_builder_maps_nested_fields(spark: Any, table_path: Any) -> None:
    path = table_path()
    (
        DeltaTable.create(spark)
        .location(path)
        .addColumn("id", "BIGINT")
        .addColumn("point", "STRUCT<x: INT, y: INT>")
        .property("delta.columnMapping.mode", "name")
        .execute()
    )
    schema = _assert_mapped(path)
    assert len(_all_fields(schema)) == 4  # id, point, point.x, point.y
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, named_struct('x', 2, 'y', 3))")
    row = spark.read.format("delta").load(path).first()
    assert row["point"].asDict() == {"x": 2, "y": 3}
    assert _by_delta_rs(path) == [(1, {"x": 2, "y": 3})]


def test_dataframe_writes_create_mapped_tables(spark: Any, table_path: Any) -> None:
    saved = table_path()
    spark.range(3).write.format("delta").option("delta.columnMapping.mode", "name").save(saved)
    schema = _assert_mapped(saved)
    assert _file_columns(saved) == _physical_names(schema)
    assert _by_delta_rs(saved) == [(0,), (1,), (2,)]

    created = table_path()
    spark.range(2).writeTo(f"delta.`{created}`").using("delta").tableProperty(
        "delta.columnMapping.mode", "id"
    ).create()
    _assert_mapped(created, "id")
    assert spark.read.format("delta").load(created).count() == 2

    # A stream that creates its sink table.
    streamed = table_path()
    query = (
        spark.readStream.format("delta")
        .load(saved)
        .writeStream.format("delta")
        .option("checkpointLocation", table_path("checkpoint"))
        .option("delta.columnMapping.mode", "name")
        .trigger(availableNow=True)
        .start(streamed)
    )
    assert query.awaitTermination(120)
    _assert_mapped(streamed)
    assert _by_delta_rs(streamed) == [(0,), (1,), (2,)]


def _assert_nothing_left(path: str) -> None:
    assert not os.path.exists(os.path.join(path, "_delta_log"))


@pytest.mark.parametrize(
    ("properties", "option"),
    [
        ("'delta.columnMapping.mode' = 'names'", "delta.columnMapping.mode"),
        (
            "'delta.columnMapping.mode' = 'name', 'delta.columnMapping.maxColumnId' = '9'",
            "delta.columnMapping.maxColumnId",
        ),
    ],
)
def test_bad_mapping_properties_are_refused_leaving_nothing(
    spark: Any, table_path: Any, properties: str, option: str
) -> None:
    path = table_path()
    statements = [
        f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta TBLPROPERTIES ({properties})",
        f"CREATE TABLE delta.`{path}` USING delta TBLPROPERTIES ({properties}) AS SELECT 1L AS id",
    ]
    for statement in statements:
        with pytest.raises(Exception) as info:  # any Spark wrapper, then typed
            spark.sql(statement).collect()
        error = deltaflow.typed_error(info.value)
        assert isinstance(error, InvalidOptionError)
        assert error.option == option
        _assert_nothing_left(path)

    name = _name()
    with pytest.raises(Exception) as info:
        spark.sql(f"CREATE TABLE {name} (id BIGINT) USING delta TBLPROPERTIES ({properties})")
    assert isinstance(deltaflow.typed_error(info.value), InvalidOptionError)
    assert not spark.catalog.tableExists(name)


def test_stores_without_conditional_put_are_refused(tmp_path: Path) -> None:
    # Only deltaflow's log writer commits a column-mapped table; it needs put-if-absent.
    with pytest.raises(UnsupportedFeatureError) as info:
        _log_write.require_mapped_create("hdfs://namenode/warehouse/t", "t")
    assert info.value.feature == "columnMapping"
    _log_write.require_mapped_create(tmp_path.as_uri(), "t")  # local: fine


def test_schema_replacing_writes_with_mapping_are_refused_leaving_the_table(
    spark: Any, table_path: Any
) -> None:
    """REPLACE ... AS SELECT / overwriteSchema do not assign physical names yet: refused
    before anything is written (they would leave a table that reads nulls)."""
    mapped = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{mapped}` (id BIGINT, kind STRING) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    plain = table_path()
    spark.sql(f"CREATE TABLE delta.`{plain}` (id BIGINT, kind STRING) USING delta")
    for path in (mapped, plain):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a')")
    attempts = [
        lambda: spark.sql(
            f"CREATE OR REPLACE TABLE delta.`{mapped}` USING delta AS SELECT 2L AS id, 'b' AS kind"
        ),
        lambda: spark.sql(
            f"CREATE OR REPLACE TABLE delta.`{plain}` USING delta TBLPROPERTIES"
            " ('delta.columnMapping.mode' = 'name') AS SELECT 2L AS id, 'b' AS kind"
        ),
        lambda: (
            spark.range(1)
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(mapped)
        ),
    ]
    for attempt in attempts:
        with pytest.raises(Exception) as info:
            attempt()
        error = deltaflow.typed_error(info.value)
        assert isinstance(error, UnsupportedFeatureError)
        assert error.feature == "columnMapping"
    for path in (mapped, plain):
        assert [tuple(r) for r in spark.read.format("delta").load(path).collect()] == [(1, "a")]
        assert deltalake.DeltaTable(path).version() == 1
