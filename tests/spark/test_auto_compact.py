"""Auto compaction and optimized writes through Spark (issue 14).

Streams and batch writes go through the connector (JVM sink / batch write, the brain's
commit); DML runs in this process. Tables and logs are checked with delta-rs and by
reading the commit files, not with our own reader.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow.table import _auto_compact
from tests._waiting import wait_until

AUTO_COMPACT = "delta.autoOptimize.autoCompact"


@contextlib.contextmanager
def session_conf(spark: Any, **settings: str) -> Iterator[None]:
    """Spark conf set for the block (keys with dots spelled with '__')."""
    keys = {k.replace("__", "."): v for k, v in settings.items()}
    try:
        for key, value in keys.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key in keys:
            spark.conf.unset(key)


def commits(path: str) -> list[list[dict[str, Any]]]:
    """Every commit's actions, by version."""
    log = Path(path) / "_delta_log"
    out = []
    for name in sorted(n.name for n in log.glob("*.json")):
        with open(log / name) as f:
            out.append([json.loads(line) for line in f if line.strip()])
    return out


def optimize_commits(path: str) -> list[list[dict[str, Any]]]:
    return [
        c
        for c in commits(path)
        if any(a.get("commitInfo", {}).get("operation") == "OPTIMIZE" for a in c)
    ]


def files_per_partition(path: str, column: str) -> collections.Counter[Any]:
    actions = DeltaTable(path).get_add_actions(flatten=True)
    return collections.Counter(actions.column(f"partition.{column}").to_pylist())


def source_table(path: str, batches: int, rows: int) -> None:
    """``batches`` commits of ``rows`` rows each (ids unique), one file per commit."""
    for b in range(batches):
        ids = list(range(b * rows, (b + 1) * rows))
        write_deltalake(
            path,
            pa.table(
                {"id": pa.array(ids, pa.int64()), "p": pa.array([i % 2 for i in ids], pa.int64())}
            ),
            mode="append",
        )


def test_stream_of_tiny_batches_ends_with_few_files(spark, table_path, tmp_path) -> None:
    source, target = table_path("source"), table_path("target")
    batches, rows = 24, 5
    source_table(source, batches, rows)
    # The target exists with the property; each micro-batch writes one small file per partition.
    spark.createDataFrame([], "id bigint, p bigint").write.format("delta").partitionBy("p").option(
        AUTO_COMPACT, "true"
    ).save(target)
    with session_conf(spark, spark__databricks__delta__autoCompact__minNumFiles="6"):
        query = (
            spark.readStream.format("delta")
            .option("maxFilesPerTrigger", "1")
            .load(source)
            .writeStream.format("delta")
            .partitionBy("p")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start(target)
        )
        assert query.awaitTermination(600)
    assert query.exception() is None

    table = DeltaTable(target)
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == list(range(batches * rows))  # nothing lost, nothing twice
    per_partition = files_per_partition(target, "p")
    # 24 batches wrote 24 files per partition; compaction keeps each under minNumFiles.
    assert set(per_partition) == {0, 1}
    assert all(n < 6 for n in per_partition.values()), per_partition
    optimized = optimize_commits(target)
    assert optimized
    for actions in optimized:
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        # delta-rs writes parameter values as strings (delta-spark: a JSON true).
        assert str(info["operationParameters"]["auto"]).lower() == "true"
        files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        assert files and all(f["dataChange"] is False for f in files)
    history = DeltaTable(target).history()
    assert any(h["operation"] == "OPTIMIZE" for h in history)


