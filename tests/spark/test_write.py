"""Batch writes: df.write.format("delta").mode(m).save(uri), checked with independent readers.

Every table written here is read back by deltalake (delta-rs) and Polars as well as by
our own Spark reader, and the raw ``_delta_log`` JSON is inspected where the protocol
matters (one commit per write, stats, protocol versions).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow import InvalidOptionError, SchemaMismatchError, TableAlreadyExistsError
from deltaflow.table.errors import ReplaceWhereViolationError, UnsupportedFeatureError

# ---- helpers ---------------------------------------------------------------------------


def log_entries(path: str, version: int) -> list[dict[str, Any]]:
    with open(Path(path) / "_delta_log" / f"{version:020d}.json") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def adds(path: str, version: int) -> list[dict[str, Any]]:
    return [e["add"] for e in log_entries(path, version) if "add" in e]


def removes(path: str, version: int) -> list[dict[str, Any]]:
    return [e["remove"] for e in log_entries(path, version) if "remove" in e]


def version(path: str) -> int:
    return int(DeltaTable(path).version())


def parquet_files(path: str) -> set[str]:
    root = Path(path)
    return {
        str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def live_files(path: str) -> set[str]:
    from urllib.parse import unquote

    prefix = str(Path(path).resolve()) + "/"
    out = set()
    for uri in DeltaTable(path).file_uris():
        local = unquote(uri[len("file://") :]) if uri.startswith("file://") else uri
        out.add(local[len(prefix) :] if local.startswith(prefix) else local)
    return out


def rows_by(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r[key] is None, r[key]))


def read_all(spark: Any, path: str, key: str = "id") -> list[dict[str, Any]]:
    """The table's rows, asserting that delta-rs, Polars and our reader agree on them."""
    by_delta_rs = rows_by(DeltaTable(path).to_pyarrow_table().to_pylist(), key)
    by_polars = rows_by(pl.read_delta(path).to_dicts(), key)
    by_spark = rows_by(
        [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()], key
    )
    assert by_polars == by_delta_rs
    assert by_spark == by_delta_rs
    return by_delta_rs


def write(df: Any, path: str, mode: str = "append", **options: Any) -> None:
    writer = df.write.format("delta").mode(mode)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(path)


@pytest.fixture
def people(spark: Any) -> Any:
    return spark.createDataFrame(
        [(1, "ann", "nl"), (2, "bob", "us"), (3, "cy", None)],
        "id long, name string, country string",
    )


# ---- 1. save modes -------------------------------------------------------------------------


