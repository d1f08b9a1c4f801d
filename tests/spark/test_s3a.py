"""Tables on S3 through Hadoop's S3A: the JVM data path, against a real S3 server (SeaweedFS).

One Spark Connect server per module, started from the wheel with ``deltaflow.spark_conf()``,
the S3A jars (``tests/_s3a.py``: ``hadoop-aws`` matching the wheel's Hadoop and the AWS SDK
modules it needs, resolved once from Maven Central) and ``fs.s3a.*`` settings, with ``s3://``
mapped to S3A as EMR does. Its environment carries no AWS variable: the brain gets its
credentials from ``fs.s3a.*`` alone (``HadoopStores.scala``). The tests are Connect clients
(a classic session of this process has no S3A on its class path); they check each result with
delta-rs, directly against the store.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from tests import _object_store
from tests.spark._conf import confs_set
from tests.spark.test_hosts import start_connect_server, stop, wait_for_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3a_conf(object_store: _object_store.ObjectStore) -> dict[str, str]:
    import deltaflow
    from tests import _s3a

    return _s3a.with_s3a(deltaflow.spark_conf(), _s3a.s3a_conf_or_skip(object_store))


@pytest.fixture(scope="module")
def server(
    s3a_conf: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, Path]]:
    home = tmp_path_factory.mktemp("s3a_server")
    # No AWS_* in the server's environment: the brain must take them from fs.s3a.*.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        process, port = start_connect_server(home, s3a_conf)
    finally:
        os.environ.update(saved)
    try:
        wait_for_port(port, process, timeout=300)
        yield port, home
    finally:
        print(stop(process, home)[-2000:])


@pytest.fixture(scope="module")
def spark(server: tuple[int, Path]) -> Iterator[Any]:
    """A Connect client of the S3A server (shadows the classic session fixture here)."""
    from pyspark.sql.connect.session import SparkSession

    session = SparkSession.builder.remote(f"sc://127.0.0.1:{server[0]}").create()
    yield session
    session.stop()


@pytest.fixture
def uris(object_store: _object_store.ObjectStore) -> Any:
    """``(s3a_uri, s3_uri)`` of one fresh table location."""

    def make(name: str = "t") -> tuple[str, str]:
        s3 = object_store.uri(name)
        return "s3a://" + s3.removeprefix("s3://"), s3

    return make


def rows_of(store: _object_store.ObjectStore, uri: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri, storage_options=store.storage_options)
    return sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())


def table(store: _object_store.ObjectStore, uri: str) -> DeltaTable:
    return DeltaTable(uri, storage_options=store.storage_options)


# The JVM write path's file names (write/_native.py): part-<n>-<job>-s<split>-<uuid>-c000.
_JVM_FILE = re.compile(r"/part-\d{5}-[0-9a-f]{8}-s\d+-[0-9a-f-]{36}-c000\.snappy\.parquet$")


def jvm_written(store: _object_store.ObjectStore, uri: str) -> bool:
    """Whether every file of ``uri``'s current version was written by the JVM path."""
    files = table(store, uri).file_uris()
    return bool(files) and all(_JVM_FILE.search(f) for f in files)


def frame(spark: Any, first: int, count: int) -> Any:
    return spark.range(first, first + count).selectExpr("id", "cast(id % 3 as string) AS k")


def test_batch_write_and_read_take_the_jvm_path(spark, object_store, uris):
    uri, s3 = uris()
    frame(spark, 0, 100).write.format("delta").save(uri)
    frame(spark, 100, 50).write.format("delta").mode("append").save(uri)
    df = spark.read.format("delta").load(uri)
    assert df.count() == 150
    plan = df._explain_string()
    assert f"DeltaScan delta.`{uri}" in plan, plan
    assert "deltaflow_python" not in plan, plan
    assert [r[0] for r in rows_of(object_store, s3)] == list(range(150))
    assert jvm_written(object_store, s3)
    # A filter on the partition-less table still reads on the JVM path.
    assert spark.read.format("delta").load(uri).where("id >= 140").count() == 10


