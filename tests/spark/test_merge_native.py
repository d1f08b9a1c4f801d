"""The delta-rs MERGE route: the same results as the Spark jobs, and every guard falls back.

Each MERGE runs on two copies of one table, once per route (the route chosen by the
session conf ``spark.deltaflow.merge.nativeMaxSourceRows``), and the two tables, their
history entries and change-data rows are compared. Which route ran is read from the
commit: the delta-rs route's commits carry ``deltaflow.mergeMetricsSplit``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F

from deltaflow import ConcurrentWriteError, DeltaTable
from deltaflow.spark.dml import _merge_native, _merge_sql
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.table import _log
from tests._waiting import wait_until
from tests.spark._rows import sorted_tuples, version_changes

COLUMNS = ("id", "kind", "value", "note")
SCHEMA = "id long, kind string, value int, note string"
BATCHES = (
    [(0, "a", 1, "x"), (1, "a", None, "y"), (2, "a", 7, None), (3, "a", 9, "x")],
    [(4, "b", 2, "x"), (5, "b", 8, "y"), (6, "b", None, "z"), (7, "b", 3, "x")],
    [(8, "a", 5, "q"), (9, "a", 6, "r")],
)
SOURCE = [(1, "a", 10, "u"), (2, "a", 0, "del"), (5, "b", 50, None), (20, "c", 3, "new")]
SOURCE += [(21, "c", -1, "skip"), (None, "a", 4, "nullkey")]
ROW_METRICS = (
    "numSourceRows",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsMatchedUpdated",
    "numTargetRowsNotMatchedBySourceUpdated",
    "numTargetRowsDeleted",
    "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceDeleted",
)


def _make(path: str, *, cdf: bool = True, configuration: dict[str, str] | None = None) -> str:
    for n, batch in enumerate(BATCHES):
        table = pa.table(
            {
                "id": pa.array([r[0] for r in batch], pa.int64()),
                "kind": pa.array([r[1] for r in batch], pa.string()),
                "value": pa.array([r[2] for r in batch], pa.int32()),
                "note": pa.array([r[3] for r in batch], pa.string()),
            }
        )
        config = {
            **({"delta.enableChangeDataFeed": "true"} if cdf else {}),
            **(configuration or {}),
        }
        write_deltalake(
            path,
            table,
            mode="append",
            partition_by=["kind"],
            configuration=config if n == 0 and config else None,
        )
    return path


@contextmanager
def _route(spark: Any, native: bool) -> Iterator[None]:
    if not native:
        spark.conf.set(_merge_native.MAX_SOURCE_ROWS_CONF, "0")
    try:
        yield
    finally:
        spark.conf.unset(_merge_native.MAX_SOURCE_ROWS_CONF)


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted_tuples(spark.read.format("delta").load(path).select(*COLUMNS))


def _changes(spark: Any, path: str, version: int) -> list[tuple[Any, ...]]:
    return sorted_tuples(version_changes(spark, path, version).select(*COLUMNS, "_change_type"))


def _by_delta_rs(path: str) -> bool:
    info = RsTable(path).history(1)[0]
    return _merge_native.SPLIT_KEY in info


def _source(spark: Any, rows: list[tuple[Any, ...]] = SOURCE, schema: str = SCHEMA) -> Any:
    return spark.createDataFrame(rows, schema).alias("s")


Merge = Callable[[Any, Any], Any]  # (target DeltaTable, source DataFrame) -> builder


def _upsert(table: Any, source: Any) -> Any:
    return (
        table.alias("t")
        .merge(source, "t.id = s.id")
        .whenMatchedDelete("s.note = 'del'")
        .whenMatchedUpdate("s.value > 0", set={"value": "s.value", "t.note": "'updated'"})
        .whenNotMatchedInsert(
            "s.value >= 0 AND s.note <> 'skip'",
            values={"id": "s.id", "kind": "s.kind", "value": "s.value", "note": "s.note"},
        )
    )


def _by_source(table: Any, source: Any) -> Any:
    return (
        table.alias("t")
        .merge(source, F.col("t.id") == F.col("s.id"))  # a Column condition
        .whenMatchedUpdateAll("s.note IS NOT NULL")
        .whenNotMatchedBySourceDelete("t.kind = 'b' AND t.value IS NULL")
        .whenNotMatchedBySourceDelete("t.id IN (0, 9)")
        .whenNotMatchedInsertAll()
    )


def _mixed_keys(table: Any, source: Any) -> Any:
    """``=`` beside ``<=>``: the delta-rs route rewrites the ``=`` null-safe (same matches);
    the source's null kind must still match nothing."""
    extra = source.sparkSession.createDataFrame([(1, None, 11, "nullkind")], SCHEMA)
    return (
        table.alias("t")
        .merge(source.unionByName(extra).alias("s"), "t.kind = s.kind AND t.id <=> s.id")
        .whenMatchedUpdate(set={"value": "s.value", "note": "s.note"})
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete("t.value IS NULL")
    )