def test_save_modes(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    people.write.format("delta").save(path)  # default mode: errorifexists, table missing
    assert version(path) == 0
    assert sum(a["stats"] and json.loads(a["stats"])["numRecords"] for a in adds(path, 0)) == 3
    assert any("metaData" in e for e in log_entries(path, 0))

    for mode in ("error", "errorifexists", None):
        with pytest.raises(TableAlreadyExistsError) as info:
            writer = people.write.format("delta")
            (writer.mode(mode) if mode else writer).save(path)
        assert info.value.table_uri == "file://" + os.path.abspath(path)
    people.write.format("delta").mode("ignore").save(path)
    assert version(path) == 0

    people.where("id = 1").write.format("delta").mode("append").save(path)
    assert version(path) == 1
    assert [r["id"] for r in read_all(spark, path)] == [1, 1, 2, 3]

    people.where("id = 2").write.format("delta").mode("overwrite").save(path)
    assert version(path) == 2
    assert read_all(spark, path) == [{"id": 2, "name": "bob", "country": "us"}]


@pytest.mark.parametrize("mode", ["ignore", "error", "append", "overwrite"])
def test_missing_table_is_created_with_data_in_version_zero(
    spark: Any, table_path: Any, people: Any, mode: str
) -> None:
    path = table_path()
    people.write.format("delta").mode(mode).save(path)
    assert version(path) == 0
    assert sorted(r["id"] for r in read_all(spark, path)) == [1, 2, 3]


# ---- 2. partitions --------------------------------------------------------------------------

SPECIAL = ["a/b=c", "sp ace", "per%cent", "colon:q?", "ünï"]


@pytest.mark.parametrize("how", ["option", "method"])
def test_partitioned_write(spark: Any, table_path: Any, how: str) -> None:
    path = table_path()
    data = [(i, SPECIAL[i % len(SPECIAL)] if i % 6 else None, i % 2) for i in range(12)]
    df = spark.createDataFrame(data, "id long, p string, q int")
    writer = df.write.format("delta").mode("append")
    writer = (
        writer.option("partitionBy", "p,q") if how == "option" else writer.partitionBy("p", "q")
    )
    writer.save(path)

    assert DeltaTable(path).metadata().partition_columns == ["p", "q"]
    for add in adds(path, 0):
        p, q = add["partitionValues"]["p"], add["partitionValues"]["q"]
        # Hive-style directories, Spark's escaping, the Hive null partition name.
        expected_dir = "p=" + ("__HIVE_DEFAULT_PARTITION__" if p is None else escape(p)) + f"/q={q}"
        assert DeltaTable(path).to_pyarrow_table().num_rows == 12
        from urllib.parse import unquote

        assert unquote(add["path"]).rsplit("/", 1)[0] == expected_dir
        assert (Path(path) / unquote(add["path"])).exists()
    assert read_all(spark, path) == [{"id": i, "p": p, "q": q} for i, p, q in data]


def escape(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in "\"#%'*/:=?\\{[]^" else c for c in value)


def test_partition_by_mismatch_on_existing_table(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    people.write.format("delta").partitionBy("country").save(path)
    with pytest.raises(SchemaMismatchError) as info:
        people.write.format("delta").mode("append").partitionBy("name").save(path)
    assert info.value.columns == ("name",)
    # Appending without partitionBy uses the table's own partitioning.
    people.write.format("delta").mode("append").save(path)
    assert version(path) == 1
    assert all(a["partitionValues"].keys() == {"country"} for a in adds(path, 1))


# ---- 3. schema enforcement and evolution ------------------------------------------------------


def test_schema_enforcement(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    people.write.format("delta").save(path)

    extra = spark.createDataFrame(
        [(4, "d", "x", 1, 2.0)], "id long, name string, country string, a int, b double"
    )
    with pytest.raises(SchemaMismatchError) as info:
        extra.write.format("delta").mode("append").save(path)
    assert info.value.columns == ("a", "b")
    assert info.value.table_uri.endswith(path)

    wrong = spark.createDataFrame([("x", "d", "x")], "id string, name string, country string")
    with pytest.raises(SchemaMismatchError) as info:
        wrong.write.format("delta").mode("append").save(path)
    assert info.value.columns == ("id",)
    assert version(path) == 0

    # Missing columns become nulls; int -> long is a safe widening; names match by case.
    narrow = spark.createDataFrame([(5, "e")], "ID int, name string")
    narrow.write.format("delta").mode("append").save(path)
    assert read_all(spark, path)[-1] == {"id": 5, "name": "e", "country": None}
    assert DeltaTable(path).schema().to_arrow().field("id").type == pa.int64()


def test_merge_schema_adds_columns(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    people.write.format("delta").save(path)
    more = spark.createDataFrame(
        [(4, "dee", "fr", 7)], "id long, name string, country string, age int"
    )
    write(more, path, mergeSchema="true")
    rows = read_all(spark, path)
    assert [r["age"] for r in rows] == [None, None, None, 7]
    assert DeltaTable(path).schema().to_arrow().names == ["id", "name", "country", "age"]
    # One commit, as delta-spark's: the new schema beside the rows, a blind append.
    assert version(path) == 1
    entry = log_entries(path, 1)
    assert "age" in next(a["metaData"]["schemaString"] for a in entry if "metaData" in a)
    assert len(adds(path, 1)) >= 1
    assert next(a["commitInfo"] for a in entry if "commitInfo" in a)["isBlindAppend"] is True


AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"


def test_the_sessions_auto_merge_adds_columns_to_writes_and_streams(
    spark: Any, table_path: Any, people: Any, tmp_path: Path
) -> None:
    """delta-spark's session switch is mergeSchema's default, for batch writes and a
    stream's micro-batches; an explicit mergeSchema=false still refuses."""
    from tests.spark._conf import conf_set

    path = table_path()
    people.write.format("delta").save(path)
    more = spark.createDataFrame(
        [(4, "dee", "fr", 7)], "id long, name string, country string, age int"
    )
    with pytest.raises(SchemaMismatchError):
        write(more, path)
    source = table_path()
    spark.createDataFrame(
        [(5, "eve", "de", 9, "x")], "id long, name string, country string, age int, tag string"
    ).write.format("delta").save(source)
    with conf_set(spark, AUTO_MERGE, "true"):
        with pytest.raises(SchemaMismatchError):
            write(more, path, mergeSchema="false")
        write(more, path)
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start(path)
        )
        query.awaitTermination(180)
    assert query.exception() is None
    rows = read_all(spark, path)
    assert [(r["id"], r["age"], r["tag"]) for r in rows] == [
        (1, None, None), (2, None, None), (3, None, None), (4, 7, None), (5, 9, "x")
    ]  # fmt: skip
    assert DeltaTable(path).schema().to_arrow().names == [
        "id", "name", "country", "age", "tag"
    ]  # fmt: skip
    with conf_set(spark, AUTO_MERGE, "yes"), pytest.raises(InvalidOptionError, match=AUTO_MERGE):
        write(more, path)


def test_partitioning_by_every_column_is_refused_and_writes_nothing(
    spark: Any, table_path: Any, tmp_path: Path
) -> None:
    """Data files would hold no column: the rows were silently dropped (a table of 0
    rows reported as written). Refused typed, as delta-spark does, from every writer."""
    from pyspark.sql import functions as F

    path = table_path()
    with pytest.raises(InvalidOptionError, match="every column"):
        spark.range(3).write.format("delta").partitionBy("id").save(path)
    assert not os.path.exists(path)
    name = "all_partitions_" + tmp_path.name[-6:].replace("-", "_")
    with pytest.raises(InvalidOptionError, match="every column"):
        spark.range(3).write.format("delta").partitionBy("id").saveAsTable(name)
    with pytest.raises(InvalidOptionError, match="every column"):
        spark.range(3).writeTo(name).using("delta").partitionedBy(F.col("id")).create()
    assert not spark.catalog.tableExists(name)


def test_overwrite_schema_replaces_schema(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    people.write.format("delta").partitionBy("country").save(path)
    other = spark.createDataFrame(
        [(1, "x", "nl"), (2, "y", None)], "id string, kind string, country string"
    )
    with pytest.raises(SchemaMismatchError):
        other.write.format("delta").mode("overwrite").save(path)
    other.write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(
        "country"
    ).save(path)
    assert version(path) == 1
    assert DeltaTable(path).metadata().partition_columns == ["country"]
    assert read_all(spark, path) == [
        {"id": "1", "kind": "x", "country": "nl"},
        {"id": "2", "kind": "y", "country": None},
    ]


def _log_actions(path: str, at: int) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{at:020d}.json")) as f:
        return [json.loads(line) for line in f]


def _partitioned_by_a(spark: Any, path: str, b_type: str = "BIGINT") -> Any:
    """A table at ``path`` partitioned by ``a``; the rows written (id, a, b)."""
    rows = spark.range(6).selectExpr("id", "id % 2 AS a", f"CAST(id % 3 AS {b_type}) AS b")
    rows.write.format("delta").partitionBy("a").save(path)
    return rows


def test_overwrite_schema_changes_the_partitioning_in_one_commit(
    spark: Any, table_path: Any
) -> None:
    path = table_path()
    rows = _partitioned_by_a(spark, path, "STRING")
    table_id = DeltaTable(path).metadata().id
    # Another partitioning without overwriteSchema: delta-spark's DELTA_METADATA_MISMATCH.
    for mode in ("overwrite", "append"):
        with pytest.raises(SchemaMismatchError):
            rows.write.format("delta").mode(mode).partitionBy("b").save(path)
    assert version(path) == 0

    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy(
        "b"
    ).save(path)
    actions = _log_actions(path, 1)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "WRITE"
    assert info["operationParameters"] == {
        "mode": "Overwrite",
        "partitionBy": '["b"]',
        "canOverwriteSchema": True,
    }
    assert info["isBlindAppend"] is False and info["readVersion"] == 0
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    assert metadata["partitionColumns"] == ["b"] and metadata["id"] == table_id
    removed = [a["remove"]["partitionValues"] for a in actions if "remove" in a]
    assert removed and all(set(values) == {"a"} for values in removed)
    added = [a["add"] for a in actions if "add" in a]
    assert {tuple(a["partitionValues"]) for a in added} == {("b",)}
    assert all(a["path"].startswith("b=") for a in added)
    assert version(path) == 1
    assert sorted(
        r.id for r in spark.read.format("delta").load(path).where("b = '1'").collect()
    ) == [
        1,
        4,
    ]
    assert sorted((r.id, r.a, r.b) for r in spark.read.format("delta").load(path).collect()) == [
        (i, i % 2, str(i % 3)) for i in range(6)
    ]

    # overwriteSchema without partitionBy leaves the table unpartitioned, as in delta-spark.
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    assert DeltaTable(path).metadata().partition_columns == []
    assert spark.read.format("delta").load(path).count() == 6
    assert DeltaTable(path).metadata().id == table_id


def test_repartitioning_is_refused_up_front_where_the_log_writer_cannot_commit(
    spark: Any, table_path: Any
) -> None:
    from deltaflow.spark.write._plan import _require_log_writer
    from deltaflow.table._snapshot import load_snapshot

    path = table_path()
    _partitioned_by_a(spark, path)
    snapshot = load_snapshot(path)
    _require_log_writer(snapshot.uri, snapshot, ("b",))  # a local table: allowed
    with pytest.raises(UnsupportedFeatureError) as refused:
        _require_log_writer("hdfs://namenode/t", snapshot, ("b",))
    # The log writer's own refusal, as for every commit it cannot make there.
    assert refused.value.feature == "logCommit"
    assert refused.value.table_uri == "hdfs://namenode/t"


def test_overwrite_schema_beside_replace_where_or_dynamic_overwrite(
    spark: Any, table_path: Any
) -> None:
    path = table_path()
    rows = _partitioned_by_a(spark, path)
    # A dynamic partition overwrite of a table partitioned after the write is refused
    # (delta-spark: DELTA_OVERWRITE_SCHEMA_WITH_DYNAMIC_PARTITION_OVERWRITE).
    for partition_by in (["a"], ["b"]):
        with pytest.raises(InvalidOptionError) as refused:
            rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
                "partitionOverwriteMode", "dynamic"
            ).partitionBy(*partition_by).save(path)
        assert refused.value.option == "partitionOverwriteMode"
    assert version(path) == 0
    # replaceWhere: overwriteSchema is ignored, so the table's schema is enforced...
    wider = rows.selectExpr("*", "'x' AS c").where("a = 1")
    with pytest.raises(SchemaMismatchError):
        wider.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
            "replaceWhere", "a = 1"
        ).save(path)
    # ...and rows that fit it replace the predicate's rows only.
    rows.where("a = 1").selectExpr("id + 100 AS id", "a", "b").write.format("delta").mode(
        "overwrite"
    ).option("overwriteSchema", "true").option("replaceWhere", "a = 1").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [
        0,
        2,
        4,
        101,
        103,
        105,
    ]
    assert DeltaTable(path).metadata().partition_columns == ["a"]
    # Without partitionBy the table becomes unpartitioned: a dynamic overwrite then
    # replaces everything (delta-spark does the same).
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
        "partitionOverwriteMode", "dynamic"
    ).save(path)
    assert DeltaTable(path).metadata().partition_columns == []
    assert spark.read.format("delta").load(path).count() == 6


# ---- 4. replaceWhere -----------------------------------------------------------------------


@pytest.fixture
def events(spark: Any, table_path: Any) -> tuple[str, Any]:
    path = table_path()
    df = spark.createDataFrame(
        [(i, dt.date(2024, 1, 1 + i % 3), i * 10) for i in range(9)], "id long, day date, v long"
    )
    df.write.format("delta").partitionBy("day").save(path)
    return path, df


def test_replace_where_on_partition_column(spark: Any, events: tuple[str, Any]) -> None:
    path, _ = events
    new = spark.createDataFrame([(100, dt.date(2024, 1, 2), 1)], "id long, day date, v long")
    write(new, path, "overwrite", replaceWhere="day = DATE'2024-01-02'")
    assert version(path) == 1
    assert {r["partitionValues"]["day"] for r in removes(path, 1)} == {"2024-01-02"}
    assert [a["partitionValues"]["day"] for a in adds(path, 1)] == ["2024-01-02"]
    rows = read_all(spark, path)
    assert [r["id"] for r in rows if r["day"] == dt.date(2024, 1, 2)] == [100]
    assert len(rows) == 7
    # History names it as delta-spark does: an overwrite with its predicate (the raw log
    # keeps delta-rs's parameters, mode Append).
    entry = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    assert entry["operation"] == "WRITE"
    assert entry["operationParameters"] == {
        "mode": "Overwrite",
        "partitionBy": '["day"]',
        "predicate": "day = DATE'2024-01-02'",
    }


def test_replace_where_on_data_column_rewrites_files(spark: Any, events: tuple[str, Any]) -> None:
    path, _ = events
    new = spark.createDataFrame([(200, dt.date(2024, 1, 1), 35)], "id long, day date, v long")
    write(new, path, "overwrite", replaceWhere="v >= 30 AND v < 60")
    assert version(path) == 1
    rows = read_all(spark, path)
    assert sorted(r["v"] for r in rows) == [0, 10, 20, 35, 60, 70, 80]
    # All of it in one commit: whole files whose rows all match, and rewritten files.
    assert removes(path, 1) and len(adds(path, 1)) >= 2
    for add in adds(path, 1):
        assert json.loads(add["stats"])["numRecords"] >= 1


def test_replace_where_violation_commits_nothing(spark: Any, events: tuple[str, Any]) -> None:
    path, _ = events
    before = parquet_files(path)
    bad = spark.createDataFrame(
        [(300, dt.date(2024, 1, 2), 1), (301, dt.date(2024, 1, 3), 1)], "id long, day date, v long"
    )
    with pytest.raises(ReplaceWhereViolationError) as info:
        write(bad.repartition(2), path, "overwrite", replaceWhere="day = '2024-01-02'")
    assert info.value.predicate == "day = '2024-01-02'"
    assert version(path) == 0
    assert parquet_files(path) == before


def test_replace_where_bad_predicate(spark: Any, events: tuple[str, Any]) -> None:
    path, df = events
    with pytest.raises(InvalidOptionError) as info:
        write(df, path, "overwrite", replaceWhere="day LIKE '2024%'")
    assert info.value.option == "replaceWhere"
    with pytest.raises(InvalidOptionError):
        write(df, path, "overwrite", replaceWhere="nope = 1")
    assert version(path) == 0


# ---- 5. table properties -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "protocol"),
    [
        ({}, (1, 2)),
        ({"delta.appendOnly": "true"}, (1, 2)),
        ({"delta.enableChangeDataFeed": "true"}, (1, 4)),
    ],
)
def test_table_properties_at_creation(
    spark: Any, table_path: Any, people: Any, properties: dict[str, str], protocol: tuple[int, int]
) -> None:
    path = table_path()
    write(people, path, **properties)
    table = DeltaTable(path)
    assert table.metadata().configuration == properties
    assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == protocol


