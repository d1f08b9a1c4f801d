"""The Delta source in Spark's real-time mode (``trigger(realTime=...)``, Spark 4.1+), and
the continuous trigger's typed refusal.

Rows are committed by Spark batch writes while a real-time query runs; they reach a
``foreach`` sink (one of the sinks real-time mode allows), which appends each row to a file
of its own per epoch. Waits are on conditions with deadlines, never on timing.
"""

from __future__ import annotations

import inspect
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from deltaflow.errors import InvalidOptionError, typed_error
from deltaflow.spark.errors import SourceSchemaChangedError, UnsupportedTriggerError
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark._result_job import run_result_job

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
HAS_REAL_TIME = tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 1)
needs_real_time = pytest.mark.skipif(
    not HAS_REAL_TIME, reason="Spark's real-time mode came with Spark 4.1"
)
# An epoch: how often the query checkpoints. Python's foreach sink hands rows to its
# Python worker in batches, so short epochs keep the tests short.
EPOCH = "2 seconds"
MIN_EPOCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"
WAIT = 90.0


@pytest.fixture(scope="module", autouse=True)
def short_epochs(spark: Any) -> Iterator[None]:
    """Spark's floor on the epoch length (5 s) lowered for this module, then restored."""
    with conf_set(spark, MIN_EPOCH_CONF, "1000"):
        yield


class FileSink:
    """A foreach writer: each attempt at an epoch's rows of a partition as JSON lines in a
    file of its own, named so that the latest attempt sorts last."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def open(self, partition_id: int, epoch_id: int) -> bool:
        name = f"{epoch_id:08d}-{partition_id}-{time.time_ns()}-{uuid.uuid4().hex}.jsonl"
        self.out = open(os.path.join(self.folder, name), "a")  # noqa: SIM115
        return True

    def process(self, row: Any) -> None:
        self.out.write(json.dumps(row.asDict()) + "\n")
        self.out.flush()

    def close(self, error: BaseException | None) -> None:
        self.out.close()


def received(folder: Path, checkpoint: str | None = None) -> list[int]:
    """Every id the sink received, sorted: of an epoch Spark ran again (a query stopped
    before the epoch was checkpointed), the last attempt, as a foreach writer that is
    idempotent by epoch id keeps it. Given the query's ``checkpoint``, only the epochs it
    committed: a later attempt of an uncommitted epoch would replace that epoch's rows."""
    committed = max(committed_epochs(checkpoint), default=-1) if checkpoint else None
    latest: dict[tuple[str, str], str] = {}
    for name in sorted(os.listdir(folder)):
        epoch, partition, _ = name.split("-", 2)
        if committed is None or int(epoch) <= committed:
            latest[(epoch, partition)] = name
    ids: list[int] = []
    for name in latest.values():
        with open(folder / name) as f:
            ids += [json.loads(line)["id"] for line in f if line.strip()]
    return sorted(ids)


def committed_epochs(checkpoint: str) -> list[int]:
    """The ids of the epochs the checkpoint's commit log holds."""
    commits = Path(checkpoint) / "commits"
    return [int(n) for n in os.listdir(commits) if n.isdigit()] if commits.is_dir() else []


def append(spark: Any, path: str, ids: list[int]) -> None:
    """One commit of ``ids`` by Spark's batch writer."""
    df = spark.createDataFrame([(i,) for i in ids], "id long")
    df.coalesce(1).write.format("delta").mode("append").save(path)


def version_of(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).version()


def real_time(writer: Any, epoch: str) -> Any:
    """``writer.trigger(realTime=epoch)``; pyspark 4.1 lacks the argument (its JVM has the
    trigger), so there it is set on the JVM writer."""
    if "realTime" in inspect.signature(writer.trigger).parameters:
        return writer.trigger(realTime=epoch)
    jvm = writer._spark._jvm
    writer._jwrite = writer._jwrite.trigger(
        jvm.org.apache.spark.sql.streaming.Trigger.RealTime(epoch)
    )
    return writer


