"""Direct writes on S3A: the tasks write final names under the table root, no staging.

One Spark Connect server per module (``local[2,2]``: a task may fail once), started from the
wheel with the S3A jars as in ``test_s3a.py``, against SeaweedFS. A watcher lists each test's
prefix while it runs: no ``_delta_staging/<job>`` or ``_temporary`` key may ever appear
(``deltaflow.write.directWrite`` is ``auto``: object stores write direct). Results are checked
with delta-rs directly against the store.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from tests import _object_store
from tests.spark.test_hosts import start_connect_server, stop, wait_for_port

pytestmark = pytest.mark.slow

# A direct write's names: part-<split>-<job>-s<split>-<uuid>-c<n>.snappy.parquet.
DIRECT_FILE = re.compile(
    r"(?:^|/)part-(\d{5})-([0-9a-f]{8})-s(\d+)-[0-9a-f-]{36}-c\d{3}\.snappy\.parquet$"
)
# A staged write's keys: its directory under _delta_staging (<job>-<uuid>) and Hadoop's
# committer's _temporary. (_delta_staging also holds leases and readers' marks: not data.)
STAGED_KEY = re.compile(r"/_delta_staging/[0-9a-f]{8}-[0-9a-f]{32}|/_temporary(/|$)")


@pytest.fixture(scope="module")
def s3a_conf(object_store: _object_store.ObjectStore) -> dict[str, str]:
    import deltaflow
    from tests import _s3a

    return _s3a.with_s3a(deltaflow.spark_conf(), _s3a.s3a_conf_or_skip(object_store))


@pytest.fixture(scope="module")
def server(s3a_conf: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    home = tmp_path_factory.mktemp("s3a_direct_server")
    conf = {
        **s3a_conf,
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    }
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        process, port = start_connect_server(home, conf, master="local[2,2]")
    finally:
        os.environ.update(saved)
    try:
        wait_for_port(port, process, timeout=300)
        yield port
    finally:
        print(stop(process, home)[-2000:])


@pytest.fixture(scope="module")
def spark(server: int) -> Iterator[Any]:
    from pyspark.sql.connect.session import SparkSession

    # getOrCreate: the active session too, which a client's udf() needs.
    session = SparkSession.builder.remote(f"sc://127.0.0.1:{server}").getOrCreate()
    yield session
    session.stop()


class StagingWatcher:
    """Lists everything under a prefix, over and over, until stopped; keeps staging keys."""

    def __init__(self, fs: pafs.FileSystem, prefix: str) -> None:
        self.fs, self.prefix = fs, prefix
        self.seen: set[str] = set()
        self.listings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(0.05)

    def scan(self) -> None:
        selector = pafs.FileSelector(self.prefix, recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError:
            return  # a key deleted mid-listing; the next round lists again
        self.seen.update(i.path for i in infos if STAGED_KEY.search(i.path))
        self.listings += 1

    def stop(self) -> set[str]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.scan()
        return self.seen


@pytest.fixture
def location(object_store: _object_store.ObjectStore) -> Iterator[Any]:
    """``make(name) -> (s3a_uri, s3_uri)`` of fresh table locations of this test, all under
    one prefix a watcher lists while the test runs; after it, no staged write's key was seen."""
    base = object_store.uri(f"direct-{os.urandom(4).hex()}")
    watcher = StagingWatcher(_object_store.store_fs(object_store), base.removeprefix("s3://"))

    def make(name: str) -> tuple[str, str]:
        s3 = f"{base}/{name}"
        return "s3a://" + s3.removeprefix("s3://"), s3

    yield make
    seen = watcher.stop()
    assert watcher.listings > 1
    assert not seen, f"staging keys were listed: {sorted(seen)[:5]}"


def table(store: _object_store.ObjectStore, uri: str) -> DeltaTable:
    return DeltaTable(uri, storage_options=store.storage_options)


def rows_of(store: _object_store.ObjectStore, uri: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in table(store, uri).to_pyarrow_table().to_pylist())