def test_s3_uris_are_opened_by_s3a_when_mapped(spark, object_store, uris):
    _, s3 = uris()
    frame(spark, 0, 10).write.format("delta").save(s3)
    df = spark.read.format("delta").load(s3)
    plan = df._explain_string()
    assert f"DeltaScan delta.`{s3}" in plan, plan
    assert sorted(r.id for r in df.collect()) == list(range(10))
    assert len(rows_of(object_store, s3)) == 10


def test_update_delete_merge_on_s3a(spark, object_store, uris):
    uri, s3 = uris()
    frame(spark, 0, 30).write.format("delta").save(uri)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 10")
    spark.sql(f"UPDATE delta.`{uri}` SET k = 'u' WHERE id >= 25")
    frame(spark, 20, 20).createOrReplaceTempView("changes")
    spark.sql(
        f"""MERGE INTO delta.`{uri}` t USING changes s ON t.id = s.id
            WHEN MATCHED AND s.id < 22 THEN DELETE
            WHEN MATCHED THEN UPDATE SET k = 'm'
            WHEN NOT MATCHED THEN INSERT *"""
    )
    got = dict(rows_of(object_store, s3))
    assert sorted(got) == [*range(10, 20), *range(22, 40)]
    assert {got[i] for i in range(22, 30)} == {"m"}  # matched (25..29 updated twice)
    assert [got[i] for i in range(30, 40)] == [str(i % 3) for i in range(30, 40)]  # inserted
    assert got[10] == str(10 % 3)
    operations = [h["operation"] for h in table(object_store, s3).history()]
    assert operations[:3] == ["MERGE", "UPDATE", "DELETE"]


@pytest.mark.parametrize(
    ("feature", "as_jobs"),
    [
        ("delta.enableChangeDataFeed", False),
        ("delta.enableChangeDataFeed", True),
        ("delta.enableDeletionVectors", False),
        ("delta.columnMapping.mode", True),
    ],
)
def test_dml_on_tables_with_features_on_s3a(spark, object_store, uris, feature, as_jobs):
    """DML on S3A, on fs.s3a.* alone, over tables whose DML takes the Python path somewhere:
    change rows (written in the brain for a small statement, in Python workers as Spark
    jobs), deletion vectors (written by the brain's pyarrow, which has no ``s3a://`` of its
    own), a column-mapped table (read by Python workers). Rows and feed read back through
    deltaflow and, where it can read them, delta-rs."""
    uri, s3 = uris()
    value = "name" if feature == "delta.columnMapping.mode" else "true"
    frame(spark, 0, 30).write.format("delta").option(feature, value).save(uri)
    with confs_set(spark, _DML_AS_SPARK_JOBS if as_jobs else {}):
        spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 5")
        spark.sql(f"UPDATE delta.`{uri}` SET k = 'u' WHERE id >= 27")
        frame(spark, 28, 4).createOrReplaceTempView("more")
        spark.sql(
            f"""MERGE INTO delta.`{uri}` t USING more s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET k = 'm' WHEN NOT MATCHED THEN INSERT *"""
        )
    expected = [(i, str(i % 3)) for i in range(5, 27)] + [(27, "u"), (28, "m"), (29, "m")]
    expected += [(30, "0"), (31, "1")]
    read = spark.read.format("delta").load(uri).collect()
    assert sorted((r.id, r.k) for r in read) == expected
    if feature in ("delta.enableDeletionVectors", "delta.columnMapping.mode"):
        # delta-rs's to_pyarrow_table() applies neither; its SQL engine applies both.
        from deltalake import QueryBuilder

        found = QueryBuilder().register("t", table(object_store, s3)).execute("SELECT id, k FROM t")
        assert sorted(tuple(r.values()) for r in pa.table(found.read_all()).to_pylist()) == expected
        if feature == "delta.enableDeletionVectors":
            history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
            metrics = {r.operation: r.operationMetrics for r in history}
            assert int(metrics["DELETE"]["numDeletionVectorsAdded"]) >= 1
        return
    assert rows_of(object_store, s3) == expected
    if feature != "delta.enableChangeDataFeed":
        return
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(uri)
        .collect()
    )
    got = sorted((r._commit_version, r._change_type, r.id, r.k) for r in changes)
    want = [(1, "delete", i, str(i % 3)) for i in range(5)]
    want += [(2, "update_preimage", i, str(i % 3)) for i in range(27, 30)]
    want += [(2, "update_postimage", i, "u") for i in range(27, 30)]
    want += [(3, "update_preimage", i, "u") for i in (28, 29)]
    want += [(3, "update_postimage", i, "m") for i in (28, 29)]
    want += [(3, "insert", 30, "0"), (3, "insert", 31, "1")]
    assert got == sorted(want)