def test_a_streams_table_compacts_itself_unless_it_says_otherwise(
    spark, table_path, tmp_path
) -> None:
    """deltaflow's default: no setting anywhere, a stream's table is compacted (in the
    background); the table's 'false' keeps it off."""
    source = table_path("source")
    source_table(source, batches=8, rows=3)

    def stream(target: str, name: str) -> None:
        query = (
            spark.readStream.format("delta")
            .option("maxFilesPerTrigger", "1")
            .load(source)
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start(target)
        )
        assert query.awaitTermination(600)
        assert query.exception() is None

    kept_off, by_default = table_path("kept_off"), table_path("by_default")
    spark.createDataFrame([], "id bigint, p bigint").write.format("delta").option(
        AUTO_COMPACT, "false"
    ).save(kept_off)
    with session_conf(spark, spark__databricks__delta__autoCompact__minNumFiles="4"):
        stream(kept_off, "off")
        stream(by_default, "default")
    # The table saying 'false' never asks for one (the hook decides at the commit), and
    # one background thread serves both tables in order.
    wait_until(lambda: bool(optimize_commits(by_default)), 120.0, "a background compaction")
    assert not optimize_commits(kept_off)
    assert len(DeltaTable(kept_off).file_uris()) >= 8  # one per micro-batch
    assert len(DeltaTable(by_default).file_uris()) < 8
    for path in (kept_off, by_default):
        ids = DeltaTable(path).to_pyarrow_table().column("id").to_pylist()
        assert sorted(ids) == list(range(8 * 3))


def test_settings_off_change_nothing(spark, table_path) -> None:
    plain, overridden = table_path("plain"), table_path("overridden")
    df = spark.range(4).selectExpr("id", "id % 2 AS p")
    with session_conf(spark, spark__databricks__delta__autoCompact__minNumFiles="2"):
        for _ in range(4):
            df.write.format("delta").mode("append").partitionBy("p").save(plain)
        # The session's "false" wins over the table's property, as in delta-spark.
        with session_conf(spark, spark__databricks__delta__autoCompact__enabled="false"):
            for _ in range(4):
                df.write.format("delta").mode("append").partitionBy("p").option(
                    AUTO_COMPACT, "true"
                ).save(overridden)
    for path in (plain, overridden):
        assert not optimize_commits(path)
        assert DeltaTable(path).version() == 3  # one commit per write, nothing else
        assert sum(files_per_partition(path, "p").values()) >= 8


def test_session_conf_turns_it_on_for_batch_writes(spark, table_path) -> None:
    path = table_path()
    df = spark.range(4).selectExpr("id", "id % 2 AS p").coalesce(1)
    with session_conf(
        spark,
        spark__databricks__delta__autoCompact__enabled="true",
        spark__databricks__delta__autoCompact__minNumFiles="3",
    ):
        for _ in range(3):
            df.write.format("delta").mode("append").partitionBy("p").save(path)
    assert len(optimize_commits(path)) == 1
    assert dict(files_per_partition(path, "p")) == {0: 1, 1: 1}
    assert DeltaTable(path).to_pyarrow_table().num_rows == 12


def test_appender_and_dml_while_auto_compaction_runs_never_fail(spark, table_path) -> None:
    from deltaflow import DeltaTable as SparkDeltaTable

    path = table_path()
    base = 200
    # Rows the DML updates, in many small files of one partition.
    spark.range(base).selectExpr("id", "0 AS v", "0 AS p").repartition(8).write.format(
        "delta"
    ).partitionBy("p").option(AUTO_COMPACT, "true").save(path)
    appends, updates = 10, 3
    failures: list[BaseException] = []

    def appender() -> None:
        try:
            for k in range(appends):
                start = base + k * 10
                spark.range(start, start + 10).selectExpr("id", "0 AS v", "0 AS p").coalesce(
                    1
                ).write.format("delta").mode("append").save(path)
        except BaseException as exc:
            failures.append(exc)

    with session_conf(spark, spark__databricks__delta__autoCompact__minNumFiles="3"):
        thread = threading.Thread(target=appender)
        thread.start()
        try:
            table = SparkDeltaTable.forPath(spark, path)
            for _ in range(updates):
                table.update(f"id < {base}", {"v": "v + 1"})
        finally:
            thread.join(600)
    assert not failures, failures
    assert not thread.is_alive()
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    values = collections.Counter((r["id"] < base, r["v"]) for r in rows)
    assert values == {(True, updates): base, (False, 0): appends * 10}
    assert optimize_commits(path)  # compactions ran meanwhile