def test_append_only_table_refuses_overwrite(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    write(people, path, **{"delta.appendOnly": "true"})
    with pytest.raises(UnsupportedFeatureError) as info:
        people.write.format("delta").mode("overwrite").save(path)
    assert info.value.feature == "appendOnly"


# ---- 6. idempotent writes and user metadata -------------------------------------------------


def test_idempotent_writes(spark: Any, table_path: Any, people: Any) -> None:
    path = table_path()
    write(people, path, txnAppId="app", txnVersion=1, userMetadata="first load")
    assert DeltaTable(path).transaction_version("app") == 1
    commit_info = next(e["commitInfo"] for e in log_entries(path, 0) if "commitInfo" in e)
    assert commit_info["userMetadata"] == "first load"  # top level, as delta-spark writes it
    files = parquet_files(path)

    for repeat in (1, 0):
        write(people, path, txnAppId="app", txnVersion=repeat)
        assert version(path) == 0
    assert parquet_files(path) == files  # a skipped write leaves no files behind

    write(people, path, txnAppId="app", txnVersion=2, userMetadata="second")
    assert version(path) == 1
    assert DeltaTable(path).transaction_version("app") == 2
    assert DeltaTable(path).history(1)[0]["userMetadata"] == "second"
    assert len(read_all(spark, path)) == 6


# ---- 7. statistics ---------------------------------------------------------------------------


def test_stats_cover_first_32_leaves(spark: Any, table_path: Any) -> None:
    path = table_path()
    columns = [f"c{i}" for i in range(40)]
    df = spark.createDataFrame(
        [tuple(range(r, r + 40)) for r in range(3)], ", ".join(f"{c} int" for c in columns)
    )
    df.coalesce(1).write.format("delta").save(path)
    (add,) = adds(path, 0)
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 3
    assert list(stats["minValues"]) == columns[:32]
    assert list(stats["nullCount"]) == columns[:32]
    assert stats["minValues"]["c5"] == 5 and stats["maxValues"]["c5"] == 7


def test_stats_respect_num_indexed_cols_nested_timestamps_strings(
    spark: Any, table_path: Any
) -> None:
    path = table_path()
    long_a, long_b = "a" * 40, "b" * 40 + "z"
    df = spark.createDataFrame(
        [
            (1, {"x": 5, "y": {"z": "q"}}, dt.datetime(2024, 1, 1, 0, 0, 0, 123456), long_a),
            (2, None, dt.datetime(2024, 1, 1, 0, 0, 1, 999), long_b),
            (3, {"x": None, "y": None}, None, "ab"),
        ],
        "id long, s struct<x: int, y: struct<z: string>>, ts timestamp, txt string",
    )
    write(df.coalesce(1), path, **{"delta.dataSkippingNumIndexedCols": "5"})
    (add,) = adds(path, 0)
    stats = json.loads(add["stats"])
    # id, s.x, s.y.z, ts, txt are the 5 leaves.
    assert stats["nullCount"] == {"id": 0, "s": {"x": 2, "y": {"z": 2}}, "ts": 1, "txt": 0}
    assert stats["minValues"]["s"] == {"x": 5, "y": {"z": "q"}}
    # Milliseconds, rounded outward so they stay bounds.
    assert stats["minValues"]["ts"].startswith("2024-01-01T00:00:00.123")
    assert stats["maxValues"]["ts"].startswith("2024-01-01T00:00:01.001")
    # Strings: a 32-character prefix as the minimum, prefix + tie-breaker as the maximum.
    assert stats["minValues"]["txt"] == "a" * 32
    assert stats["maxValues"]["txt"] == "b" * 32 + "\U0010ffff"
    assert stats["maxValues"]["txt"] > long_b

    write(df.select("id"), table_path(), **{"delta.dataSkippingNumIndexedCols": "0"})


def test_num_indexed_cols_limits_leaves(spark: Any, table_path: Any) -> None:
    path = table_path()
    df = spark.createDataFrame(
        [(1, {"x": 1, "y": 2}, 3)], "a long, s struct<x: int, y: int>, b long"
    )
    write(df, path, **{"delta.dataSkippingNumIndexedCols": "2"})
    for add in adds(path, 0):
        assert json.loads(add["stats"])["nullCount"] == {"a": 0, "s": {"x": 0}}


# ---- 8. parallel tasks, one commit -------------------------------------------------------------


def test_tasks_write_in_parallel_and_commit_once(spark: Any, table_path: Any) -> None:
    path = table_path()
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "id % 7 as k")
    df.write.format("delta").save(path)
    assert version(path) == 0
    files = adds(path, 0)
    task_ids = {f["path"].split("-")[3] for f in files}  # part-NNNNN-<job>-<task>-<uuid>...
    assert len(files) == 4 and len(task_ids) == 4
    assert sum(json.loads(f["stats"])["numRecords"] for f in files) == 1000
    assert len(read_all(spark, path)) == 1000