def test_sql_insert_alter_and_clustering_on_s3a(spark, object_store, uris):
    """SQL INSERT INTO / INSERT OVERWRITE (a partition, dynamic), ALTER TABLE, and a
    clustered table's CREATE and OPTIMIZE, by path on S3A."""
    uri, s3 = uris()
    t = f"delta.`{uri}`"
    spark.sql(f"CREATE TABLE {t} (id BIGINT, k STRING) USING delta PARTITIONED BY (k)")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'a')")
    spark.sql(f"INSERT OVERWRITE {t} PARTITION (k = 'a') VALUES (10)")
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        spark.sql(f"INSERT OVERWRITE {t} VALUES (20, 'b'), (30, 'c')")
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    assert rows_of(object_store, s3) == [(10, "a"), (20, "b"), (30, "c")]
    spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('deltaflow.test' = 'yes')")
    spark.sql(f"ALTER TABLE {t} ADD COLUMNS (note STRING)")
    spark.sql(f"INSERT INTO {t} VALUES (40, 'd', 'new')")
    delta = table(object_store, s3)
    assert delta.metadata().configuration.get("deltaflow.test") == "yes"
    assert [f.name for f in delta.schema().fields] == ["id", "k", "note"]
    got = spark.sql(f"SELECT id, k, note FROM {t}").collect()
    assert sorted(tuple(r) for r in got) == [
        (10, "a", None),
        (20, "b", None),
        (30, "c", None),
        (40, "d", "new"),
    ]

    clustered, clustered_s3 = uris("clustered")
    c = f"delta.`{clustered}`"
    spark.sql(f"CREATE TABLE {c} (id BIGINT, v STRING) USING delta CLUSTER BY (id)")
    for first in range(0, 40, 10):
        spark.sql(
            f"INSERT INTO {c} SELECT id, cast(id AS STRING) FROM range({first}, {first + 10})"
        )
    before = len(table(object_store, clustered_s3).file_uris())
    spark.sql(f"OPTIMIZE {c}")
    after = table(object_store, clustered_s3)
    assert len(after.file_uris()) < before
    assert after.history(1)[0]["operation"] == "OPTIMIZE"
    assert [r[0] for r in rows_of(object_store, clustered_s3)] == list(range(40))


def added_by(store: _object_store.ObjectStore, s3: str, version: int) -> set[str]:
    """The data files ``version`` of the table at ``s3`` added."""
    before = set(
        DeltaTable(s3, version=version - 1, storage_options=store.storage_options).file_uris()
    )
    return (
        set(DeltaTable(s3, version=version, storage_options=store.storage_options).file_uris())
        - before
    )


# The small-DML shortcuts write in the driver's Python on purpose (a small DELETE/UPDATE's
# one-job route, a small MERGE's delta-rs route); off, DML runs as Spark jobs.
_DML_AS_SPARK_JOBS = {
    "spark.deltaflow.dml.localRewriteMaxBytes": "0",
    "spark.deltaflow.merge.nativeMaxSourceRows": "0",
}


def test_dml_as_spark_jobs_writes_with_the_jvm_writer_on_s3a(spark, object_store, uris):
    """DELETE, UPDATE and MERGE run as Spark jobs write their files with Spark's Parquet
    writer (``stage_native``) on S3A, not with the Python writer in Python workers."""
    uri, s3 = uris()
    frame(spark, 0, 30).repartition(2).write.format("delta").save(uri)
    with confs_set(spark, _DML_AS_SPARK_JOBS):
        spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 10 = 0")
        spark.sql(f"UPDATE delta.`{uri}` SET k = 'u' WHERE id % 10 = 1")
        frame(spark, 25, 10).createOrReplaceTempView("dml_changes")
        spark.sql(
            f"""MERGE INTO delta.`{uri}` t USING dml_changes s ON t.id = s.id
                WHEN MATCHED THEN UPDATE SET k = 'm'
                WHEN NOT MATCHED THEN INSERT *"""
        )
    operations = [h["operation"] for h in table(object_store, s3).history()]
    assert operations[:3] == ["MERGE", "UPDATE", "DELETE"]
    for version in (1, 2, 3):
        added = added_by(object_store, s3, version)
        assert added, (version, operations)
        assert all(_JVM_FILE.search(f) for f in added), (version, sorted(added))
    got = dict(rows_of(object_store, s3))
    assert sorted(got) == [i for i in range(35) if i % 10 != 0 or i >= 30]
    assert {got[i] for i in (1, 11, 21)} == {"u"}
    assert {got[i] for i in range(25, 30)} == {"m"}  # matched
    assert [got[i] for i in range(30, 35)] == [str(i % 3) for i in range(30, 35)]  # inserted


