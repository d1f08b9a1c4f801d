"""``dropDuplicates`` in Spark's real-time mode (Spark >= 4.3, its pipelined shuffle) into
the Delta sink, exactly once: the sink's row-count replay holds when the shuffle has a
single producer partition (deltaflow's Delta source plans one), see docs/realtime.md.

One session for the module, with one shuffle partition: on ``local[2]`` the source task
and the shuffle's reader must run at once (Spark's slot check for a pipelined group).
The tables are read with delta-rs while a query runs (its tasks hold the cores).
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltaflow
from deltaflow.spark._compat import PYSPARK_MINOR
from deltaflow.table.errors import UnsupportedFeatureError
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark.test_realtime_sink import EPOCH, failing_at_25, real_time

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PYSPARK_MINOR < (4, 3), reason="dropDuplicates in real-time mode is Spark >= 4.3"
    ),
]

_names = itertools.count()
ALLOWLIST = "spark.sql.streaming.realTimeMode.allowlistCheck"
FORMAT = "spark.sql.streaming.stateStore.checkpointFormatVersion"


@pytest.fixture(scope="module", autouse=True)
def dedup_session(spark) -> Any:
    with conf_set(spark, ALLOWLIST, "false"), conf_set(spark, "spark.sql.shuffle.partitions", "1"):
        yield


def append(path: str, values: list[int]) -> None:
    frame = pa.table({"id": pa.array(values, pa.int32()), "n": pa.array(values, pa.int32())})
    mode = "append" if DeltaTable.is_deltatable(path) else "error"
    write_deltalake(path, frame, mode=mode)


def new_table(spark: Any) -> tuple[str, str]:
    name = f"realtime_dedup_{next(_names)}"
    spark.sql(f"CREATE TABLE {name} (id INT, n INT) USING delta")
    location = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"]
    return name, str(location).removeprefix("file:")


def start(frame: Any, name: str, checkpoint: str) -> Any:
    writer = (
        frame.writeStream.format("delta")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .option("realTimeCommitIntervalMs", "20")
    )
    return real_time(writer, EPOCH).toTable(name)


def ids(location: str) -> list[int]:
    return sorted(DeltaTable(location).to_pyarrow_table().column("id").to_pylist())


def wait_for_ids(location: str, query: Any, expected: list[int]) -> None:
    def landed() -> bool:
        assert query.exception() is None, query.exception()
        return len(ids(location)) >= len(expected)

    wait_until(landed, 120, f"{len(expected)} rows in {location}")
    assert ids(location) == expected


def test_ids_committed_twice_upstream_land_once_across_a_restart(spark, table_path) -> None:
    source = table_path("src")
    append(source, list(range(10)))
    name, location = new_table(spark)
    checkpoint = table_path("ck")
    query = start(
        spark.readStream.format("delta").load(source).dropDuplicates(["id"]), name, checkpoint
    )
    try:
        wait_for_ids(location, query, list(range(10)))
        append(source, list(range(5, 15)))  # 5..9 again
        wait_for_ids(location, query, list(range(15)))
        append(source, [3, 15, 15, 16])
        wait_for_ids(location, query, list(range(17)))
        assert query.lastProgress is None  # all inside the first epoch
    finally:
        query.stop()
    streamed = [
        h for h in DeltaTable(location).history() if h.get("operation") == "STREAMING UPDATE"
    ]
    assert len(streamed) >= 3  # committed inside the epoch, not at its end

    # The restart replays epoch 0 from its start offsets (Spark committed no batch): the
    # dedup state is the epoch's start state again, the rows the same; then new ones.
    append(source, [0, 16, 17, 18])
    query = start(
        spark.readStream.format("delta").load(source).dropDuplicates(["id"]), name, checkpoint
    )
    try:
        wait_for_ids(location, query, list(range(19)))
        append(source, [1, 19])
        wait_for_ids(location, query, list(range(20)))
    finally:
        query.stop()
    assert ids(location) == list(range(20))


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_task_failure_mid_epoch_fails_the_query_and_its_restart_adds_no_duplicates(
    spark, table_path, where
) -> None:
    # Row 25 fails its task once, in the source's stage (before the shuffle) or in the
    # sink's (after dropDuplicates). A pipelined shuffle gives each task one attempt on any
    # master: the job aborts, the query ends; its restart replays the epoch.
    marker = f"deltaflow.test.realtime.dedup.failed.{next(_names)}"

    def failing(frame: Any) -> Any:
        if where == "before":
            return failing_at_25(frame, marker, "n").dropDuplicates(["id"])
        return failing_at_25(frame.dropDuplicates(["id"]), marker, "n")

    source = table_path("src")
    checkpoint = table_path("ck")
    append(source, list(range(20)))
    name, location = new_table(spark)
    query = start(failing(spark.readStream.format("delta").load(source)), name, checkpoint)
    try:
        wait_for_ids(location, query, list(range(20)))
        append(source, list(range(15, 40)))
        wait_until(lambda: not query.isActive, 120, "the query to fail at row 25")
    finally:
        query.stop()
    assert spark._jvm.java.lang.System.getProperty(marker) == "x"  # the failure happened
    assert "injected failure" in str(query.exception())
    before = ids(location)
    assert len(before) == len(set(before)) and set(range(20)) <= set(before)

    query = start(failing(spark.readStream.format("delta").load(source)), name, checkpoint)
    try:
        wait_for_ids(location, query, list(range(40)))
        append(source, [25, 40])
        wait_for_ids(location, query, list(range(41)))
    finally:
        query.stop()
    assert ids(location) == list(range(41))


def test_a_union_of_two_sources_is_refused_at_start(spark, table_path) -> None:
    one, two = table_path("one"), table_path("two")
    append(one, [1])
    append(two, [2])
    union = (
        spark.readStream.format("delta").load(one).union(spark.readStream.format("delta").load(two))
    )
    name, location = new_table(spark)
    with pytest.raises(Exception) as raised:
        start(union.dropDuplicates(["id"]), name, table_path("ck"))
    error = deltaflow.typed_error(raised.value)
    assert isinstance(error, UnsupportedFeatureError), raised.value
    assert error.feature == "realTimeSinkOperators"
    assert error.operators == "dropDuplicates(id)"
    assert "2 streaming sources" in str(error)
    assert "at least once" in str(error)  # Kafka/foreach are not offered as equivalent
    assert error.alternative == "trigger(processingTime='1 second')"
    assert ids(location) == []


def test_checkpoint_format_1_is_refused_at_start(spark, table_path) -> None:
    # Spark 4.3 refuses it itself, inside start() and before the connector's own check
    # (RealTimeRefusal), for any real-time query: its message names the setting.
    source = table_path("src")
    append(source, [1])
    name, location = new_table(spark)
    with conf_set(spark, FORMAT, "1"), pytest.raises(Exception) as raised:
        start(
            spark.readStream.format("delta").load(source).dropDuplicates(["id"]),
            name,
            table_path("ck"),
        )
    assert FORMAT in str(raised.value)
    assert "must be 2 or above" in str(raised.value)
    assert ids(location) == []
