"""DML on the JVM path: Spark's Parquet scan and writer where eligible, same results as Python."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.spark.dml import _changes, _delete_update, _local_rewrite, _target_scan
from deltaflow.spark.errors import MultipleSourceRowMatchingTargetRowError
from deltaflow.spark.write._native import NATIVE_WRITE_CONF
from tests.table.dv_fixtures import add_deletion_vectors

JVM_SCAN = "JVM Parquet scan"
PYTHON_SCAN = "Python scan"
JVM_WRITE = "JVM Parquet writer"
# Metrics that depend on file layout or timing, not on what the operation did.
_LAYOUT_METRICS = ("Bytes", "Files", "TimeMs")


@pytest.fixture(autouse=True)
def default_paths(spark: Any) -> Iterator[None]:
    for key in (_target_scan.NATIVE_SCAN_CONF, NATIVE_WRITE_CONF):
        spark.conf.unset(key)
    # These tables are small: UPDATE / DELETE would take the one-job route, whose writer is
    # the Python one (tests/spark/test_dml_local_rewrite.py). Here: the two jobs' paths.
    spark.conf.set(_local_rewrite.MAX_BYTES_CONF, "0")
    yield
    for key in (_target_scan.NATIVE_SCAN_CONF, NATIVE_WRITE_CONF, _local_rewrite.MAX_BYTES_CONF):
        spark.conf.unset(key)


def use_python(spark: Any, python: bool) -> None:
    spark.conf.set(_target_scan.NATIVE_SCAN_CONF, "false" if python else "auto")
    spark.conf.set(NATIVE_WRITE_CONF, "false" if python else "auto")


def make_table(path: str, *, cdf: bool = False) -> None:
    """12 rows in 4 files over two partitions (kind a / b)."""
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    for start in (0, 3, 6, 9):
        ids = list(range(start, start + 3))
        write_deltalake(
            path,
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "kind": ["a" if start < 6 else "b"] * 3,
                    "value": pa.array([float(i) for i in ids]),
                }
            ),
            mode="append",
            partition_by=["kind"],
            configuration=config,
        )


def contents(spark: Any, path: str) -> list[tuple[Any, ...]]:
    rows = spark.read.format("delta").load(path).select("id", "kind", "value").collect()
    return sorted(tuple(r) for r in rows)


def metrics(spark: Any, path: str) -> dict[str, str]:
    last = deltaflow.DeltaTable.forPath(spark, path).history(1).collect()[0]
    values = dict(last["operationMetrics"] or {})
    return {k: v for k, v in values.items() if not any(part in k for part in _LAYOUT_METRICS)}


def merge_all_clauses(spark: Any, path: str) -> None:
    source = spark.createDataFrame(
        [(1, "a", 10.0), (4, "a", -1.0), (7, "b", 70.0), (20, "b", 200.0), (21, "a", None)],
        "id long, kind string, value double",
    )
    (
        deltaflow.DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.value < 0")
        .whenMatchedUpdate(set={"value": "t.value + s.value"})
        .whenNotMatchedInsert(
            "s.value IS NOT NULL", values={"id": "s.id", "kind": "s.kind", "value": "s.value"}
        )
        .execute()
    )


def merge_by_source(spark: Any, path: str) -> None:
    source = spark.createDataFrame(
        [(2, "a", 5.0), (8, "b", 5.0)], "id long, kind string, value double"
    )
    (
        deltaflow.DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedBySourceUpdate("t.id > 9", set={"value": "0.0"})
        .whenNotMatchedBySourceDelete("t.id < 1")
        .execute()
    )


def merge_duplicate_unapplied(spark: Any, path: str) -> None:
    # id 5 matches twice but only "s.value > 100" updates: the copied row is written once.
    source = spark.createDataFrame(
        [(5, "a", 1.0), (5, "a", 2.0), (6, "b", 500.0)], "id long, kind string, value double"
    )
    (
        deltaflow.DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdate("s.value > 100", set={"value": "s.value"})
        .execute()
    )


def delete_some(spark: Any, path: str) -> None:
    deltaflow.DeltaTable.forPath(spark, path).delete("value > 4 AND value < 8")


def update_some(spark: Any, path: str) -> None:
    deltaflow.DeltaTable.forPath(spark, path).update("kind = 'b'", {"value": "value * 2"})


OPERATIONS: dict[str, Callable[[Any, str], None]] = {
    "merge": merge_all_clauses,
    "merge_by_source": merge_by_source,
    "merge_duplicates": merge_duplicate_unapplied,
    "delete": delete_some,
    "update": update_some,
}


@pytest.mark.parametrize("cdf", [False, True], ids=["plain", "cdf"])
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_jvm_and_python_paths_agree(
    spark: Any, table_path: Any, caplog: Any, name: str, cdf: bool
) -> None:
    caplog.set_level(logging.INFO, logger="deltaflow")
    results = {}
    for python in (False, True):
        path = table_path()
        make_table(path, cdf=cdf)
        use_python(spark, python)
        caplog.clear()
        OPERATIONS[name](spark, path)
        text = caplog.text
        if python:
            assert JVM_SCAN not in text and PYTHON_SCAN in text
            assert JVM_WRITE not in text
        else:
            assert JVM_SCAN in text and PYTHON_SCAN not in text
            # Change rows go through the Python writer; plain rows through Spark's.
            assert (JVM_WRITE in text) is not cdf
        changes = []
        if cdf:
            feed = (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", 4)
                .load(path)
            )
            changes = sorted(tuple(r) for r in feed.select("id", "value", "_change_type").collect())
        results[python] = (contents(spark, path), metrics(spark, path), changes)
        assert RsTable(path).to_pyarrow_table().num_rows == len(results[python][0])
    assert results[False] == results[True]


def test_files_with_deletion_vectors_take_the_jvm_scan_by_row_index(
    spark: Any, table_path: Any, caplog: Any, merge_as_spark_jobs: None
) -> None:
    # The table enables deletion vectors (the fixture sets the property): the JVM scan
    # reads the file and drops the DV's rows by _metadata.row_index (issue 14 part 3).
    caplog.set_level(logging.INFO, logger="deltaflow")
    path = table_path()
    write_deltalake(path, pa.table({"id": pa.array(range(6), pa.int64()), "v": [0.0] * 6}))
    (file,) = RsTable(path).file_uris()
    add_deletion_vectors(path, {file.rsplit("/", 1)[-1]: [1, 4]})
    source = spark.createDataFrame([(0, 1.0), (4, 1.0), (9, 1.0)], "id long, v double")
    (
        deltaflow.DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    assert JVM_SCAN in caplog.text
    assert PYTHON_SCAN not in caplog.text
    rows = sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    # Row 4 was deleted by the DV, so source row 4 is an insert.
    assert rows == [(0, 1.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 0.0), (9, 1.0)]


def test_multiple_matches_fail_on_the_jvm_path(
    spark: Any, table_path: Any, caplog: Any, merge_as_spark_jobs: None
) -> None:
    caplog.set_level(logging.INFO, logger="deltaflow")
    path = table_path()
    make_table(path)
    source = spark.createDataFrame([(3, 1.0), (3, 2.0)], "id long, value double")
    with pytest.raises(MultipleSourceRowMatchingTargetRowError):
        (
            deltaflow.DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"value": "s.value"})
            .execute()
        )
    assert JVM_SCAN in caplog.text
    assert len(RsTable(path).history()) == 4  # nothing committed


def test_merge_equi_join_is_a_hash_join(
    spark: Any, table_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = table_path()
    make_table(path)
    plans: list[str] = []
    original = _changes.write

    def recording(rows: Any, plan: Any, *, changes: bool) -> Any:
        plans.append(str(rows._jdf.queryExecution().executedPlan().toString()))
        return original(rows, plan, changes=changes)

    monkeypatch.setattr(_changes, "write", recording)
    merge_all_clauses(spark, path)
    (plan,) = plans
    assert "NestedLoopJoin" not in plan
    assert any(j in plan for j in ("BroadcastHashJoin", "SortMergeJoin", "ShuffledHashJoin"))


def test_bad_conf_value_is_a_typed_error(spark: Any, table_path: Any) -> None:
    path = table_path()
    make_table(path)
    spark.conf.set(_target_scan.NATIVE_SCAN_CONF, "sometimes")
    with pytest.raises(InvalidOptionError) as info:
        delete_some(spark, path)
    assert info.value.option == _target_scan.NATIVE_SCAN_CONF


def _drop_row_counts(path: str) -> None:
    """Rewrite the table's commits without ``stats``: the log no longer knows row counts."""
    import json
    from pathlib import Path

    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        for action in actions:
            action.get("add", {}).pop("stats", None)
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions))


