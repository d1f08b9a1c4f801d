"""A row log's frame, synced, to its row in a JVM foreach sink (issue 28, the reader side).

A local Delta table; a real-time query reads it (``trigger(realTime="5 seconds")``) into
:file:`_jvm/LatencyWriter.scala`. Python appends one-row frames to a row log segment beside
the table (``_rowlog.SegmentWriter``, fdatasync per frame) at a steady rate and no Delta
commit: latency of a row = its arrival in the sink minus the return of its frame's append
(one machine, one clock, ms). Not part of ``run_all.py``.

Usage: python bench/bench_rowlog_read.py [frames per second] [seconds]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from _common import loadavg, percentile, spark_session
from _realtime import writer_jar
from deltaflow.table import _rowlog


def arrivals(folder: Path) -> dict[int, int]:
    """seq -> its arrival (ms)."""
    seen: dict[int, int] = {}
    for path in folder.iterdir():
        for line in path.read_text().splitlines():
            seq, at = line.split()
            seen[int(seq)] = int(at)
    return seen


def main(rate: int, seconds: int) -> None:
    from pyspark.sql.streaming.query import StreamingQuery

    root = Path(tempfile.mkdtemp(prefix="rowlog-read-"))
    source, arrived = str(root / "src"), root / "arrived"
    arrived.mkdir()
    spark = spark_session({"spark.jars": str(writer_jar())})
    spark.createDataFrame([(-1,)], "seq long").write.format("delta").save(source)
    jvm = spark._jvm
    query = StreamingQuery(
        spark.readStream.format("delta")
        .load(source)
        ._jdf.writeStream()
        .foreach(jvm.deltaflow.bench.LatencyWriter(str(arrived)))
        .outputMode("update")
        .option("checkpointLocation", str(root / "chk"))
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime("5 seconds"))
        .start()
    )
    deadline = time.monotonic() + 180
    while -1 not in arrivals(arrived):  # the query is up
        assert time.monotonic() < deadline and query.isActive, query.exception()
        time.sleep(0.05)
    segment = _rowlog.SegmentWriter(_rowlog.partition_dir(source, "bench", 0), 1, 0)
    written: dict[int, float] = {}
    load = loadavg()
    for seq in range(rate * seconds):
        due = time.monotonic() + 1 / rate
        segment.append(pa.record_batch({"seq": pa.array([seq], pa.int64())}))
        written[seq] = time.time() * 1000
        time.sleep(max(0.0, due - time.monotonic()))
    deadline = time.monotonic() + 30
    while len(arrivals(arrived)) <= len(written) and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = arrivals(arrived)
    query.stop()
    ms = [seen[s] - at for s, at in written.items() if s in seen]
    print(
        f"{rate} frames/s for {seconds} s: {len(ms)} of {len(written)} rows arrived;"
        f" p50 {percentile(ms, 0.5):.1f} p90 {percentile(ms, 0.9):.1f}"
        f" p99 {percentile(ms, 0.99):.1f} max {max(ms):.1f} mean {statistics.fmean(ms):.1f} ms;"
        f" load {load.split()[0]} -> {loadavg().split()[0]}"
    )


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 100,
        int(sys.argv[2]) if len(sys.argv) > 2 else 20,
    )