def test_optimize_write_writes_one_file_per_partition(spark, table_path) -> None:
    plain, optimized = table_path("plain"), table_path("optimized")
    df = spark.range(2000).selectExpr("id", "id % 16 AS p").repartition(6)
    df.write.format("delta").partitionBy("p").save(plain)
    df.write.format("delta").partitionBy("p").option(
        "delta.autoOptimize.optimizeWrite", "true"
    ).save(optimized)
    assert sum(files_per_partition(plain, "p").values()) > 16  # 6 tasks write each partition
    assert dict(files_per_partition(optimized, "p")) == {p: 1 for p in range(16)}
    assert DeltaTable(optimized).to_pyarrow_table().num_rows == 2000
    # The table property keeps applying to later appends; the write option overrides it.
    df.write.format("delta").mode("append").save(optimized)
    assert set(files_per_partition(optimized, "p").values()) == {2}
    df.write.format("delta").mode("append").option("optimizeWrite", "false").save(optimized)
    assert sum(files_per_partition(optimized, "p").values()) > 48


def test_optimize_write_shuffles_by_partition_without_adaptive_execution(
    spark, table_path, tmp_path
) -> None:
    # Spark drops the REBALANCE hint when adaptive execution is off, as it always is in a
    # stream's micro-batches: the write then hash-shuffles by the partition columns itself.
    path = table_path()
    df = spark.range(600).selectExpr("id", "id % 4 AS p").repartition(6)
    with session_conf(spark, spark__sql__adaptive__enabled="false"):
        df.write.format("delta").partitionBy("p").option(
            "delta.autoOptimize.optimizeWrite", "true"
        ).save(path)
    assert dict(files_per_partition(path, "p")) == {p: 1 for p in range(4)}

    source, streamed = table_path("source"), table_path("streamed")
    df.write.format("delta").save(source)  # 6 files: one micro-batch of 6 tasks
    query = (
        spark.readStream.format("delta")
        .load(source)
        .writeStream.format("delta")
        .partitionBy("p")
        .option("optimizeWrite", "true")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(streamed)
    )
    assert query.awaitTermination(300)
    assert dict(files_per_partition(streamed, "p")) == {p: 1 for p in range(4)}
    assert DeltaTable(streamed).to_pyarrow_table().num_rows == 600


def test_background_mode_does_not_hold_the_writer(spark, table_path) -> None:
    path = table_path()
    df = spark.range(4).selectExpr("id", "id % 2 AS p").coalesce(1)
    with session_conf(
        spark,
        spark__databricks__delta__autoCompact__enabled="true",
        spark__databricks__delta__autoCompact__minNumFiles="3",
        spark__deltaflow__autoCompact__background="true",
    ):
        for _ in range(3):
            df.write.format("delta").mode("append").partitionBy("p").save(path)
    # The compaction ran in the brain process (the connector's commits run there); wait
    # for its commit in the log.
    wait_until(lambda: bool(optimize_commits(path)), 60.0, "a background compaction")
    assert dict(files_per_partition(path, "p")) == {0: 1, 1: 1}
    assert DeltaTable(path).to_pyarrow_table().num_rows == 12
    assert _auto_compact.wait_for_background(1.0)  # this process has none of its own


@pytest.mark.parametrize("value", ["sometimes", "-1"])
def test_bad_session_settings_fail_the_write_before_it_runs(spark, table_path, value) -> None:
    from deltaflow.errors import InvalidOptionError

    key = (
        "spark.databricks.delta.autoCompact.enabled"
        if value == "sometimes"
        else "spark.databricks.delta.autoCompact.minNumFiles"
    )
    spark.conf.set(key, value)
    try:
        with pytest.raises(InvalidOptionError) as caught:
            spark.range(1).write.format("delta").save(table_path())
    finally:
        spark.conf.unset(key)
    assert caught.value.option == key


def test_vacuum_leaves_held_leases_alone(tmp_path) -> None:
    from deltaflow.spark.write._native import delete_stale_staging
    from deltaflow.table import _compaction_lease

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    held = _compaction_lease.try_acquire(path)
    assert held is not None
    stale_job = Path(path) / "_delta_staging" / "job-1"
    stale_job.mkdir()
    assert [p.rsplit("/", 1)[-1] for p in delete_stale_staging(path, 0)] == ["job-1"]
    assert _compaction_lease.try_acquire(path) is None  # still held
    _compaction_lease.release(path, held)
