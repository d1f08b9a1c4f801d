"""Batch reads through Spark: ``spark.read.format("delta").load(path)``.

Tables are written by delta-rs (``deltalake.write_deltalake``) or hand-edited
logs; every expectation comes from the Arrow table that was written, never from
our own reader.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema, write_deltalake

import deltaflow
from deltaflow.spark import ScanReport, scan_reports
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.spark.read._reader import FILE_SKIPPING_SAFE, plan_scan, to_predicate
from deltaflow.spark.read._scan_report import WORKER_LOGGING_CONF
from deltaflow.table._snapshot import load_snapshot
from tests.table.dv_fixtures import add_deletion_vectors

# Spark 4.0 pushes no filters into Python data sources (pyspark 4.1 added them).
needs_pushdown = pytest.mark.skipif(
    PYSPARK_MINOR < (4, 1), reason="Spark 4.0 pushes no filters into Python data sources"
)
if PYSPARK_MINOR >= (4, 1):
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        IsNull,
        LessThan,
        LessThanOrEqual,
        Not,
        StringStartsWith,
    )

UTC = dt.timezone.utc


# --- helpers -------------------------------------------------------------------------------


def read(spark: Any, path: str, **options: Any) -> Any:
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def sorted_rows(rows: list[dict[str, Any]], key: str = "id") -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r[key])


def assert_rows(df: Any, expected: pa.Table | list[dict[str, Any]], key: str = "id") -> None:
    """``df`` holds exactly ``expected``'s rows (any order), column for column."""
    actual = df.toArrow()
    want = expected.to_pylist() if isinstance(expected, pa.Table) else expected
    got = actual.to_pylist()
    if want:
        assert set(actual.column_names) == set(want[0]), actual.schema
    assert sorted_rows(got, key) == sorted_rows(want, key)


def ids(df: Any) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def log_dir(path: str) -> str:
    return os.path.join(path, "_delta_log")


def commit_file(path: str, version: int) -> str:
    return os.path.join(log_dir(path), f"{version:020d}.json")


def read_actions(path: str, version: int) -> list[dict[str, Any]]:
    with open(commit_file(path, version)) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_commit(path: str, version: int, actions: list[dict[str, Any]]) -> None:
    with open(commit_file(path, version), "x") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


def metadata_of(path: str) -> dict[str, Any]:
    return next(a["metaData"] for a in read_actions(path, 0) if "metaData" in a)


def add_paths(path: str) -> dict[int, str]:
    """Each data file's path (as in the log), keyed by its smallest ``id``."""
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    return {a["min.id"]: a["path"] for a in actions}


def remove_commits_before(path: str, version: int) -> None:
    """Simulate log cleanup, so that only a checkpoint can rebuild ``version``."""
    for v in range(version):
        os.remove(commit_file(path, v))


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def assert_deltaflow_error(exc: BaseException, cls: type, *facts: str) -> None:
    """Our typed error, raised directly or carried inside a pyspark exception's message."""
    text = error_text(exc)
    assert isinstance(exc, cls) or cls.__name__ in text, text
    for fact in facts:
        assert fact in text, f"{fact!r} not in {text}"


def clustered_table(path: str, files: int = 3, rows: int = 10) -> pa.Table:
    """``files`` appends; file ``k`` holds ids ``k*rows ..`` (stats do not overlap)."""
    written = []
    for k in range(files):
        ids_ = list(range(k * rows, (k + 1) * rows))
        batch = pa.table(
            {
                "id": pa.array(ids_, pa.int64()),
                "name": [f"n{i:03d}" for i in ids_],
                "maybe": pa.array([None if k == 1 else i for i in ids_], pa.int32()),
            }
        )
        write_deltalake(path, batch, mode="append")
        written.append(batch)
    return pa.concat_tables(written)


NATIVE_SCAN_CONF = "deltaflow.read.nativeScan"


@pytest.fixture(autouse=True)
def python_path(spark: Any) -> Any:
    """These tests exercise the Python data source; tests marked ``both_paths`` also run
    on the JVM path, and tests/spark/test_native_read.py covers that path in depth."""
    spark.conf.set(NATIVE_SCAN_CONF, "false")
    yield
    spark.conf.unset(NATIVE_SCAN_CONF)


both_paths = pytest.mark.parametrize("scan_path", ["python", "native"])


