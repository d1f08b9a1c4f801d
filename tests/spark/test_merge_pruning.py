"""MERGE prunes target files by the source's join-key values (``_merge_keys``).

Each MERGE runs twice on copies of one table: as it is, and with key pruning turned
off (``equality_keys`` finding no key: every file is read, as before pruning existed).
Both must leave exactly the same rows; the pruned one must have read and rewritten
only the files that hold source keys (the commit's remove actions say which).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow import DeltaTable
from deltaflow.spark.dml import _merge, _merge_keys, _target_scan
from deltaflow.table._snapshot import FileEntry

# The Spark jobs' key pruning: MERGEs here run as Spark jobs (not the delta-rs route).
pytestmark = pytest.mark.usefixtures("merge_as_spark_jobs")

SCHEMA = "id long, name string, value int"
# Four files of disjoint id ranges (and name ranges: name = f"n{id:03d}").
RANGES = ((0, 10), (10, 20), (20, 30), (30, 40))


def _make(path: str, *, properties: dict[str, str] | None = None) -> str:
    for low, high in RANGES:
        ids = list(range(low, high))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([f"n{i:03d}" for i in ids], pa.string()),
                "value": pa.array([i * 10 for i in ids], pa.int32()),
            }
        )
        write_deltalake(path, table, mode="append", configuration=properties)
    return path


def _actions(path: str) -> list[dict[str, Any]]:
    log = os.path.join(path, "_delta_log")
    last = max(f for f in os.listdir(log) if f.endswith(".json"))
    with open(os.path.join(log, last), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _removed(path: str) -> set[str]:
    return {a["remove"]["path"] for a in _actions(path) if "remove" in a}


def _file_of(path: str, key: int) -> str:
    """The data file (as the log names it) that holds ``id = key``."""
    actions = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    return next(a["path"] for a in actions if a["min.id"] <= key <= a["max.id"])


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(path).select("id", "name", "value")
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _merge_both(
    spark: Any,
    path: str,
    source: Any,
    condition: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    inserts: bool = True,
) -> tuple[list[int], list[int]]:
    """The MERGE on ``path`` (pruned) and on a copy with key pruning off; the files each
    scan read, in order (job 1's scan first). Asserts both leave the same rows and the
    same metrics."""
    copy = path + "_full"
    shutil.copytree(path, copy)
    scanned: dict[str, list[int]] = {"pruned": [], "full": []}
    current = ["pruned"]
    original = _target_scan.scan

    def recording_scan(spark, snapshot, struct, files, alias, **kwargs):  # type: ignore[no-untyped-def]
        scanned[current[0]].append(len(files))
        return original(spark, snapshot, struct, files, alias, **kwargs)

    monkeypatch.setattr(_target_scan, "scan", recording_scan)

    def run(target: str) -> dict[str, str]:
        builder = (
            DeltaTable.forPath(spark, target)
            .alias("t")
            .merge(source.alias("s"), condition)
            .whenMatchedUpdate(set={"value": "s.value"})
        )
        if inserts:
            builder = builder.whenNotMatchedInsertAll()
        builder.execute()
        metrics = DeltaTable.forPath(spark, target).history(1).collect()[0]["operationMetrics"]
        return {k: v for k, v in metrics.items() if not k.endswith("TimeMs")}

    pruned = run(path)
    with monkeypatch.context() as m:
        m.setattr(_merge_keys, "equality_keys", lambda *a, **k: [])
        current[0] = "full"
        full = run(copy)
    assert _rows(spark, path) == _rows(spark, copy)
    same = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numOutputRows")
    assert {k: pruned.get(k) for k in same} == {k: full.get(k) for k in same}
    return scanned["pruned"], scanned["full"]


def test_one_key_reads_and_rewrites_only_its_file(spark, table_path, monkeypatch):
    path = _make(table_path())
    touched = _file_of(path, 15)
    source = spark.createDataFrame([(15, "n015", -1), (100, "new", -2)], SCHEMA)
    pruned, full = _merge_both(spark, path, source, "t.id = s.id", monkeypatch)
    assert pruned == [1, 1]  # job 1 and job 2 each read the one file
    assert full == [4, 1]
    assert _removed(path) == {touched}
    adds = [a["add"] for a in _actions(path) if "add" in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == 11  # 10 copied + 1 new
    assert (15, "n015", -1) in _rows(spark, path) and (100, "new", -2) in _rows(spark, path)


def test_null_keys_never_match_and_an_all_null_source_reads_nothing(spark, table_path, monkeypatch):
    path = _make(table_path())
    source = spark.createDataFrame([(None, "a", 1), (5, "n005", 2)], SCHEMA)
    touched = _file_of(path, 5)
    pruned, _ = _merge_both(spark, path, source, "t.id = s.id", monkeypatch)
    assert pruned[0] == 1
    assert _removed(path) == {touched}

    path = _make(table_path())
    only_null = spark.createDataFrame([(None, "a", 1)], SCHEMA)
    pruned, _ = _merge_both(spark, path, only_null, "t.id = s.id", monkeypatch)
    assert pruned == []  # no file can match: no scan at all; the row is inserted
    assert _removed(path) == set()
    assert (None, "a", 1) in _rows(spark, path)


def test_non_equality_condition_reads_every_file(spark, table_path, monkeypatch):
    path = _make(table_path())
    source = spark.createDataFrame([(15, "n015", -1)], SCHEMA)
    touched = _file_of(path, 15)
    pruned, _ = _merge_both(spark, path, source, "t.id <= s.id AND t.id >= s.id", monkeypatch)
    assert pruned[0] == 4
    assert _removed(path) == {touched}


def test_several_key_columns_and_string_keys(spark, table_path, monkeypatch):
    path = _make(table_path())
    source = spark.createDataFrame(
        [(3, "n003", -1), (33, "n033", -2), (25, "no-such-name", -3)], SCHEMA
    )
    touched = {_file_of(path, 3), _file_of(path, 33)}
    pruned, _ = _merge_both(spark, path, source, "t.id = s.id AND t.name = s.name", monkeypatch)
    # ids {3, 25, 33} hit three files; names {n003, n033, no-such-name} hit the first
    # and last only ("no-such-name" sorts after every "n0.."): both must hold.
    assert pruned[0] == 2
    assert _removed(path) == touched

    path = _make(table_path())
    by_name = spark.createDataFrame([(0, "n021", -1)], SCHEMA)
    touched = {_file_of(path, 21)}
    pruned, _ = _merge_both(spark, path, by_name, "t.name = s.name", monkeypatch, inserts=False)
    assert pruned[0] == 1
    assert _removed(path) == touched


def test_source_above_the_collection_threshold_prunes_by_its_range(spark, table_path, monkeypatch):
    monkeypatch.setattr(_merge_keys, "MAX_EXACT_ROWS", 2)
    monkeypatch.setattr(_merge, "SMALL_SOURCE_ROWS", 2)  # the Spark aggregate of job 1
    path = _make(table_path())
    source = spark.createDataFrame([(11, "x", -1), (12, "y", -2), (18, "z", -3)], SCHEMA)
    touched = {_file_of(path, 11)}
    pruned, _ = _merge_both(spark, path, source, "t.id = s.id", monkeypatch)
    assert pruned[0] == 1  # the range 11..18 lies in one file
    assert _removed(path) == touched

    path = _make(table_path())
    spread = spark.createDataFrame([(1, "x", -1), (12, "y", -2), (38, "z", -3)], SCHEMA)
    touched = {_file_of(path, k) for k in (1, 12, 38)}
    pruned, _ = _merge_both(spark, path, spread, "t.id = s.id", monkeypatch)
    assert pruned[0] == 4  # 1..38 covers every file; only matches rewrite
    assert _removed(path) == touched


def test_source_read_from_files_prunes_exactly_and_counts(spark, table_path, tmp_path, monkeypatch):
    source_path = str(tmp_path / "source")
    rows = [(21, "n021", -1), (29, "n029", -2), (500, "new", 0)]
    spark.createDataFrame(rows, SCHEMA).write.parquet(source_path)
    source = spark.read.parquet(source_path)
    path = _make(table_path())
    touched = {_file_of(path, 21)}
    pruned, _ = _merge_both(spark, path, source, "t.id = s.id", monkeypatch)
    assert pruned[0] == 1
    assert _removed(path) == touched
    metrics = DeltaTable.forPath(spark, path).history(1).collect()[0]["operationMetrics"]
    assert metrics["numSourceRows"] == "3" and metrics["numTargetRowsInserted"] == "1"


def test_keys_of_another_type_do_not_prune(spark, table_path, monkeypatch):
    path = _make(table_path())
    # A string source key compared with a long column: Spark casts; no pruning.
    source = spark.createDataFrame([("15", -1)], "id string, value int")
    pruned, _ = _merge_both(spark, path, source, "t.id = s.id", monkeypatch, inserts=False)
    assert pruned[0] == 4
    assert (15, "n015", -1) in _rows(spark, path)


def test_deletion_vectors_with_key_pruning(spark, table_path, monkeypatch):
    path = table_path()
    rows = [(i, f"n{i:03d}", i * 10) for i in range(40)]
    (
        spark.createDataFrame(rows, SCHEMA)
        .repartitionByRange(4, "id")
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .save(path)
    )
    source = spark.createDataFrame([(7, "n007", -1), (99, "new", 0)], SCHEMA)
    pruned, full = _merge_both(spark, path, source, "t.id = s.id", monkeypatch)
    assert pruned[0] == 1 and full[0] == 4
    actions = _actions(path)
    # The touched file is re-added with a deletion vector; the others are left alone.
    assert _removed(path) == {_file_of_version(actions, 7)}
    assert any((a.get("add") or {}).get("deletionVector") for a in actions)


def _file_of_version(actions: list[dict[str, Any]], key: int) -> str:
    """The file a DV commit re-added with a deletion vector (it held ``key``)."""
    added = [a["add"] for a in actions if (a.get("add") or {}).get("deletionVector")]
    assert len(added) == 1, added
    stats = json.loads(added[0]["stats"])
    assert stats["minValues"]["id"] <= key <= stats["maxValues"]["id"]
    return str(added[0]["path"])


def test_key_domain_and_file_checks_without_spark():
    exact = _merge_keys.KeyDomain(3, 40, (3, 17, 40))
    assert exact.may_hold(10, 20) and exact.may_hold(None, 3) and exact.may_hold(40, None)
    assert not exact.may_hold(4, 16) and not exact.may_hold(41, 50) and not exact.may_hold(0, 2)
    ranged = _merge_keys.KeyDomain(3, 40)
    assert ranged.may_hold(4, 16) and not ranged.may_hold(41, 50)
    assert not _merge_keys.KeyDomain(None, None, ()).may_hold(None, None)
    assert _merge_keys.KeyDomain(1, 2).may_hold("a", "b")  # incomparable stats: keep
    days = _merge_keys.KeyDomain(dt.date(2024, 1, 2), dt.date(2024, 1, 2), (dt.date(2024, 1, 2),))
    assert not days.may_hold(dt.date(2024, 1, 3), dt.date(2024, 2, 1))
    money = _merge_keys.KeyDomain(Decimal("1.50"), Decimal("1.50"), (Decimal("1.50"),))
    assert money.may_hold(1, 2) and not money.may_hold(2, 3)

    def entry(**kwargs: Any) -> FileEntry:
        return FileEntry("f", 1, 0, 10, {}, **kwargs)

    domains = {"id": exact}
    assert _merge_keys.file_may_match(
        entry(min_values={"id": 10}, max_values={"id": 20}), domains, {}
    )
    assert not _merge_keys.file_may_match(
        entry(min_values={"ID": 4}, max_values={"ID": 16}), domains, {}
    )
    assert _merge_keys.file_may_match(entry(), domains, {})  # no stats: keep
    assert not _merge_keys.file_may_match(entry(null_counts={"id": 10}), domains, {})  # all NULL
    part = FileEntry("p", 1, 0, 10, {"kind": None})
    assert not _merge_keys.file_may_match(part, {"kind": ranged}, {"kind": "kind"})
