"""The JVM read path: the Python source's rows, used only when exact; typed errors in-process."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.spark.read import _native
from deltaflow.spark.read._native import NATIVE_SCAN_CONF, Fallback, NativeScan, plan_native_scan
from deltaflow.table._snapshot import load_snapshot
from tests.table.dv_fixtures import add_deletion_vectors

SPECIAL = ["a/b", "c:d", "e f", "x%y", "q=r", "it's", "ü", "%41", None, "z"]


@pytest.fixture(autouse=True)
def native_reads(spark: Any) -> Iterator[None]:
    spark.conf.unset(NATIVE_SCAN_CONF)
    yield
    spark.conf.unset(NATIVE_SCAN_CONF)


def plan_of(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def is_native(df: Any) -> bool:
    """Read by the connector's DSv2 scan (Spark's Parquet reader), not the Python source."""
    plan = plan_of(df)
    native = "DeltaScan delta." in plan
    assert native != ("deltaflow_python" in plan), plan
    return native


def load(spark: Any, path: str, native: bool, **options: Any) -> Any:
    spark.conf.set(NATIVE_SCAN_CONF, "auto" if native else "false")
    return spark.read.format("delta").options(**options).load(path)


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def both_paths(spark: Any, path: str, **options: Any) -> tuple[Any, Any]:
    native, python = load(spark, path, True, **options), load(spark, path, False, **options)
    assert is_native(native)
    assert not is_native(python)
    assert native.columns == python.columns
    return native, python


def partitioned_table(spark: Any, path: str) -> None:
    data = [(i, value, i * 10) for i, value in enumerate(SPECIAL)]
    # Partition column first: the JVM path must put it back in the table's order.
    df = spark.createDataFrame(data, "id long, p string, n int").select("p", "id", "n")
    df.write.format("delta").partitionBy("p").save(path)


def test_partitioned_table_with_special_values_reads_the_same(spark: Any, table_path: Any) -> None:
    path = table_path()
    partitioned_table(spark, path)
    native, python = both_paths(spark, path)
    assert native.columns == ["p", "id", "n"]
    assert rows(native) == rows(python)
    assert sorted(r[0] for r in rows(native) if r[0] is not None) == sorted(
        v for v in SPECIAL if v is not None
    )


def test_partition_filters_prune_on_the_native_path(spark: Any, table_path: Any) -> None:
    path = table_path()
    partitioned_table(spark, path)
    df = load(spark, path, True).where("p = 'c:d' OR p IS NULL")
    plan = plan_of(df)
    assert "skipping by [Or(EqualTo(p,c:d),IsNull(p))]" in plan, plan
    assert sorted(r.id for r in df.collect()) == [1, 8]
    report = deltaflow.spark.scan_reports(spark, path)[-1]
    assert (report.files_scanned, report.skipped_by_partition) == (2, report.files_in_snapshot - 2)
    python = load(spark, path, False).where("p = 'c:d' OR p IS NULL")
    assert rows(df) == rows(python)


def test_time_travel_on_both_paths(spark: Any, table_path: Any) -> None:
    path = table_path()
    first = pa.table({"id": pa.array([1, 2], pa.int64()), "d": ["a", "b"]})
    write_deltalake(path, first, partition_by=["d"])
    write_deltalake(path, pa.table({"id": pa.array([3], pa.int64()), "d": ["c"]}), mode="append")
    native, python = both_paths(spark, path, versionAsOf=0)
    assert rows(native) == rows(python) == [(1, "a"), (2, "b")]
    native, python = both_paths(spark, path)
    assert rows(native) == rows(python) == [(1, "a"), (2, "b"), (3, "c")]


def test_typed_partition_columns(spark: Any, table_path: Any) -> None:
    import datetime as dt

    path = table_path()
    table = pa.table(
        {
            "v": pa.array([1.5, 2.5, 3.5]),
            "day": pa.array([dt.date(2024, 1, 1), None, dt.date(2024, 2, 29)]),
            "n": pa.array([-1, 7, None], pa.int32()),
            "flag": pa.array([True, False, None]),
        }
    )
    write_deltalake(path, table, partition_by=["day", "n", "flag"])
    native, python = both_paths(spark, path)
    assert native.columns == ["v", "day", "n", "flag"]
    assert rows(native) == rows(python)
    assert len(rows(native)) == 3


def test_deletion_vectors_are_applied_by_the_connector(spark: Any, table_path: Any) -> None:
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array(range(6), pa.int64())}))
    (file,) = DeltaTable(path).file_uris()
    add_deletion_vectors(path, {file.rsplit("/", 1)[-1]: [1, 4]})
    native, python = both_paths(spark, path)
    assert sorted(r.id for r in native.collect()) == [0, 2, 3, 5]
    assert rows(native) == rows(python)
    assert sorted(r.id for r in native.where("id > 2").collect()) == [3, 5]
    assert isinstance(plan_native_scan(load_snapshot(path)), Fallback)


def test_deletion_vector_feature_without_vectors_stays_native(spark: Any, table_path: Any) -> None:
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array(range(6), pa.int64())}))
    (file,) = DeltaTable(path).file_uris()
    add_deletion_vectors(path, {file.rsplit("/", 1)[-1]: []})
    assert load_snapshot(path).has_deletion_vectors_enabled
    native, python = both_paths(spark, path)
    assert rows(native) == rows(python)


def test_column_mapping_is_read_by_physical_names(spark: Any, table_path: Any) -> None:
    path = table_path()
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]})
    write_deltalake(path, table, configuration={"delta.columnMapping.mode": "name"})
    df = load(spark, path, True)
    assert is_native(df)
    assert rows(df) == [(1, "a"), (2, "b")]
    assert [r.name for r in df.where("id = 2").select("name").collect()] == ["b"]


def test_conf_false_turns_the_native_path_off(spark: Any, table_path: Any) -> None:
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    assert is_native(load(spark, path, True))
    assert not is_native(load(spark, path, False))
    spark.conf.set(NATIVE_SCAN_CONF, "sometimes")
    with pytest.raises(deltaflow.InvalidOptionError) as info:
        spark.read.format("delta").load(path)
    assert info.value.option == NATIVE_SCAN_CONF


def test_other_formats_are_untouched(spark: Any, tmp_path: Any) -> None:
    spark.range(3).write.parquet(str(tmp_path / "p"))
    df = spark.read.format("parquet").option("mergeSchema", "false").load(str(tmp_path / "p"))
    assert sorted(r.id for r in df.collect()) == [0, 1, 2]


@pytest.mark.parametrize("native", [True, False])
def test_errors_are_typed_in_the_callers_process(spark: Any, table_path: Any, native: bool) -> None:
    missing = table_path("missing")
    with pytest.raises(deltaflow.TableNotFoundError) as not_found:
        load(spark, missing, native)
    assert not_found.value.table_uri.endswith(missing.rsplit("/", 1)[-1])

    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(deltaflow.VersionNotFoundError) as version:
        load(spark, path, native, versionAsOf=5)
    assert (version.value.version, version.value.latest) == (5, 0)
    with pytest.raises(deltaflow.InvalidOptionError) as option:
        load(spark, path, native, versionAsOff=0)
    assert option.value.option == "versionasoff"


def test_empty_table_reads_no_rows(spark: Any, table_path: Any) -> None:
    path = table_path()
    DeltaTable.create(path, schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    df = load(spark, path, True)
    assert df.columns == ["id", "s"]
    assert df.collect() == []


@pytest.mark.parametrize(
    ("relative", "value", "problem"),
    [
        ("p=a%2Fb/f.parquet", "a/b", None),
        ("p=__HIVE_DEFAULT_PARTITION__/f.parquet", None, None),
        ("p=%C3%BC/f.parquet", "ü", "not the log's"),  # delta-rs escapes UTF-8 bytes
        ("p=__HIVE_DEFAULT_PARTITION__/f.parquet", "", "reads back as null"),
        ("p=__HIVE_DEFAULT_PARTITION__/f.parquet", "__HIVE_DEFAULT_PARTITION__", "null"),
        ("p=x/f.parquet", None, "null value"),
        ("f.parquet", "x", "do not match"),
        ("q=x/f.parquet", "x", "not named"),
        ("p=%+41/f.parquet", "%+41", "not the log's"),  # Spark decodes %+4 like Java's parseInt
    ],
)
def test_path_checks(relative: str, value: Any, problem: str | None) -> None:
    found = _native._path_problem(relative, ("p",), {"p": value})
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_delta_rs_escaped_partitions_fall_back_when_spark_would_misread(table_path: Any) -> None:
    path = table_path()
    one = pa.array([1], pa.int64())
    write_deltalake(path, pa.table({"id": one, "p": ["ü"]}), partition_by=["p"])
    plan = plan_native_scan(load_snapshot(path))
    assert isinstance(plan, Fallback) and "not the log's" in plan.reason
    write_deltalake(path, pa.table({"id": one, "p": ["e f"]}), mode="overwrite")
    assert isinstance(plan_native_scan(load_snapshot(path)), NativeScan)


def test_connector_scans_are_reported_without_worker_logging(spark, table_path):
    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "false")
    path = table_path()
    spark.range(10).selectExpr("id", "id % 2 AS p").write.format("delta").partitionBy("p").save(
        path
    )
    before = len(deltaflow.spark.scan_reports(spark, path))
    assert spark.read.format("delta").load(path).where("p = 1").count() == 5
    reports = deltaflow.spark.scan_reports(spark, path)
    assert len(reports) == before + 1
    last = reports[-1]
    assert last.files_scanned >= 1
    assert last.skipped_by_partition == last.files_in_snapshot - last.files_scanned > 0


def test_variant_columns_round_trip_through_the_connector(spark: Any, table_path: Any) -> None:
    path = table_path()
    df = spark.sql(
        "SELECT id, parse_json(concat('{\"a\": ', id, ', \"s\": \"x', id, '\"}')) AS v"
        " FROM range(4)"
    )
    df.write.format("delta").save(path)
    assert "variantType" in DeltaTable(path).protocol().reader_features
    back = load(spark, path, True)
    assert is_native(back)
    assert back.schema.simpleString() == "struct<id:bigint,v:variant>"
    got = back.selectExpr("id", "variant_get(v, '$.a', 'int') AS a", "v:s::string AS s")
    assert sorted(tuple(r) for r in got.collect()) == [(i, i, f"x{i}") for i in range(4)]
    # The Python data source cannot read VARIANT: refused, typed, naming the feature.
    with pytest.raises(deltaflow.UnsupportedFeatureError) as info:
        load(spark, path, False)
    assert info.value.feature == "variantType"


WIDENINGS = [
    ("integer", "long", pa.int32(), [7, None], [7, None]),
    ("short", "integer", pa.int16(), [-3, 4], [-3, 4]),
    ("float", "double", pa.float32(), [1.5, None], [1.5, None]),
    ("integer", "double", pa.int32(), [2, 3], [2.0, 3.0]),
    ("decimal(5,2)", "decimal(10,4)", pa.decimal128(5, 2), [1, 2], None),
    ("byte", "long", pa.int8(), [-1, 127], [-1, 127]),
    (
        "date",
        "timestamp_ntz",
        pa.date32(),
        [dt.date(2024, 2, 29), None],
        [dt.datetime(2024, 2, 29), None],
    ),
]


@pytest.mark.parametrize(("old", "new", "arrow", "values", "expected"), WIDENINGS)
def test_type_widening_is_read_by_the_connector(
    spark: Any, table_path: Any, old: str, new: str, arrow: Any, values: list[Any], expected: Any
) -> None:
    """Files written before a widening are read with the table's new type, on both paths."""
    import decimal
    import json
    from pathlib import Path

    path = table_path()
    if expected is None:  # decimals
        values = [decimal.Decimal(v) for v in values]
        expected = [decimal.Decimal(v).quantize(decimal.Decimal("0.0001")) for v in values]
    write_deltalake(
        path, pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array(values, arrow)})
    )
    log = Path(path) / "_delta_log"
    metadata = next(
        json.loads(line)["metaData"]
        for line in (log / f"{0:020d}.json").read_text().splitlines()
        if "metaData" in line
    )
    schema = json.loads(metadata["schemaString"])
    for field in schema["fields"]:
        if field["name"] == "x":
            field["type"] = new
            field["metadata"] = {"delta.typeChanges": [{"fromType": old, "toType": new}]}
    features = ["typeWidening", *(["timestampNtz"] if new == "timestamp_ntz" else [])]
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": features,
        "writerFeatures": features,
    }
    actions = [
        {"protocol": protocol},
        {"metaData": {**metadata, "schemaString": json.dumps(schema)}},
    ]
    (log / f"{1:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    native, python = both_paths(spark, path)
    assert rows(native) == rows(python) == list(zip([1, 2], expected, strict=True))