def use_path(spark: Any, scan_path: str) -> None:
    spark.conf.set(NATIVE_SCAN_CONF, "false" if scan_path == "python" else "auto")


@pytest.fixture
def worker_logs(spark: Any) -> Any:
    """Collect Python worker logs (where scan reports travel) for this test only."""
    spark.conf.set(WORKER_LOGGING_CONF, "true")
    yield spark
    spark.conf.set(WORKER_LOGGING_CONF, "false")


def last_scan(spark: Any, path: str) -> ScanReport:
    reports = scan_reports(spark, path)
    assert reports, "no scan report was logged"
    return reports[-1]


# --- 1. snapshots and time travel ------------------------------------------------------------


@both_paths
def test_reads_latest_snapshot_and_time_travels_past_an_overwrite(spark, table_path, scan_path):
    use_path(spark, scan_path)
    path = table_path()
    v0 = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    v1 = pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]})
    v2 = pa.table({"id": pa.array([10, 11], pa.int64()), "v": ["x", "y"]})
    write_deltalake(path, v0)
    write_deltalake(path, v1, mode="append")
    write_deltalake(path, v2, mode="overwrite")

    assert_rows(read(spark, path), v2)
    assert_rows(read(spark, path, versionAsOf=0), v0)
    assert_rows(read(spark, path, versionAsOf=1), pa.concat_tables([v0, v1]))
    assert_rows(read(spark, path, versionAsOf=2), v2)


def _pin_commit_times(path: str, times: list[dt.datetime]) -> None:
    """Give commit ``v`` the timestamp ``times[v]`` (commitInfo and file mtime), no sleeping."""
    for version, when in enumerate(times):
        ms = int(when.timestamp() * 1000)
        actions = read_actions(path, version)
        for action in actions:
            if "commitInfo" in action:
                action["commitInfo"]["timestamp"] = ms
        os.remove(commit_file(path, version))
        write_commit(path, version, actions)
        os.utime(commit_file(path, version), (ms / 1000, ms / 1000))


def test_timestamp_as_of_picks_the_latest_commit_at_or_before(spark, table_path):
    path = table_path()
    for i in range(3):
        write_deltalake(path, pa.table({"id": pa.array([i], pa.int64())}), mode="append")
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)
    _pin_commit_times(path, [base, base + dt.timedelta(hours=1), base + dt.timedelta(hours=2)])

    cases = {
        "2024-01-01": [0],  # a date is its midnight: exactly commit 0
        "2024-01-01 00:30:00": [0],
        "2024-01-01 01:00:00": [0, 1],  # at a commit's timestamp: that commit
        "2024-01-01T01:59:59.999Z": [0, 1],
        "2024-01-01T02:30:00+01:00": [0, 1],  # 01:30 UTC
        "2024-01-01 02:00:00": [0, 1, 2],
    }
    for timestamp, expected in cases.items():
        assert ids(read(spark, path, timestampAsOf=timestamp)) == expected, timestamp

    for too_early in ("2023-12-31 23:59:59", "2024-01-01 02:00:00.001"):
        with pytest.raises(Exception) as info:
            read(spark, path, timestampAsOf=too_early).collect()
        assert_deltaflow_error(info.value, deltaflow.VersionNotFoundError, path)


# --- 2. partition columns --------------------------------------------------------------------


