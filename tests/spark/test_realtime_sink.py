"""The Delta sink in Spark's real-time mode (``trigger(realTime=...)``, Spark >= 4.1):
rows land in the table within the epoch, every commit interval, exactly once across a
task failure and a restart mid-epoch; what the sink cannot replay is refused typed.

The source is Spark's own real-time memory stream (``LowLatencyMemoryStream``), reached
through the JVM: its rows live in the driver, so a restart gets a new stream fed the same
rows in the same order, which is what a durable source (Kafka, Delta) replays. The table
is read with delta-rs while the query runs: the epoch's long-running tasks hold the
session's cores, so a Spark read would wait for the epoch to end.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.errors import InvalidOptionError
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.spark.errors import RealTimeModeError
from deltaflow.table.errors import UnsupportedFeatureError
from tests._waiting import wait_until
from tests.spark._conf import conf_set

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

_names = itertools.count()
# An epoch far longer than any test: every commit seen below was made inside it.
EPOCH = "5 minutes"
ALLOWLIST = "spark.sql.streaming.realTimeMode.allowlistCheck"
_SOURCES = "org.apache.spark.sql.execution.streaming.sources"


@pytest.fixture(scope="module", autouse=True)
def real_time_session(spark) -> Any:
    # Spark's sink allowlist names only its own sinks (see docs/realtime.md); the
    # connector checks the query's operators itself.
    with conf_set(spark, ALLOWLIST, "false"):
        yield


class MemoryStream:
    """Spark's real-time memory source over two partitions, fed from the test."""

    def __init__(self, spark: Any) -> None:
        jvm = spark._jvm
        cls = getattr(jvm, f"{_SOURCES}.LowLatencyMemoryStream")
        self._jvm = jvm
        self._stream = cls.apply(spark._jsparkSession, 2, jvm.org.apache.spark.sql.Encoders.INT())
        self.spark = spark

    def add(self, values: list[int]) -> None:
        self._stream.addData(self._jvm.org.apache.spark.api.python.PythonUtils.toSeq(values))

    def frame(self) -> Any:
        from pyspark.sql import DataFrame

        return DataFrame(self._stream.toDF(), self.spark).selectExpr("value AS id")


def new_table(spark: Any, properties: str = "") -> tuple[str, str]:
    name = f"realtime_{next(_names)}"
    spark.sql(f"CREATE TABLE {name} (id INT) USING delta {properties}")
    location = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"]
    return name, str(location).removeprefix("file:")


def start(frame: Any, name: str, checkpoint: str, **options: str) -> Any:
    writer = (
        frame.writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        # No asyncProgressTrackingEnabled: the connector turns Spark's real-time default
        # for it off when a real-time query into Delta starts (StreamTriggerCheck).
        .options(**options)
    )
    return real_time(writer, EPOCH).toTable(name)


def real_time(writer: Any, epoch: str) -> Any:
    """``writer.trigger(realTime=epoch)``; PySpark 4.1 and 4.2 have that trigger only in
    Scala (``Trigger.RealTime``), reached here through the JVM."""
    if "realTime" in inspect.signature(writer.trigger).parameters:
        return writer.trigger(realTime=epoch)
    trigger = writer._spark._jvm.org.apache.spark.sql.streaming.Trigger.RealTime(epoch)
    writer._jwrite = writer._jwrite.trigger(trigger)
    return writer


def ids(location: str) -> list[int]:
    return sorted(DeltaTable(location).to_pyarrow_table().column("id").to_pylist())


def wait_for_rows(location: str, query: Any, count: int) -> None:
    def landed() -> bool:
        assert query.exception() is None, query.exception()
        return len(ids(location)) >= count

    wait_until(landed, 120, f"{count} rows in {location}")


