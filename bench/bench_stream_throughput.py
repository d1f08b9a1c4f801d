"""Streaming throughput: Delta -> Delta vs Spark's parquet -> parquet file stream, same files.

One Delta table of N rows (8 files, written by delta-rs) is the data for every
variant: the Delta source reads it through its log, the parquet file source lists the
same directory (Spark's file listing skips ``_delta_log``), so both read the very same
Parquet files. Every variant runs the same query with ``trigger(availableNow=True)``
into a fresh output and checkpoint:

    where(qty % 10 <> 0) . select(id, ts, upper(category), value * 2)

Variants: parquet -> parquet (baseline), delta -> delta (deltaflow), and the two mixed
ones, which tell the source's cost from the sink's; "Python source" variants read through
the Python data source the connector's JVM source replaced (``nativeScan=false``). A
last variant, "bare Python source -> parquet", is the ceiling of Spark's Python stream
source API on this machine: a source with no Delta logic at all that reads the same
files with pyarrow, grouped into the same tasks as deltaflow's Python source. The output
row count of every run is checked against the baseline's. ``--sources-only`` runs the
sources into Spark's ``noop`` sink instead (input row counts checked).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import _bare_source
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

    files = sorted(str(p) for p in table.glob("*.parquet"))
    # In the same tasks as deltaflow's source, so that the two differ only in what a task does.
    _bare_source.register(
        spark, "bare_python_stream", schema, lambda _: files, _bare_source.as_deltaflow_groups
    )

    def source(kind: str) -> Any:
        if kind == "delta":
            return spark.readStream.format("delta").load(str(table))
        if kind == "delta-python":  # the Python data source the connector replaced
            spark.conf.set("deltaflow.read.nativeScan", "false")
            try:
                return spark.readStream.format("delta").load(str(table))
            finally:
                spark.conf.unset("deltaflow.read.nativeScan")
        if kind == "bare":
            return spark.readStream.format("bare_python_stream").load()
        return spark.readStream.schema(schema).parquet(str(table))

    expected: dict[str, int] = {}

    def variant(src: str, dst: str):
        if dst == "noop":
            return into_noop(src)

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

    def into_noop(src: str):
        def run() -> None:
            target = out / uuid.uuid4().hex
            query = (
                transform(source(src))
                .writeStream.format("noop")
                .option("checkpointLocation", str(target / "_chk"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            count = sum(p["numInputRows"] for p in query.recentProgress)
            assert count == rows, (src, count, rows)

        return run

    if args.sources_only:
        base_name = "parquet -> noop (Spark file source)"
        variants = {
            base_name: variant("parquet", "noop"),
            "delta -> noop (deltaflow connector source)": variant("delta", "noop"),
            "delta -> noop (deltaflow Python source)": variant("delta-python", "noop"),
            "bare Python source -> noop (the API's ceiling)": variant("bare", "noop"),
        }
        return report(args, rows, base_name, variants, lambda: "into noop", "stream_sources")
    variants = {
        "parquet -> parquet (Spark file stream)": variant("parquet", "parquet"),
        "delta -> delta (deltaflow)": variant("delta", "delta"),
        "delta -> parquet (deltaflow source only)": variant("delta", "parquet"),
        "delta -> parquet (Python source, before the connector)": variant(
            "delta-python", "parquet"
        ),
        "parquet -> delta (deltaflow sink only)": variant("parquet", "delta"),
        "bare Python source -> parquet (the API's ceiling)": variant("bare", "parquet"),
    }
    base_name = "parquet -> parquet (Spark file stream)"
    return report(
        args, rows, base_name, variants, lambda: f"{expected['rows']:,} out", "stream_throughput"
    )


def report(
    args: Any,
    rows: int,
    base_name: str,
    variants: dict[str, Any],
    describe_output: Callable[[], str],
    result_name: str,
) -> dict[str, object]:
    timings = run_side_by_side(variants, args.reps)
    output = describe_output()  # after the runs: they count the output
    base = timings.median(base_name)
    table_rows = [
        (name, timings.median(name), rows, base / timings.median(name)) for name in variants
    ]
    print_table(f"Streaming throughput, {rows:,} rows in, {output}", table_rows)
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
        "output": output,
        "reps": args.reps,
        "seconds": timings.seconds,
        "median_s": {name: timings.median(name) for name in variants},
        "ratio_of_medians": {name: base / timings.median(name) for name in variants},
        "per_rep_ratios": per_rep,
    }
    save_result(result_name if args.rows is None else f"{result_name}_{rows}", result)
    return result


if __name__ == "__main__":
    main()