@both_paths
def test_typed_partition_values_with_nulls_and_special_characters(spark, table_path, scan_path):
    use_path(spark, scan_path)
    path = table_path()
    ts = dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    strings = ["a b", "x=y", "a/b", "%", "é", "#{}?*", None, "plain"]
    n = len(strings)
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": strings,
            "i": pa.array([1, -2, None, 3, 4, 5, 6, 7], pa.int32()),
            "l": pa.array([2**40, None, -1, 0, 1, 2, 3, 4], pa.int64()),
            "d": pa.array([dt.date(2024, 2, 29), None] + [dt.date(1970, 1, 1)] * (n - 2)),
            "ts": pa.array(
                [ts, None] + [dt.datetime(2024, 1, 1, tzinfo=UTC)] * (n - 2),
                pa.timestamp("us", tz="UTC"),
            ),
            "b": pa.array([True, False, None, True, True, True, True, False]),
            # delta-rs 1.6.6 cannot write negative decimal partition values ('-3.-50').
            "dec": pa.array(
                [Decimal("1.25"), None] + [Decimal("3.50")] * (n - 2), pa.decimal128(5, 2)
            ),
            "payload": [f"row{i}" for i in range(n)],
        }
    )
    partition_by = ["s", "i", "l", "d", "ts", "b", "dec"]
    write_deltalake(path, table, partition_by=partition_by)

    df = read(spark, path)
    assert df.schema.simpleString() == (
        "struct<id:bigint,s:string,i:int,l:bigint,d:date,ts:timestamp,b:boolean,"
        "dec:decimal(5,2),payload:string>"
    )
    assert_rows(df, table)
    rows = table.to_pylist()
    for value in [v for v in strings if v is not None]:
        assert ids(df.where(df.s == value)) == [r["id"] for r in rows if r["s"] == value], value
    assert ids(df.where("s IS NULL")) == [6]
    assert ids(df.where("i IS NULL OR l IS NULL")) == [1, 2]
    assert ids(df.where("d = DATE'2024-02-29'")) == [0]
    assert ids(df.where("ts = TIMESTAMP'2024-01-01 12:00:00.123456'")) == [0]
    assert ids(df.where("ts > TIMESTAMP'2024-01-01 00:00:00'")) == [0]
    assert ids(df.where("b = false")) == [1, 7]
    assert ids(df.where("dec < 2")) == [0]


def test_empty_string_partition_value_reads_as_null_like_delta_rs(spark, table_path):
    # delta-spark and delta-rs both treat an empty partition value as null.
    path = table_path()
    write_deltalake(
        path, pa.table({"id": pa.array([1, 2], pa.int64()), "s": ["", "x"]}), partition_by=["s"]
    )
    expected = pa.table(DeltaTable(path).to_pyarrow_table()).to_pylist()
    assert [r["s"] for r in sorted_rows(expected)] == [None, "x"]
    assert_rows(read(spark, path), expected)


# --- 3. every type ---------------------------------------------------------------------------

ITEM_LIST = pa.list_(pa.struct([("c", pa.string()), ("m", pa.map_(pa.string(), pa.int64()))]))
NESTED = pa.struct(
    [
        ("a", pa.int32()),
        ("items", ITEM_LIST),
    ]
)


@both_paths
def test_every_delta_type_round_trips(spark, table_path, scan_path):
    use_path(spark, scan_path)
    path = table_path()
    big = Decimal("1234567890123456789012345678.0123456789")
    table = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "byte": pa.array([-128, 127, None], pa.int8()),
            "short": pa.array([-32768, 32767, None], pa.int16()),
            "int": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
            "long": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
            "float": pa.array([1.5, -0.25, None], pa.float32()),
            "double": pa.array([1e300, -2.5e-300, None], pa.float64()),
            "dec1": pa.array([Decimal("9"), Decimal("-9"), None], pa.decimal128(1, 0)),
            "dec5": pa.array([Decimal("123.45"), Decimal("-0.01"), None], pa.decimal128(5, 2)),
            "dec18": pa.array(
                [Decimal("12345678901234.5678"), Decimal("0.0001"), None], pa.decimal128(18, 4)
            ),
            "dec38": pa.array([big, -big, None], pa.decimal128(38, 10)),
            "string": ["", "héllo ☃", None],
            "binary": [b"", b"\x00\xff", None],
            "bool": [True, False, None],
            "date": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31), None]),
            "ts": pa.array(
                [
                    dt.datetime(1970, 1, 1, tzinfo=UTC),
                    dt.datetime(2024, 6, 30, 23, 59, 59, 999999, tzinfo=UTC),
                    None,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "ts_ntz": pa.array(
                [dt.datetime(2000, 1, 1, 1, 2, 3, 4), dt.datetime(1900, 1, 1), None],
                pa.timestamp("us"),
            ),
            "ints": pa.array([[1, None, 3], [], None], pa.list_(pa.int32())),
            "structs": pa.array(
                [[{"x": 1, "y": "a"}, None, {"x": None, "y": None}], None, []],
                pa.list_(pa.struct([("x", pa.int32()), ("y", pa.string())])),
            ),
            "map": pa.array([[("k", 1), ("n", None)], [], None], pa.map_(pa.string(), pa.int64())),
            "map_of_lists": pa.array(
                [[("a", [1, 2])], [("b", None)], None], pa.map_(pa.string(), pa.list_(pa.int32()))
            ),
            "nested": pa.array(
                [
                    {"a": 1, "items": [{"c": "x", "m": [("k", 1)]}, {"c": None, "m": None}, None]},
                    {"a": None, "items": None},
                    None,
                ],
                NESTED,
            ),
        }
    )
    write_deltalake(path, table)

    df = read(spark, path)
    assert df.schema.simpleString() == (
        "struct<id:bigint,byte:tinyint,short:smallint,int:int,long:bigint,float:float,"
        "double:double,dec1:decimal(1,0),dec5:decimal(5,2),dec18:decimal(18,4),"
        "dec38:decimal(38,10),string:string,binary:binary,bool:boolean,date:date,"
        "ts:timestamp,ts_ntz:timestamp_ntz,ints:array<int>,"
        "structs:array<struct<x:int,y:string>>,map:map<string,bigint>,"
        "map_of_lists:map<string,array<int>>,"
        "nested:struct<a:int,items:array<struct<c:string,m:map<string,bigint>>>>>"
    )
    assert_rows(df, table)
    assert ids(df.where("nested.a = 1")) == [0]
    assert ids(df.where("dec38 > 0")) == [0]
    assert ids(df.where("ts_ntz < TIMESTAMP_NTZ'1950-01-01 00:00:00'")) == [1]