# ---- 9. NOT NULL columns ---------------------------------------------------------------------


def test_not_null_violation_commits_nothing(spark: Any, table_path: Any) -> None:
    path = table_path()
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    write_deltalake(path, pa.table({"id": [1], "v": ["a"]}, schema=schema))
    before = parquet_files(path)
    # One task: with two, the task holding (2, 'b') may finish writing after the job was
    # aborted, and its file (never committed; VACUUM removes it) would outlive the abort.
    df = spark.createDataFrame([(2, "b"), (None, "c")], "id long, v string").coalesce(1)
    with pytest.raises(SchemaMismatchError) as info:
        df.write.format("delta").mode("append").save(path)
    assert info.value.columns == ("id",)
    assert version(path) == 0
    assert parquet_files(path) == before
    df.where("id is not null").write.format("delta").mode("append").save(path)
    assert DeltaTable(path).schema().to_arrow().field("id").nullable is False


# ---- 10. every type round-trips ------------------------------------------------------------------


def test_all_types_round_trip(spark: Any, table_path: Any) -> None:
    path = table_path()
    schema = (
        "id int, b boolean, by byte, sh short, l long, f float, d double, dec decimal(20,4),"
        " s string, bin binary, day date, ts timestamp, ntz timestamp_ntz,"
        " arr array<int>, m map<string, long>, st struct<a: int, inner: struct<b: string>>,"
        " arr_st array<struct<x: int>>"
    )
    row = (
        1,
        True,
        7,
        300,
        2**40,
        1.5,
        2.25,
        decimal.Decimal("1234567890.1234"),
        "héllo",
        b"\x00\xff",
        dt.date(2024, 2, 29),
        dt.datetime(2024, 1, 1, 12, 30, 0, 123456),
        dt.datetime(2024, 1, 1, 12, 30, 0, 654321),
        [1, None, 3],
        {"k": 1},
        {"a": 1, "inner": {"b": "x"}},
        [{"x": 1}, None],
    )
    nulls = (2, *([None] * (len(row) - 1)))
    spark.createDataFrame([row, nulls], schema).write.format("delta").save(path)

    table = DeltaTable(path).to_pyarrow_table().sort_by("id")
    got = table.to_pylist()
    assert got[1] == {"id": 2, **{k: None for k in table.column_names if k != "id"}}
    first = got[0]
    assert first["dec"] == decimal.Decimal("1234567890.1234")
    assert first["bin"] == b"\x00\xff"
    assert first["ts"] == dt.datetime(2024, 1, 1, 12, 30, 0, 123456, tzinfo=dt.timezone.utc)
    assert first["ntz"] == dt.datetime(2024, 1, 1, 12, 30, 0, 654321)
    assert table.schema.field("ntz").type == pa.timestamp("us")
    assert dict(first["m"]) == {"k": 1}
    assert first["st"] == {"a": 1, "inner": {"b": "x"}}
    assert first["arr_st"] == [{"x": 1}, None]
    assert first["arr"] == [1, None, 3]

    polars_rows = pl.read_delta(path).sort("id").to_dicts()
    assert polars_rows[0]["dec"] == first["dec"]
    assert polars_rows[0]["ntz"] == first["ntz"]
    assert polars_rows[0]["ts"].replace(tzinfo=dt.timezone.utc) == first["ts"]
    assert polars_rows[0]["st"] == first["st"]
    assert polars_rows[0]["m"] in ({"k": 1}, [{"key": "k", "value": 1}])
    assert polars_rows[1]["s"] is None and polars_rows[1]["arr"] is None

    back = spark.read.format("delta").load(path).orderBy("id").collect()
    assert back[0].dec == first["dec"] and back[0].ntz == first["ntz"]
    assert back[0].st.inner.b == "x" and back[0].m == {"k": 1}
    assert back[1].arr_st is None
    protocol = DeltaTable(path).protocol()
    assert "timestampNtz" in (protocol.reader_features or [])


