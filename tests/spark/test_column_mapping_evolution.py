"""Schema evolution of column-mapped tables (``delta.columnMapping.mode`` = ``name`` / ``id``).

A write with ``mergeSchema`` (or under ``spark.databricks.delta.schema.autoMerge.enabled``)
that brings new columns or struct fields gives each its own id and ``col-<uuid>`` physical
name, raises ``delta.columnMapping.maxColumnId`` and commits all of it with the data, in one
commit; the files name the columns physically. Earlier rows read the new columns as null, in
deltaflow and in delta-rs.
"""

from __future__ import annotations

import glob
import json
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import QueryBuilder

import deltaflow
from deltaflow.spark._options import parse_write_options
from deltaflow.spark.write._plan import plan_write
from deltaflow.table import _schema
from deltaflow.table._snapshot import load_snapshot
from deltaflow.table.errors import SchemaMismatchError, UnsupportedFeatureError
from tests.spark._conf import conf_set

AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"
ID_KEY = "delta.columnMapping.id"
NAME_KEY = "delta.columnMapping.physicalName"
MAX_KEY = "delta.columnMapping.maxColumnId"
# The table's columns and the rows every test starts from.
COLUMNS = "id BIGINT, s STRUCT<a: INT, b: STRING>"
FIRST = "(1, named_struct('a', 1, 'b', 'x'))"


@pytest.fixture
def catalog_name(spark: Any) -> Iterator[str]:
    """A catalog name for the test's table, dropped after the test."""
    name = "cm_evolve_" + uuid.uuid4().hex[:8]
    yield name
    spark.sql(f"DROP TABLE IF EXISTS {name}")


def _mapped_table(spark: Any, target: str, mode: str) -> None:
    spark.sql(
        f"CREATE TABLE {target} ({COLUMNS}) USING delta"
        f" TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}')"
    )
    spark.sql(f"INSERT INTO {target} VALUES {FIRST}")


def _fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every field by its dotted path (struct fields inside structs)."""
    out: dict[str, dict[str, Any]] = {}

    def visit(t: Any, prefix: str) -> None:
        if isinstance(t, dict) and t.get("type") == "struct":
            for f in t["fields"]:
                out[prefix + f["name"]] = f
                visit(f["type"], prefix + f["name"] + ".")

    visit(schema, "")
    return out


def _log_actions(path: str, version: int) -> list[str]:
    text = Path(path, "_delta_log", f"{version:020}.json").read_text()
    return [next(iter(json.loads(line))) for line in text.splitlines()]


def _by_delta_rs(path: str) -> list[dict[str, Any]]:
    """The rows as delta-rs reads them (its query engine resolves column mapping)."""
    found = QueryBuilder().register("t", deltalake.DeltaTable(path)).execute("SELECT * FROM t")
    return sorted(pa.table(found.read_all()).to_pylist(), key=lambda r: r["id"])


def _rows(frame: Any) -> list[dict[str, Any]]:
    return sorted((r.asDict(recursive=True) for r in frame.collect()), key=lambda r: r["id"])


def _with_z(*values: str | None) -> list[dict[str, Any]]:
    """Rows 1, 2, ... of the tests' tables (``s`` = (n, 'x' / 'y' / 'z')) with a column
    ``z`` added, holding ``values``."""
    return [
        {"id": n, "s": {"a": n, "b": "xyz"[n - 1]}, "z": value}
        for n, value in enumerate(values, start=1)
    ]


def _assert_reads(spark: Any, path: str, expected: list[dict[str, Any]]) -> None:
    """deltaflow and delta-rs read the table at ``path`` as ``expected`` (sorted by id)."""
    assert _rows(spark.read.format("delta").load(path)) == expected
    assert _by_delta_rs(path) == expected


def _assert_evolved(path: str, before: int, added: list[str]) -> dict[str, dict[str, Any]]:
    """One commit after ``before`` holds the new metadata and the data; the ``added`` fields
    have the next ids, fresh physical names and a raised maxColumnId; the commit's files
    name every column physically. The table's fields by path."""
    table = deltalake.DeltaTable(path)
    assert table.version() == before + 1
    actions = _log_actions(path, before + 1)
    assert "metaData" in actions and "add" in actions
    fields = _fields(json.loads(table.schema().to_json()))
    old_max = len(fields) - len(added)
    assert sorted(fields[name]["metadata"][ID_KEY] for name in added) == list(
        range(old_max + 1, old_max + len(added) + 1)
    )
    names = [f["metadata"][NAME_KEY] for f in fields.values()]
    assert len(set(names)) == len(names)
    assert all(fields[name]["metadata"][NAME_KEY].startswith("col-") for name in added)
    assert table.metadata().configuration[MAX_KEY] == str(len(fields))
    logical = set(fields) | {n.rsplit(".", 1)[-1] for n in fields}
    for file in glob.glob(f"{path}/**/*.parquet", recursive=True):
        in_file = {f.name for f in pq.read_schema(file)}
        assert not in_file & logical, file
    return fields