# --- 4. deletion vectors ---------------------------------------------------------------------


def _without_ids(table: pa.Table, deleted: set[int]) -> list[dict[str, Any]]:
    return [r for r in table.to_pylist() if r["id"] not in deleted]


@pytest.mark.parametrize("inline", [False, True], ids=["file", "inline"])
def test_deleted_rows_do_not_appear(spark, table_path, inline):
    path = table_path()
    table = clustered_table(path, files=2)
    files = add_paths(path)
    add_deletion_vectors(path, {files[0]: [1, 3], files[10]: [0, 9]}, inline=inline)
    assert_rows(read(spark, path), _without_ids(table, {1, 3, 10, 19}))
    # The version before the DELETE still has every row.
    assert_rows(read(spark, path, versionAsOf=1), table)


def test_deletion_vectors_survive_a_checkpoint_and_log_cleanup(spark, table_path):
    path = table_path()
    table = clustered_table(path, files=2)
    files = add_paths(path)
    version = add_deletion_vectors(path, {files[0]: [0, 5]})
    version = add_deletion_vectors(path, {files[0]: [6], files[10]: [2]}, inline=True)
    DeltaTable(path).create_checkpoint()
    remove_commits_before(path, version)
    assert_rows(read(spark, path), _without_ids(table, {0, 5, 6, 12}))


def test_deletion_vectors_with_a_partition_filter(spark, table_path):
    path = table_path()
    table = pa.table(
        {"id": pa.array(range(8), pa.int64()), "p": ["a", "b"] * 4, "v": list(range(8))}
    )
    write_deltalake(path, table, partition_by=["p"])
    by_partition = {
        a["partition.p"]: a["path"]
        for a in pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    }
    # Within the p=a file the rows are ids 0, 2, 4, 6 in order: delete 2 and 6.
    add_deletion_vectors(path, {by_partition["a"]: [1, 3]})
    df = read(spark, path)
    assert ids(df.where("p = 'a'")) == [0, 4]
    assert ids(df.where("p = 'b'")) == [1, 3, 5, 7]
    assert_rows(df, _without_ids(table, {2, 6}))


# --- 5. column mapping -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_with_nested_and_partition_columns(spark, table_path, mode):
    path = table_path()
    arrow_schema = pa.schema(
        [
            ("id", pa.int64()),
            ("Mixed Case", pa.string()),
            ("s", pa.struct([("a", pa.int32()), ("inner", pa.struct([("b", pa.string())]))])),
            ("arr", pa.list_(pa.struct([("x", pa.int32())]))),
            ("p", pa.string()),
        ]
    )
    DeltaTable.create(
        path,
        schema=Schema.from_arrow(arrow_schema),
        partition_by=["p"],
        configuration={"delta.columnMapping.mode": mode},
    )
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "Mixed Case": ["one", None, "three"],
            "s": [{"a": 1, "inner": {"b": "x"}}, None, {"a": 30, "inner": None}],
            "arr": [[{"x": 1}], None, [None, {"x": 3}]],
            "p": ["a", "b", None],
        },
        schema=arrow_schema,
    )
    write_deltalake(path, table, mode="append")

    # The files hold physical names, not the logical ones.
    data_file = pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path")[0].as_py()
    physical = pq.read_schema(os.path.join(path, data_file))
    assert "Mixed Case" not in physical.names and "s" not in physical.names

    df = read(spark, path)
    assert df.columns == ["id", "Mixed Case", "s", "arr", "p"]
    assert_rows(df, table)
    assert ids(df.where("p = 'b'")) == [2]
    assert ids(df.where("s.a > 5")) == [3]
    assert ids(df.where("`Mixed Case` = 'three'")) == [3]


