"""Structured Streaming on Delta: readStream / writeStream .format("delta").

Source tables are built with deltalake (delta-rs) so that each write is exactly one
commit with one file; streams run with availableNow and stop by themselves, so no
test sleeps. Targets are checked with delta-rs, not with our own reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.errors import InvalidOptionError, unpack_remote_error
from deltaflow.spark.errors import ChangeCommitError
from deltaflow.spark.write._native import NATIVE_WRITE_CONF
from tests.spark._checkpoints import forget_batch

# ---- helpers ---------------------------------------------------------------------------


def append(path: str, ids: list[int], mode: str = "append") -> None:
    """One commit with one file holding ``ids`` (and a derived string column)."""
    data = pa.table(
        {"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())}
    )
    write_deltalake(path, data, mode=mode)


def rows(path: str, *columns: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(path).to_pyarrow_table()
    names = columns or tuple(table.column_names)
    return sorted(zip(*(table.column(c).to_pylist() for c in names), strict=True))


def ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def run(writer: Any, target: str) -> Any:
    """Start ``writer`` with availableNow into ``target`` and wait until it stops."""
    query = writer.trigger(availableNow=True).start(target)
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return query


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def stream(spark: Any, source: str, **options: str) -> Any:
    return spark.readStream.format("delta").options(**options).load(source)


def sink(df: Any, checkpoint: str, mode: str = "append") -> Any:
    return df.writeStream.format("delta").outputMode(mode).option("checkpointLocation", checkpoint)


# ---- source ----------------------------------------------------------------------------


def test_snapshot_then_new_commits_exactly_once_across_restart(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    append(source, [3])
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3]

    append(source, [4, 5])
    append(source, [6])
    query = run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3, 4, 5, 6]
    assert sum(batch_sizes(query)) == 3  # only the new rows were read

    query = run(sink(stream(spark, source), checkpoint), target)  # nothing new
    assert ids(target) == [1, 2, 3, 4, 5, 6]
    assert sum(batch_sizes(query)) == 0
    # Offsets follow delta-spark's model.
    offsets = sorted(Path(checkpoint, "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    last = json.loads(offsets[-1].read_text().splitlines()[-1])
    assert last["reservoirId"] == DeltaTable(source).metadata().id
    assert set(last) == {
        "sourceVersion",
        "reservoirId",
        "reservoirVersion",
        "index",
        "isStartingVersion",
    }
    assert (last["reservoirVersion"], last["index"]) == (4, -1)


def test_stream_start_leaves_the_shared_worker_env_keys_alone(spark, table_path) -> None:
    # Spark's streaming source runner puts entries into the envVars map of the function
    # registered for the source, which every task of every query serializes; a new key
    # racing a task's serialization broke the task (java.io.OptionalDataException).
    # register() adds the keys up front, so a stream start must not add any.
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env_vars = manager.lookupDataSource("deltaflow_python").dataSourceCls().envVars()
    before = set(env_vars.keySet())
    assert {"SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"} <= before
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2]
    assert set(env_vars.keySet()) == before


def test_max_files_per_trigger_splits_available_now(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])  # initial snapshot: 2 files
    append(source, [3])
    df = stream(spark, source, maxFilesPerTrigger="2")
    query = run(sink(df, checkpoint), target)
    assert batch_sizes(query) == [3]  # the first batch is the snapshot

    for i in range(4, 9):
        append(source, [i])  # 5 commits of 1 row
    query = run(sink(stream(spark, source, maxFilesPerTrigger="2"), checkpoint), target)
    assert batch_sizes(query) == [2, 2, 1]
    assert ids(target) == list(range(1, 9))


def test_max_bytes_per_trigger_is_soft(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [0])
    for i in range(1, 4):
        append(source, [i])
    query = run(
        sink(stream(spark, source, startingVersion="1", maxBytesPerTrigger="1"), checkpoint), target
    )
    assert batch_sizes(query) == [1, 1, 1]  # one file per batch although each exceeds 1 byte


def test_starting_version(spark, table_path) -> None:
    source, target = table_path("src"), table_path("dst")
    for i in range(4):
        append(source, [i])  # versions 0..3
    run(sink(stream(spark, source, startingVersion="2"), table_path("ck")), target)
    assert ids(target) == [2, 3]

    latest_target, checkpoint = table_path("dst"), table_path("ck")
    query = run(sink(stream(spark, source, startingVersion="latest"), checkpoint), latest_target)
    assert sum(batch_sizes(query)) == 0
    append(source, [10])
    run(sink(stream(spark, source, startingVersion="latest"), checkpoint), latest_target)
    assert ids(latest_target) == [10]


def test_change_commit_fails_typed_and_skip_change_commits_continues(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    run(sink(stream(spark, source), checkpoint), target)
    DeltaTable(source).delete("id = 1")  # version 1: remove + add, dataChange=true
    append(source, [3])  # version 2

    with pytest.raises(Exception) as caught:
        run(sink(stream(spark, source), checkpoint), target)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, ChangeCommitError)
    assert (error.version, error.table_uri) == (1, "file://" + str(Path(source).resolve()))
    assert "skipChangeCommits" in str(error)

    run(sink(stream(spark, source, skipChangeCommits="true"), checkpoint), target)
    assert ids(target) == [1, 2, 3]


def test_optimize_commits_are_ignored(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    run(sink(stream(spark, source), checkpoint), target)
    append(source, [2])
    DeltaTable(source).optimize.compact()  # dataChange=false
    append(source, [3])
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3]


def test_stream_option_errors(spark, table_path) -> None:
    from deltaflow import typed_error

    source = table_path("src")
    append(source, [1])
    with pytest.raises(InvalidOptionError):
        from deltaflow.spark._options import parse_stream_options

        parse_stream_options({"path": source, "maxFilesPerTriger": "2"})
    # Wrong stream settings fail where the stream is defined, before any query starts.
    for bad in ({"maxFilesPerTrigger": "0"}, {"startingVersion": "-3"}):
        with pytest.raises(Exception) as caught:
            stream(spark, source, **bad)
        error = typed_error(caught.value)
        assert isinstance(error, InvalidOptionError), caught.value
        assert error.option == next(iter(bad))
    assert spark.streams.active == []
    with pytest.raises(Exception, match="change data was not recorded"):  # feed is off
        run(sink(stream(spark, source, readChangeFeed="true"), table_path("ck")), table_path("d"))


def test_delta_to_delta_filter_and_projection(spark, table_path) -> None:
    from pyspark.sql import functions as F

    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3, 4])
    append(source, [5, 6])
    df = stream(spark, source).where("id % 2 = 0").select("id", F.upper("name").alias("label"))
    run(sink(df, checkpoint), target)
    assert rows(target) == [(2, "N2"), (4, "N4"), (6, "N6")]


# ---- sink ------------------------------------------------------------------------------


@pytest.fixture(params=["jvm", "python"])
def sink_kind(request: Any, spark: Any) -> Iterator[str]:
    """Each sink test runs on both sinks: the JVM path (foreachBatch with Spark's Parquet
    writer, the default) and the Python data source sink (nativeWrite off)."""
    if request.param == "python":
        spark.conf.set(NATIVE_WRITE_CONF, "false")
    yield request.param
    spark.conf.unset(NATIVE_WRITE_CONF)


def sink_description(query: Any) -> str:
    return str(query.lastProgress["sink"]["description"])


def write_routes(spark: Any, target: str) -> list[str]:
    """How the connector wrote each of its batch writes to ``target`` (oldest first)."""
    uri = "file://" + str(Path(target).resolve())
    reports = json.loads(spark._jvm.io.deltaflow.spark.WriteReports.json())
    return [r["route"] for r in reports if r["table_uri"] == uri]


def test_sink_runs_where_the_conf_says(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    query = run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2]
    if sink_kind == "jvm":
        assert sink_description(query) == f"DeltaSink[{target}]"
        assert write_routes(spark, target) == ["jvm"]
    else:
        assert "DeltaSink" not in sink_description(query)
        assert write_routes(spark, target) == []
    # Either way the commit names the query and batch, for the progress listener.
    info = DeltaTable(target).history(1)[0]
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert info["deltaflow.stream"] == {"queryId": app_id, "batchId": 0, "outputMode": "Append"}
    assert info["operationMetrics"]["numOutputRows"] == "2"


def test_replayed_batch_is_not_committed_twice(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    append(source, [2])
    run(sink(stream(spark, source), checkpoint), target)
    append(source, [3])
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3]
    versions_before = DeltaTable(target).version()
    files_before = set(DeltaTable(target).file_uris())

    # Forget that the last batch finished, as after a crash between the Delta commit
    # and Spark's commit log entry: Spark runs batch 1 again with the same offsets.
    last = forget_batch(checkpoint)
    run(sink(stream(spark, source), checkpoint), target)

    assert ids(target) == [1, 2, 3]
    assert DeltaTable(target).version() == versions_before
    assert set(DeltaTable(target).file_uris()) == files_before
    data_files = {str(p) for p in Path(target).rglob("*.parquet")}
    assert len(data_files) == len(files_before)  # the replay's copies were deleted
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert DeltaTable(target).transaction_version(app_id) == last


def test_new_checkpoint_is_a_new_query(spark, table_path, sink_kind) -> None:
    source, target = table_path("src"), table_path("dst")
    append(source, [1])
    run(sink(stream(spark, source), table_path("ck")), target)
    # Same target, fresh checkpoint: batch 0 again, but of another query: not a replay.
    run(sink(stream(spark, source), table_path("ck")), target)
    assert ids(target) == [1, 1]


def test_complete_mode_overwrites(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3])
    counts = stream(spark, source).selectExpr("id % 2 AS parity").groupBy("parity").count()
    run(sink(counts, checkpoint, "complete"), target)
    assert rows(target, "parity", "count") == [(0, 1), (1, 2)]
    append(source, [4, 5, 6, 7])
    run(sink(counts, checkpoint, "complete"), target)
    assert rows(target, "parity", "count") == [(0, 3), (1, 4)]


def test_partition_by_option(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3])
    df = stream(spark, source).selectExpr("id", "id % 2 AS parity")
    run(sink(df, checkpoint).option("partitionBy", "parity"), target)
    assert DeltaTable(target).metadata().partition_columns == ["parity"]
    assert rows(target, "id", "parity") == [(1, 1), (2, 0), (3, 1)]


def test_merge_schema_adds_columns(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    run(sink(stream(spark, source).select("id"), checkpoint), target)
    df = stream(spark, source).selectExpr("id", "name")
    append(source, [2])
    run(sink(df, checkpoint).option("mergeSchema", "true"), target)
    assert rows(target, "id", "name") == [(1, None), (2, "n2")]


def test_partition_by_method(spark, table_path, sink_kind) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3])
    df = stream(spark, source).selectExpr("id", "id % 2 AS parity")
    run(sink(df, checkpoint).partitionBy("parity"), target)
    assert DeltaTable(target).metadata().partition_columns == ["parity"]
    assert rows(target, "id", "parity") == [(1, 1), (2, 0), (3, 1)]
    assert all(("parity=" in uri) for uri in DeltaTable(target).file_uris())


def test_other_sinks_keep_partition_by(spark, table_path) -> None:
    # partitionBy is deferred for Delta sinks only; a parquet sink still gets it.
    source, target, checkpoint = table_path("src"), table_path("out"), table_path("ck")
    append(source, [1, 2])
    df = stream(spark, source).selectExpr("id", "id % 2 AS parity")
    query = (
        df.writeStream.format("parquet")
        .partitionBy("parity")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination(120)
    assert sorted(p.name for p in Path(target).glob("parity=*")) == ["parity=0", "parity=1"]


def test_jvm_sink_writes_timestamp_stats(spark, table_path) -> None:
    # Spark writes INT96 timestamps (no stats) unless the session of the micro-batch's
    # DataFrame (the query's clone of the user's session) says otherwise.
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    df = stream(spark, source).selectExpr("id", "timestamp_micros(id * 1000000) AS ts")
    run(sink(df, checkpoint), target)
    adds = pa.table(DeltaTable(target).get_add_actions(flatten=True)).to_pydict()
    assert adds["min.ts"] and all(v is not None for v in adds["min.ts"])
    assert rows(target, "id") == [(1,), (2,)]


def test_jvm_sink_writes_a_batch_it_cannot_take_through_the_python_source(
    spark, table_path
) -> None:
    # Spark's "lz4" is Hadoop-framed: the JVM path leaves that codec to the Python writer,
    # batch by batch, with the same app transaction (a replay is still skipped).
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1])
    run(sink(stream(spark, source), checkpoint).option("compression", "lz4"), target)
    assert write_routes(spark, target) == ["python"]
    assert ids(target) == [1]
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert DeltaTable(target).transaction_version(app_id) == 0
    forget_batch(checkpoint, 0)  # replay batch 0
    run(sink(stream(spark, source), checkpoint).option("compression", "lz4"), target)
    assert ids(target) == [1]
    assert DeltaTable(target).version() == 0


def test_jvm_sink_sees_other_writers_between_batches(spark, table_path) -> None:
    """Each batch is planned against the table as it is then: another writer's commit
    between two batches is kept, and the replay of a batch is still skipped."""
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2])
    run(sink(stream(spark, source), checkpoint), target)
    append(target, [100])  # another writer, between two batches
    append(source, [3])
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3, 100]
    app_id = json.loads(Path(checkpoint, "metadata").read_text())["id"]
    assert DeltaTable(target).transaction_version(app_id) == 1
    assert DeltaTable(target).history(1)[0]["deltaflow.stream"]["batchId"] == 1
    forget_batch(checkpoint)
    run(sink(stream(spark, source), checkpoint), target)
    assert ids(target) == [1, 2, 3, 100]


def test_replayed_batch_of_a_stateful_query(spark, table_path, sink_kind) -> None:
    # A skipped replay must still run the batch: Spark 4.3 checks that every state store
    # of a stateful query committed for the batch (else STATE_STORE_COMMIT_VALIDATION_FAILED).
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    append(source, [1, 2, 3])
    counts = stream(spark, source).selectExpr("id % 2 AS parity").groupBy("parity").count()
    run(sink(counts, checkpoint, "complete"), target)
    version = DeltaTable(target).version()
    forget_batch(checkpoint, 0)  # as after a kill between the two commits
    run(sink(counts, checkpoint, "complete"), target)
    assert DeltaTable(target).version() == version  # the replay committed nothing
    append(source, [4])
    run(sink(counts, checkpoint, "complete"), target)
    assert rows(target, "parity", "count") == [(0, 2), (1, 2)]


@pytest.mark.parametrize("deleted", [False, True], ids=["columnar", "deletion-vectors"])
def test_partition_column_in_the_middle_keeps_its_place(spark, table_path, deleted) -> None:
    """Spark's Parquet reader emits partition columns last; a stream's rows must still be
    in the table's column order (columnar reads, and row reads for deletion vectors)."""
    from tests.table.dv_fixtures import add_deletion_vectors

    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    table = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "p": ["a", "a", "b"], "v": [1.5, 2.5, 3.5]}
    )
    write_deltalake(source, table, partition_by=["p"])
    if deleted:
        paths = DeltaTable(source).get_add_actions(flatten=True).column("path").to_pylist()
        (in_a,) = [f for f in paths if f.startswith("p=a/")]
        add_deletion_vectors(source, {in_a: [0]})  # the row of id 1
    df = stream(spark, source)
    assert df.columns == ["id", "p", "v"]
    run(sink(df, checkpoint), target)
    kept = [(1, "a", 1.5)] if not deleted else []
    assert rows(target, "id", "p", "v") == [*kept, (2, "a", 2.5), (3, "b", 3.5)]