# ---- 11. a failing task aborts the job --------------------------------------------------------


def test_failed_task_commits_nothing_and_deletes_files(
    spark: Any, table_path: Any, people: Any
) -> None:
    from pyspark.sql.functions import udf

    path = table_path()
    people.write.format("delta").save(path)
    before = parquet_files(path)

    @udf("long")
    def explode_on_777(value: int) -> int:
        if value == 777:
            raise ValueError("boom")
        return value

    df = spark.range(0, 1000, numPartitions=4).select(explode_on_777("id").alias("id"))
    with pytest.raises(Exception, match="boom"):
        df.write.format("delta").mode("append").save(path)
    assert version(path) == 0
    assert live_files(path) == before
    # abort() deletes every file the job's finished tasks wrote. A task Spark was still
    # cancelling when the job failed may leave a file behind; it is never referenced by
    # the log (checked above) and carries the job id, so VACUUM removes it.
    leftovers = parquet_files(path) - before
    assert len(leftovers) <= 1


def test_unknown_option_is_refused(spark: Any, table_path: Any, people: Any) -> None:
    with pytest.raises(InvalidOptionError) as info:
        write(people, table_path(), mergeSchemaa="true")
    assert info.value.option == "mergeschemaa"


def test_errors_are_deltaflow_errors() -> None:
    assert issubclass(ReplaceWhereViolationError, deltaflow.DeltaflowError)


