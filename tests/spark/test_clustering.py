"""Liquid clustering: CLUSTER BY / clusterBy declared on every create route, the log's
clustering domain and features, ALTER TABLE CLUSTER BY, and OPTIMIZE that clusters only
what is not clustered yet; interop with delta-rs and Polars."""

from __future__ import annotations

import itertools
import json
import os
import uuid
from typing import Any

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.table._cluster_optimize import hilbert_index


def _name() -> str:
    return "clu_" + uuid.uuid4().hex[:8]


def _actions(path: str) -> list[dict[str, Any]]:
    log = os.path.join(path, "_delta_log")
    out = []
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            with open(os.path.join(log, name)) as f:
                out.extend(json.loads(line) for line in f if line.strip())
    return out


def _domain(path: str) -> list[list[str]] | None:
    found = None
    for action in _actions(path):
        d = action.get("domainMetadata")
        if d and d["domain"] == "delta.clustering":
            found = json.loads(d["configuration"])["clusteringColumns"]
    return found


def _protocol(path: str) -> dict[str, Any]:
    return [a["protocol"] for a in _actions(path) if "protocol" in a][-1]


def _detail(spark: Any, table: str) -> Any:
    return spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]


def _typed(spark: Any, statement: str) -> deltaflow.DeltaflowError:
    with pytest.raises(Exception) as info:
        spark.sql(statement).collect()
    error = deltaflow.typed_error(info.value)
    assert error is not None, f"no deltaflow error in: {info.value}"
    return error


def _assert_clustered(path: str, columns: list[list[str]]) -> None:
    assert _domain(path) == columns
    protocol = _protocol(path)
    assert protocol["minWriterVersion"] == 7
    assert {"clustering", "domainMetadata"} <= set(protocol["writerFeatures"])


def test_create_table_cluster_by_writes_domain_and_features(spark, table_path):
    path = table_path()
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, kind STRING, v DOUBLE) USING delta"
        f" CLUSTER BY (id, kind) LOCATION '{path}'"
    )
    _assert_clustered(path, [["id"], ["kind"]])
    assert _detail(spark, name).clusteringColumns == ["id", "kind"]
    # Writes after creation go through deltaflow's log writer and keep the domain.
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a', 1.0), (2, 'b', 2.0)")
    spark.range(5).selectExpr("id", "'c' AS kind", "CAST(id AS DOUBLE) AS v").write.format(
        "delta"
    ).mode("append").save(path)
    assert _domain(path) == [["id"], ["kind"]]
    assert spark.table(name).count() == 7
    stats = [json.loads(a["add"]["stats"]) for a in _actions(path) if "add" in a]
    assert all({"id", "kind"} <= set(s["minValues"]) for s in stats)


def test_managed_ctas_and_rtas_cluster_by(spark):
    name = _name()
    spark.sql(
        f"CREATE TABLE {name} USING delta CLUSTER BY (id) AS SELECT id, id % 3 AS g FROM range(10)"
    )
    row = _detail(spark, name)
    path = row.location.replace("file:", "")
    _assert_clustered(path, [["id"]])
    assert row.clusteringColumns == ["id"]
    assert spark.table(name).count() == 10
    spark.sql(
        f"CREATE OR REPLACE TABLE {name} USING delta CLUSTER BY (g) AS SELECT id, id % 3"
        " AS g FROM range(4)"
    )
    assert _detail(spark, name).clusteringColumns == ["g"]
    assert spark.table(name).count() == 4
    spark.sql(f"DROP TABLE {name}")


def test_builder_and_writer_v2_cluster_by(spark, table_path):
    path = table_path()
    deltaflow.DeltaTable.create(spark).location(path).addColumn("id", "BIGINT").addColumn(
        "s", "STRING"
    ).clusterBy("s").execute()
    _assert_clustered(path, [["s"]])
    name = _name()
    spark.range(6).selectExpr("id", "CAST(id AS STRING) AS s").writeTo(name).using(
        "delta"
    ).clusterBy("id").create()
    assert _detail(spark, name).clusteringColumns == ["id"]
    assert spark.table(name).count() == 6
    spark.sql(f"DROP TABLE {name}")