def log_files(store: _object_store.ObjectStore, uri: str) -> list[str]:
    # The log's paths are percent-encoded (Delta protocol); the stored keys are not.
    return [unquote(str(p)) for p in add_actions(store, uri).column("path").to_pylist()]


def add_actions(store: _object_store.ObjectStore, uri: str) -> pa.Table:
    return pa.table(table(store, uri).get_add_actions(flatten=True))


def assert_direct_names(store: _object_store.ObjectStore, uri: str) -> set[str]:
    """Every file of the current version has a direct write's name; the job ids."""
    files = log_files(store, uri)
    assert files
    matches = [DIRECT_FILE.search(f) for f in files]
    assert all(matches), files
    return {m.group(2) for m in matches if m}


def data_keys(store: _object_store.ObjectStore, s3: str) -> set[str]:
    """The Parquet keys under a table, relative to its root."""
    root = s3.removeprefix("s3://")
    selector = pafs.FileSelector(root, recursive=True)
    return {
        i.path[len(root) + 1 :]
        for i in _object_store.store_fs(store).get_file_info(selector)
        if i.path.endswith(".parquet") and "/_delta_log/" not in i.path
    }


def frame(spark: Any, first: int, count: int) -> Any:
    return spark.range(first, first + count).selectExpr("id", "cast(id % 3 as string) AS k")


def test_batch_writes_go_direct(spark, object_store, location):
    uri, s3 = location("plain")
    frame(spark, 0, 100).write.format("delta").save(uri)
    (job,) = assert_direct_names(object_store, s3)
    frame(spark, 100, 50).write.format("delta").mode("append").save(uri)
    assert [r[0] for r in rows_of(object_store, s3)] == list(range(150))
    jobs = assert_direct_names(object_store, s3)
    assert len(jobs) == 2 and job in jobs
    # Each commit's files carry that commit's job id, and are exactly what is stored.
    assert data_keys(object_store, s3) == set(log_files(object_store, s3))
    frame(spark, 500, 10).write.format("delta").mode("overwrite").save(uri)
    assert [r[0] for r in rows_of(object_store, s3)] == list(range(500, 510))
    assert len(assert_direct_names(object_store, s3)) == 1


def test_partitioned_writes_go_direct(spark, object_store, location):
    uri, s3 = location("parted")
    frame(spark, 0, 60).write.format("delta").partitionBy("k").save(uri)
    frame(spark, 60, 30).write.format("delta").partitionBy("k").mode("append").save(uri)
    rows = rows_of(object_store, s3)
    assert sorted(r[0] for r in rows) == list(range(90))
    assert all(k == str(i % 3) for i, k in rows)
    assert_direct_names(object_store, s3)
    # Files sit in Spark's Hive-style directories, which agree with the logged values.
    actions = add_actions(object_store, s3).to_pylist()
    assert {a["path"].split("/")[0] for a in actions} == {"k=0", "k=1", "k=2"}
    assert all(a["path"].startswith(f"k={a['partition.k']}/") for a in actions)
    # Values Spark cannot tell apart in a directory name keep their mark there; the log
    # has them exactly.
    spark.createDataFrame([(100, ""), (101, None)], "id long, k string").write.format("delta").mode(
        "append"
    ).save(uri)
    rows = rows_of(object_store, s3)
    assert (100, None) in rows and (101, None) in rows  # "" is null, as on the staged path
    assert data_keys(object_store, s3) == set(log_files(object_store, s3))


def test_a_stream_writes_direct_exactly_once(spark, object_store, location):
    source, _ = location("src")
    sink, sink_s3 = location("dst")
    checkpoint = location("ckpt")[0]
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
    version = table(object_store, sink_s3).version()
    run()  # nothing new, nothing committed
    assert table(object_store, sink_s3).version() == version
    frame(spark, 20, 5).write.format("delta").mode("append").save(source)
    run()
    assert [r[0] for r in rows_of(object_store, sink_s3)] == list(range(25))
    assert len(assert_direct_names(object_store, sink_s3)) == 2  # one job per micro-batch
    assert data_keys(object_store, sink_s3) == set(log_files(object_store, sink_s3))


