"""End-to-end streaming latency: upstream commit -> visible in the downstream Delta table.

An upstream writer thread (delta-rs, in this process) appends a small commit every
``--interval-ms`` (10 rows each; every row carries ``seq``, the commit's sequence
number). A Delta -> Delta query (``where`` + ``upper``) runs with
``trigger(processingTime="0 seconds")``. A poller thread watches the sink's
``_delta_log`` for the next commit file (every 2 ms: one ``stat``) and reads the new
commit's ``add`` stats: their ``seq`` min/max tell which upstream commits it made
visible. Latency of an upstream commit = the time the poller saw the sink commit minus
the time ``write_deltalake`` returned upstream (both this process's clock).

Two references run first, with the upstream writing a Parquet file per commit into a
folder and Spark's parquet file sink downstream: Spark's own file source (Spark's floor
here) and a bare Python stream source that lists the folder (the floor for any Python
source). Variants run one after another in one Spark session (Python workers warm), each
with a fresh source, sink and checkpoint: a warm-up, then ``--seconds`` of measurement.
p50 / p90 / p99 / max are over the upstream commits of the measurement window.

Real-time mode variants (``_realtime.py``; ``--only realtime`` runs just those): the Delta
source under ``trigger(realTime=...)`` into a JVM foreach sink that stamps each row on
arrival; latency of a commit = its last row's arrival minus ``write_deltalake``'s return.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa

import _bare_source
from _common import (
    DATA_DIR,
    drive_upstream,
    fresh_dir,
    loadavg,
    parse_args,
    percentile,
    save_result,
    spark_session,
)

ROWS_PER_COMMIT = 10
FILE_SCHEMA = "seq long, id long, kind string"
RAW_LOCAL_FS = "org.apache.hadoop.fs.local.RawLocalFs"


class Upstream(threading.Thread):
    def __init__(
        self, path: str, interval_s: float, kind: str = "delta", rows: int = ROWS_PER_COMMIT
    ) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.rows = rows
        self.kind = kind  # "delta": a commit per write; otherwise a Parquet file per write
        self.interval_s = interval_s
        self.visible_at: dict[int, float] = {}  # seq -> when write_deltalake returned
        self.stop_event = threading.Event()
        self.seq = 0

    def write(self) -> None:
        from deltalake import write_deltalake

        seq = self.seq
        table = pa.table(
            {
                "seq": pa.array([seq] * self.rows, pa.int64()),
                "id": pa.array(range(seq * 100, seq * 100 + self.rows), pa.int64()),
                "kind": pa.array(["click"] * self.rows),
            }
        )
        if self.kind == "delta":
            write_deltalake(self.path, table, mode="append")
        else:  # a file Spark's file source lists once it has its final name
            import pyarrow.parquet as pq

            Path(self.path).mkdir(parents=True, exist_ok=True)
            staged = Path(self.path, f".part-{seq:06d}.parquet")
            pq.write_table(table, staged)
            staged.rename(Path(self.path, f"part-{seq:06d}.parquet"))
        self.visible_at[seq] = time.time()
        self.seq += 1

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            self.write()
            next_at += self.interval_s
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))


class SinkPoller(threading.Thread):
    def __init__(self, path: str, kind: str = "delta") -> None:
        super().__init__(daemon=True)
        self.log = Path(path) / "_delta_log"
        self.kind = kind
        self.path = Path(path)
        self.seen_at: dict[int, float] = {}  # seq -> when the sink commit with it appeared
        self.stop_event = threading.Event()

    def run(self) -> None:
        if self.kind != "delta":
            self.run_file_sink()
            return
        version = 0
        while not self.stop_event.is_set():
            entry = self.log / f"{version:020d}.json"
            if not entry.exists():
                time.sleep(0.002)
                continue
            seen = time.time()
            for line in entry.read_text().splitlines():
                if '"add"' not in line:
                    continue
                stats = json.loads(json.loads(line)["add"]["stats"])
                low, high = stats["minValues"]["seq"], stats["maxValues"]["seq"]
                for seq in range(low, high + 1):
                    self.seen_at.setdefault(seq, seen)
            version += 1

    def run_file_sink(self) -> None:
        """Spark's file sink: ``_spark_metadata/<batch>`` (``<batch>.compact`` every 10th)
        lists the files a batch committed; their footers' ``seq`` stats say which."""
        import pyarrow.parquet as pq

        batch = 0
        while not self.stop_event.is_set():
            log = self.path / "_spark_metadata"
            entry = next(
                (p for p in (log / str(batch), log / f"{batch}.compact") if p.exists()), None
            )
            if entry is None:
                time.sleep(0.002)
                continue
            seen = time.time()
            for line in entry.read_text().splitlines()[1:]:
                file_path = unquote(urlparse(json.loads(line)["path"]).path)
                meta = pq.read_metadata(file_path)
                column = meta.schema.names.index("seq")
                for group in range(meta.num_row_groups):
                    stats = meta.row_group(group).column(column).statistics
                    if stats is not None and stats.has_min_max:
                        for seq in range(stats.min, stats.max + 1):
                            self.seen_at.setdefault(seq, seen)
            batch += 1