# ---- column mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["name", "id"])
def test_append_to_column_mapped_table_is_read_by_deltalake(
    spark: Any, table_path: Any, mode: str
) -> None:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable as RsTable

    path = table_path()
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("Full Name", pa.string()),
            pa.field("point", pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.int32())])),
        ]
    )
    RsTable.create(path, schema, configuration={"delta.columnMapping.mode": mode})
    rows = [
        {"id": 1, "Full Name": "ada", "point": {"x": 1, "y": 2}},
        {"id": 2, "Full Name": None, "point": None},
    ]
    spark.createDataFrame(pa.Table.from_pylist(rows, schema)).write.format("delta").mode(
        "append"
    ).save(path)

    # delta-rs's scan() resolves column mapping (its to_pyarrow_table() does not, even for
    # files delta-rs itself wrote).
    by_rs = sorted(pa.table(RsTable(path).scan()).to_pylist(), key=lambda r: r["id"])
    assert by_rs == rows
    ours = sorted(
        (r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()),
        key=lambda r: r["id"],
    )
    assert ours == rows
    # Files use physical names and carry the column-mapping field ids.
    files = list(RsTable(path).file_uris())
    file_schema = pq.read_schema(files[0])
    assert "Full Name" not in file_schema.names
    assert all(f.metadata and b"PARQUET:field_id" in f.metadata for f in file_schema)


def test_replace_where_on_special_character_partitions(spark: Any, table_path: Any) -> None:
    """Removes must name files exactly as the log does, escaping included."""
    path = table_path()
    rows = [{"id": i, "p": p} for i, p in enumerate(["a b", "x=y", "50%", "a b", "plain"])]
    spark.createDataFrame(rows, "id long, p string").write.format("delta").partitionBy("p").save(
        path
    )
    replacement = spark.createDataFrame([{"id": 100, "p": "a b"}], "id long, p string")
    replacement.write.format("delta").mode("overwrite").option("replaceWhere", "p = 'a b'").save(
        path
    )
    expected = sorted([(1, "x=y"), (2, "50%"), (4, "plain"), (100, "a b")])
    by_rs = sorted((r["id"], r["p"]) for r in DeltaTable(path).to_pyarrow_table().to_pylist())
    assert by_rs == expected
    ours = spark.read.format("delta").load(path).collect()
    assert sorted((r.id, r.p) for r in ours) == expected