def test_dml_rewrites_go_direct(spark, object_store, location):
    uri, s3 = location("dml")
    frame(spark, 0, 30).write.format("delta").save(uri)
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 10")
    spark.sql(f"UPDATE delta.`{uri}` SET k = 'u' WHERE id >= 25")
    got = dict(rows_of(object_store, s3))
    assert sorted(got) == list(range(10, 30))
    assert {got[i] for i in range(25, 30)} == {"u"}
    # Whichever writer the rewrite takes, nothing is staged (the watcher) and the table
    # holds exactly its logged files once VACUUM removed the rewritten ones.
    spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    assert data_keys(object_store, s3) == set(log_files(object_store, s3))


def test_a_failed_task_attempt_leaves_nothing_in_the_log(
    spark, object_store, location, monkeypatch
):
    """Attempt 0 of one task fails after it wrote files (small files, a failure on its last
    row); the retry succeeds: rows exact, every logged file from one job, and after VACUUM
    with retention 0 the table holds exactly the logged files."""
    uri, s3 = location("retry")
    last = 19_999

    def fail_first_attempt(i: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        if i == last and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("attempt 0 fails after writing")
        return i

    # A Connect client's udf: pyspark routes udf() by this variable.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    from pyspark.sql.functions import udf

    failing = udf(fail_first_attempt, "long")
    df = spark.range(0, last + 1, 1, 2).select(failing("id").alias("id"))
    df.write.format("delta").option("maxRecordsPerFile", 2000).save(uri)
    ids = [r[0] for r in rows_of(object_store, s3)]
    assert ids == list(range(last + 1))
    assert len(assert_direct_names(object_store, s3)) == 1
    spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    assert data_keys(object_store, s3) == set(log_files(object_store, s3))


def test_rolled_files_upload_in_the_background_and_are_logged_whole(spark, object_store, location):
    """Many files a task (``maxRecordsPerFile``), so each task closes, that is uploads, most
    of its files in the background while it writes the next: every file the log names is
    stored whole (the logged size is the object's), rows are exact, batch, partitioned and
    streamed alike."""
    uri, s3 = location("rolled")
    spark.range(0, 20_000, 1, 2).selectExpr("id", "cast(id % 3 as string) AS k").write.format(
        "delta"
    ).option("maxRecordsPerFile", 1000).save(uri)
    parted, parted_s3 = location("rolled_parted")
    spark.range(0, 9_000, 1, 2).selectExpr("id", "cast(id % 3 as string) AS k").write.format(
        "delta"
    ).partitionBy("k").option("maxRecordsPerFile", 1000).save(parted)
    sink, sink_s3 = location("rolled_stream")
    query = (
        spark.readStream.format("delta")
        .load(uri)
        .writeStream.format("delta")
        .option("checkpointLocation", location("rolled_ckpt")[0])
        .option("maxRecordsPerFile", 1000)
        .trigger(availableNow=True)
        .start(sink)
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    fs = _object_store.store_fs(object_store)
    # The stream's own commit is version 0 (auto compaction may commit after it).
    for s3_uri, count, least_files, version in (
        (s3, 20_000, 20, None),
        (parted_s3, 9_000, 9, None),
        (sink_s3, 20_000, 20, 0),
    ):
        assert [r[0] for r in rows_of(object_store, s3_uri)] == list(range(count)), s3_uri
        written = table(object_store, s3_uri)
        if version is not None:
            written.load_as_version(version)
        actions = pa.table(written.get_add_actions(flatten=True)).to_pylist()
        assert len(actions) >= least_files, (s3_uri, len(actions))
        root = s3_uri.removeprefix("s3://")
        for action in actions:
            stored = fs.get_file_info(f"{root}/{unquote(action['path'])}")
            assert stored.size == action["size_bytes"], (action["path"], stored.size, action)
        assert {unquote(a["path"]) for a in actions} <= data_keys(object_store, s3_uri)
