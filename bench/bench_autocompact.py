"""Auto compaction on a stream of tiny micro-batches (issue 14, part 7).

A source Delta table gets ``--batches`` commits of ``ROWS`` rows each (delta-rs, one file
per commit, ids increasing). A Delta -> Delta stream reads it with
``maxFilesPerTrigger=1`` and ``availableNow``: one micro-batch, one sink commit and one
small file per source commit. It runs twice in one Spark session into fresh targets:
without auto compaction, and with ``delta.autoOptimize.autoCompact=true`` (delta-spark's
defaults: 50 small files in a partition start a compaction to 128 MB files). Figures:
files at the end, the stream's wall time (the write cost, compactions included), and the
median time of a selective query (``id`` in a 1% range: stats skipping) on each target.

    python bench/bench_autocompact.py            # 1,000 micro-batches
    python bench/bench_autocompact.py --quick    # 100
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pyarrow as pa

from _common import DATA_DIR, fresh_dir, loadavg, save_result, spark_session

ROWS = 20


def source_table(path: Path, batches: int) -> None:
    from deltalake import write_deltalake

    for b in range(batches):
        ids = pa.array(range(b * ROWS, (b + 1) * ROWS), pa.int64())
        write_deltalake(
            str(path),
            pa.table({"id": ids, "value": pa.array([f"v{i}" for i in ids.to_pylist()])}),
            mode="append",
        )


def run_stream(spark, source: Path, target: Path, checkpoint: Path) -> float:
    start = time.perf_counter()
    query = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", "1")
        .load(str(source))
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(target))
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(query.exception())
    return time.perf_counter() - start


def selective_query_seconds(spark, target: Path, batches: int, reps: int = 5) -> float:
    total = batches * ROWS
    low, high = total // 2, total // 2 + max(total // 100, 1)
    seconds = []
    for _ in range(reps + 1):  # the first run warms up
        start = time.perf_counter()
        found = (
            spark.read.format("delta")
            .load(str(target))
            .where(f"id >= {low} AND id < {high}")
            .count()
        )
        seconds.append(time.perf_counter() - start)
        assert found == high - low, found
    return statistics.median(seconds[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 micro-batches")
    parser.add_argument("--batches", type=int, default=None)
    args = parser.parse_args()
    batches = args.batches or (100 if args.quick else 1000)
    from deltalake import DeltaTable

    root = fresh_dir(DATA_DIR / "autocompact")
    source = root / "source"
    started = time.perf_counter()
    source_table(source, batches)
    print(f"source: {batches} commits in {time.perf_counter() - started:.1f}s", flush=True)
    spark = spark_session({"spark.sql.shuffle.partitions": "2"})
    results = {}
    for name, properties in (
        ("off", {}),
        ("autoCompact", {"delta.autoOptimize.autoCompact": "true"}),
    ):
        target = root / f"target-{name}"
        # The target exists first, with its properties, as a user would create it.
        writer = spark.createDataFrame([], "id bigint, value string").write.format("delta")
        for key, value in properties.items():
            writer = writer.option(key, value)
        writer.save(str(target))
        load_before = loadavg()
        write_s = run_stream(spark, source, target, root / f"checkpoint-{name}")
        table = DeltaTable(str(target))
        files = len(table.get_add_actions(flatten=True))
        optimizes = sum(1 for h in table.history() if h.get("operation") == "OPTIMIZE")
        rows = table.to_pyarrow_table().num_rows
        assert rows == batches * ROWS, rows
        query_s = selective_query_seconds(spark, target, batches)
        results[name] = {
            "batches": batches,
            "files_at_end": files,
            "optimize_commits": optimizes,
            "write_seconds": round(write_s, 2),
            "selective_query_seconds": round(query_s, 3),
            "load_before": load_before,
            "load_after": loadavg(),
        }
        print(name, results[name], flush=True)
    off, on = results["off"], results["autoCompact"]
    results["ratios"] = {
        "files": round(on["files_at_end"] / max(off["files_at_end"], 1), 3),
        "write": round(on["write_seconds"] / off["write_seconds"], 2),
        "selective_query": round(on["selective_query_seconds"] / off["selective_query_seconds"], 2),
    }
    print("ratios (autoCompact / off):", results["ratios"], flush=True)
    save_result("autocompact", results)
    spark.stop()


if __name__ == "__main__":
    main()