@pytest.mark.parametrize("mode", ["name", "id"])
def test_merge_schema_by_path_adds_a_column_and_a_struct_field(
    spark: Any, table_path: Any, mode: str
) -> None:
    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", mode)
    wider = spark.createDataFrame(
        [(2, (2, "y", 2.5), "new")], "id long, s struct<a:int, b:string, c:double>, z string"
    )

    with pytest.raises(Exception) as refused:
        wider.write.format("delta").mode("append").save(path)
    assert isinstance(deltaflow.typed_error(refused.value), SchemaMismatchError)
    assert deltalake.DeltaTable(path).version() == 1

    wider.write.format("delta").mode("append").option("mergeSchema", "true").save(path)

    fields = _assert_evolved(path, 1, ["s.c", "z"])
    expected = [
        {"id": 1, "s": {"a": 1, "b": "x", "c": None}, "z": None},
        {"id": 2, "s": {"a": 2, "b": "y", "c": 2.5}, "z": "new"},
    ]
    _assert_reads(spark, path, expected)
    if mode == "id":
        # The new file carries the field ids delta-spark reads columns by in id mode.
        newest = max(
            glob.glob(f"{path}/**/*.parquet", recursive=True),
            key=lambda f: Path(f).stat().st_mtime_ns,
        )
        z = pq.read_schema(newest).field(fields["z"]["metadata"][NAME_KEY])
        assert z.metadata[b"PARQUET:field_id"] == str(fields["z"]["metadata"][ID_KEY]).encode()


@pytest.mark.parametrize("mode", ["name", "id"])
def test_catalog_writes_evolve_a_mapped_table(spark: Any, catalog_name: str, mode: str) -> None:
    """saveAsTable and writeTo with mergeSchema, SQL INSERT under autoMerge: each adds its
    column in the commit of its rows."""
    name = catalog_name
    _mapped_table(spark, name, mode)
    location = spark.sql(f"DESCRIBE DETAIL {name}").first()["location"]
    path = location.removeprefix("file:")

    spark.createDataFrame(
        [(2, (2, "y"), 2.5)], "id long, s struct<a:int, b:string>, x double"
    ).write.format("delta").mode("append").option("mergeSchema", "true").saveAsTable(name)
    _assert_evolved(path, 1, ["x"])

    spark.createDataFrame(
        [("t", 3, (3, "z", True))], "y string, id long, s struct<a:int, b:string, w:boolean>"
    ).writeTo(name).option("mergeSchema", "true").append()
    _assert_evolved(path, 2, ["s.w", "y"])

    with conf_set(spark, AUTO_MERGE, "true"):
        spark.sql(
            f"INSERT INTO {name} BY NAME SELECT 4L AS id, named_struct('a', 4, 'b', 'q',"
            " 'w', false) AS s, 'u' AS y, 4.5D AS x, DATE'2026-11-30' AS d"
        )
    _assert_evolved(path, 3, ["d"])

    expected = [
        {"id": 1, "s": {"a": 1, "b": "x", "w": None}, "x": None, "y": None, "d": None},
        {"id": 2, "s": {"a": 2, "b": "y", "w": None}, "x": 2.5, "y": None, "d": None},
        {"id": 3, "s": {"a": 3, "b": "z", "w": True}, "x": None, "y": "t", "d": None},
        {"id": 4, "s": {"a": 4, "b": "q", "w": False}, "x": 4.5, "y": "u", "d": date(2026, 11, 30)},
    ]
    assert _rows(spark.table(name)) == expected
    assert spark.table(name).columns == ["id", "s", "x", "y", "d"]
    assert [r["id"] for r in _by_delta_rs(path)] == [1, 2, 3, 4]