def _on_both_routes(spark, table_path, native: str, merge: Merge) -> dict[bool, tuple]:
    """``merge`` run on ``native`` by the delta-rs route (True) and on a copy as Spark jobs
    (False): (counts, rows, changes, operation, parameters, row metrics) of each."""
    jobs = table_path()
    shutil.copytree(native, jobs)
    results = {}
    for path, on in ((native, True), (jobs, False)):
        with _route(spark, on):
            counts = merge(DeltaTable.forPath(spark, path), _source(spark)).execute().collect()
        entry = DeltaTable.forPath(spark, path).history(1).collect()[0]
        results[on] = (
            tuple(counts[0]),
            _rows(spark, path),
            _changes(spark, path, entry["version"]),
            entry["operation"],
            entry["operationParameters"],
            {k: entry["operationMetrics"][k] for k in ROW_METRICS},
        )
    assert _by_delta_rs(native) and not _by_delta_rs(jobs)
    return results


@pytest.mark.parametrize(
    "merge", [_upsert, _by_source, _mixed_keys], ids=["upsert", "by-source", "mixed-keys"]
)
def test_both_routes_give_the_same_table_metrics_and_changes(spark, table_path, merge: Merge):
    native = _make(table_path())
    results = _on_both_routes(spark, table_path, native, merge)
    assert results[True] == results[False]
    assert results[True][3] == "MERGE"
    assert int(results[True][0][0]) > 0 and results[True][2]  # something changed, with CDF


def test_multiple_matches_raise_the_typed_error_on_the_delta_rs_route(spark, table_path):
    path = _make(table_path(), cdf=False)
    version = RsTable(path).version()
    source = _source(spark, [(1, "a", 10, "p"), (1, "a", 11, "q")])
    table = DeltaTable.forPath(spark, path).alias("t")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError) as info:
        table.merge(source, "t.id = s.id").whenMatchedUpdateAll().execute()
    assert info.value.table_uri.endswith(path)
    assert RsTable(path).version() == version
    # One unconditional delete is unambiguous (delta-spark), on this route too.
    table.merge(source, "t.id = s.id").whenMatchedDelete().execute()
    assert _by_delta_rs(path)
    assert 1 not in {r[0] for r in _rows(spark, path)}


def _udf_condition(spark: Any) -> Any:
    from pyspark.sql.functions import udf

    same = udf(lambda a, b: a == b, "boolean")
    return same(F.col("t.id"), F.col("s.id"))


