"""Change data feed writing, DML on deletion-vector tables, and DML conflicts.

Change rows are read with delta-rs (``load_cdf``) or straight from the ``cdc``
actions' files, never with deltaflow's own reader, and compared row by row with
expectations computed in plain Python from the rows the test wrote.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow import ConcurrentWriteError, DeltaTable
from deltaflow.spark.dml import _delete_update, _merge
from tests.table.dv_fixtures import add_deletion_vectors

COLUMNS = ("id", "kind", "value")
# Three writes -> files: kind=a (ids 0-3), kind=b (ids 4-7), then kind=a (ids 8-9).
BATCHES = (
    [(0, "a", 1), (1, "a", None), (2, "a", 7), (3, "a", 9)],
    [(4, "b", 2), (5, "b", 8), (6, "b", None), (7, "b", 3)],
    [(8, "a", 5), (9, "a", 6)],
)
ROWS = [r for batch in BATCHES for r in batch]
CDF = {"delta.enableChangeDataFeed": "true"}


def _arrow(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "kind": pa.array([r[1] for r in rows], pa.string()),
            "value": pa.array([r[2] for r in rows], pa.int32()),
        }
    )


def _make(path: str, *, partitioned: bool = True, cdf: bool = True) -> str:
    for n, batch in enumerate(BATCHES):
        write_deltalake(
            path,
            _arrow(batch),
            mode="append",
            partition_by=["kind"] if partitioned else None,
            configuration=CDF if cdf and n == 0 else None,
        )
    return path


def _rows(spark, path: str) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(path)
    return sorted(tuple(r) for r in df.select(*COLUMNS).collect())


def _key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) for v in row)


def _changes(path: str, version: int) -> list[tuple[Any, ...]]:
    """(id, kind, value, _change_type) of ``version`` as delta-rs's CDF reader gives them."""
    table = pa.table(RsTable(path).load_cdf(starting_version=version, ending_version=version))
    rows = [
        (r["id"], r["kind"], r["value"], r["_change_type"])
        for r in table.to_pylist()
        if r["_commit_version"] == version
    ]
    return sorted(rows, key=_key)


def _commit_actions(path: str, version: int) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _change_files(path: str, version: int) -> list[tuple[Any, ...]]:
    """Rows of the commit's ``cdc`` files, read with pyarrow (partition values from the log)."""
    rows = []
    for action in _commit_actions(path, version):
        cdc = action.get("cdc")
        if cdc is None:
            continue
        assert cdc["path"].startswith("_change_data/") and cdc["dataChange"] is False
        data = pq.read_table(os.path.join(path, cdc["path"])).to_pylist()
        for r in data:
            kind = r.get("kind", cdc["partitionValues"].get("kind"))
            rows.append((r["id"], kind, r["value"], r["_change_type"]))
    return sorted(rows, key=_key)


def _expect(rows: list[tuple[Any, ...]], change: str) -> list[tuple[Any, ...]]:
    return [(*r, change) for r in rows]


def _interleave(module: Any, monkeypatch, concurrent: Callable[[], Any]) -> None:
    """Run ``concurrent`` (another, real writer) right before ``module``'s commit."""
    original = module.commit

    def commit_after_concurrent_writer(request):
        concurrent()
        return original(request)

    monkeypatch.setattr(module, "commit", commit_after_concurrent_writer)


# ---- change data feed ------------------------------------------------------------------


def test_delete_writes_every_deleted_row_as_change_rows(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).delete("kind = 'b' OR id = 0")  # b whole, a1 partly
    version = RsTable(path).version()
    deleted = [r for r in ROWS if r[1] == "b" or r[0] == 0]
    expected = sorted(_expect(deleted, "delete"), key=_key)
    # The commit has change files, so readers take only them: the wholly deleted
    # kind=b file's rows must be there too.
    assert _change_files(path, version) == expected
    assert _changes(path, version) == expected
    cdc = [a["cdc"] for a in _commit_actions(path, version) if "cdc" in a]
    assert {c["partitionValues"]["kind"] for c in cdc} == {"a", "b"}
    assert all(
        c["path"].startswith(f"_change_data/kind={c['partitionValues']['kind']}/") for c in cdc
    )
    history = DeltaTable.forPath(spark, path).history(1).collect()[0]
    assert history["operationMetrics"]["numAddedChangeFiles"] == str(len(cdc))
    assert _rows(spark, path) == sorted(r for r in ROWS if r not in deleted)