def test_partitioned_and_clustered_is_refused(spark, table_path):
    path = table_path()
    # Spark's parser refuses the SQL form itself; the builder is refused by deltaflow.
    with pytest.raises(Exception, match="CLUSTER BY and PARTITIONED BY"):
        spark.sql(
            f"CREATE TABLE {_name()} (id INT, p STRING) USING delta PARTITIONED BY (p)"
            f" CLUSTER BY (id) LOCATION '{path}'"
        )
    assert not os.path.exists(path)
    with pytest.raises(InvalidOptionError, match="both partitioned"):
        deltaflow.DeltaTable.create(spark).location(table_path()).addColumn("id", "INT").addColumn(
            "p", "STRING"
        ).partitionedBy("p").clusterBy("id").execute()


def test_unknown_clustering_column_is_refused(spark, table_path):
    path = table_path()
    with pytest.raises(InvalidOptionError) as info:
        deltaflow.DeltaTable.create(spark).location(path).addColumn("id", "INT").clusterBy(
            "nope"
        ).execute()
    assert info.value.option == "clusterBy" and "id" in (info.value.valid or ())
    assert not os.path.exists(os.path.join(path, "_delta_log", f"{0:020d}.json"))


def test_alter_cluster_by_and_none(spark, table_path):
    path = table_path()
    name = _name()
    spark.sql(f"CREATE TABLE {name} (id BIGINT, s STRING) USING delta LOCATION '{path}'")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'a')")
    assert _detail(spark, name).clusteringColumns == []
    spark.sql(f"ALTER TABLE {name} CLUSTER BY (s, id)")
    _assert_clustered(path, [["s"], ["id"]])
    assert _detail(spark, name).clusteringColumns == ["s", "id"]
    spark.sql(f"ALTER TABLE {name} CLUSTER BY NONE")
    assert _domain(path) == []
    assert _detail(spark, name).clusteringColumns == []
    spark.sql(f"INSERT INTO {name} VALUES (2, 'b')")
    assert spark.table(name).count() == 2


def _clustered_table(spark: Any, path: str, name: str, batches: int = 4) -> None:
    spark.sql(
        f"CREATE TABLE {name} (x BIGINT, y BIGINT, pad STRING) USING delta"
        f" CLUSTER BY (x, y) LOCATION '{path}'"
        " TBLPROPERTIES ('delta.targetFileSize' = '40kb')"
    )
    for b in range(batches):
        spark.range(b * 5000, (b + 1) * 5000).selectExpr(
            "(id * 7919) % 20000 AS x", "(id * 104729) % 997 AS y", "repeat('p', 8) AS pad"
        ).repartition(2).write.format("delta").mode("append").save(path)


def test_optimize_clusters_incrementally_and_full_reclusters(spark, table_path):
    path = table_path()
    name = _name()
    _clustered_table(spark, path, name)
    before = sorted(map(tuple, spark.table(name).collect()))
    first = spark.sql(f"OPTIMIZE {name}").collect()[0].metrics
    assert first.numFilesRemoved == 8 and first.numFilesAdded > 1
    adds = [a["add"] for a in _actions(path) if "add" in a and not a["add"]["dataChange"]]
    assert adds and all(a["clusteringProvider"] == "liquid" for a in adds)
    assert sorted(map(tuple, spark.table(name).collect())) == before
    # Nothing new: nothing to do.
    again = spark.sql(f"OPTIMIZE {name}").collect()[0].metrics
    assert (again.numFilesAdded, again.numFilesRemoved) == (0, 0)
    # Only the new files are clustered.
    spark.range(3).selectExpr("id AS x", "id AS y", "'n' AS pad").coalesce(1).write.format(
        "delta"
    ).mode("append").save(path)
    live = len(deltalake.DeltaTable(path).file_uris())
    third = spark.sql(f"OPTIMIZE {name}").collect()[0].metrics
    assert third.numFilesRemoved == 1 and third.totalConsideredFiles == live
    live = len(deltalake.DeltaTable(path).file_uris())
    full = spark.sql(f"OPTIMIZE {name} FULL").collect()[0].metrics
    assert full.numFilesRemoved == live
    assert spark.table(name).count() == len(before) + 3
    assert _domain(path) == [["x"], ["y"]]


