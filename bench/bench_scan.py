"""Full scan: ``format("delta")`` (connector, Python path) vs ``spark.read.parquet``, same files.

The baseline is ``spark.read.schema(s).parquet(*files)``: with the schema given,
Spark does not read footers to infer it, so the comparison is scan against scan.
Every column is materialised into Spark rows and dropped by the ``noop`` sink, so the
figure is the scan itself: Parquet decode plus, for the Python path, Arrow batches
moving from the Python worker into the JVM.
"""

from __future__ import annotations

from _common import parse_args, print_table, run_side_by_side, save_result, spark_session
from _data import events_table, table_files


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows, files = (400_000, 4) if args.quick else (8_000_000, 8)
    path = events_table("events", rows, files)
    spark = spark_session()
    uris = table_files(path)
    schema = spark.read.parquet(uris[0]).schema

    def scan(df_factory):
        def run() -> None:
            df_factory().write.format("noop").mode("overwrite").save()

        return run

    def delta(mode: str):
        def make():
            spark.conf.set("deltaflow.read.nativeScan", mode)
            return spark.read.format("delta").load(str(path))

        return make

    variants = {
        "parquet": scan(lambda: spark.read.schema(schema).parquet(*uris)),
        "parquet, schema inferred": scan(lambda: spark.read.parquet(*uris)),
        "delta (connector)": scan(delta("auto")),
        "delta (Python path)": scan(delta("false")),
    }
    print(f"scan: {rows} rows, {files} files, {args.reps} warm reps")
    timings = run_side_by_side(variants, args.reps)
    spark.conf.set("deltaflow.read.nativeScan", "auto")
    base = timings.median("parquet")
    table = [(n, timings.median(n), rows, base / timings.median(n)) for n in variants]
    print_table(f"scan, {rows} rows x 5 columns, {files} files", table)
    result = {"rows": rows, "files": files, "seconds": timings.seconds, "table": table}
    save_result("scan_quick" if args.quick else "scan", result)
    spark.stop()
    return result


if __name__ == "__main__":
    main()
