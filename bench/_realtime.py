"""Real-time mode variants of the latency benchmark (``bench_stream_latency.py``).

Upstream: ``write_deltalake`` appends commits (``rows`` rows each, all carrying the commit's
``seq``) at a steady rate. The query reads the table with deltaflow's Delta source under
``trigger(realTime="5 seconds")`` into :file:`_jvm/LatencyWriter.scala`, a JVM foreach sink
that writes ``seq`` and its arrival time (ms) per row. Latency of a commit = the arrival of
its last row minus the moment ``write_deltalake`` returned (one machine, one clock).
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from _common import DATA_DIR, drive_upstream, loadavg, percentile

HERE = Path(__file__).parent
EPOCH = "5 seconds"


def writer_jar() -> Path:
    """The benchmark's JVM foreach sink, compiled with the Scala compiler pyspark ships."""
    from deltaflow.spark._jar import pyspark_jars_dir, scalac

    source = HERE / "_jvm" / "LatencyWriter.scala"
    jar = DATA_DIR / f"latency-writer-{int(source.stat().st_mtime)}.jar"
    if not jar.exists():
        jar.parent.mkdir(parents=True, exist_ok=True)
        classpath = str(pyspark_jars_dir() / "*")
        scalac([str(source)], classpath, jar)
    return jar


def _arrivals(folder: Path) -> dict[int, float]:
    """seq -> the arrival (s) of its last row."""
    last: dict[int, float] = {}
    for path in folder.iterdir():
        for line in path.read_text().splitlines():
            seq, at = line.split()
            last[int(seq)] = max(last.get(int(seq), 0.0), int(at) / 1000)
    return last


def measure_realtime(
    spark: Any, rate: int, args: Any, out: Path, upstream_class: Any
) -> dict[str, Any]:
    from pyspark.sql.streaming.query import StreamingQuery

    # ~rate events/s: 10 commits/s of rate/10 rows below 1,000 events/s, else 20 commits/s.
    commits_per_s = 10 if rate < 1000 else 20
    rows = max(1, rate // commits_per_s)
    name = f"real-time: Delta -> JVM foreach, {rate} events/s ({commits_per_s} commits/s)"
    root = out / f"realtime-{rate}-{uuid.uuid4().hex[:8]}"
    source, arrived = str(root / "src"), root / "arrived"
    arrived.mkdir(parents=True)
    upstream = upstream_class(source, 1 / commits_per_s, "delta", rows)
    upstream.write()
    jvm = spark._jvm
    jwriter = (
        spark.readStream.format("delta")
        .load(source)
        .select("seq", "id", "kind")
        ._jdf.writeStream()
        .foreach(jvm.deltaflow.bench.LatencyWriter(str(arrived)))
        .outputMode("update")
        .option("checkpointLocation", str(root / "chk"))
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(EPOCH))
    )
    query = StreamingQuery(jwriter.start())
    deadline = time.monotonic() + 180
    while 0 not in _arrivals(arrived):
        if time.monotonic() > deadline or not query.isActive:
            raise RuntimeError(f"{name}: the first rows never arrived: {query.exception()}")
        time.sleep(0.05)
    first_seq, last_seq, load_before = drive_upstream(
        upstream, lambda: _arrivals(arrived), args, drain_seconds=30
    )
    seen = _arrivals(arrived)
    query.stop()
    latencies = [
        (seen[s] - upstream.visible_at[s]) * 1000 for s in range(first_seq, last_seq) if s in seen
    ]
    result = {
        "variant": name,
        "events_per_s": rate,
        "rows_per_commit": rows,
        "commits": len(latencies),
        "missing": sum(1 for s in range(first_seq, last_seq) if s not in seen),
        "p50_ms": percentile(latencies, 0.5),
        "p90_ms": percentile(latencies, 0.9),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "mean_ms": statistics.fmean(latencies),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    print(
        f"| {name} | {result['commits']} | {result['p50_ms']:.0f} | {result['p90_ms']:.0f} |"
        f" {result['p99_ms']:.0f} | {result['max_ms']:.0f} | {load_before.split()[0]} |",
        flush=True,
    )
    return result