def test_rows_land_within_the_epoch_exactly_once_across_a_restart(spark, table_path) -> None:
    name, location = new_table(spark)
    checkpoint = table_path("ck")
    source = MemoryStream(spark)
    query = start(source.frame(), name, checkpoint, realTimeCommitIntervalMs="20")
    try:
        for start_at in range(0, 30, 10):
            source.add(list(range(start_at, start_at + 10)))
            wait_for_rows(location, query, start_at + 10)
        # Still the first epoch: Spark has committed no batch, the table has every row.
        assert query.lastProgress is None
        assert ids(location) == list(range(30))
    finally:
        query.stop()

    history = DeltaTable(location).history()
    streamed = [h for h in history if h.get("operation") == "STREAMING UPDATE"]
    assert len(streamed) >= 2  # more than one commit inside one epoch

    # The restart replays epoch 0 from its start offsets: the same rows, then new ones.
    again = MemoryStream(spark)
    for start_at in range(0, 30, 10):
        again.add(list(range(start_at, start_at + 10)))
    again.add(list(range(30, 40)))
    query = start(again.frame(), name, checkpoint)
    try:
        wait_for_rows(location, query, 40)
        assert ids(location) == list(range(40))
    finally:
        query.stop()
    assert ids(location) == list(range(40))


def test_auto_compaction_of_the_small_files_never_fails_the_stream(spark, table_path) -> None:
    name, location = new_table(spark, "TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')")
    source = MemoryStream(spark)
    key = "spark.databricks.delta.autoCompact.minNumFiles"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "3")
    try:
        query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="10")
        try:
            for start_at in range(0, 60, 6):
                source.add(list(range(start_at, start_at + 6)))
                wait_for_rows(location, query, start_at + 6)
            assert query.exception() is None
        finally:
            query.stop()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    assert ids(location) == list(range(60))
    operations = [h.get("operation") for h in DeltaTable(location).history()]
    assert "OPTIMIZE" in operations, operations
    assert len(DeltaTable(location).file_uris()) < operations.count("STREAMING UPDATE")


def failing_at_25(frame: Any, marker: str, *columns: str) -> Any:
    """``frame`` (its ``id`` and ``columns``) whose row 25 raises the first time it is
    evaluated in this JVM: that evaluation sets the system property ``marker``. ``reflect``
    returns the *string* ``'null'`` for setProperty's null (no previous value), never SQL
    NULL: an ``IS NULL`` test there never raises."""
    return frame.selectExpr(
        f"CASE WHEN id = 25 AND reflect('java.lang.System', 'setProperty', '{marker}', 'x')"
        " = 'null' THEN CAST(raise_error('injected failure') AS INT) ELSE id END AS id",
        *columns,
    )


def test_a_task_failure_mid_epoch_fails_the_query_and_its_restart_adds_no_duplicates(
    spark, table_path
) -> None:
    # On local[N] Spark gives a task one attempt (maxTaskFailures = 1): the failure aborts
    # the epoch's job and ends the query; the restart replays the epoch from the log's counts.
    name, location = new_table(spark)
    checkpoint = table_path("ck")
    marker = f"deltaflow.test.realtime.failed.{next(_names)}"
    source = MemoryStream(spark)
    query = start(failing_at_25(source.frame(), marker), name, checkpoint)
    try:
        source.add(list(range(20)))
        wait_for_rows(location, query, 20)
        source.add(list(range(20, 40)))
        wait_until(lambda: not query.isActive, 120, "the query to fail at row 25")
    finally:
        query.stop()
    assert spark._jvm.java.lang.System.getProperty(marker) == "x"  # the failure happened
    assert "injected failure" in str(query.exception())
    before = ids(location)
    assert len(before) == len(set(before)) and set(range(20)) <= set(before) < set(range(40))

    again = MemoryStream(spark)
    again.add(list(range(20)))
    again.add(list(range(20, 40)))
    query = start(failing_at_25(again.frame(), marker), name, checkpoint)
    try:
        wait_for_rows(location, query, 40)
        assert ids(location) == list(range(40))
    finally:
        query.stop()
    assert ids(location) == list(range(40))