# --- 6. checkpoints and protocol features ----------------------------------------------------


def _five_commits(path: str) -> list[pa.Table]:
    tables = [pa.table({"id": pa.array([i * 10, i * 10 + 1], pa.int64())}) for i in range(5)]
    for t in tables:
        write_deltalake(path, t, mode="append")
    return tables


def test_classic_checkpoint_then_time_travel(spark, table_path):
    path = table_path()
    tables = _five_commits(path)
    DeltaTable(path, version=3).create_checkpoint()
    remove_commits_before(path, 3)
    assert os.path.exists(os.path.join(log_dir(path), f"{3:020d}.checkpoint.parquet"))

    assert_rows(read(spark, path), pa.concat_tables(tables))
    assert_rows(read(spark, path, versionAsOf=3), pa.concat_tables(tables[:4]))
    with pytest.raises(Exception) as info:
        read(spark, path, versionAsOf=1).collect()
    assert_deltaflow_error(info.value, deltaflow.VersionNotFoundError, "Version 1")


def test_multi_part_checkpoint(spark, table_path):
    path = table_path()
    tables = _five_commits(path)
    DeltaTable(path).create_checkpoint()  # at version 4
    single = os.path.join(log_dir(path), f"{4:020d}.checkpoint.parquet")
    actions = pq.read_table(single)
    # PROTOCOL.md: n.checkpoint.o.p.parquet, part o of p, all parts together the snapshot.
    half = actions.num_rows // 2
    for part, (offset, length) in enumerate([(0, half), (half, actions.num_rows - half)], 1):
        name = f"{4:020d}.checkpoint.{part:010d}.{2:010d}.parquet"
        pq.write_table(actions.slice(offset, length), os.path.join(log_dir(path), name))
    os.remove(single)
    with open(os.path.join(log_dir(path), "_last_checkpoint"), "w") as f:
        json.dump({"version": 4, "size": actions.num_rows, "parts": 2}, f)
    remove_commits_before(path, 4)

    assert_rows(read(spark, path), pa.concat_tables(tables))


def test_v2_checkpoint_in_json_is_read(spark, table_path):
    path = table_path()
    tables = _five_commits(path)
    metadata = metadata_of(path)
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["v2Checkpoint"],
        "writerFeatures": ["v2Checkpoint"],
    }
    v2_metadata = {**metadata, "configuration": {"delta.checkpointPolicy": "v2"}}
    write_commit(path, 5, [{"protocol": protocol}, {"metaData": v2_metadata}])
    adds = [{"add": a["add"]} for v in range(5) for a in read_actions(path, v) if "add" in a]
    lines = [{"checkpointMetadata": {"version": 5}}, *read_actions(path, 5), *adds]
    name = os.path.join(log_dir(path), f"{5:020d}.checkpoint.{uuid.uuid4()}.json")
    with open(name, "w") as f:
        f.write("\n".join(json.dumps(a) for a in lines) + "\n")
    with open(os.path.join(log_dir(path), "_last_checkpoint"), "w") as f:
        json.dump(
            {
                "version": 5,
                "size": len(lines),
                "sizeInBytes": os.path.getsize(name),
                "numOfAddFiles": len(adds),
            },
            f,
        )
    remove_commits_before(path, 5)

    assert_rows(read(spark, path), pa.concat_tables(tables))