def test_dropped_column_ids_are_not_handed_out_again(spark: Any, table_path: Any) -> None:
    """A column added back after DROP COLUMN is a new column: a new id above every id the
    table ever used (maxColumnId never goes down), a new physical name, no old values."""
    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "name")
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (x STRING)")
    spark.sql(f"UPDATE delta.`{path}` SET x = 'old'")
    old = _fields(json.loads(deltalake.DeltaTable(path).schema().to_json()))["x"]["metadata"]
    spark.sql(f"ALTER TABLE delta.`{path}` DROP COLUMN x")
    before = deltalake.DeltaTable(path).version()

    spark.createDataFrame([(2, "new")], "id long, x string").write.format("delta").mode(
        "append"
    ).option("mergeSchema", "true").save(path)

    x = _fields(json.loads(deltalake.DeltaTable(path).schema().to_json()))["x"]["metadata"]
    assert x[ID_KEY] == old[ID_KEY] + 1
    assert x[NAME_KEY] != old[NAME_KEY]
    assert deltalake.DeltaTable(path).version() == before + 1
    rows = _rows(spark.read.format("delta").load(path))
    assert [(r["id"], r["x"]) for r in rows] == [(1, None), (2, "new")]


def test_planning_a_write_twice_names_its_new_columns_alike(spark: Any, table_path: Any) -> None:
    """A write is planned more than once (the connector, then the Python writer; a stream's
    batch, then its commit): the files and the commit must agree on the new physical names."""
    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "name")
    incoming = spark.createDataFrame([], "id long, z string").schema.jsonValue()
    options = parse_write_options({"path": path, "mergeSchema": "true"})

    first = plan_write(path, incoming, "append", options)
    second = plan_write(path, incoming, "append", options)

    assert first.schema == second.schema
    assert first.physical_schema == second.physical_schema
    assert first.evolves_in_commit and first.new_columns == ()
    assert first.configuration == {MAX_KEY: "5"}  # id, s, s.a, s.b; then z
    other = table_path()
    _mapped_table(spark, f"delta.`{other}`", "name")
    elsewhere = plan_write(
        other, incoming, "append", parse_write_options({"path": other, "mergeSchema": "true"})
    )
    assert (
        _schema.top_level_physical_names(elsewhere.schema)["z"]
        != (_schema.top_level_physical_names(first.schema)["z"])
    )


def test_stores_without_conditional_put_refuse_before_writing(spark: Any, table_path: Any) -> None:
    """Where deltaflow's log writer cannot commit (no put-if-absent), mergeSchema on a
    column-mapped table is refused, typed, before any file is written."""
    from deltaflow.spark.write import _plan

    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "name")
    snapshot = load_snapshot(path)
    incoming = spark.createDataFrame([], "id long, z string").schema.jsonValue()
    with pytest.raises(UnsupportedFeatureError) as refused:
        _plan._mapped_merged_schema("hdfs://namenode/warehouse/t", snapshot, incoming)
    assert refused.value.feature == "columnMapping"
    assert refused.value.table_uri == "hdfs://namenode/warehouse/t"


def test_merge_with_schema_evolution_adds_a_column(spark: Any, table_path: Any) -> None:
    """MERGE's schema evolution (``INSERT *`` / ``UPDATE SET *`` under autoMerge) plans
    through mergeSchema: on a column-mapped table it evolves the same way, in MERGE's
    commit."""
    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "name")
    spark.createDataFrame(
        [(1, (1, "x"), "one"), (2, (2, "y"), "two")], "id long, s struct<a:int, b:string>, z string"
    ).createOrReplaceTempView("cm_merge_source")
    with conf_set(spark, AUTO_MERGE, "true"):
        spark.sql(
            f"MERGE INTO delta.`{path}` t USING cm_merge_source s ON t.id = s.id"
            " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )

    _assert_evolved(path, 1, ["z"])
    _assert_reads(spark, path, _with_z("one", "two"))


def test_a_stream_with_merge_schema_adds_a_column(
    spark: Any, table_path: Any, tmp_path: Path
) -> None:
    """A micro-batch is planned where Spark plans the query and committed later: the
    column it adds keeps the physical name its files were written with."""
    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "id")
    source = table_path()
    spark.createDataFrame(
        [(2, (2, "y"), "two"), (3, (3, "z"), "three")],
        "id long, s struct<a:int, b:string>, z string",
    ).write.format("delta").save(source)

    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .option("mergeSchema", "true")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(path)
    )
    assert query.awaitTermination(180)
    assert query.exception() is None

    _assert_evolved(path, 1, ["z"])
    _assert_reads(spark, path, _with_z(None, "two", "three"))


