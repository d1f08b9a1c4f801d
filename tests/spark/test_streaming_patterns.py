"""What Spark offers on top of a stream works through deltaflow's source and sink.

Each test reads Delta with ``readStream.format("delta")``, runs a Spark streaming
pattern (watermarks, deduplication, joins, foreachBatch, arbitrary state) and writes
Delta; sources are written with delta-rs (one commit per call), queries run with
``availableNow`` and stop by themselves, and expectations are computed in plain Python.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as DeltaRsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F

import deltaflow
from deltaflow.errors import unpack_remote_error
from deltaflow.table.errors import SchemaMismatchError
from tests.spark._checkpoints import forget_batch

BASE = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
TS = pa.timestamp("us", tz="UTC")


# ---- helpers ---------------------------------------------------------------------------


def at(minutes: float) -> dt.datetime:
    return BASE + dt.timedelta(minutes=minutes)


def commit(path: str, **columns: pa.Array) -> None:
    """One commit with one file holding ``columns``."""
    write_deltalake(path, pa.table(columns), mode="append")


def events(path: str, rows: list[tuple[int, float]]) -> None:
    """One commit of ``(id, minute)`` events with an event-time column ``ts``."""
    commit(
        path,
        id=pa.array([r[0] for r in rows], pa.int64()),
        ts=pa.array([at(r[1]) for r in rows], TS),
    )


def table_rows(path: str, *columns: str) -> list[tuple[Any, ...]]:
    table = DeltaRsTable(path).to_pyarrow_table()
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def run(writer: Any, target: str | None = None) -> Any:
    """Start ``writer`` with availableNow (into ``target``) and wait until it stops."""
    trigger = writer.trigger(availableNow=True)
    query = trigger.start(target) if target is not None else trigger.start()
    assert query.awaitTermination(180), "the availableNow query did not finish in time"
    if query.exception() is not None:
        raise query.exception()
    return query


def stream(spark: Any, source: str) -> Any:
    return spark.readStream.format("delta").load(source)


def sink(df: Any, checkpoint: str) -> Any:
    return df.writeStream.format("delta").option("checkpointLocation", checkpoint)


# ---- event time ------------------------------------------------------------------------


@pytest.mark.slow
def test_windowed_aggregation_with_watermark_drops_late_data(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    first = [(1, 0.1), (2, 0.5), (3, 1.2), (4, 1.7), (5, 2.5), (6, 10.0)]
    events(source, first[:3])
    events(source, first[3:])
    counts = (
        stream(spark, source)
        .withWatermark("ts", "1 minute")
        .groupBy(F.window("ts", "1 minute"))
        .count()
        .selectExpr("window.start AS start", "count")
    )
    # availableNow runs a last no-data batch only when the watermark moved; a second run
    # emits the windows the first run's final watermark closed.
    run(sink(counts, checkpoint), target)
    run(sink(counts, checkpoint), target)

    late = [(7, 0.3)]  # window [0, 1) closed at watermark 9:00: dropped
    later = [(8, 10.5), (9, 13.0)]  # watermark 12:00 closes [10, 11)
    events(source, late + later)
    run(sink(counts, checkpoint), target)
    run(sink(counts, checkpoint), target)

    watermark = 13.0 - 1.0
    on_time = first + later
    expected: dict[dt.datetime, int] = {}
    for _, minute in on_time:
        start = int(minute)
        if start + 1 <= watermark:
            expected[at(start)] = expected.get(at(start), 0) + 1
    got = {s.astimezone(dt.timezone.utc): n for s, n in table_rows(target, "start", "count")}
    assert got == expected
    assert got[at(0)] == 2  # the late event is not counted


def test_drop_duplicates_with_watermark(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    batches = [[(1, 0.0), (2, 0.5), (1, 0.0)], [(2, 0.5), (3, 1.0)], [(3, 1.0), (1, 0.0)]]
    for batch in batches:
        events(source, batch)
        deduped = stream(spark, source).withWatermark("ts", "10 minutes")
        run(sink(deduped.dropDuplicates(["id", "ts"]), checkpoint), target)

    expected = sorted({(i, at(m)) for batch in batches for i, m in batch})
    got = [(i, t.astimezone(dt.timezone.utc)) for i, t in table_rows(target, "id", "ts")]
    assert got == expected


def test_drop_duplicates_within_watermark(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    # The same id again within the watermark delay is a duplicate even with another ts.
    batches = [[(1, 0.0), (2, 0.2)], [(1, 0.5), (3, 0.6)], [(2, 1.0), (4, 1.5)]]
    for batch in batches:
        events(source, batch)
        deduped = stream(spark, source).withWatermark("ts", "10 minutes")
        run(sink(deduped.dropDuplicatesWithinWatermark(["id"]), checkpoint), target)

    first_seen: dict[int, float] = {}
    for batch in batches:
        for i, minute in batch:
            first_seen.setdefault(i, minute)
    got = [(i, t.astimezone(dt.timezone.utc)) for i, t in table_rows(target, "id", "ts")]
    assert got == sorted((i, at(m)) for i, m in first_seen.items())


# ---- joins -----------------------------------------------------------------------------


def test_stream_static_join_with_a_delta_table(spark, table_path) -> None:
    source, dims, target, checkpoint = (
        table_path("src"), table_path("dims"), table_path("dst"), table_path("ck"),
    )  # fmt: skip
    names = {1: "one", 2: "two", 3: "three"}
    commit(dims, id=pa.array(list(names), pa.int64()), name=pa.array(list(names.values())))
    batches = [[(1, 0.0), (2, 0.1), (9, 0.2)], [(3, 1.0), (1, 1.1)]]
    static = spark.read.format("delta").load(dims)
    for batch in batches:
        events(source, batch)
        joined = stream(spark, source).join(static, "id").select("id", "name", "ts")
        run(sink(joined, checkpoint), target)

    expected = sorted((i, names[i]) for batch in batches for i, _ in batch if i in names)
    assert table_rows(target, "id", "name") == expected


@pytest.mark.slow
def test_stream_stream_join_with_watermarks_and_a_time_bound(spark, table_path) -> None:
    clicks_path, views_path = table_path("clicks"), table_path("views")
    target, checkpoint = table_path("dst"), table_path("ck")
    views = [(1, 0.0), (2, 0.0), (3, 5.0), (4, 20.0)]
    clicks = [(1, 2.0), (2, 9.0), (3, 6.0), (4, 21.0), (5, 1.0)]
    events(views_path, views)
    events(clicks_path, clicks)

    v = stream(spark, views_path).selectExpr("id AS view_id", "ts AS view_ts")
    c = stream(spark, clicks_path).selectExpr("id AS click_id", "ts AS click_ts")
    joined = v.withWatermark("view_ts", "2 minutes").join(
        c.withWatermark("click_ts", "3 minutes"),
        F.expr(
            "click_id = view_id AND click_ts >= view_ts"
            " AND click_ts <= view_ts + interval 5 minutes"
        ),
    )
    run(sink(joined.select("view_id", "click_ts"), checkpoint), target)

    clicked = dict(clicks)
    expected = sorted(
        (i, at(clicked[i]))
        for i, minute in views
        if i in clicked and minute <= clicked[i] <= minute + 5
    )
    got = [(i, t.astimezone(dt.timezone.utc)) for i, t in table_rows(target, "view_id", "click_ts")]
    assert got == expected


# ---- foreachBatch ----------------------------------------------------------------------


def test_foreach_batch_merge_upsert(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    commit(target, key=pa.array(["a"]), value=pa.array([0], pa.int64()))

    def upsert(batch: Any, batch_id: int) -> None:
        (
            deltaflow.DeltaTable.forPath(batch.sparkSession, target)
            .alias("t")
            .merge(batch.alias("s"), "t.key = s.key")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    updates = [[("a", 1), ("b", 2)], [("b", 3), ("c", 4)], [("a", 5)]]
    query = None
    for batch in updates:
        commit(source, key=pa.array([k for k, _ in batch]), value=pa.array([v for _, v in batch]))
        query = run(
            stream(spark, source).writeStream.foreachBatch(upsert)
            .option("checkpointLocation", checkpoint)
        )  # fmt: skip
    assert query is not None

    expected = {"a": 0}
    for batch in updates:
        expected.update(batch)
    assert table_rows(target, "key", "value") == sorted(expected.items())


def test_foreach_batch_idempotent_writes_with_txn_options(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")

    def write(batch: Any, batch_id: int) -> None:
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", "orders-pipeline")
            .option("txnVersion", batch_id)
            .save(target)
        )

    def start() -> None:
        run(
            stream(spark, source).writeStream.foreachBatch(write)
            .option("checkpointLocation", checkpoint)
        )  # fmt: skip

    commit(source, id=pa.array([1, 2], pa.int64()))
    start()
    commit(source, id=pa.array([3], pa.int64()))
    start()
    version = DeltaRsTable(target).version()

    # Forget that the last batch finished, as after a crash right after the write:
    # Spark runs it again with the same batch id, and the write is skipped.
    last = forget_batch(checkpoint)
    start()

    assert table_rows(target, "id") == [(1,), (2,), (3,)]
    assert DeltaRsTable(target).version() == version
    assert DeltaRsTable(target).transaction_version("orders-pipeline") == last


def test_foreach_batch_txn_skip_in_a_stateful_query(spark, table_path) -> None:
    # delta-spark's idempotent-write pattern on a stateful query: on a replay the write is
    # skipped, yet the batch must still run, or Spark 4.3 fails the query with
    # STATE_STORE_COMMIT_VALIDATION_FAILED (its state stores did not commit the batch).
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")

    def write(batch: Any, batch_id: int) -> None:
        (
            batch.write.format("delta")
            .mode("overwrite")
            .option("txnAppId", "counts")
            .option("txnVersion", batch_id)
            .save(target)
        )

    def start() -> None:
        counts = stream(spark, source).selectExpr("id % 2 AS parity").groupBy("parity").count()
        run(
            counts.writeStream.foreachBatch(write).outputMode("complete")
            .option("checkpointLocation", checkpoint)
        )  # fmt: skip

    commit(source, id=pa.array([1, 2, 3], pa.int64()))
    start()
    version = DeltaRsTable(target).version()
    forget_batch(checkpoint, 0)  # as after a kill between the two commits
    start()  # the replay: skipped write, state stores still commit
    assert DeltaRsTable(target).version() == version
    commit(source, id=pa.array([4], pa.int64()))
    start()
    assert table_rows(target, "parity", "count") == [(0, 2), (1, 2)]


def test_only_stateful_micro_batches_run_when_skipped(spark, table_path) -> None:
    # A skipped write re-runs its batch only where Spark needs it (state stores).
    from deltaflow.spark.write._save import _runs_state_stores

    source = table_path("src")
    commit(source, id=pa.array([1, 2, 3], pa.int64()))
    seen: dict[str, bool] = {}

    def capture(name: str) -> Any:
        def inspect(batch: Any, batch_id: int) -> None:
            seen[name] = _runs_state_stores(batch)
            batch.write.format("noop").mode("overwrite").save()

        return inspect

    counts = stream(spark, source).groupBy((F.col("id") % 2).alias("p")).count()
    for name, df, mode in [("stateless", stream(spark, source), "append"),
                           ("stateful", counts, "complete")]:  # fmt: skip
        run(
            df.writeStream.foreachBatch(capture(name)).outputMode(mode)
            .option("checkpointLocation", table_path(f"ck_{name}"))
        )  # fmt: skip
    assert seen == {"stateless": False, "stateful": True}
    assert _runs_state_stores(spark.range(3)) is False  # a batch DataFrame


# ---- arbitrary state -------------------------------------------------------------------

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"


@pytest.fixture
def rocksdb_state(spark) -> Iterator[None]:
    """transformWithState needs the RocksDB state store; restore the session afterwards."""
    before = spark.conf.get(STATE_STORE_CONF, None)
    spark.conf.set(STATE_STORE_CONF, ROCKSDB)
    yield
    if before is None:
        spark.conf.unset(STATE_STORE_CONF)
    else:
        spark.conf.set(STATE_STORE_CONF, before)


@pytest.mark.slow
def test_transform_with_state_in_pandas_running_counts(spark, table_path, rocksdb_state) -> None:
    pytest.importorskip("google.protobuf", reason="transformWithStateInPandas needs protobuf")
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class RunningCount(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            total = self.total.get()[0] if self.total.exists() else 0
            total += sum(len(frame) for frame in rows)
            self.total.update((total,))
            yield pd.DataFrame({"device": [key[0]], "total": [total]})

        def close(self) -> None:
            pass

    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    batches = [["a", "a", "b"], ["b", "c"], ["a"]]
    for batch in batches:
        commit(source, device=pa.array(batch))
        counts = (
            stream(spark, source)
            .groupBy("device")
            .transformWithStateInPandas(
                statefulProcessor=RunningCount(),
                outputStructType="device string, total long",
                outputMode="Append",
                timeMode="None",
            )
        )
        run(sink(counts, checkpoint).outputMode("append"), target)

    expected: list[tuple[str, int]] = []
    totals: dict[str, int] = {}
    for batch in batches:
        for device in sorted(set(batch)):
            totals[device] = totals.get(device, 0) + batch.count(device)
            expected.append((device, totals[device]))
    assert table_rows(target, "device", "total") == sorted(expected)


# ---- catalog tables --------------------------------------------------------------------


def test_read_stream_table_and_to_table_with_catalog_tables(spark, table_path) -> None:
    import uuid

    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    commit(source, id=pa.array([1, 2], pa.int64()))
    src, dst = f"src_{uuid.uuid4().hex[:8]}", f"dst_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {src} USING delta LOCATION '{source}'")
    spark.sql(f"CREATE TABLE {dst} (id BIGINT) USING delta LOCATION '{target}'")

    def start() -> None:
        query = (
            spark.readStream.table(src)
            .writeStream.option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .toTable(dst)
        )
        assert query.awaitTermination(180)
        assert query.exception() is None

    start()
    commit(source, id=pa.array([3], pa.int64()))
    start()
    assert table_rows(target, "id") == [(1,), (2,), (3,)]
    assert table_rows(source, "id") == [(1,), (2,), (3,)]  # the source is untouched
    assert sorted(r.id for r in spark.table(dst).collect()) == [1, 2, 3]


def test_a_failing_foreach_batch_function_is_a_user_code_error(spark, table_path) -> None:
    source, checkpoint = table_path("src"), table_path("ck")
    commit(source, id=pa.array([1], pa.int64()))

    def explode(batch: Any, batch_id: int) -> None:
        raise ValueError(f"no rows wanted, got {batch.count()}")

    query = (
        stream(spark, source).writeStream.foreachBatch(explode)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )  # fmt: skip
    with pytest.raises(Exception) as caught:
        query.awaitTermination(180)
    for failure in (caught.value, query.exception()):
        error = deltaflow.typed_error(failure)
        assert isinstance(error, deltaflow.UserCodeError), failure
        assert error.batch_id == 0
        assert "explode" in str(error) and "ValueError: no rows wanted, got 1" in str(error)


def test_a_deltaflow_error_in_foreach_batch_keeps_its_type(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    commit(source, id=pa.array([1], pa.int64()), extra=pa.array(["x"]))
    commit(target, id=pa.array([0], pa.int64()))

    def append(batch: Any, batch_id: int) -> None:
        batch.write.format("delta").mode("append").save(target)  # no mergeSchema

    with pytest.raises(Exception) as caught:
        run(
            stream(spark, source).writeStream.foreachBatch(append)
            .option("checkpointLocation", checkpoint)
        )  # fmt: skip
    error = deltaflow.typed_error(caught.value)
    assert isinstance(error, SchemaMismatchError), caught.value
    assert error.columns and error.columns[0].startswith("extra")
    assert table_rows(target, "id") == [(0,)]


# ---- sink errors -----------------------------------------------------------------------


def test_new_columns_without_merge_schema_fail_typed(spark, table_path) -> None:
    source, target, checkpoint = table_path("src"), table_path("dst"), table_path("ck")
    commit(source, id=pa.array([1], pa.int64()), extra=pa.array(["x"]))
    commit(target, id=pa.array([0], pa.int64()))

    with pytest.raises(Exception) as caught:
        run(sink(stream(spark, source), checkpoint), target)
    error = unpack_remote_error(caught.value)
    assert isinstance(error, SchemaMismatchError)
    assert error.table_uri == "file://" + str(Path(target).resolve())
    assert len(error.columns) == 1 and error.columns[0].startswith("extra")
    assert table_rows(target, "id") == [(0,)]