def test_optimize_and_vacuum_on_s3a(spark, object_store, uris):
    uri, s3 = uris()
    for first in range(0, 40, 10):
        frame(spark, first, 10).write.format("delta").mode("append").save(uri)
    before = len(table(object_store, s3).file_uris())
    assert before >= 4
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    after = table(object_store, s3)
    assert len(after.file_uris()) < before
    assert [r[0] for r in rows_of(object_store, s3)] == list(range(40))
    spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = false")
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    finally:
        spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = true")
    # Only the files the current version references remain under the table.
    listed = {
        info.path
        for info in _object_store.store_fs(object_store).get_file_info(
            pafs.FileSelector(s3.removeprefix("s3://"), recursive=True)
        )
        if info.path.endswith(".parquet")
    }
    current = {u.removeprefix("s3://") for u in table(object_store, s3).file_uris()}
    assert listed == current
    assert [r[0] for r in rows_of(object_store, s3)] == list(range(40))


def test_a_stream_with_its_checkpoint_on_s3a_restarts_exactly_once(spark, object_store, uris):
    source, _ = uris("src")
    sink, sink_s3 = uris("dst")
    checkpoint = uris("ckpt")[0]
    frame(spark, 0, 20).write.format("delta").save(source)

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(sink)
        )
        assert query.awaitTermination(300)
        assert query.exception() is None

    run()
    assert [r[0] for r in rows_of(object_store, sink_s3)] == list(range(20))
    version = table(object_store, sink_s3).version()
    run()  # nothing new: nothing committed
    assert table(object_store, sink_s3).version() == version
    frame(spark, 20, 5).write.format("delta").mode("append").save(source)
    run()
    assert [r[0] for r in rows_of(object_store, sink_s3)] == list(range(25))
    assert jvm_written(object_store, sink_s3)
    # The offsets and commits Spark wrote are on S3, read back by the second and third runs.
    commits = _object_store.store_fs(object_store).get_file_info(
        pafs.FileSelector(checkpoint.removeprefix("s3a://") + "/commits")
    )
    assert sorted(i.base_name for i in commits if not i.base_name.startswith(".")) == ["0", "1"]


def test_two_concurrent_writers_lose_no_commit(spark, object_store, uris):
    """Spark (JVM path, the brain's put-if-absent commit) and delta-rs append at once."""
    uri, s3 = uris()
    frame(spark, 0, 1).write.format("delta").save(uri)
    rounds = 4
    failures: list[BaseException] = []

    def by_delta_rs() -> None:
        try:
            for i in range(rounds):
                data = pa.table({"id": pa.array([1000 + i], pa.int64()), "k": ["r"]})
                write_deltalake(
                    s3, data, mode="append", storage_options=object_store.storage_options
                )
        except BaseException as failure:  # reported below, in the test's thread
            failures.append(failure)

    other = threading.Thread(target=by_delta_rs)
    other.start()
    for i in range(rounds):
        frame(spark, 100 + i, 1).write.format("delta").mode("append").save(uri)
    other.join(300)
    assert not other.is_alive()
    assert not failures, failures
    got = [r[0] for r in rows_of(object_store, s3)]
    assert sorted(got) == [0, *range(100, 100 + rounds), *range(1000, 1000 + rounds)]
    assert table(object_store, s3).version() == 2 * rounds