def test_delete_of_whole_files_only_writes_no_change_files(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).delete("kind = 'b'")
    version = RsTable(path).version()
    assert not [a for a in _commit_actions(path, version) if "cdc" in a]
    # Readers turn the removes into delete rows.
    expected = sorted(_expect([r for r in ROWS if r[1] == "b"], "delete"), key=_key)
    assert _changes(path, version) == expected


def test_update_writes_pre_and_post_images_unpartitioned(spark, table_path):
    path = _make(table_path(), partitioned=False)
    DeltaTable.forPath(spark, path).update("value > 6", {"value": "value * 10"})
    version = RsTable(path).version()
    before = [r for r in ROWS if r[2] is not None and r[2] > 6]
    after = [(i, k, v * 10) for i, k, v in before]
    expected = sorted(
        _expect(before, "update_preimage") + _expect(after, "update_postimage"), key=_key
    )
    assert _changes(path, version) == expected
    assert _change_files(path, version) == expected
    assert _rows(spark, path) == sorted([r for r in ROWS if r not in before] + after)
    assert {a["cdc"]["path"].count("/") for a in _commit_actions(path, version) if "cdc" in a} == {
        1
    }  # _change_data/cdc-*.parquet: no partition directories


def test_update_moving_rows_across_partitions(spark, table_path):
    path = _make(table_path())
    DeltaTable.forPath(spark, path).update("value < 3", {"kind": "'c'"})
    version = RsTable(path).version()
    before = [r for r in ROWS if r[2] is not None and r[2] < 3]
    after = [(i, "c", v) for i, _, v in before]
    expected = sorted(
        _expect(before, "update_preimage") + _expect(after, "update_postimage"), key=_key
    )
    assert _changes(path, version) == expected
    assert _rows(spark, path) == sorted([r for r in ROWS if r not in before] + after)


def test_merge_writes_updates_deletes_and_inserts(spark, table_path):
    path = _make(table_path())
    source_rows = [(1, "a", 100), (5, "b", -1), (7, "b", 0), (20, "c", 3)]
    source = spark.createDataFrame(source_rows, "id long, kind string, value int")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.value <= 0")
        .whenMatchedUpdate(set={"value": "s.value"})
        .whenNotMatchedInsertAll()
        .execute()
    )
    version = RsTable(path).version()
    by_id = {r[0]: r for r in ROWS}
    expected: list[tuple[Any, ...]] = []
    table = dict(by_id)
    for sid, skind, svalue in source_rows:
        if sid not in by_id:
            expected.append((sid, skind, svalue, "insert"))
            table[sid] = (sid, skind, svalue)
        elif svalue <= 0:
            expected.append((*by_id[sid], "delete"))
            del table[sid]
        else:
            new = (sid, by_id[sid][1], svalue)
            expected += [(*by_id[sid], "update_preimage"), (*new, "update_postimage")]
            table[sid] = new
    assert _changes(path, version) == sorted(expected, key=_key)
    assert _rows(spark, path) == sorted(table.values())
    metrics = DeltaTable.forPath(spark, path).history(1).collect()[0]["operationMetrics"]
    assert int(metrics["numTargetChangeFilesAdded"]) >= 2  # kind=a, b and c directories


# The Spark jobs write no change files for inserts only; delta-rs's route writes them (the
# change rows read the same: tests/spark/test_merge_native.py).
@pytest.mark.usefixtures("merge_as_spark_jobs")
def test_insert_only_merge_on_cdf_table_writes_no_change_files(spark, table_path):
    path = _make(table_path())
    source = spark.createDataFrame([(1, "a", 5), (30, "c", 3)], "id long, kind string, value int")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenNotMatchedInsertAll()
        .execute()
    )
    version = RsTable(path).version()
    assert not [a for a in _commit_actions(path, version) if "cdc" in a]
    assert _changes(path, version) == [(30, "c", 3, "insert")]
    assert _commit_actions(path, version)[0]["commitInfo"]["readVersion"] == version - 1