def test_a_task_failure_is_retried_inside_the_epoch_where_spark_retries_tasks(
    tmp_path,
) -> None:
    # local[2,2] (as a cluster's spark.task.maxFailures): the failed task's second attempt
    # runs in the same job, against the same driver endpoint; it skips the rows its
    # partition already committed, and the query goes on.
    from tests.spark._result_job import run_result_job

    result, stderr = run_result_job("_realtime_retry_job.py", str(tmp_path), cwd=tmp_path)
    assert result["failed"] and result["error"] is None and result["active"], result
    assert result["ids"] == list(range(40))
    assert "aborting job" not in stderr, stderr[-4000:]


def test_a_retry_past_the_epoch_deadline_fails_the_epoch_and_the_restart_adds_no_duplicates(
    tmp_path,
) -> None:
    # local[2,2]: a task fails only after the epoch's deadline (fixed once for every
    # attempt), so its retry reads no row, while the failed attempt's rolls are committed.
    # Without the epoch-end check the next epoch read those rows again and the table held
    # them twice (12 duplicates); now the epoch fails typed before Spark records its
    # offsets, and the restart replays it.
    from tests.spark._result_job import run_result_job

    result, _ = run_result_job("_realtime_retry_job.py", str(tmp_path), "short", cwd=tmp_path)
    assert result["failed"], result
    assert result["typed"] == "RealTimeEpochError", result
    fields = result["fields"]
    assert fields["rows"] < fields["visible"], fields
    assert "restart the query" in result["error"], result["error"]
    assert result["ids"] == list(range(40)), result["ids"]


def test_a_shuffle_from_several_source_partitions_is_refused_typed(spark, table_path) -> None:
    if PYSPARK_MINOR < (4, 3):
        pytest.skip("Spark < 4.3 refuses dropDuplicates in real-time mode itself")
    name, location = new_table(spark)
    source = MemoryStream(spark)
    query = start(source.frame().dropDuplicates(["id"]), name, table_path("ck"))
    try:
        source.add([1, 2])
        wait_until(lambda: query.exception() is not None, 120, "the query to fail")
    finally:
        query.stop()
    error = deltaflow.typed_error(query.exception())
    assert isinstance(error, UnsupportedFeatureError)
    assert error.feature == "realTimeSinkOperators"
    # Spark's memory stream plans two partitions: several producers into the shuffle
    # (one producer is allowed: tests/spark/test_realtime_dedup.py).
    assert error.operators == "Exchange from 2 source partitions", error.operators
    assert "at least once" in str(error)
    assert ids(location) == []


def test_a_commit_interval_out_of_bounds_is_refused_typed(spark, table_path) -> None:
    # A catalog table's streaming write reads its options when the first epoch starts.
    name, location = new_table(spark)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="1")
    try:
        wait_until(lambda: query.exception() is not None, 120, "the query to fail")
    finally:
        query.stop()
    error = deltaflow.typed_error(query.exception())
    assert isinstance(error, InvalidOptionError)
    assert error.option == "realTimeCommitIntervalMs"
    assert ids(location) == []


def test_delta_to_delta_in_real_time(spark, table_path) -> None:
    # The Delta source's real-time mode (issue 28 part 1) into the Delta sink.
    source = table_path("src")
    write_deltalake(source, pa.table({"id": pa.array([0], pa.int32())}))
    name, location = new_table(spark)
    query = start(spark.readStream.format("delta").load(source), name, table_path("ck"))
    try:
        wait_for_rows(location, query, 1)
        for i in range(1, 4):
            write_deltalake(source, pa.table({"id": pa.array([i], pa.int32())}), mode="append")
            wait_for_rows(location, query, i + 1)
        assert query.lastProgress is None  # all inside the first epoch
    finally:
        query.stop()
    assert ids(location) == [0, 1, 2, 3]


def test_start_path_is_refused_typed_and_a_path_table_name_runs(spark, table_path) -> None:
    # start(path) runs Spark's V1 sink, which real-time mode cannot run: refused at
    # start(), naming toTable("delta.`<path>`"), which runs the table's real-time write.
    _, location = new_table(spark)
    source = MemoryStream(spark)
    writer = real_time(
        source.frame()
        .writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", table_path("ck")),
        EPOCH,
    )
    with pytest.raises(Exception) as raised:
        writer.start(location)
    error = deltaflow.typed_error(raised.value)
    assert isinstance(error, RealTimeModeError), raised.value
    assert error.feature == "startPath"
    assert error.table_uri.rstrip("/").endswith(location.rstrip("/"))

    query = real_time(
        source.frame()
        .writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", table_path("ck2")),
        EPOCH,
    ).toTable(f"delta.`{location}`")
    try:
        source.add([1, 2, 3])
        wait_for_rows(location, query, 3)
    finally:
        query.stop()
    assert ids(location) == [1, 2, 3]