def start(
    spark: Any,
    source: str,
    checkpoint: str,
    out: Path,
    epoch: str = EPOCH,
    where: str = "true",
    **options: str,
) -> Any:
    out.mkdir(exist_ok=True)
    writer = (
        spark.readStream.format("delta")
        .options(**options)
        .load(source)
        .where(where)
        .writeStream.foreach(FileSink(str(out)))
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
    )
    return real_time(writer, epoch).start()


def wait_for(out: Path, expected: list[int], query: Any, checkpoint: str | None = None) -> None:
    """Until the sink holds as many rows as ``expected``, then that it holds exactly them.
    After a restart pass the ``checkpoint``: the stopped query's last, uncommitted epoch
    may hold rows its re-run replaces, so only committed epochs count."""
    got: list[int] = []

    def arrived() -> bool:
        nonlocal got
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        got = received(out, checkpoint)
        return len(got) >= len(expected)

    wait_until(arrived, WAIT, f"{len(expected)} rows in the foreach sink")
    assert got == sorted(expected)


def end_offsets(checkpoint: str) -> list[dict[str, Any]]:
    """The source's end offset of each epoch the checkpoint committed (its offset log
    entry: a version line, the query's metadata, then one offset per source)."""
    ends = []
    for epoch in committed_epochs(checkpoint):
        offsets = Path(checkpoint) / "offsets" / str(epoch)
        if offsets.is_file():
            ends.append(json.loads(offsets.read_text().splitlines()[2]))
    return ends


def wait_for_epoch_past(checkpoint: str, version: int) -> None:
    """Until an epoch whose end offset is past commit ``version`` is checkpointed."""

    def past() -> bool:
        return any(
            end.get("reservoirVersion", -1) > version and "rowsOfNextFile" not in end
            for end in end_offsets(checkpoint)
        )

    wait_until(past, WAIT, f"an epoch checkpointed past version {version}")


@pytest.mark.slow
@needs_real_time
def test_committed_rows_reach_a_foreach_sink(spark, table_path, tmp_path, stopping) -> None:
    source = table_path("src")
    append(spark, source, [0, 1, 2])
    out = tmp_path / "out"
    query = start(spark, source, str(tmp_path / "ck"), out)
    stopping.append(query)
    wait_for(out, [0, 1, 2], query)  # the snapshot
    for batch in ([10, 11], [20], [30, 31, 32]):
        append(spark, source, batch)  # a commit each, while the epoch runs
    wait_for(out, [0, 1, 2, 10, 11, 20, 30, 31, 32], query)
    assert "DeltaSource" in query.lastProgress["sources"][0]["description"]


@pytest.mark.slow
@needs_real_time
def test_restart_from_checkpoint_loses_and_repeats_nothing(
    spark, table_path, tmp_path, stopping
) -> None:
    source, checkpoint = table_path("src"), str(tmp_path / "ck")
    append(spark, source, [0, 1])
    out = tmp_path / "out"
    first = start(spark, source, checkpoint, out)
    stopping.append(first)
    append(spark, source, [2, 3])
    wait_for(out, [0, 1, 2, 3], first)
    wait_for_epoch_past(checkpoint, version_of(source))
    first.stop()
    append(spark, source, [4, 5])  # while the query is down
    again = start(spark, source, checkpoint, out)
    stopping.append(again)
    append(spark, source, [6])
    wait_for(out, [0, 1, 2, 3, 4, 5, 6], again, checkpoint)


