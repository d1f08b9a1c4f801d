"""The JVM write path: Spark's Parquet writer, footer stats, one commit (``_native_write``).

Each behaviour is checked against the Python source's result for the same data
(``deltaflow.write.nativeWrite=false``), read back by delta-rs, Polars and our reader.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import polars as pl
import pytest
from deltalake import DeltaTable

from deltaflow import InvalidOptionError
from deltaflow import typed_error as deltaflow_typed
from deltaflow.spark.read._native import NativeScan, plan_native_scan
from deltaflow.spark.write import _native
from deltaflow.table._snapshot import load_snapshot

CONF = _native.NATIVE_WRITE_CONF
SPECIAL = ["a/b=c", "sp ace", "per%cent", "colon:q?", "ünï", "", "__HIVE_DEFAULT_PARTITION__"]
SPECIAL += ["\x01lead", "{[x]}*"]


@pytest.fixture
def python_path(spark: Any) -> Iterator[None]:
    spark.conf.set(CONF, "false")
    try:
        yield
    finally:
        spark.conf.unset(CONF)


@pytest.fixture
def jvm_log(spark: Any, caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="deltaflow.write")
    spark._jvm.io.deltaflow.spark.WriteReports.clear()
    return caplog


def jvm_writes(caplog: pytest.LogCaptureFixture) -> int:
    """Batch writes the connector ran on Spark's Parquet writer since ``jvm_log`` started
    (the connector's write reports), plus stream batches the Python side logged."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    reports = json.loads(spark._jvm.io.deltaflow.spark.WriteReports.json())
    batch = sum(r["route"] == "jvm" for r in reports)
    return batch + sum("JVM write" in r.getMessage() for r in caplog.records)


def log_entries(path: str, version: int) -> list[dict[str, Any]]:
    with open(Path(path) / "_delta_log" / f"{version:020d}.json") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def adds(path: str, version: int) -> list[dict[str, Any]]:
    return [e["add"] for e in log_entries(path, version) if "add" in e]


def parquet_files(path: str) -> set[str]:
    root = Path(path)
    return {
        str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def rows_by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def read_three_ways(spark: Any, path: str) -> tuple[list[Any], list[Any], list[Any]]:
    by_delta_rs = rows_by_id(DeltaTable(path).to_pyarrow_table().to_pylist())
    by_polars = rows_by_id(pl.read_delta(path).to_dicts())
    by_spark = rows_by_id(
        [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()]
    )
    return by_delta_rs, by_polars, by_spark


def write(df: Any, path: str, mode: str = "append", **options: Any) -> None:
    writer = df.write.format("delta").mode(mode)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(path)


MULTI_SCHEMA = (
    "id long, p string, n int, day date, flag boolean, b byte, sh short, big long,"
    " f float, d double, dec decimal(20,4), small_dec decimal(9,2), s string, bin binary,"
    " ts timestamp, ntz timestamp_ntz, arr array<int>, m map<string, long>,"
    " st struct<a: int, inner: struct<b: string>>"
)


def multi_rows() -> list[tuple[Any, ...]]:
    rows = []
    for i in range(36):
        rows.append(
            (
                i,
                SPECIAL[i % len(SPECIAL)] if i % 10 else None,
                (i % 3) - 1 if i % 7 else None,
                dt.date(2024, 1, 1 + i % 2),
                i % 2 == 0,
                i % 100,
                i * 3,
                2**40 + i,
                i / 4,
                i * 1.25 if i % 5 else None,
                decimal.Decimal(f"{i}.{i:04d}"),
                decimal.Decimal(f"{i}.5"),
                ("x" * 40 + str(i)) if i % 4 == 0 else f"v{i}",
                bytes([i]),
                dt.datetime(2024, 3, 1, 0, 0, i, 123456 + i),
                dt.datetime(2024, 3, 2, 0, 0, i, 654321),
                [i, i + 1],
                {"k": i},
                {"a": i, "inner": {"b": f"b{i}"}} if i % 3 else None,
            )
        )
    return rows


@pytest.fixture(scope="module")
def multi_tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same partitioned data written once by each path, one file per partition."""
    root = tmp_path_factory.mktemp("native_write")
    df = spark.createDataFrame(multi_rows(), MULTI_SCHEMA).coalesce(1)
    native, python = str(root / "jvm"), str(root / "python")
    df.write.format("delta").partitionBy("p", "n", "day", "flag").save(native)
    spark.conf.set(CONF, "false")
    try:
        df.write.format("delta").partitionBy("p", "n", "day", "flag").save(python)
    finally:
        spark.conf.unset(CONF)
    return native, python


def test_multi_type_partitioned_table_reads_the_same_everywhere(
    spark: Any, multi_tables: tuple[str, str]
) -> None:
    native, python = multi_tables
    assert "_delta_staging" in {p.name for p in Path(native).iterdir()}  # the JVM path ran
    assert "_delta_staging" not in {p.name for p in Path(python).iterdir()}
    jvm_rows, python_rows = read_three_ways(spark, native), read_three_ways(spark, python)
    assert jvm_rows == python_rows
    by_delta_rs, by_polars, by_spark = jvm_rows
    assert len(by_delta_rs) == 36
    assert [r["p"] for r in by_spark] == [r["p"] for r in by_delta_rs]
    assert [r["st"] for r in by_polars] == [r["st"] for r in by_delta_rs]
    assert DeltaTable(native).schema() == DeltaTable(python).schema()
    assert DeltaTable(native).metadata().partition_columns == ["p", "n", "day", "flag"]
    # Same Hive-style layout as the Python path, no staging directory in any path.
    layout = {a["path"].rsplit("/", 1)[0] for a in adds(native, 0)}
    assert layout == {a["path"].rsplit("/", 1)[0] for a in adds(python, 0)}
    assert not any("_delta_staging" in a["path"] for a in adds(native, 0))


def test_stats_match_the_python_path(multi_tables: tuple[str, str]) -> None:
    native, python = multi_tables

    def by_partition(path: str) -> dict[str, dict[str, Any]]:
        out = {}
        for add in adds(path, 0):
            key = json.dumps(add["partitionValues"], sort_keys=True)
            assert key not in out  # one file per partition in both tables
            out[key] = json.loads(add["stats"])
        return out

    jvm, py = by_partition(native), by_partition(python)
    assert jvm.keys() == py.keys()
    for key, stats in jvm.items():
        assert stats == py[key], key
    some = next(iter(jvm.values()))
    assert set(some["nullCount"]) == {
        "id", "b", "sh", "big", "f", "d", "dec", "small_dec", "s", "bin", "ts", "ntz",
        "arr", "m", "st",
    }  # fmt: skip


def test_footer_stats_leave_out_what_the_footer_cannot_prove(
    spark: Any, table_path: Any, jvm_log: pytest.LogCaptureFixture
) -> None:
    path = table_path()
    df = spark.createDataFrame(
        [(1, [1, None], float("nan")), (2, None, 2.0)], "id long, arr array<int>, x double"
    )
    df.coalesce(1).write.format("delta").save(path)
    assert jvm_writes(jvm_log) == 1
    (add,) = adds(path, 0)
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 2
    # Null list elements and null lists share the footer's count: no nullCount for arr.
    assert "arr" not in stats["nullCount"] and stats["nullCount"]["id"] == 0
    assert stats["minValues"]["id"] == 1 and stats["maxValues"]["id"] == 2
    x_min = stats["minValues"].get("x")
    assert x_min is None or x_min <= 2.0


def test_partition_values_null_empty_and_special(spark: Any, table_path: Any) -> None:
    path = table_path()
    values = [*SPECIAL, None]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "id long, p string")
    df.write.format("delta").partitionBy("p").save(path)
    logged = sorted(
        (a["partitionValues"]["p"] for a in adds(path, 0)), key=lambda v: (v is None, v or "")
    )
    assert logged == sorted(values, key=lambda v: (v is None, v or ""))
    by_delta_rs = rows_by_id(DeltaTable(path).to_pyarrow_table().to_pylist())
    # delta-rs reads the empty string back as null, whichever path wrote it.
    assert [r["p"] for r in by_delta_rs] == [None if v == "" else v for v in values]
    for add in adds(path, 0):
        assert (Path(path) / unquote(add["path"])).exists()


def test_plain_values_stay_on_the_jvm_read_path(spark: Any, table_path: Any) -> None:
    path = table_path()
    df = spark.createDataFrame(
        [(i, ["a/b", "ünï", None, "x:y"][i % 4], i % 3) for i in range(12)],
        "id long, p string, q int",
    )
    df.write.format("delta").partitionBy("p", "q").save(path)
    assert isinstance(plan_native_scan(load_snapshot(path)), NativeScan)
    by_delta_rs, by_polars, by_spark = read_three_ways(spark, path)
    assert by_delta_rs == by_polars == by_spark
    assert len(by_spark) == 12


def test_idempotent_app_transactions(spark: Any, table_path: Any) -> None:
    path = table_path()
    df = spark.range(0, 10, numPartitions=2)
    write(df, path, txnAppId="app", txnVersion=1, userMetadata="first")
    files = parquet_files(path)
    write(df, path, txnAppId="app", txnVersion=1)
    assert int(DeltaTable(path).version()) == 0 and parquet_files(path) == files
    commit_info = next(e["commitInfo"] for e in log_entries(path, 0) if "commitInfo" in e)
    assert commit_info["userMetadata"] == "first"
    assert DeltaTable(path).transaction_version("app") == 1

    # A duplicate that passes the planning check but loses at commit leaves no files:
    # while its job runs, another writer commits the same app transaction.
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake
    from pyspark.sql.functions import udf

    marker = Path(path + ".raced")

    @udf("long")
    def race_once(value: int) -> int:
        if not marker.exists():
            marker.touch()
            write_deltalake(
                path,
                pa.table({"id": pa.array([100], pa.int64())}),
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction("app", 2)]),
            )
        return value

    racing = df.select(race_once("id").alias("id"))
    write(racing, path, txnAppId="app", txnVersion=2)
    assert marker.exists()
    assert int(DeltaTable(path).version()) == 1  # the other writer's commit only
    assert DeltaTable(path).transaction_version("app") == 2
    assert len(parquet_files(path)) == len(files) + 1  # ours were deleted
    assert len(DeltaTable(path).to_pyarrow_table()) == 11


def test_overwrite(spark: Any, table_path: Any, jvm_log: pytest.LogCaptureFixture) -> None:
    path = table_path()
    df = spark.createDataFrame([(i, i % 2) for i in range(6)], "id long, k int")
    df.write.format("delta").partitionBy("k").save(path)
    df.where("id >= 4").write.format("delta").mode("overwrite").save(path)
    assert jvm_writes(jvm_log) == 2
    assert int(DeltaTable(path).version()) == 1
    removed = [e["remove"] for e in log_entries(path, 1) if "remove" in e]
    assert len(removed) == len(adds(path, 0))
    assert [r["id"] for r in read_three_ways(spark, path)[2]] == [4, 5]


def test_failed_job_commits_nothing(spark: Any, table_path: Any) -> None:
    from pyspark.sql.functions import udf

    path = table_path()
    spark.range(3).write.format("delta").save(path)
    before = parquet_files(path)

    @udf("long")
    def explode_on_777(value: int) -> int:
        if value == 777:
            raise ValueError("boom")
        return value

    df = spark.range(0, 1000, numPartitions=4).select(explode_on_777("id").alias("id"))
    with pytest.raises(Exception, match="boom"):
        df.write.format("delta").mode("append").save(path)
    assert int(DeltaTable(path).version()) == 0
    assert parquet_files(path) == before
    assert not any((Path(path) / "_delta_staging").iterdir())


def test_failed_commit_deletes_moved_files(spark: Any, table_path: Any) -> None:
    """The commit fails for real after the job (the log cannot be written: a task put
    a file where the ``_delta_log`` directory was); the files already moved into the
    table are deleted and nothing is committed."""
    from pyspark.sql.functions import udf

    from deltaflow import DeltaflowError

    path = table_path()
    spark.range(3).write.format("delta").save(path)
    before = parquet_files(path)
    log_dir = Path(path) / "_delta_log"
    hidden = Path(path + ".log")

    @udf("long")
    def break_the_log_once(value: int) -> int:
        if not hidden.exists():
            log_dir.rename(hidden)
            log_dir.write_text("not a directory")
        return value

    df = spark.range(0, 100, numPartitions=1).select(break_the_log_once("id").alias("id"))
    with pytest.raises(DeltaflowError):
        try:
            df.write.format("delta").mode("append").save(path)
        except Exception as exc:
            raise (deltaflow_typed(exc) or exc) from exc
    assert hidden.exists()
    log_dir.unlink()
    hidden.rename(log_dir)
    assert parquet_files(path) == before
    assert not any((Path(path) / "_delta_staging").iterdir())
    assert int(DeltaTable(path).version()) == 0


def test_other_jobs_staged_files_are_never_picked_up(spark: Any, table_path: Any) -> None:
    path = table_path()
    spark.range(3).write.format("delta").save(path)
    # Another writer's job in flight: its staging directory holds committed task files.
    foreign = Path(path) / "_delta_staging" / "other-job" / "part-00000-x-c000.snappy.parquet"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes((next(Path(path).glob("*.parquet"))).read_bytes())
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    assert foreign.exists()
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2, 3, 4]


def test_conf_turns_it_off(
    spark: Any, table_path: Any, python_path: None, jvm_log: pytest.LogCaptureFixture
) -> None:
    path = table_path()
    spark.range(5).write.format("delta").save(path)
    assert jvm_writes(jvm_log) == 0
    assert not (Path(path) / "_delta_staging").exists()
    spark.conf.set(CONF, "sometimes")
    with pytest.raises(InvalidOptionError) as info:
        spark.range(5).write.format("delta").mode("append").save(path)
    assert info.value.option == CONF


def test_ineligible_writes_take_the_python_path(
    spark: Any, table_path: Any, jvm_log: pytest.LogCaptureFixture
) -> None:
    path = table_path()
    events = spark.createDataFrame(
        [(1, dt.datetime(2024, 1, 1), 1.5)], "id long, ts timestamp, x double"
    )
    events.write.format("delta").partitionBy("ts").save(path)  # timestamp partition column
    events.write.format("delta").mode("append").option("compression", "lz4").save(path)
    assert jvm_writes(jvm_log) == 0
    assert len(DeltaTable(path).to_pyarrow_table()) == 2

    plain = table_path()
    events.write.format("delta").option("compression", "lz4").save(plain)
    write(events, plain, "overwrite", replaceWhere="id = 1")
    assert jvm_writes(jvm_log) == 0
    assert len(DeltaTable(plain).to_pyarrow_table()) == 1

    mapped = table_path()
    DeltaTable.create(
        mapped,
        DeltaTable(plain).schema(),
        configuration={"delta.columnMapping.mode": "name"},
    )
    events.write.format("delta").mode("append").save(mapped)
    assert jvm_writes(jvm_log) == 0
    assert len(DeltaTable(mapped).to_pyarrow_table()) == 1


def test_partition_by_reaches_parquet_writes(spark: Any, tmp_path: Path) -> None:
    # The patched DataFrameWriter defers partitionBy for delta; other formats keep it.
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, p string")
    df.write.partitionBy("p").parquet(str(tmp_path / "method"))
    df.write.parquet(str(tmp_path / "kwarg"), partitionBy="p")
    for name in ("method", "kwarg"):
        assert {d.name for d in (tmp_path / name).iterdir() if d.is_dir()} == {"p=a", "p=b"}