@pytest.mark.parametrize("name", ["merge", "merge_duplicates"])
def test_merge_agrees_with_and_without_row_counts_in_the_log(
    spark: Any, table_path: Any, name: str
) -> None:
    # With every file's numRecords known, job 1 joins INNER and takes the unmatched rows'
    # number from the log; without, it joins LEFT OUTER and counts them.
    results = []
    for counts in (True, False):
        path = table_path()
        make_table(path)
        if not counts:
            _drop_row_counts(path)
            assert all(f.num_records is None for f in _delete_update.load_snapshot(path).files())
        OPERATIONS[name](spark, path)
        results.append((contents(spark, path), metrics(spark, path)))
    assert results[0] == results[1]
    assert int(results[0][1]["numTargetRowsCopied"]) > 0


def test_dml_leaves_the_session_conf_as_it_found_it(spark: Any, table_path: Any) -> None:
    # DML jobs set split and listing confs for their own scans only.
    keys = (_target_scan.MIN_PARTITIONS_CONF, _target_scan.LISTING_THRESHOLD_CONF)
    path = table_path()
    make_table(path)
    before = {k: spark.conf.get(k, None) for k in keys}
    merge_all_clauses(spark, path)
    update_some(spark, path)
    assert {k: spark.conf.get(k, None) for k in keys} == before
    spark.conf.set(_target_scan.MIN_PARTITIONS_CONF, "3")
    try:
        delete_some(spark, path)
        assert spark.conf.get(_target_scan.MIN_PARTITIONS_CONF) == "3"
    finally:
        spark.conf.unset(_target_scan.MIN_PARTITIONS_CONF)


