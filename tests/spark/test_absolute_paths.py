"""Tables whose log names data files by absolute URI, as delta-spark's shallow clones do
(``CREATE TABLE t SHALLOW CLONE s``: version 0 adds the source's files where they are).
deltaflow reads them, runs DML, OPTIMIZE and VACUUM on them, and never touches the source's
files (OPTIMIZE with ZORDER BY or WHERE is refused typed: delta-rs, which does those, reads
only files under the table's root)."""

from __future__ import annotations

import glob
import json
import os
import uuid
from typing import Any
from urllib.parse import quote

import deltalake
import pyarrow as pa
import pytest

import deltaflow


def shallow_clone(source: str, target: str) -> None:
    """``target`` as delta-spark's shallow clone of ``source`` (written in one commit):
    the source's protocol, its metadata with a new id, its adds with absolute paths."""
    with open(os.path.join(source, "_delta_log", f"{0:020d}.json")) as handle:
        actions = [json.loads(line) for line in handle if line.strip()]
    root = "file://" + quote(os.path.abspath(source))
    out: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": 1, "operation": "CLONE", "operationParameters": {}}}
    ]
    for action in actions:
        if "protocol" in action:
            out.append(action)
        elif "metaData" in action:
            out.append({"metaData": {**action["metaData"], "id": str(uuid.uuid4())}})
        elif "add" in action:
            out.append({"add": {**action["add"], "path": f"{root}/{action['add']['path']}"}})
    os.makedirs(os.path.join(target, "_delta_log"))
    with open(os.path.join(target, "_delta_log", f"{0:020d}.json"), "w") as handle:
        handle.writelines(json.dumps(a) + "\n" for a in out)


def _log_paths(path: str) -> list[str]:
    """The live files' paths as the log names them."""
    adds = deltalake.DeltaTable(path).get_add_actions(flatten=True)
    return sorted(pa.table(adds).column("path").to_pylist())


def _ids(spark: Any, path: str) -> list[int]:
    return sorted(r.id for r in spark.read.format("delta").load(path).collect())


def test_a_shallow_clone_reads_changes_and_vacuums_without_touching_its_source(spark, table_path):
    source, clone = table_path(), table_path()
    spark.range(10).selectExpr("id", "id % 2 AS p").write.format("delta").partitionBy("p").save(
        source
    )
    source_files = sorted(glob.glob(f"{source}/**/*.parquet", recursive=True))
    shallow_clone(source, clone)
    assert _ids(spark, clone) == list(range(10))
    found = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(clone))
    assert pa.table(found.execute("SELECT count(*) AS n FROM t").read_all())["n"][0].as_py() == 10

    spark.sql(f"DELETE FROM delta.`{clone}` WHERE id = 3")
    spark.sql(f"UPDATE delta.`{clone}` SET id = id + 100 WHERE id = 4")
    spark.createDataFrame([(5, 1), (20, 0)], "id long, p long").createOrReplaceTempView("more")
    spark.sql(
        f"MERGE INTO delta.`{clone}` t USING more s ON t.id = s.id"
        " WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *"
    )
    assert _ids(spark, clone) == [0, 1, 2, 6, 7, 8, 9, 20, 104]
    with pytest.raises(deltaflow.UnsupportedFeatureError, match="outside the table") as refused:
        spark.sql(f"OPTIMIZE delta.`{clone}` ZORDER BY (id)")
    assert refused.value.feature == "absolutePaths"

    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{clone}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert sorted(glob.glob(f"{source}/**/*.parquet", recursive=True)) == source_files
    assert _ids(spark, source) == list(range(10))
    assert _ids(spark, clone) == [0, 1, 2, 6, 7, 8, 9, 20, 104]


def test_optimize_of_a_shallow_clone_compacts_into_its_own_root(spark, table_path):
    """Each partition's small files, all of them the source's, become one new file under
    the clone's root: removed from the clone, never deleted from the source."""
    source, clone = table_path(), table_path()
    spark.range(10).selectExpr("id", "id % 2 AS p").repartition(4).write.format(
        "delta"
    ).partitionBy("p").save(source)
    source_files = sorted(glob.glob(f"{source}/**/*.parquet", recursive=True))
    shallow_clone(source, clone)
    before = _log_paths(clone)
    assert len(before) > 2 and all(p.startswith("file:") for p in before)

    metrics = spark.sql(f"OPTIMIZE delta.`{clone}`").collect()[0].metrics
    assert (metrics.numFilesRemoved, metrics.numFilesAdded) == (len(before), 2)
    assert metrics.partitionsOptimized == 2
    after = _log_paths(clone)
    assert len(after) == 2 and all(p.startswith("p=") for p in after)
    assert all(os.path.exists(os.path.join(clone, p)) for p in after)
    assert _ids(spark, clone) == list(range(10))
    found = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(clone))
    ids = pa.table(found.execute("SELECT id, p FROM t").read_all()).to_pylist()
    assert sorted((r["id"], r["p"]) for r in ids) == [(i, i % 2) for i in range(10)]
    last = spark.sql(f"DESCRIBE HISTORY delta.`{clone}` LIMIT 1").collect()[0]
    assert last.operation == "OPTIMIZE"
    assert sorted(glob.glob(f"{source}/**/*.parquet", recursive=True)) == source_files
    assert _ids(spark, source) == list(range(10))