FALLBACKS: dict[str, Callable[[Any, Any], Any]] = {
    # In a clause condition: Spark refuses a Python UDF in an outer join's condition.
    "a UDF condition": lambda spark, t: t.merge(_source(spark), "t.id = s.id").whenMatchedUpdate(
        _udf_condition(spark), set={"value": "s.value"}
    ),
    "a division": lambda spark, t: t.merge(
        _source(spark), "t.id = s.id AND t.id / 1 >= 0"
    ).whenMatchedUpdate(set={"value": "s.value"}),
    "arithmetic in an assignment": lambda spark, t: t.merge(
        _source(spark), "t.id = s.id"
    ).whenMatchedUpdate(set={"value": "s.value + 1"}),
    "a function": lambda spark, t: t.merge(_source(spark), "t.id = s.id").whenMatchedUpdate(
        "upper(s.note) = 'U'", set={"value": "s.value"}
    ),
    "an assignment that casts": lambda spark, t: t.merge(
        _source(spark), "t.id = s.id"
    ).whenMatchedUpdate(set={"value": "s.id"}),
    "schema evolution": lambda spark, t: (
        t.merge(_source(spark).withColumn("extra", F.lit(1)), "t.id = s.id")
        .withSchemaEvolution()
        .whenMatchedUpdateAll()
    ),
    "an unaliased source": lambda spark, t: _unaliased(spark, t),
}


def _unaliased(spark: Any, table: Any) -> Any:
    source = spark.createDataFrame(SOURCE, SCHEMA)
    return table.merge(source, F.col("t.id") == source["id"]).whenMatchedUpdate(set={"value": "3"})


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_each_guard_falls_back_to_spark_jobs(spark, table_path, case: str):
    path = _make(table_path(), cdf=False)
    table = DeltaTable.forPath(spark, path).alias("t")
    FALLBACKS[case](spark, table).execute()
    assert RsTable(path).version() >= 3  # committed, by the Spark jobs
    assert not _by_delta_rs(path)


def test_a_source_over_the_limit_falls_back(spark, table_path):
    path = _make(table_path(), cdf=False)
    with _route(spark, True):
        spark.conf.set(_merge_native.MAX_SOURCE_ROWS_CONF, str(len(SOURCE) - 1))
        _upsert(DeltaTable.forPath(spark, path), _source(spark)).execute()
    assert not _by_delta_rs(path)