def test_credentials_come_from_fs_s3a_and_are_never_shown(spark, server, uris):
    """The server has no AWS variable: everything above ran on fs.s3a.* alone. A failing
    command's error names the problem, not the secret."""
    uri, _ = uris()
    missing = "s3a://no-such-bucket-" + uri.rsplit("-", 1)[1] + "/t"
    with pytest.raises(Exception) as caught:
        spark.read.format("delta").load(missing).collect()
    text = str(caught.value)
    assert "no-such-bucket" in text
    assert _object_store.SECRET_KEY not in text
    log = (server[1] / "server.log").read_text()
    assert _object_store.SECRET_KEY not in log


def test_routing_follows_the_schemes_the_driver_names(monkeypatch):
    """Without the connector's variable (no S3A on the driver, or
    spark.deltaflow.objectStore.jvmPath=false) object stores stay on the Python path."""
    from deltaflow.spark.read import _native

    def opens(listed: str | None, uri: str) -> bool:
        if listed is None:
            monkeypatch.delenv(_native.HADOOP_SCHEMES_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(_native.HADOOP_SCHEMES_VARIABLE, listed)
        _native.hadoop_object_stores.cache_clear()
        try:
            return _native.hadoop_opens(uri)
        finally:
            _native.hadoop_object_stores.cache_clear()

    assert not opens(None, "s3a://b/t")
    assert not opens("", "s3://b/t")
    assert opens("s3a,s3", "s3a://b/t") and opens("s3a,s3", "S3://b/t")
    assert not opens("s3a", "s3://b/t")
    assert not opens("s3a,s3", "gs://b/t")
    assert opens(None, "file:///tmp/t") and opens(None, "/tmp/t")


def test_the_python_path_on_demand(s3a_conf, object_store, uris, tmp_path):
    """``spark.deltaflow.objectStore.jvmPath=false``: S3A on the class path, yet s3a:// takes
    the Python data path (whose executors read the store through the AWS variables)."""
    from pyspark.sql.connect.session import SparkSession

    conf = {**s3a_conf, "spark.deltaflow.objectStore.jvmPath": "false"}
    saved = dict(os.environ)
    os.environ.update(object_store.env)
    try:
        process, port = start_connect_server(tmp_path, conf)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        wait_for_port(port, process, timeout=300)
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        try:
            uri, s3 = uris()
            # Written by delta-rs, and only planned here: the route is the brain's answer,
            # and the Python path's first run (its workers) is slow on a busy machine.
            data = pa.table({"id": pa.array(range(5), pa.int64())})
            write_deltalake(s3, data, storage_options=object_store.storage_options)
            plan = session.read.format("delta").load(uri)._explain_string()
            assert "BatchScan deltaflow_python" in plan, plan
            assert "DeltaScan" not in plan, plan
        finally:
            session.stop()
    finally:
        stop(process, tmp_path)


def test_replace_where_and_dynamic_overwrite_on_s3a(spark, object_store, uris):
    """Overwrites that replace part of a table, and change-feed reads, go through deltaflow's
    Python data source: its workers get the server's fs.s3a.* credentials too (no AWS_* in
    its environment), as the brain does."""
    uri, s3 = uris()
    (
        frame(spark, 0, 30)
        .write.format("delta")
        .partitionBy("k")
        .option("delta.enableChangeDataFeed", "true")
        .save(uri)
    )
    (
        frame(spark, 100, 6)
        .where("k = '1'")
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "k = '1'")
        .save(uri)
    )
    got = rows_of(object_store, s3)
    assert sorted(i for i, k in got if k == "1") == [100, 103]
    assert sorted(i for i, k in got if k != "1") == [i for i in range(30) if i % 3 != 1]
    (
        frame(spark, 200, 3)
        .where("k = '2'")
        .write.format("delta")
        .mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .save(uri)
    )
    got = rows_of(object_store, s3)
    assert sorted(i for i, k in got if k == "2") == [200]
    assert sorted(i for i, k in got if k == "1") == [100, 103]
    assert len([i for i, k in got if k == "0"]) == 10
    operations = [h["operation"] for h in table(object_store, s3).history()]
    assert operations[:2] == ["WRITE", "WRITE"]
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(uri)
        .where("_change_type = 'insert'")
    )
    assert sorted(r.id for r in changes.collect()) == [100, 103, 200]