# ---- deletion vectors -------------------------------------------------------------------


def _dv_table(path: str) -> tuple[str, dict[str, Any]]:
    """The standard table, rows id=1 and id=5 deleted by deletion vectors.

    Without CDF: the fixture's protocol upgrade from CDF's writer version 4 would list
    checkConstraints / generatedColumns, which deltaflow refuses to write."""
    _make(path, cdf=False)
    adds = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    first_a = next(a["path"] for a in adds if a["partition.kind"] == "a" and a["num_records"] == 4)
    b = next(a["path"] for a in adds if a["partition.kind"] == "b")
    add_deletion_vectors(path, {first_a: [1], b: [1]})  # ids 1 and 5
    dvs = {}
    for action in _commit_actions(path, RsTable(path).version()):
        if "add" in action:
            dvs[action["add"]["path"]] = action["add"]["deletionVector"]
    return first_a, dvs


def test_dml_rewrites_files_with_deletion_vectors(spark, table_path):
    path = table_path()
    first_a, dvs = _dv_table(path)
    live = [r for r in ROWS if r[0] not in (1, 5)]
    assert _rows(spark, path) == sorted(live)
    # With the property off, DML rewrites files (with it on, it marks rows: test_dv_write).
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')"
    )

    DeltaTable.forPath(spark, path).delete("id = 2")  # rewrites the DV'd kind=a file
    version = RsTable(path).version()
    actions = _commit_actions(path, version)
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    assert removes[first_a]["deletionVector"] == dvs[first_a]
    assert removes[first_a]["extendedFileMetadata"] is True
    # The rewritten file keeps only live rows: the DV'd row 1 is not resurrected.
    live = [r for r in live if r[0] != 2]
    assert _rows(spark, path) == sorted(live)
    new_adds = [a["add"] for a in actions if "add" in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in new_adds) == 2  # ids 0 and 3

    DeltaTable.forPath(spark, path).update("kind = 'b'", {"value": "0"})
    live = [(i, k, 0 if k == "b" else v) for i, k, v in live]
    assert _rows(spark, path) == sorted(live)
    version = RsTable(path).version()
    b_file = next(p for p in dvs if p != first_a)
    removes = [a["remove"] for a in _commit_actions(path, version) if "remove" in a]
    assert [r["deletionVector"] for r in removes if r["path"] == b_file] == [dvs[b_file]]
    # Other engines see the same table: no live file still carries the old DV.
    remaining = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    assert b_file not in {a["path"] for a in remaining}
    assert sum(a["num_records"] for a in remaining) == len(live)


# ---- conflicts ------------------------------------------------------------------------------


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the Spark jobs' commit seam
def test_merge_succeeds_over_a_concurrent_blind_append(spark, table_path, monkeypatch):
    path = _make(table_path(), cdf=False)
    appended = [(40, "a", 4)]
    _interleave(
        _merge,
        monkeypatch,
        lambda: write_deltalake(path, _arrow(appended), mode="append", partition_by=["kind"]),
    )
    source = spark.createDataFrame([(2, "a", 70)], "id long, kind string, value int")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id AND t.kind = 'a'")
        .whenMatchedUpdateAll()
        .execute()
    )
    monkeypatch.undo()
    expected = [(2, "a", 70) if r[0] == 2 else r for r in ROWS] + appended
    assert _rows(spark, path) == sorted(expected)