def test_type_widening_casts_old_files_to_the_table_type(spark, table_path):
    path = table_path()
    old = pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array([7, None], pa.int32())})
    write_deltalake(path, old)
    metadata = metadata_of(path)
    schema = json.loads(metadata["schemaString"])
    for field in schema["fields"]:
        if field["name"] == "x":
            field["type"] = "long"
            field["metadata"] = {"delta.typeChanges": [{"fromType": "integer", "toType": "long"}]}
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["typeWidening"],
        "writerFeatures": ["typeWidening"],
    }
    write_commit(
        path,
        1,
        [{"protocol": protocol}, {"metaData": {**metadata, "schemaString": json.dumps(schema)}}],
    )
    df = read(spark, path)
    assert df.schema["x"].dataType.simpleString() == "bigint"
    assert_rows(df, [{"id": 1, "x": 7}, {"id": 2, "x": None}])


def test_unknown_reader_feature_is_named_in_the_error(spark, table_path):
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    write_commit(
        path,
        1,
        [
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["fancyNewThing"],
                    "writerFeatures": ["fancyNewThing"],
                }
            }
        ],
    )
    with pytest.raises(Exception) as info:
        read(spark, path).collect()
    assert_deltaflow_error(info.value, deltaflow.UnsupportedFeatureError, "fancyNewThing")


# --- 7. filter pushdown and file skipping ----------------------------------------------------


def scanned(total: int, pruned: int) -> int:
    """Files a scan reads: ``pruned`` when file skipping is on in this Spark, else all."""
    return pruned if FILE_SKIPPING_SAFE else total


def plan(path: str, *filters: Any) -> ScanReport:
    """The table layer's plan for Spark ``filters`` (pruning logic, whatever the Spark)."""
    predicates = [p for p in map(to_predicate, filters) if p is not None]
    return plan_scan(load_snapshot(path), predicates)[1]


@needs_pushdown
def test_scan_reports_show_partition_pruning(worker_logs, table_path):
    spark, path = worker_logs, table_path()
    table = pa.table({"id": pa.array(range(9), pa.int64()), "p": ["x", "y", "z"] * 3})
    write_deltalake(path, table, partition_by=["p"])

    assert ids(read(spark, path).where("p = 'x'")) == [0, 3, 6]
    report = last_scan(spark, path)
    assert (report.files_in_snapshot, report.files_scanned) == (3, scanned(3, 1))
    assert report.version == 0 and report.bytes_scanned > 0
    assert ids(read(spark, path).where("p IN ('x', 'z')")) == [0, 2, 3, 5, 6, 8]
    assert last_scan(spark, path).files_scanned == scanned(3, 2)
    assert ids(read(spark, path)) == list(range(9))  # unfiltered scans are reported too
    assert last_scan(spark, path).files_scanned == 3

    p = ("p",)
    assert plan(path, EqualTo(p, "x")).skipped_by_partition == 2
    assert plan(path, In(p, ("x", "z"))).files_scanned == 2
    assert plan(path, Not(EqualTo(p, "x"))).files_scanned == 2
    assert plan(path, IsNull(p)).files_scanned == 0
    assert plan(path, IsNotNull(p), StringStartsWith(p, "y")).files_scanned == 1


def test_a_reused_dataframe_reads_every_file_after_a_filtered_query(spark, table_path):
    # Spark 4.1-4.3 reuse the pushdown query's read plan for later unfilterable queries.
    path = table_path()
    table = pa.table({"id": pa.array(range(6), pa.int64()), "p": ["x", "y"] * 3})
    write_deltalake(path, table, partition_by=["p"])
    df = read(spark, path)
    assert ids(df.where("p = 'x'")) == [0, 2, 4]
    assert ids(df.where("p = 'y' OR id = 0")) == [0, 1, 3, 5]
    assert ids(df) == list(range(6))


