"""A real-time Delta sink hands a roll over as soon as the Delta source of its task says
it has handed on every row it holds (issue 28: no 2 ms grace per hop), and keeps the grace
behind a source that says nothing (Spark's real-time memory stream). Read from the
writers' per-epoch timing line in the JVM's log, in real queries (``local[2]``).

The grace is raised for these queries (``spark.deltaflow.realTime.graceMs``, internal) so
that which rule sent a roll is not a matter of timing: behind the Delta source no roll may
wait for it; behind the memory stream every roll must.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltaflow.spark._compat import PYSPARK_MINOR
from tests._waiting import wait_until
from tests.spark._conf import conf_set
from tests.spark._jvm_log import jvm_log_lines
from tests.spark.test_realtime_sink import (
    ALLOWLIST,
    MemoryStream,
    ids,
    new_table,
    real_time,
    wait_for_rows,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

EPOCH = "2 seconds"  # short epochs: each epoch's end logs its writers' lines
MIN_EPOCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"
GRACE_CONF = "spark.deltaflow.realTime.graceMs"
LOGGER = "org.apache.spark.sql.deltaflow"
STEP = r"(?:(\d+)x p50 ([\d.]+) p99 ([\d.]+) max ([\d.]+) ms|-)"
LINE = re.compile(
    r"deltaflow real-time writer p\d+ e\d+ a\d+: (\d+) rolls \((\d+) at the source's idle, "
    rf"before the grace\); open {STEP}; row path waits for open {STEP}; held {STEP}; "
    rf"close {STEP}; commit round trip {STEP}$"
)
COMMITS = 4


def writer_lines(logged: Any) -> list[dict[str, Any]]:
    lines = []
    for message in logged():
        if message.startswith("deltaflow real-time writer"):
            match = LINE.match(message)
            assert match is not None, message
            groups = match.groups()
            held = groups[10:14]
            lines.append(
                {
                    "idle": int(groups[1]),
                    "held": int(held[0]) if held[0] else 0,
                    "held_p50_ms": float(held[1]) if held[0] else 0.0,
                }
            )
    return lines


def run(spark, tmp_path, frame: Any, feed: Any, grace_ms: int) -> list[dict[str, Any]]:
    name, location = new_table(spark)
    with (
        conf_set(spark, ALLOWLIST, "false"),
        conf_set(spark, MIN_EPOCH_CONF, "1000"),
        conf_set(spark, GRACE_CONF, str(grace_ms)),
        jvm_log_lines(spark, LOGGER, tmp_path / "jvm.log") as logged,
    ):
        writer = (
            frame.writeStream.format("delta")
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "ck"))
        )
        query = real_time(writer, EPOCH).toTable(name)
        try:
            for i in range(COMMITS):
                feed(i)
                wait_for_rows(location, query, i + 1)
            assert ids(location) == list(range(COMMITS))
            # Lines from epochs that ended after the rows landed.
            wait_until(
                lambda: sum(w["held"] for w in writer_lines(logged)) >= 1,
                90,
                "a writer line with a roll handed over during its epoch",
            )
        finally:
            query.stop()
    return writer_lines(logged)


def test_behind_the_delta_source_a_roll_goes_without_the_grace(spark, table_path, tmp_path) -> None:
    source = table_path("src")
    write_deltalake(source, pa.table({"id": pa.array([0], pa.int32())}))

    def feed(i: int) -> None:
        if i:  # row 0 is the table's first commit
            write_deltalake(source, pa.table({"id": pa.array([i], pa.int32())}), mode="append")

    frame = spark.readStream.format("delta").load(source)
    # A grace of 10 minutes: a roll that waited for it would not land in this test.
    lines = run(spark, tmp_path, frame, feed, grace_ms=600_000)
    handed = [w for w in lines if w["held"]]
    assert handed, lines
    for w in handed:
        # Every roll handed over during an epoch went at the source's idle.
        assert w["idle"] == w["held"], w


def test_behind_a_source_that_says_nothing_the_grace_holds(spark, tmp_path) -> None:
    memory = MemoryStream(spark)
    lines = run(spark, tmp_path, memory.frame(), lambda i: memory.add([i]), grace_ms=300)
    handed = [w for w in lines if w["held"]]
    assert handed, lines
    for w in handed:
        assert w["idle"] == 0, w
        assert w["held_p50_ms"] >= 299, w  # every roll waited out the grace
