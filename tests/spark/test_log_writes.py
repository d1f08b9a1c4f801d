"""Commits delta-rs 1.6 cannot write (table/_log_write.py) from Spark: identity columns
and clustering on one table, RESTORE of a clustered or identity table, DML on an identity
table; interop with delta-rs and Polars."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import deltalake
import polars as pl
import pytest

import deltaflow


def _name() -> str:
    return "lw_" + uuid.uuid4().hex[:8]


def _actions(path: str, version: int | None = None) -> list[dict[str, Any]]:
    log = os.path.join(path, "_delta_log")
    out = []
    for name in sorted(os.listdir(log)):
        if name.endswith(".json") and (version is None or int(name[:20]) == version):
            with open(os.path.join(log, name)) as f:
                out.extend(json.loads(line) for line in f if line.strip())
    return out


def _latest(path: str, kind: str) -> dict[str, Any]:
    return [a[kind] for a in _actions(path) if kind in a][-1]


def _domain(path: str) -> list[list[str]] | None:
    found = [
        json.loads(a["domainMetadata"]["configuration"])["clusteringColumns"]
        for a in _actions(path)
        if a.get("domainMetadata", {}).get("domain") == "delta.clustering"
    ]
    return found[-1] if found else None


def _high_water_mark(path: str, column: str) -> int | None:
    schema = json.loads(_latest(path, "metaData")["schemaString"])
    field = next(f for f in schema["fields"] if f["name"] == column)
    return field["metadata"].get("delta.identity.highWaterMark")


def _rows(spark: Any, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.table(table).collect())


def _interop(path: str, expected: list[tuple[Any, ...]], columns: list[str]) -> None:
    by_rs = deltalake.DeltaTable(path).to_pyarrow_table().select(columns).to_pylist()
    assert sorted(tuple(r[c] for c in columns) for r in by_rs) == expected
    by_polars = pl.read_delta(path).select(columns).rows()
    assert sorted(by_polars) == expected


def test_identity_and_cluster_by_on_one_table(spark, table_path):
    path = table_path()
    table = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT GENERATED ALWAYS AS IDENTITY, x INT, y STRING)"
        " USING delta CLUSTER BY (x)"
    )
    protocol = _latest(path, "protocol")
    assert protocol["minWriterVersion"] == 7
    assert {"identityColumns", "clustering", "domainMetadata"} <= set(protocol["writerFeatures"])
    assert _domain(path) == [["x"]]

    spark.sql(f"INSERT INTO {table} (x, y) VALUES (3, 'c'), (1, 'a')")
    spark.sql(f"INSERT INTO {table} (x, y) VALUES (2, 'b')")
    ids = [r.id for r in spark.read.format("delta").load(path).collect()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 3
    assert _high_water_mark(path, "id") == max(ids)

    live = len(deltalake.DeltaTable(path).file_uris())
    metrics = spark.sql(f"OPTIMIZE {table}").collect()[0].metrics
    assert metrics.numFilesRemoved == live and metrics.numFilesAdded == 1
    optimized = _actions(path, deltalake.DeltaTable(path).version())
    added = [a["add"] for a in optimized if "add" in a]
    assert added and all(a.get("clusteringProvider") == "liquid" for a in added)
    # Both features' state survives every commit: the domain and the high water mark.
    assert _domain(path) == [["x"]]
    assert _high_water_mark(path, "id") == max(ids)
    spark.sql(f"INSERT INTO {table} (x, y) VALUES (4, 'd')")
    rows = sorted((r.id, r.x, r.y) for r in spark.read.format("delta").load(path).collect())
    new_id = next(i for i, x, _ in rows if x == 4)
    assert new_id > max(ids) and _high_water_mark(path, "id") == new_id
    assert sorted(y for _, _, y in rows) == ["a", "b", "c", "d"]
    _interop(path, rows, ["id", "x", "y"])


def test_restore_of_a_clustered_table(spark, table_path):
    path = table_path()
    name = _name()
    spark.sql(f"CREATE TABLE {name} (k INT, v STRING) USING delta CLUSTER BY (k) LOCATION '{path}'")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a'), (2, 'b')")  # version 1
    at_one = _rows(spark, name)
    spark.sql(f"INSERT INTO {name} VALUES (3, 'c')")  # version 2
    spark.sql(f"ALTER TABLE {name} CLUSTER BY (v)")  # version 3
    spark.sql(f"DELETE FROM {name} WHERE k = 1")  # version 4
    assert _domain(path) == [["v"]]

    row = spark.sql(f"RESTORE TABLE {name} TO VERSION AS OF 1").collect()[0]
    assert row.num_restored_files >= 1 and row.num_removed_files >= 1
    assert _rows(spark, name) == at_one
    last = spark.sql(f"DESCRIBE HISTORY {name}").collect()[0]
    assert last.operation == "RESTORE" and last.operationParameters["version"] == "1"
    # delta-spark restores the clustering columns of the version restored to.
    assert _domain(path) == [["k"]]
    assert {"clustering", "domainMetadata"} <= set(_latest(path, "protocol")["writerFeatures"])
    _interop(path, at_one, ["k", "v"])
    spark.sql(f"INSERT INTO {name} VALUES (9, 'z')")  # still writable after the restore
    assert _rows(spark, name) == sorted([*at_one, (9, "z")])


def test_restore_keeps_identity_high_water_mark(spark, table_path):
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT GENERATED ALWAYS AS IDENTITY, v STRING)"
        " USING delta"
    )
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES ('a')")  # version 1
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES ('b'), ('c')")  # version 2
    mark = _high_water_mark(path, "id")
    spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF 1")
    assert [r.v for r in spark.read.format("delta").load(path).collect()] == ["a"]
    assert _high_water_mark(path, "id") == mark  # ids handed out are never handed out again
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES ('d')")
    ids = {r.v: r.id for r in spark.read.format("delta").load(path).collect()}
    assert ids["d"] > mark > ids["a"]


def test_update_and_delete_on_an_identity_table(spark, table_path):
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT GENERATED ALWAYS AS IDENTITY, v INT) USING delta"
    )
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES (1), (2), (3)")
    before = {r.v: r.id for r in spark.read.format("delta").load(path).collect()}
    mark = _high_water_mark(path, "id")
    spark.sql(f"UPDATE delta.`{path}` SET v = v * 10 WHERE v >= 2")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE v = 1")
    rows = sorted((r.id, r.v) for r in spark.read.format("delta").load(path).collect())
    assert rows == [(before[2], 20), (before[3], 30)]  # ids kept, not generated again
    assert _high_water_mark(path, "id") == mark
    assert _latest(path, "protocol")["minWriterVersion"] == 6
    latest = deltalake.DeltaTable(path).version()
    for version in (latest - 1, latest):  # DML leaves the metadata alone (no false conflicts)
        actions = _actions(path, version)
        assert not any("metaData" in a or "protocol" in a for a in actions)
        assert next(a["commitInfo"] for a in actions if "commitInfo" in a)["operation"] in (
            "UPDATE",
            "DELETE",
        )
    _interop(path, rows, ["id", "v"])


def test_optimize_of_an_identity_table_is_a_typed_refusal(spark, table_path):
    path = table_path()
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT GENERATED ALWAYS AS IDENTITY, v INT) USING delta"
    )
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES (1)")
    spark.sql(f"INSERT INTO delta.`{path}` (v) VALUES (2)")
    version = deltalake.DeltaTable(path).version()
    with pytest.raises(Exception) as info:
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    error = deltaflow.typed_error(info.value)
    assert isinstance(error, deltaflow.UnsupportedFeatureError), info.value
    assert error.feature == "identityColumns"
    assert not isinstance(error, deltaflow.ConcurrentWriteError)
    assert deltalake.DeltaTable(path).version() == version  # nothing committed