def test_spark_s_sink_allowlist_refusal_is_typed(spark, table_path) -> None:
    # Spark checks a real-time sink against its own list inside start(), before the
    # connector sees the trigger: deltaflow.typed_error names the setting to change.
    name, _ = new_table(spark)
    source = MemoryStream(spark)
    with conf_set(spark, ALLOWLIST, "true"), pytest.raises(Exception) as raised:
        start(source.frame(), name, table_path("ck"))
    error = deltaflow.typed_error(raised.value)
    assert isinstance(error, RealTimeModeError), raised.value
    assert error.feature == "allowlistCheck"
    assert ALLOWLIST in str(error)


def test_the_async_progress_default_is_set_only_when_unset(spark, table_path) -> None:
    # The connector sets Spark's real-time default for asynchronous progress tracking (Spark
    # 4.3+) to false when a real-time query into Delta starts, and leaves a user's own value
    # alone.
    key = "spark.sql.streaming.realTimeMode.asyncProgressTrackingByDefault.enabled"
    name, location = new_table(spark)
    source = MemoryStream(spark)
    spark.conf.unset(key)
    query = start(source.frame(), name, table_path("ck"))
    try:
        assert spark.conf.get(key) == "false"
        source.add([7])
        wait_for_rows(location, query, 1)
    finally:
        query.stop()
    if PYSPARK_MINOR < (4, 3):  # Spark 4.1 and 4.2 have no such default (async is off)
        spark.conf.unset(key)
        return
    with conf_set(spark, key, "true"):
        with pytest.raises(Exception) as raised:
            start(MemoryStream(spark).frame(), name, table_path("ck2"))
        assert spark.conf.get(key) == "true"
    assert "async" in str(raised.value).lower()
    spark.conf.unset(key)


def _sink_commits(location: str) -> list[tuple[int, list[dict[str, Any]]]]:
    """The commit timestamp (ms) and txn actions of each STREAMING UPDATE commit in the
    table's log, in order."""
    import json
    from pathlib import Path

    commits = []
    for path in sorted(Path(location, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if info.get("operation") == "STREAMING UPDATE":
            commits.append((int(info["timestamp"]), [a["txn"] for a in actions if "txn" in a]))
    return commits


# CommitPacing.Burst in jvm/.../CommitPacing.scala: commits a query may make back to back.
COMMIT_BURST = 3


def test_commits_are_capped_by_the_interval_and_gather_every_partition(spark, table_path) -> None:
    # Writers hand a roll over when it is ready, and close it just before the driver's next
    # commit may start: rolls of both partitions that wait for that start go in one commit
    # (each partition's app transaction once). The interval caps the commit rate: after a
    # burst of COMMIT_BURST, one commit per interval.
    interval = 1500
    name, location = new_table(spark)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs=str(interval))
    try:
        for round_ in range(COMMIT_BURST + 2):
            source.add(list(range(20 * round_, 20 * round_ + 20)))
            wait_for_rows(location, query, 20 * round_ + 20)
    finally:
        query.stop()
    assert ids(location) == list(range(20 * (COMMIT_BURST + 2)))
    commits = _sink_commits(location)
    assert len(commits) >= COMMIT_BURST + 2, commits
    for _, txns in commits:
        apps = [t["appId"] for t in txns]
        assert len(apps) == len(set(apps)), apps  # one roll per partition per commit
    assert any(
        {t["appId"].rsplit("/", 1)[1] for t in txns} == {"rtm-p0", "rtm-p1"} for _, txns in commits
    ), commits
    # n commits span at least (n - burst) intervals. A commit's timestamp comes after its
    # plan, which a loaded machine can stretch: a second of slack, still far below what
    # back-to-back commits would show (the whole run takes ~3 s with pacing, ~0.5 s without).
    stamps = [stamp for stamp, _ in commits]
    for first, later in itertools.combinations(range(len(stamps)), 2):
        floor = (later - first - COMMIT_BURST + 1) * interval - 1000
        assert stamps[later] - stamps[first] >= floor, (first, later, stamps)
    # And it is a cap, not a spacing: the fresh query's first commits went back to back (a
    # burst soon after a commit goes at once while the bucket holds a commit).
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    assert min(gaps) < interval // 2, stamps


def test_rows_are_committed_when_ready_not_at_an_interval_boundary(spark, table_path) -> None:
    # A fresh query's first rows go at once: the interval (10 s here) only spaces commits,
    # it is no clock the rows wait for (a boundary every 10 s would hold them 5 s on average).
    name, location = new_table(spark)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="10000")
    try:
        source.add(list(range(20)))
        wait_until(lambda: len(ids(location)) >= 1, 3, "the first rows, well within 10 s")
        wait_for_rows(location, query, 20)
        assert query.exception() is None
    finally:
        query.stop()
    assert ids(location) == list(range(20))