def test_delete_and_update_by_a_microsecond_timestamp(spark: Any, table_path: Any) -> None:
    """delta-rs (like delta-spark) keeps timestamp stats at millisecond precision (max
    12:00:00.123 for a row at 12:00:00.123456): file pruning must not skip that row's file."""
    from deltaflow.tables import DeltaTable

    path = table_path()
    for i, micros in ((1, 123456), (2, 123789)):
        # One file per row: each row is its file's max.
        ts = pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, micros)], pa.timestamp("us", tz="UTC"))
        write_deltalake(path, pa.table({"id": pa.array([i], pa.int64()), "ts": ts}), mode="append")
    table = DeltaTable.forPath(spark, path)
    table.update("ts = TIMESTAMP '2024-01-01 12:00:00.123789'", {"id": "20"})
    table.delete("ts = TIMESTAMP '2024-01-01 12:00:00.123456'")
    rows = spark.read.format("delta").load(path).collect()
    assert [r.id for r in rows] == [20]


def test_overlapping_dml_session_settings_restore_the_session(spark: Any) -> None:
    """Pipelines run DMLs on one session from several threads: overlapping overrides
    (A in, B in, A out, B out) must leave the session as it was, not B's saved 'false'."""
    import threading

    key = _target_scan.ADAPTIVE_CONF
    before = spark.conf.get(key, None)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with _target_scan.session_conf(spark, {key: "false"}):
            a_in.set()
            assert b_in.wait(30)
        a_out.set()

    def second() -> None:
        assert a_in.wait(30)
        with _target_scan.session_conf(spark, {key: "false"}):
            b_in.set()
            assert a_out.wait(30)
            assert spark.conf.get(key) == "false"  # still B's while B runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert spark.conf.get(key, None) == before