def test_a_micro_batch_commits_the_columns_its_files_were_written_with(
    spark: Any, table_path: Any, tmp_path: Path
) -> None:
    """The Python sink's writer reaches its commit unpickled (it plans again there). A
    batch that adds a column commits by the plan its files were written under, so a
    metadata change in between is a typed conflict, not a column that reads as nulls."""
    import pickle

    from deltaflow.spark.stream._writer import DeltaStreamWriter
    from deltaflow.table.errors import ConcurrentWriteError

    incoming = spark.createDataFrame([], "id long, s struct<a:int, b:string>, z string").schema
    batch = pa.RecordBatch.from_pylist(
        [{"id": 2, "s": {"a": 2, "b": "y"}, "z": "two"}],
        pa.schema(
            [
                ("id", pa.int64()),
                ("s", pa.struct([("a", pa.int32()), ("b", pa.string())])),
                ("z", pa.string()),
            ]
        ),
    )

    def run_batch(path: str, between: str | None) -> None:
        options = parse_write_options({"path": path, "mergeSchema": "true"})
        sink = DeltaStreamWriter(path, incoming, False, options, str(tmp_path), app_id="cm-app")
        message = pickle.loads(pickle.dumps(sink)).write(iter([batch]))
        if between is not None:
            spark.sql(between.format(t=f"delta.`{path}`"))
        pickle.loads(pickle.dumps(sink)).commit([message], 0)

    path = table_path()
    _mapped_table(spark, f"delta.`{path}`", "name")
    run_batch(path, None)
    _assert_evolved(path, 1, ["z"])
    assert [r["z"] for r in _rows(spark.read.format("delta").load(path))] == [None, "two"]

    raced = table_path()
    _mapped_table(spark, f"delta.`{raced}`", "name")
    with pytest.raises(Exception) as conflict:
        run_batch(raced, "ALTER TABLE {t} ADD COLUMNS (w STRING)")
    assert isinstance(deltaflow.typed_error(conflict.value), ConcurrentWriteError)
    assert deltalake.DeltaTable(raced).version() == 2
    assert [r["id"] for r in _rows(spark.read.format("delta").load(raced))] == [1]


def test_struct_fields_in_arrays_and_maps_get_ids_in_the_files(spark: Any, table_path: Any) -> None:
    """Struct fields inside an array or a map (new ones too) get ids, and in the files the
    field ids delta-spark's 'id' mode reads them by (it reads nulls without)."""
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, l ARRAY<STRUCT<a: INT>>,"
        " m MAP<STRING, STRUCT<a: INT>>) USING delta"
        " TBLPROPERTIES ('delta.columnMapping.mode' = 'id')"
    )
    spark.sql(
        f"INSERT INTO delta.`{path}` VALUES (1, array(named_struct('a', 1)),"
        " map('k', named_struct('a', 1)))"
    )
    spark.sql(
        "SELECT 2L AS id, array(named_struct('a', 2, 'b', 'y')) AS l,"
        " map('k', named_struct('a', 2, 'c', 'z')) AS m"
    ).write.format("delta").mode("append").option("mergeSchema", "true").save(path)

    schema = json.loads(deltalake.DeltaTable(path).schema().to_json())
    l_type, m_type = schema["fields"][1]["type"], schema["fields"][2]["type"]
    element = {f["name"]: f["metadata"][ID_KEY] for f in l_type["elementType"]["fields"]}
    value = {f["name"]: f["metadata"][ID_KEY] for f in m_type["valueType"]["fields"]}
    assert element == {"a": 3, "b": 6} and value == {"a": 5, "c": 7}
    assert deltalake.DeltaTable(path).metadata().configuration[MAX_KEY] == "7"
    for file in glob.glob(f"{path}/**/*.parquet", recursive=True):
        file_schema = pq.read_schema(file)
        in_element = file_schema.field(1).type.value_field.type
        in_value = file_schema.field(2).type.item_field.type
        for struct in (in_element, in_value):
            ids = [struct.field(i).metadata[b"PARQUET:field_id"] for i in range(struct.num_fields)]
            assert all(ids) and len(ids) >= 1
    rows = _rows(spark.read.format("delta").load(path))
    assert [(r["l"], r["m"]) for r in rows] == [
        ([{"a": 1, "b": None}], {"k": {"a": 1, "c": None}}),
        ([{"a": 2, "b": "y"}], {"k": {"a": 2, "c": "z"}}),
    ]