def measure(
    spark: Any, name: str, options: dict[str, str], args: Any, out: Path, kind: str = "delta"
) -> dict[str, Any]:
    slug = re.sub(r"\W+", "_", name)
    root = out / f"{slug}-{uuid.uuid4().hex[:8]}"
    source, sink, checkpoint = str(root / "src"), str(root / "dst"), str(root / "chk")
    upstream = Upstream(source, args.interval_ms / 1000, kind)
    upstream.write()  # the table exists before the query starts
    from pyspark.sql import functions as F

    if kind == "delta":
        reader = spark.readStream.format("delta").load(source)
    elif kind == "bare":
        reader = spark.readStream.format("bare_python_files").load(source)
    else:
        reader = spark.readStream.schema(FILE_SCHEMA).parquet(source)
    writer = (
        reader.where("kind <> 'heartbeat'")
        .select("seq", "id", F.upper("kind").alias("kind"))
        .writeStream.format("delta" if kind == "delta" else "parquet")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    poller = SinkPoller(sink, kind)
    poller.start()
    query = writer.start(sink)
    deadline = time.monotonic() + 180
    while 0 not in poller.seen_at:  # the first batch (and the Python workers) are up
        if time.monotonic() > deadline or not query.isActive:
            raise RuntimeError(f"{name}: the first batch never arrived: {query.exception()}")
        time.sleep(0.05)
    first_seq, last_seq, load_before = drive_upstream(
        upstream, lambda: poller.seen_at, args, drain_seconds=60
    )
    progress = query.recentProgress
    query.stop()
    poller.stop_event.set()
    poller.join()
    latencies = [
        (poller.seen_at[s] - upstream.visible_at[s]) * 1000
        for s in range(first_seq, last_seq)
        if s in poller.seen_at
    ]
    missing = sum(1 for s in range(first_seq, last_seq) if s not in poller.seen_at)
    durations: dict[str, list[int]] = {}
    for p in progress:
        if p["numInputRows"]:
            for key, value in p["durationMs"].items():
                durations.setdefault(key, []).append(int(value))
    result = {
        "variant": name,
        "options": options,
        "commits": len(latencies),
        "missing": missing,
        "p50_ms": percentile(latencies, 0.5),
        "p90_ms": percentile(latencies, 0.9),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "mean_ms": statistics.fmean(latencies),
        "batch_phase_median_ms": {k: statistics.median(v) for k, v in durations.items()},
        "batches_with_data": len(durations.get("triggerExecution", [])),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    print(
        f"| {name} | {result['commits']} | {result['p50_ms']:.0f} | {result['p90_ms']:.0f} |"
        f" {result['p99_ms']:.0f} | {result['max_ms']:.0f} | {load_before.split()[0]} |",
        flush=True,
    )
    print(f"    phases (median ms, batches with data): {result['batch_phase_median_ms']}")
    return result


# name -> (writeStream options, session confs set for the variant's query)
VARIANTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "baseline": ({}, {}),
    "Python sink (nativeWrite=false)": ({}, {"deltaflow.write.nativeWrite": "false"}),
    "asyncProgressTracking": (
        {
            "asyncProgressTrackingEnabled": "true",
            "asyncProgressTrackingCheckpointIntervalMs": "1000",
        },
        {},
    ),
    "noDataMicroBatches off": ({}, {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}),
    # Checkpoint files through Hadoop's raw local FileContext: no .crc file per entry.
    "raw local checkpoint FS": ({}, {"fs.AbstractFileSystem.file.impl": RAW_LOCAL_FS}),
}


def main() -> dict[str, object]:
    parser_args = parse_args(__doc__ or "")
    args = parser_args
    args.seconds = 15 if args.quick else 60
    args.warmup = 5 if args.quick else 10
    args.interval_ms = 200
    from _realtime import measure_realtime, writer_jar

    spark = spark_session({"spark.jars": str(writer_jar())})
    out = fresh_dir(DATA_DIR / "stream_latency_out")
    if args.only == "realtime":
        results = [measure_realtime(spark, rate, args, out, Upstream) for rate in (100, 1000)]
        save_result("stream_latency_realtime", {"seconds": args.seconds, "results": results})
        return {"results": results}
    print("| variant | commits | p50 ms | p90 ms | p99 ms | max ms | load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    results = []
    # Spark's own floor on this machine: its parquet file source and sink, same query.
    reference = "Spark reference: parquet files -> parquet file sink"
    results.append(measure(spark, reference, {}, args, out, kind="parquet"))
    # The floor of any Python stream source: the same, with the files listed and read
    # by a Python source that has no Delta logic.
    _bare_source.register(
        spark,
        "bare_python_files",
        FILE_SCHEMA,
        lambda options: sorted(str(p) for p in Path(options["path"]).glob("part-*.parquet")),
        lambda new: [new],
    )
    bare = "bare Python source: parquet files -> parquet file sink"
    results.append(measure(spark, bare, {}, args, out, kind="bare"))
    for name, (options, confs) in VARIANTS.items():
        previous = {key: spark.conf.get(key, None) for key in confs}
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            results.append({**measure(spark, name, options, args, out), "confs": confs})
        except Exception as exc:  # report a refused variant and go on
            message = str(exc).splitlines()[0][:300]
            print(f"| {name} | refused: {message} |", flush=True)
            results.append({"variant": name, "options": options, "error": message})
        finally:
            for key, value in previous.items():
                if value is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, value)
    # Real-time mode (Spark 4.1+): Delta -> a JVM foreach sink, at ~100 and ~1,000 events/s.
    results += [measure_realtime(spark, rate, args, out, Upstream) for rate in (100, 1000)]
    result = {
        "interval_ms": args.interval_ms,
        "rows_per_commit": ROWS_PER_COMMIT,
        "seconds": args.seconds,
        "results": results,
    }
    save_result("stream_latency", result)
    return result


if __name__ == "__main__":
    main()