def _staged(location: str) -> list[str]:
    """Every file and directory under the table's staging directory, relative to it."""
    from pathlib import Path

    root = Path(location, "_delta_staging")
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_rolls_are_opened_ahead_without_crc_files_and_none_is_left_behind(
    spark, table_path
) -> None:
    # The next roll is opened ahead of its first row (off the row path), through a local
    # file system that writes no .crc; a roll opened ahead and never used is deleted when
    # the task ends.
    name, location = new_table(spark)
    source = MemoryStream(spark)
    query = start(source.frame(), name, table_path("ck"), realTimeCommitIntervalMs="50")
    seen: set[str] = set()
    try:
        source.add(list(range(20)))
        wait_for_rows(location, query, 20)

        def opened_ahead() -> bool:
            # Both partitions started a roll and then handed it over: each now holds a
            # roll opened ahead, with its Parquet file open and no row in it.
            staged = _staged(location)
            seen.update(staged)
            return sum(1 for s in staged if s.endswith(".parquet")) >= 2

        wait_until(opened_ahead, 60, "rolls opened ahead in the staging directory")
        source.add(list(range(20, 40)))
        wait_for_rows(location, query, 40)
        seen.update(_staged(location))
    finally:
        query.stop()
    assert ids(location) == list(range(40))
    assert not [s for s in seen if s.endswith(".crc")], seen
    assert not [s for s in _staged(location) if "-e0-" in s], _staged(location)


def test_the_rolls_file_system_keeps_permissions_without_a_fork(spark, tmp_path) -> None:
    import os
    import stat

    jvm = spark._jvm
    forkless = jvm.org.apache.spark.sql.deltaflow.ForklessLocalFileSystem
    conf = jvm.org.apache.hadoop.conf.Configuration()
    assert forkless.use(conf, f"file:{tmp_path}/roll")
    path = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/roll/part-0.parquet")
    fs = path.getFileSystem(conf)
    assert fs.getClass().getSimpleName() == "ForklessLocalFileSystem"
    fs.create(path).close()  # Hadoop's default file mode: 0666 less the 022 umask
    directory = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/private")
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    assert fs.mkdirs(directory, permission("750"))
    assert stat.S_IMODE(os.stat(tmp_path / "roll" / "part-0.parquet").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o750
    assert sorted(os.listdir(tmp_path / "roll")) == ["part-0.parquet"]  # no .crc

    # Object stores, HDFS and a file system the user chose for file: are left alone.
    assert not forkless.use(jvm.org.apache.hadoop.conf.Configuration(), "s3a://bucket/t")
    chosen = jvm.org.apache.hadoop.conf.Configuration()
    chosen.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
    assert not forkless.use(chosen, f"file:{tmp_path}/roll")
    assert chosen.get("fs.file.impl") == "org.apache.hadoop.fs.RawLocalFileSystem"
