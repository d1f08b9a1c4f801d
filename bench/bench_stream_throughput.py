"""Streaming throughput: Delta -> Delta vs Spark's parquet -> parquet file stream, same files.

One Delta table of N rows (8 files, written by delta-rs) is the data for every
variant: the Delta source reads it through its log, the parquet file source lists the
same directory (Spark's file listing skips ``_delta_log``), so both read the very same
Parquet files. Every variant runs the same query with ``trigger(availableNow=True)``
into a fresh output and checkpoint:

    where(qty % 10 <> 0) . select(id, ts, upper(category), value * 2)

Variants: parquet -> parquet (baseline), delta -> delta (deltaflow), and the two mixed
ones, which tell the source's cost from the sink's. The output row count of every run
is checked against the baseline's.
"""

from __future__ import annotations

import uuid
from typing import Any

from _common import (
    DATA_DIR,
    fresh_dir,
    parse_args,
    print_table,
    run_side_by_side,
    save_result,
    spark_session,
)
from _data import events_table


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows = args.rows or (400_000 if args.quick else 4_000_000)
    table = events_table("stream_events", rows, 8)
    spark = spark_session()
    from pyspark.sql import functions as F

    schema = spark.read.format("delta").load(str(table)).schema
    out = fresh_dir(DATA_DIR / "stream_throughput_out")

    def transform(df: Any) -> Any:
        return df.where("qty % 10 <> 0").select(
            "id", "ts", F.upper("category").alias("category"), (F.col("value") * 2).alias("value")
        )

    def source(kind: str) -> Any:
        if kind == "delta":
            return spark.readStream.format("delta").load(str(table))
        return spark.readStream.schema(schema).parquet(str(table))

    expected: dict[str, int] = {}

    def variant(src: str, dst: str):
        def run() -> None:
            target = out / uuid.uuid4().hex
            writer = (
                transform(source(src))
                .writeStream.format(dst)
                .option("checkpointLocation", str(target / "_chk"))
                .trigger(availableNow=True)
            )
            path = str(target / "data")
            query = writer.start(path) if dst == "delta" else writer.option("path", path).start()
            query.awaitTermination()
            reader = spark.read.format(dst)
            count = (
                reader.load(path)
                if dst == "delta"
                else reader.schema(
                    transform(spark.read.schema(schema).parquet(str(table))).schema
                ).load(path)
            ).count()
            expected.setdefault("rows", count)
            assert count == expected["rows"], (src, dst, count, expected)

        return run

    variants = {
        "parquet -> parquet (Spark file stream)": variant("parquet", "parquet"),
        "delta -> delta (deltaflow)": variant("delta", "delta"),
        "delta -> parquet (deltaflow source only)": variant("delta", "parquet"),
        "parquet -> delta (deltaflow sink only)": variant("parquet", "delta"),
    }
    timings = run_side_by_side(variants, args.reps)
    base_name = "parquet -> parquet (Spark file stream)"
    base = timings.median(base_name)
    table_rows = [
        (name, timings.median(name), rows, base / timings.median(name)) for name in variants
    ]
    print_table(f"Streaming throughput, {rows:,} rows in, {expected['rows']:,} out", table_rows)
    per_rep = {
        name: sorted(
            b / s for b, s in zip(timings.seconds[base_name], timings.seconds[name], strict=True)
        )
        for name in variants
    }
    for name, ratios in per_rep.items():
        print(f"  per-rep ratios {name}: {', '.join(f'{r:.2f}' for r in ratios)}")
    result = {
        "rows": rows,
        "output_rows": expected["rows"],
        "reps": args.reps,
        "seconds": timings.seconds,
        "median_s": {name: timings.median(name) for name in variants},
        "ratio_of_medians": {name: base / timings.median(name) for name in variants},
        "per_rep_ratios": per_rep,
    }
    save_result("stream_throughput" if args.rows is None else f"stream_throughput_{rows}", result)
    return result


if __name__ == "__main__":
    main()