@needs_pushdown
def test_scan_reports_show_stats_skipping(worker_logs, table_path):
    spark, path = worker_logs, table_path()
    table = clustered_table(path, files=3)  # ids 0-9, 10-19, 20-29; 'maybe' null in file 2
    expected = table.to_pylist()

    want_files: list[int] = []

    def check(condition: str, keep: Any, spark_filter: Any, files: int, query: bool = True) -> None:
        if query:  # every case runs through the planner; half also through Spark, for time
            got = ids(read(spark, path).where(condition))
            assert got == sorted(r["id"] for r in expected if keep(r)), condition
            want_files.append(scanned(3, files))
        planned = plan(path, spark_filter)
        assert (planned.files_scanned, planned.skipped_by_stats) == (files, 3 - files), condition

    i, m, n = ("id",), ("maybe",), ("name",)
    check("id >= 25", lambda r: r["id"] >= 25, GreaterThanOrEqual(i, 25), 1)
    check("id < 10", lambda r: r["id"] < 10, LessThan(i, 10), 1, query=False)
    check("id > 19", lambda r: r["id"] > 19, GreaterThan(i, 19), 1, query=False)
    check("id <= 10", lambda r: r["id"] <= 10, LessThanOrEqual(i, 10), 2)
    check("id IN (3, 27)", lambda r: r["id"] in (3, 27), In(i, (3, 27)), 2)
    check("maybe IS NULL", lambda r: r["maybe"] is None, IsNull(m), 1)
    check("maybe IS NOT NULL", lambda r: r["maybe"] is not None, IsNotNull(m), 2, query=False)
    check("name = 'n015'", lambda r: r["name"] == "n015", EqualTo(n, "n015"), 1, query=False)
    check("name LIKE 'n02%'", lambda r: r["name"].startswith("n02"), StringStartsWith(n, "n02"), 1)
    check("id = 100", lambda r: False, EqualTo(i, 100), 0)
    reports = scan_reports(spark, path)
    assert [r.files_scanned for r in reports] == want_files