def test_optimize_zorder_on_clustered_table_is_refused(spark, table_path):
    path = table_path()
    name = _name()
    spark.sql(f"CREATE TABLE {name} (x INT, y INT) USING delta CLUSTER BY (x) LOCATION '{path}'")
    error = _typed(spark, f"OPTIMIZE {name} ZORDER BY (y)")
    assert isinstance(error, InvalidOptionError) and error.option == "zOrderBy"
    plain = table_path()
    spark.range(3).write.format("delta").save(plain)
    error = _typed(spark, f"OPTIMIZE delta.`{plain}` FULL")
    assert isinstance(error, InvalidOptionError) and error.option == "full"


def test_clustered_table_scans_fewer_files(spark, table_path):
    """The same rows and the same query: the clustered table skips more files."""
    plain, clustered = table_path("plain"), table_path("clustered")
    name = _name()
    _clustered_table(spark, clustered, name)
    spark.sql(f"OPTIMIZE {name} FULL").collect()
    files = len(deltalake.DeltaTable(clustered).file_uris())
    # The same rows, as many files, in write order (unclustered).
    spark.read.format("delta").load(clustered).repartition(files).write.format("delta").save(plain)
    counts = {}
    for path in (plain, clustered):
        df = spark.read.format("delta").load(path).where("x BETWEEN 100 AND 300")
        counts[path] = (df.count(), deltaflow.spark.scan_reports(spark, path)[-1])
    assert counts[plain][0] == counts[clustered][0] > 0
    plain_report, clustered_report = counts[plain][1], counts[clustered][1]
    assert clustered_report.files_in_snapshot > 2
    assert clustered_report.files_scanned < plain_report.files_scanned


def test_delta_rs_and_polars_read_the_clustered_table(spark, table_path):
    path = table_path()
    name = _name()
    _clustered_table(spark, path, name, batches=2)
    spark.sql(f"OPTIMIZE {name}").collect()
    expected = sorted(map(tuple, spark.table(name).collect()))
    rs = deltalake.DeltaTable(path).to_pyarrow_table()
    assert sorted(zip(*(rs.column(c).to_pylist() for c in ("x", "y", "pad")), strict=True)) == (
        expected
    )
    frame = pl.read_delta(path).sort(["x", "y", "pad"])
    assert [tuple(r) for r in frame.iter_rows()] == expected
    # delta-rs VACUUM and checkpoints keep working and keep the domain.
    deltalake.DeltaTable(path).create_checkpoint()
    # delta-rs refuses to log a VACUUM on a clustered table; deltaflow's VACUUM deletes.
    removed = {a["remove"]["path"] for a in _actions(path) if "remove" in a}
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM {name} RETAIN 0 HOURS").collect()
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert removed and not any(os.path.exists(os.path.join(path, p)) for p in removed)
    assert _detail(spark, name).clusteringColumns == ["x", "y"]
    spark.range(2).selectExpr("id AS x", "id AS y", "'z' AS pad").write.format("delta").mode(
        "append"
    ).save(path)
    assert _detail(spark, name).clusteringColumns == ["x", "y"]
    assert spark.table(name).count() == len(expected) + 2


def test_hilbert_index_is_a_continuous_curve():
    grid = np.array([(x, y) for x in range(16) for y in range(16)], dtype=np.uint64)
    keys = hilbert_index(grid, 4)
    assert sorted(keys.tolist()) == list(range(256))
    path = grid[np.argsort(keys)].astype(int)
    assert all(np.abs(a - b).sum() == 1 for a, b in itertools.pairwise(path))


def test_domain_survives_in_a_checkpoint_arrow_roundtrip(table_path):
    """A table created by the table layer reads back with delta-rs (no Spark)."""
    from deltaflow.table import _commit, _log_write

    path = table_path()
    _log_write.commit_write(
        _commit.CommitRequest(
            table_uri=path,
            schema={
                "type": "struct",
                "fields": [{"name": "a", "type": "long", "nullable": True, "metadata": {}}],
            },
            partition_columns=(),
            adds=(),
            clustering_columns=("a",),
            operation="CREATE TABLE",
        )
    )
    table = deltalake.DeltaTable(path)
    assert table.version() == 0 and table.to_pyarrow_table().equals(
        pa.table({"a": pa.array([], pa.int64())})
    )
    assert _domain(path) == [["a"]]