@pytest.mark.usefixtures("merge_as_spark_jobs")  # the Spark jobs' commit seam
def test_concurrent_insert_only_merges_conflict(spark, table_path, monkeypatch):
    # An insert-only MERGE reads the target: a concurrent MERGE that inserted into the
    # partitions it read is a ConcurrentAppend (a blind append would not be).
    path = _make(table_path(), cdf=False)
    table = DeltaTable.forPath(spark, path)
    theirs = spark.createDataFrame([(50, "a", 1)], "id long, kind string, value int")
    mine = spark.createDataFrame([(50, "a", 2)], "id long, kind string, value int")

    def concurrent_merge() -> None:
        monkeypatch.undo()
        table.alias("t").merge(theirs.alias("s"), "t.id = s.id").whenNotMatchedInsertAll().execute()

    _interleave(_merge, monkeypatch, concurrent_merge)
    with pytest.raises(ConcurrentWriteError) as info:
        table.alias("t").merge(mine.alias("s"), "t.id = s.id").whenNotMatchedInsertAll().execute()
    assert info.value.kind == "ConcurrentAppend"
    assert _rows(spark, path) == sorted([*ROWS, (50, "a", 1)])


def test_dml_succeeds_over_a_concurrent_optimize_of_other_partitions(
    spark, table_path, monkeypatch
):
    path = _make(table_path())
    write_deltalake(path, _arrow([(11, "b", 1)]), mode="append")  # kind=b: two files
    table = DeltaTable.forPath(spark, path)
    _interleave(
        _delete_update,
        monkeypatch,
        lambda: table.optimize().where("kind = 'b'").executeCompaction(),
    )
    table.delete("kind = 'a' AND id = 3")
    monkeypatch.undo()
    assert _rows(spark, path) == sorted([r for r in ROWS if r[0] != 3] + [(11, "b", 1)])
    kinds = [
        a["partition.kind"]
        for a in pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    ]
    assert kinds.count("b") == 1  # the compaction committed too


def _variant_changes(path: str, version: int) -> list[tuple[Any, ...]]:
    """(id, whether v is NULL, _change_type) of a commit's change files."""
    rows = []
    for action in _commit_actions(path, version):
        if "cdc" in action:
            data = pq.read_table(os.path.join(path, action["cdc"]["path"])).to_pylist()
            rows += [(r["id"], r["v"] is None, r["_change_type"]) for r in data]
    return sorted(rows)


@pytest.mark.parametrize("statement", ["delete", "update", "merge"])
def test_dml_on_a_variant_table_keeps_null_variants_in_rows_and_changes(
    spark, table_path, statement
):
    """A NULL VARIANT reaches the change writer as a null struct over required children;
    its rows and change rows are written, and read back NULL."""
    path = table_path()
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id INT, v VARIANT) USING delta"
        " TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    ).collect()
    # One file, so that each statement rewrites it and writes change files.
    spark.sql(
        f"INSERT INTO {t} SELECT /*+ COALESCE(1) */ id, parse_json(j) FROM VALUES"
        " (1, '{\"a\": 1}'), (2, '\"s\"'), (3, NULL) AS s(id, j)"
    ).collect()
    assert len([a for a in _commit_actions(path, 1) if "add" in a]) == 1
    if statement == "delete":
        spark.sql(f"DELETE FROM {t} WHERE id >= 2").collect()
        table = [(1, '{"a":1}')]
        changes = [(2, False, "delete"), (3, True, "delete")]
    elif statement == "update":
        spark.sql(f"UPDATE {t} SET id = id + 10 WHERE id >= 2").collect()
        table = [(1, '{"a":1}'), (12, '"s"'), (13, None)]
        changes = [
            (2, False, "update_preimage"),
            (3, True, "update_preimage"),
            (12, False, "update_postimage"),
            (13, True, "update_postimage"),
        ]
    else:
        spark.sql(
            f"MERGE INTO {t} t USING (SELECT 3 AS id, parse_json('1') AS v"
            " UNION ALL SELECT 4, CAST(NULL AS VARIANT)) s ON t.id = s.id"
            " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()
        table = [(1, '{"a":1}'), (2, '"s"'), (3, "1"), (4, None)]
        changes = [
            (3, False, "update_postimage"),
            (3, True, "update_preimage"),
            (4, True, "insert"),
        ]
    rows = spark.sql(f"SELECT id, to_json(v) FROM {t} ORDER BY id").collect()
    assert [tuple(r) for r in rows] == table
    assert _variant_changes(path, 2) == changes
