"""The real-time Delta source's per-epoch timing line (issue 28, rtmsplit): where a
commit's milliseconds go on the source's side (notice, Parquet open, rest of the file),
logged by each epoch's reader at INFO, read here from the JVM's log in a real Delta →
Delta real-time query (``local[2]``).

The line is read from the log, not from a test hook: the log line is what an engineer
running a query or ``bench_realtime.py`` gets, so the test checks that, logger and
level included. Durations are checked for shape only (counts, order), never for speed.
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
from tests.spark.test_realtime_sink import ALLOWLIST, new_table, real_time, wait_for_rows

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1"),
]

# Short epochs (Spark's floor lowered to 1 s): each epoch's end logs its reader's line.
EPOCH = "2 seconds"
MIN_EPOCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"
LOGGER = "org.apache.spark.sql.deltaflow"
STEP = r"(?:(\d+)x p50 ([\d.]+) p99 ([\d.]+) max ([\d.]+) ms|-)"
LINE = re.compile(
    r"deltaflow real-time reader e(\d+) of (\S+): (\d+) files, (\d+) rows "
    r"\((\d+) from the row log\); "
    rf"notice {STEP}; open {STEP}; rest of file {STEP}; file {STEP}$"
)
COMMITS = 4


def parse(line: str) -> dict[str, Any]:
    match = LINE.match(line)
    assert match is not None, line
    groups = match.groups()
    steps = {}
    for i, step in enumerate(("notice", "open", "rest", "file")):
        count, *ms = groups[5 + 4 * i : 9 + 4 * i]
        steps[step] = (int(count), *map(float, ms)) if count else (0, 0.0, 0.0, 0.0)
    return {
        "epoch": int(groups[0]),
        "table": groups[1],
        "files": int(groups[2]),
        "rows": int(groups[3]),
        "row_log_rows": int(groups[4]),
        **steps,
    }


def test_each_epoch_logs_where_the_source_s_milliseconds_go(spark, table_path, tmp_path) -> None:
    source = table_path("src")
    write_deltalake(source, pa.table({"id": pa.array([0], pa.int32())}))
    name, location = new_table(spark)
    with (
        conf_set(spark, ALLOWLIST, "false"),
        conf_set(spark, MIN_EPOCH_CONF, "1000"),
        jvm_log_lines(spark, LOGGER, tmp_path / "jvm.log") as logged,
    ):
        writer = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("delta")
            .outputMode("update")
            .option("checkpointLocation", table_path("ck"))
        )
        query = real_time(writer, EPOCH).toTable(name)
        try:
            wait_for_rows(location, query, 1)
            for i in range(1, COMMITS):
                ids = pa.array([i], pa.int32())
                write_deltalake(source, pa.table({"id": ids}), mode="append")
                wait_for_rows(location, query, i + 1)

            def readers() -> list[dict[str, Any]]:
                return [parse(m) for m in logged() if m.startswith("deltaflow real-time reader")]

            # Every commit's file read, in epochs that ended (one line per epoch).
            wait_until(
                lambda: sum(r["files"] for r in readers()) >= COMMITS,
                90,
                f"reader lines covering {COMMITS} files",
            )
        finally:
            query.stop()
    lines = [r for r in readers() if r["table"].endswith(source)]
    assert lines, logged()
    # One file a commit, counted by the epoch that reads it to its end: an epoch that ends
    # inside a file leaves it unfinished (opened, not counted), and the next epoch opens it
    # again and skips the rows already emitted (not counted twice).
    assert sum(r["files"] for r in lines) == COMMITS
    assert sum(r["rows"] for r in lines) == COMMITS
    assert all(r["row_log_rows"] == 0 for r in lines)  # no row log on this table
    assert len({r["epoch"] for r in lines}) == len(lines)  # one line per epoch
    for r in lines:
        assert r["rest"][0] == r["file"][0] == r["files"], r
        assert r["open"][0] in (r["files"], r["files"] + 1), r  # + one still open
        assert r["notice"][0] <= r["open"][0], r  # a notice brings at least one file
        for step in ("notice", "open", "rest", "file"):
            _, p50, p99, most = r[step]
            assert 0.0 <= p50 <= p99 <= most, (step, r)
        if r["open"][0] == r["files"]:  # no file left open: the same files in both steps
            # A file's wall time holds its open: every sample, so every quantile.
            assert r["file"][1] >= r["open"][1] and r["file"][3] >= r["open"][3], r
    # The first epoch's reader noticed the first commit(s).
    assert sum(r["notice"][0] for r in lines) >= 1