@pytest.mark.slow
@needs_real_time
def test_a_schema_change_mid_stream_fails_typed_and_a_restart_reads_on(
    spark, table_path, tmp_path, stopping
) -> None:
    # As delta-spark's DELTA_SCHEMA_CHANGED_WITH_VERSION: the query stops at the commit
    # that changed the schema; a restart reads on with the new one, losing and repeating
    # no row.
    source, checkpoint, out = table_path("src"), str(tmp_path / "ck"), tmp_path / "out"
    append(spark, source, [0, 1])
    first = start(spark, source, checkpoint, out)
    stopping.append(first)
    wait_for(out, [0, 1], first)
    wait_for_epoch_past(checkpoint, version_of(source))
    spark.sql(f"ALTER TABLE delta.`{source}` ADD COLUMNS (w STRING)")
    changed = version_of(source)
    spark.sql(f"INSERT INTO delta.`{source}` VALUES (2, 'x')")
    wait_until(lambda: not first.isActive, WAIT, "the query to fail")
    error = typed_error(first.exception())
    assert isinstance(error, SourceSchemaChangedError), first.exception()
    assert (error.version, error.additive) == (changed, True)
    assert f"Version {changed}" in str(error) and "Restart the query" in str(error)
    again = start(spark, source, checkpoint, out)
    stopping.append(again)
    wait_for(out, [0, 1, 2], again, checkpoint)  # each row once
    rows = [json.loads(line) for f in out.iterdir() for line in f.read_text().splitlines()]
    assert {"id": 2, "w": "x"} in rows  # read with the new schema


@pytest.mark.slow
@needs_real_time
def test_an_epoch_ending_inside_a_file_resumes_at_its_next_row(
    spark, table_path, tmp_path, stopping
) -> None:
    # One file that takes longer to read than an epoch lasts: epochs end inside it, and
    # their offsets count the rows of it already emitted. Time alone cannot promise that
    # (a warm reader emits 300,000 ids in under 200 ms, and the foreach sink buffers what
    # it has not written yet), so each row costs CPU in the task that reads it: a filter
    # that keeps every row but hashes a 20 kB string of it first (about 15 us a row here,
    # 3 s for the file, three epochs).
    source, checkpoint = table_path("src"), str(tmp_path / "ck")
    rows = 200_000
    spark.range(rows).coalesce(1).write.format("delta").save(source)
    out = tmp_path / "out"
    slow = "length(sha2(repeat(cast(id AS STRING), 4000), 256)) = 64"
    first = start(spark, source, checkpoint, out, epoch="1 second", where=slow)
    stopping.append(first)

    def inside_the_file() -> bool:
        if first.exception() is not None:
            raise AssertionError(f"the query failed: {first.exception()}")
        return any("rowsOfNextFile" in end for end in end_offsets(checkpoint))

    wait_until(inside_the_file, WAIT, "an epoch checkpointed inside the file")
    first.stop()  # inside the file: the restart goes on from the checkpointed row
    again = start(spark, source, checkpoint, out, where=slow)
    stopping.append(again)
    wait_for(out, list(range(rows)), again, checkpoint)


@pytest.mark.slow
@needs_real_time
def test_starting_version(spark, table_path, tmp_path, stopping) -> None:
    source = table_path("src")
    for batch in ([0], [1], [2]):
        append(spark, source, batch)  # versions 0, 1, 2
    out = tmp_path / "out"
    query = start(
        spark, source, str(tmp_path / "ck"), out, startingVersion="1", realTimePollIntervalMs="50"
    )
    stopping.append(query)
    append(spark, source, [3])
    wait_for(out, [1, 2, 3], query)


@pytest.mark.slow
@needs_real_time
def test_a_bad_poll_interval_fails_the_query_with_a_typed_error(
    spark, table_path, tmp_path, stopping
) -> None:
    source = table_path("src")
    append(spark, source, [0])
    query = start(spark, source, str(tmp_path / "ck"), tmp_path / "out", realTimePollIntervalMs="0")
    stopping.append(query)
    wait_until(lambda: not query.isActive, WAIT, "the query to fail")
    error = typed_error(query.exception())
    assert isinstance(error, InvalidOptionError), query.exception()
    assert error.option == "realTimePollIntervalMs"