@needs_pushdown
def test_timestamp_stats_at_millisecond_precision_never_skip_matching_rows(worker_logs, table_path):
    spark, path = worker_logs, table_path()
    first = pa.table(
        {
            "id": pa.array([0, 1], pa.int64()),
            "ts": pa.array(
                [
                    dt.datetime(2024, 1, 1, 12, 0, 0, 0, tzinfo=UTC),
                    dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    second = pa.table(
        {
            "id": pa.array([2], pa.int64()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 12, 0, 0, 999999, tzinfo=UTC)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    write_deltalake(path, first)
    write_deltalake(path, second, mode="append")
    df = read(spark, path)
    assert ids(df.where("ts = TIMESTAMP'2024-01-01 12:00:00.123456'")) == [1]
    assert last_scan(spark, path).files_scanned == scanned(2, 1)
    ts = ("ts",)
    for value, files in [
        (dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC), 1),
        (dt.datetime(2024, 1, 1, 12, 0, 0, 999999, tzinfo=UTC), 1),
        (dt.datetime(2024, 1, 1, 12, 0, 0, 999999), 1),  # naive = UTC
        # past the max's 1 ms slack
        (dt.datetime(2024, 1, 1, 12, 0, 1, 1000, tzinfo=UTC), 0),
    ]:
        assert plan(path, EqualTo(ts, value)).files_scanned == files, value
    assert plan(path, GreaterThan(ts, dt.datetime(2024, 1, 1, 12, 0, 0, 123400))).files_scanned == 2
    assert ids(df.where("ts > TIMESTAMP'2024-01-01 12:00:00.1234'")) == [1, 2]
    assert ids(df.where("ts >= TIMESTAMP'2024-01-01 12:00:00.999999'")) == [2]
    assert ids(df.where("ts = TIMESTAMP'2024-01-01 12:00:00.999999'")) == [2]
    assert ids(df.where("ts < TIMESTAMP'2024-01-01 12:00:00.999999'")) == [0, 1]


@needs_pushdown
def test_truncated_string_stats_never_skip_matching_rows(spark, table_path):
    path = table_path()
    long_low, long_high = "k" * 40 + "a", "k" * 40 + "z"
    first = pa.table({"id": pa.array([0, 1], pa.int64()), "s": [long_low, long_high]})
    write_deltalake(path, first)
    second = pa.table({"id": pa.array([2], pa.int64()), "s": ["m" * 50]})
    write_deltalake(path, second, mode="append")
    df = read(spark, path)
    assert ids(df.where(df.s == long_high)) == [1]
    assert ids(df.where(df.s > "k" * 40 + "b")) == [1, 2]
    assert ids(df.where(df.s >= "m" * 50)) == [2]
    assert ids(df.where(df.s.startswith("k" * 35))) == [0, 1]
    assert ids(df.where(df.s < "k" * 40 + "b")) == [0]
    s = ("s",)
    assert plan(path, EqualTo(s, long_high)).files_scanned == 1
    assert plan(path, GreaterThan(s, "k" * 40 + "b")).files_scanned == 2
    assert plan(path, StringStartsWith(s, "k" * 35)).files_scanned == 1


# --- 8. errors -------------------------------------------------------------------------------


def test_missing_table_names_the_path(spark, table_path):
    path = table_path("missing")
    with pytest.raises(Exception) as info:
        read(spark, path).collect()
    assert_deltaflow_error(info.value, deltaflow.TableNotFoundError, path, "No Delta table")


def test_missing_table_raises_typed_in_load(spark, table_path):
    """The driver loads no log for a plain read any more; the connector's table.load, in
    load() too, raises for the marked read (delta-spark raises in load() as well)."""
    path = table_path("missing")
    with pytest.raises(deltaflow.TableNotFoundError) as info:
        spark.read.format("delta").load(path)
    assert info.value.table_uri == "file://" + os.path.realpath(path)


def test_a_repeated_read_sees_each_append(spark, table_path):
    """The brain keeps the snapshot between reads and checks by name for the next commit."""
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    assert ids(read(spark, path)) == [1]
    assert ids(read(spark, path)) == [1]
    write_deltalake(path, pa.table({"id": pa.array([2], pa.int64())}), mode="append")
    assert ids(read(spark, path)) == [1, 2]
    assert ids(read(spark, path, versionAsOf=0)) == [1]


def test_version_that_does_not_exist(spark, table_path):
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(Exception) as info:
        read(spark, path, versionAsOf=5).collect()
    assert_deltaflow_error(
        info.value, deltaflow.VersionNotFoundError, "Version 5", "latest version is 0"
    )


def test_unknown_option_is_named(spark, table_path):
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(Exception) as info:
        read(spark, path, versionAsOff=0).collect()
    assert_deltaflow_error(info.value, deltaflow.InvalidOptionError, "versionasoff", "versionAsOf")


# --- 9. interop ------------------------------------------------------------------------------


@pytest.mark.slow
def test_table_written_by_spark_reads_identically_in_deltalake_and_polars(spark, table_path):
    import polars as pl

    path = table_path()
    df = spark.sql(
        """
        SELECT CAST(id AS BIGINT) AS id,
               CAST(id AS TINYINT) AS b, CAST(id AS SMALLINT) AS sh, CAST(id AS INT) AS i,
               CAST(id / 3 AS FLOAT) AS f, id / 7 AS d, CAST(id * 1.25 AS DECIMAL(10, 2)) AS dec,
               IF(id = 2, NULL, CONCAT('s', id)) AS s, CAST(CONCAT('b', id) AS BINARY) AS bin,
               id % 2 = 0 AS flag, DATE_ADD(DATE'2024-01-01', CAST(id AS INT)) AS day,
               TIMESTAMP'2024-01-01 00:00:00' + MAKE_INTERVAL(0, 0, 0, 0, 0, 0, id * 1.5) AS ts,
               ARRAY(id, id + 1) AS arr, NAMED_STRUCT('x', id, 'y', CONCAT('y', id)) AS st
        FROM range(5)
        """
    )
    df.write.format("delta").save(path)
    expected = df.toArrow().to_pylist()

    assert_rows(read(spark, path), expected)
    assert sorted_rows(pa.table(DeltaTable(path).to_pyarrow_table()).to_pylist()) == sorted_rows(
        expected
    )
    assert sorted_rows(pl.read_delta(path).to_arrow().to_pylist()) == sorted_rows(expected)


@needs_pushdown
def test_file_skipping_option_turns_skipping_on(worker_logs, table_path):
    """fileSkipping=true opts in on Spark versions where it is off by default."""
    spark, path = worker_logs, table_path()
    table = pa.table({"id": pa.array(range(9), pa.int64()), "p": ["x", "y", "z"] * 3})
    write_deltalake(path, table, partition_by=["p"])
    df = spark.read.format("delta").option("fileSkipping", "true").load(path)
    assert ids(df.where("p = 'x'")) == [0, 3, 6]
    report = last_scan(spark, path)
    assert (report.files_in_snapshot, report.files_scanned, report.skipped_by_partition) == (
        3,
        1,
        2,
    )

    off = spark.read.format("delta").option("fileSkipping", "false").load(path)
    assert ids(off.where("p = 'x'")) == [0, 3, 6]
    assert last_scan(spark, path).files_scanned == 3