@pytest.mark.parametrize("merge", [_upsert, _by_source], ids=["upsert", "by-source"])
def test_deletion_vectors_take_the_route_and_match_the_spark_jobs(spark, table_path, merge: Merge):
    # Rows already deleted by a deletion vector (ids 1 and 6, in files the MERGE touches)
    # must neither match nor come back; delta-rs rewrites the touched files without them.
    native = _make(table_path())
    spark.sql(
        f"ALTER TABLE delta.`{native}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    DeltaTable.forPath(spark, native).delete("id IN (1, 6)")
    assert RsTable(native).protocol().reader_features == ["deletionVectors"]
    assert any("deletionVector" in a.get("add", {}) for _, a in _log.read_commit(native, 4) or [])
    results = {
        on: (r[0], r[1], r[2], r[5])  # counts, rows, changes, row metrics
        for on, r in _on_both_routes(spark, table_path, native, merge).items()
    }
    assert results[True] == results[False]
    assert not any(r[0] == 6 for r in results[True][1])  # deleted, not matched by the source
    # The route's remove actions name the vector of the file they replace.
    removes = [a["remove"] for _, a in _log.read_commit(native, 5) or [] if "remove" in a]
    assert any("deletionVector" in r and r["deletionVector"] for r in removes)


def test_a_lost_race_is_a_typed_conflict_and_nothing_is_committed(spark, table_path, monkeypatch):
    path = _make(table_path(), cdf=False)
    collect = _merge_native._collect

    def collect_then_concurrent_delete(source: Any, limit: int) -> Any:
        collected = collect(source, limit)
        RsTable(path).delete("id <= 3")  # removes the kind=a file the MERGE reads
        return collected

    monkeypatch.setattr(_merge_native, "_collect", collect_then_concurrent_delete)
    source = _source(spark, [(3, "a", 30, "u")])
    builder = DeltaTable.forPath(spark, path).alias("t").merge(source, "t.id = s.id")
    with pytest.raises(ConcurrentWriteError) as info:
        builder.whenMatchedUpdateAll().execute()
    assert info.value.kind == "ConcurrentDeleteRead"
    monkeypatch.undo()
    expected = [r for batch in BATCHES for r in batch if r[0] > 3]
    assert _rows(spark, path) == sorted(expected, key=repr)


def test_deltaflow_checkpoints_after_the_delta_rs_commit(spark, table_path):
    path = _make(table_path(), cdf=False, configuration={"delta.checkpointInterval": "3"})
    _upsert(DeltaTable.forPath(spark, path), _source(spark)).execute()
    assert _by_delta_rs(path)
    assert RsTable(path).version() == 3
    # The brain checkpoints off the commit path, right after the commit returned.
    wait_until(lambda: _log.last_checkpoint(path) == 3, 60, "the checkpoint at version 3")


def _scope() -> _merge_sql.Scope:
    columns = {"id": ("id", "bigint"), "kind": ("kind", "string"), "value": ("value", "int")}
    columns |= {"score": ("score", "double"), "flag": ("Flag", "boolean")}
    return _merge_sql.Scope({"t": ("t", columns), "src": ("s", columns)})


@pytest.mark.parametrize(
    ("expression", "sql"),
    [
        ("t.id = src.id", '("t"."id" = "s"."id")'),
        (
            "T.ID <=> src.id AND NOT t.kind IS NULL",
            '(("t"."id" IS NOT DISTINCT FROM "s"."id") AND (NOT ("t"."kind" IS NULL)))',
        ),
        (
            "t.kind IN ('a', 'it''s') OR t.flag",
            """(("t"."kind" IN ('a', 'it''s')) OR "t"."Flag")""",
        ),
        ("t.value <> -3", '(NOT ("t"."value" = -3))'),
    ],
)
def test_the_exact_core_translates(spark, expression: str, sql: str):
    assert _merge_sql.condition(spark, expression, _scope()) == sql


def test_an_on_clause_mixing_equality_and_null_safe_keys_hashes_on_all_of_them(spark):
    sql, keys = _merge_sql.join_condition(
        spark, "t.kind = src.kind AND t.id <=> src.id AND t.value > 0", _scope()
    )
    assert sql == (
        '((("t"."kind" IS NOT DISTINCT FROM "s"."kind") AND ("t"."kind" IS NOT NULL)'
        ' AND ("s"."kind" IS NOT NULL)) AND ("t"."id" IS NOT DISTINCT FROM "s"."id")'
        ' AND ("t"."value" > 0))'
    )
    assert keys == (_merge_sql.JoinKey('"t"."kind"', "kind", "string"),)
    source = pa.table({"kind": ["b", "a", None, "c"]})
    assert _merge_sql.key_bounds(keys, source) == """ AND ("t"."kind" BETWEEN 'a' AND 'c')"""
    quoted = pa.table({"kind": ["it's", "b"]})
    assert _merge_sql.key_bounds(keys, quoted) == ""  # no bound rather than a doubtful one
    # Only equalities: left as they are (DataFusion hashes on them).
    plain = _merge_sql.join_condition(spark, "t.kind = src.kind AND t.id = src.id", _scope())
    assert plain == ('(("t"."kind" = "s"."kind") AND ("t"."id" = "s"."id"))', ())


@pytest.mark.parametrize(
    "expression",
    [
        "t.id / 2 = src.id",
        "t.id + 1 = src.id",
        "t.score = src.score",
        "t.id = src.kind",
        "rand() > 0",
        "t.kind = 'a' AND t.value",
        "t.missing = 1",
        "x.id = 1",
        "id = 1",
        "t.value = 1.5",
        "t.id IN (src.id)",
        "t.id <=> src.id AND t.kind = src.kind AND t.value",
    ],
)
def test_what_is_outside_the_core_does_not_translate(spark, expression: str):
    with pytest.raises(_merge_sql.Untranslatable):
        _merge_sql.condition(spark, expression, _scope())
    with pytest.raises(_merge_sql.Untranslatable):
        _merge_sql.join_condition(spark, expression, _scope())


def test_a_parquet_source_is_read_by_pyarrow_with_sparks_rows(spark, tmp_path):
    # A bare spark.read.parquet(path) source is read from its files without a Spark job.
    plain = str(tmp_path / "plain")
    _source(spark).repartition(2).write.parquet(plain)
    df = spark.read.parquet(plain).alias("s")
    direct = _merge_native._parquet_files_read_directly(df, 100)
    assert direct is not None
    assert direct.schema.names == list(COLUMNS)
    assert sorted(map(repr, direct.to_pylist())) == sorted(map(repr, df.toArrow().to_pylist()))
    with pytest.raises(_merge_sql.Untranslatable):
        _merge_native._parquet_files_read_directly(df, len(SOURCE) - 1)
    # SQL's `USING view AS s`: a temporary view over the files, a `SELECT *` of it.
    spark.read.parquet(plain).createOrReplaceTempView("plain_source")
    for viewed in (spark.table("plain_source").alias("s"), spark.sql("SELECT * FROM plain_source")):
        again = _merge_native._parquet_files_read_directly(viewed, 100)
        assert again is not None and again.equals(direct)
    # Anything else goes through Spark: a subset, a filter, a renaming.
    assert _merge_native._parquet_files_read_directly(df.select("id").alias("s"), 100) is None
    for query in ("SELECT * FROM plain_source WHERE id > 1", "SELECT id AS x FROM plain_source"):
        assert _merge_native._parquet_files_read_directly(spark.sql(query), 100) is None
    parted = str(tmp_path / "parted")
    _source(spark).write.partitionBy("kind").parquet(parted)
    assert _merge_native._parquet_files_read_directly(spark.read.parquet(parted), 100) is None
    stamped = str(tmp_path / "stamped")
    spark.range(3).selectExpr("id", "timestamp'2024-01-01 00:00:00' AS at").write.parquet(stamped)
    assert _merge_native._parquet_files_read_directly(spark.read.parquet(stamped), 100) is None


def test_a_parquet_source_gives_the_same_table_on_both_routes(spark, table_path, tmp_path):
    source = str(tmp_path / "source")
    _source(spark).write.parquet(source)
    native = _make(table_path())
    jobs = table_path()
    shutil.copytree(native, jobs)
    for path, on in ((native, True), (jobs, False)):
        with _route(spark, on):
            read = spark.read.parquet(source).alias("s")
            _upsert(DeltaTable.forPath(spark, path), read).execute()
    assert _by_delta_rs(native) and not _by_delta_rs(jobs)
    assert _rows(spark, native) == _rows(spark, jobs)
    assert _changes(spark, native, 3) == _changes(spark, jobs, 3)


def test_a_source_column_that_widens_without_loss_takes_the_route(spark, table_path):
    """An INT source key and a SMALLINT value into BIGINT / INT columns (a ``VALUES`` list of
    plain numbers in SQL is INT): the delta-rs route casts them as Spark's MERGE does, and
    both routes leave the same rows and schema."""
    native = _make(table_path())
    jobs = table_path()
    shutil.copytree(native, jobs)
    source = _source(spark, schema="id int, kind string, value smallint, note string")
    for path, on in ((native, True), (jobs, False)):
        with _route(spark, on):
            (
                DeltaTable.forPath(spark, path)
                .alias("t")
                .merge(source, "t.id = s.id")
                .whenMatchedUpdate(set={"value": "s.value"})
                .whenNotMatchedInsertAll()
                .execute()
            )
    assert _by_delta_rs(native) and not _by_delta_rs(jobs)
    assert _rows(spark, native) == _rows(spark, jobs)
    read = spark.read.format("delta").load(native).schema
    assert read == spark.read.format("delta").load(jobs).schema
    assert read["id"].dataType.simpleString() == "bigint"