@pytest.mark.slow
@needs_real_time
def test_rows_deleted_by_deletion_vectors_are_not_emitted(
    spark, table_path, tmp_path, stopping
) -> None:
    source = table_path("src")
    spark.sql(
        f"CREATE TABLE delta.`{source}` (id BIGINT) USING delta"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    append(spark, source, list(range(10)))
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id % 2 = 0")
    out = tmp_path / "out"
    query = start(spark, source, str(tmp_path / "ck"), out, skipChangeCommits="true")
    stopping.append(query)
    wait_for(out, [1, 3, 5, 7, 9], query)
    # A DELETE while the query runs is a change commit: skipped, and later appends flow.
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id = 1")
    append(spark, source, [100])
    wait_for(out, [1, 3, 5, 7, 9, 100], query)


@pytest.mark.slow
@pytest.mark.cluster
@needs_real_time
def test_real_time_on_local_cluster(tmp_path) -> None:
    """The long-lived task runs in an executor JVM, which reaches the driver only by RPC;
    for the change feed, its files, their change and constants cross it too. Both queries
    run in one child session (one local-cluster start)."""
    from tests.spark.test_cluster import _spark_home

    results, _ = run_result_job(
        "_realtime_cluster_job.py",
        str(tmp_path),
        cwd=tmp_path,
        env={"SPARK_HOME": _spark_home(tmp_path)},
    )
    for name, result in results.items():
        assert result["error"] is None, name
        assert result["executors"] == 1, name
    assert results["rows"]["ids"] == [0, 1, 2, 10, 11, 12]
    # The change feed: the snapshot's inserts, the appends, then id 0's delete.
    assert results["cdf"]["ids"] == [0, 0, 1, 2, 10, 11, 12]


@pytest.mark.skipif(HAS_REAL_TIME, reason="Spark 4.1+ has real-time mode")
def test_spark_without_real_time_mode_has_no_such_trigger(spark, table_path) -> None:
    # Spark 4.0 has no real-time mode at all: its DataStreamWriter takes no realTime
    # trigger, so nothing reaches the connector to refuse.
    writer = spark.readStream.format("delta").load(table_path("src")).writeStream
    with pytest.raises(TypeError):
        writer.trigger(realTime="5 seconds")


def test_continuous_trigger_from_delta_is_refused_with_a_typed_error(
    spark, table_path, tmp_path
) -> None:
    source = table_path("src")
    append(spark, source, [0])
    writer = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("console")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(continuous="1 second")
    )
    with pytest.raises(Exception) as caught:
        writer.start().stop()
    error = typed_error(caught.value)
    assert isinstance(error, UnsupportedTriggerError), caught.value
    assert error.alternative == "trigger(realTime=...)"
    assert error.table_uri.rstrip("/").endswith(Path(source).name)


def test_continuous_trigger_into_delta_is_refused_with_a_typed_error(
    spark, table_path, tmp_path
) -> None:
    target = table_path("dst")
    writer = (
        spark.readStream.format("rate")
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(continuous="1 second")
    )
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        writer.start(target).stop()
    error = typed_error(caught.value)
    assert isinstance(error, UnsupportedTriggerError), caught.value
    assert error.alternative == "trigger(realTime=...)"
    assert time.monotonic() - started < WAIT


@needs_real_time
@pytest.mark.parametrize("mode", ["complete", "append"])
def test_output_modes_other_than_update_are_refused_naming_update(
    spark, table_path, tmp_path, mode
) -> None:
    # Spark refuses them at start() with its own error class, naming the alternative; the
    # connector adds nothing (docs/realtime.md, "Limits").
    from pyspark.errors import AnalysisException

    source = table_path("src")
    append(spark, source, [0])
    rows = spark.readStream.format("delta").load(source)
    if mode == "complete":
        rows = rows.groupBy("id").count()
    writer = real_time(
        rows.writeStream.outputMode(mode)
        .foreach(lambda row: None)
        .option("checkpointLocation", str(tmp_path / "ck")),
        EPOCH,
    )
    with pytest.raises(AnalysisException) as caught:
        writer.start().stop()
    assert caught.value.getCondition() == "STREAMING_REAL_TIME_MODE.OUTPUT_MODE_NOT_SUPPORTED"
    assert "set the output mode to Update" in str(caught.value)
