"""Liquid clustering: a selective query on a clustered vs an unclustered table.

The same rows (``--rows``, 2M by default; random order: ``x`` and ``y`` are hashes of
the row number) are written twice, each as 32 appends of one file:

- unclustered: a plain Delta table;
- clustered: ``CLUSTER BY (x, y)``, then ``OPTIMIZE`` (Hilbert order over x and y),
  with ``delta.targetFileSize`` chosen so both tables end up with about as many files.

The query selects about 1% of ``x`` (``x BETWEEN lo AND hi``) and sums a column, on the
JVM path; files scanned come from deltaflow's scan reports (``scan_reports``). Also
timed: the OPTIMIZE itself, and an incremental OPTIMIZE after one more append.
"""

from __future__ import annotations

import time

from _common import DATA_DIR, fresh_dir, parse_args, run_side_by_side, save_result, spark_session

APPENDS = 32


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows = args.rows or (200_000 if args.quick else 2_000_000)
    spark = spark_session()
    from pyspark.sql import functions as F

    import deltaflow

    root = fresh_dir(DATA_DIR / "clustering")
    plain, clustered = str(root / "plain"), str(root / "clustered")
    per = rows // APPENDS

    def batch(i: int):
        return spark.range(i * per, (i + 1) * per, numPartitions=1).selectExpr(
            "abs(xxhash64(id)) % 1000000 AS x",
            "abs(xxhash64(id, 7)) % 1000000 AS y",
            "id",
            "rand(3) AS value",
        )

    spark.sql(
        f"CREATE TABLE delta.`{clustered}` (x BIGINT, y BIGINT, id BIGINT, value DOUBLE)"
        " USING delta CLUSTER BY (x, y)"
    )
    for i in range(APPENDS):
        batch(i).write.format("delta").mode("append").save(plain)
        batch(i).write.format("delta").mode("append").save(clustered)
    size = sum(p.stat().st_size for p in (root / "plain").glob("*.parquet"))
    target = max(size // APPENDS, 1)
    spark.sql(
        f"ALTER TABLE delta.`{clustered}` SET TBLPROPERTIES ('delta.targetFileSize' = '{target}')"
    )
    start = time.perf_counter()
    spark.sql(f"OPTIMIZE delta.`{clustered}`").collect()
    optimize_s = time.perf_counter() - start
    batch(APPENDS).write.format("delta").mode("append").save(clustered)
    start = time.perf_counter()
    incremental = spark.sql(f"OPTIMIZE delta.`{clustered}`").collect()[0].metrics
    incremental_s = time.perf_counter() - start
    batch(APPENDS).write.format("delta").mode("append").save(plain)

    lo, hi = 400_000, 410_000  # 1% of x
    expected = {}

    def query(path: str):
        def run() -> None:
            got = (
                spark.read.format("delta")
                .load(path)
                .where(f"x BETWEEN {lo} AND {hi}")
                .agg(F.count("id"), F.sum("value"))
                .collect()
            )
            expected.setdefault("count", got[0][0])
            assert got[0][0] == expected["count"], got

        return run

    variants = {"unclustered": query(plain), "clustered (OPTIMIZE)": query(clustered)}
    print(f"clustering: {rows} rows, x in [{lo}, {hi}], {args.reps} warm reps")
    timings = run_side_by_side(variants, args.reps)
    table = []
    print(f"\n### selective query (1% of x), {rows} rows\n")
    print("| table | files scanned / in snapshot | median s |")
    print("| --- | --- | ---: |")
    for name, path in (("unclustered", plain), ("clustered (OPTIMIZE)", clustered)):
        query(path)()
        report = deltaflow.spark.scan_reports(spark, path)[-1]
        seconds = timings.median(name)
        scanned = f"{report.files_scanned} / {report.files_in_snapshot}"
        table.append((name, scanned, seconds, report.bytes_scanned))
        print(f"| {name} | {scanned} | {seconds:.3f} |")
    print(
        f"\nOPTIMIZE (cluster {APPENDS} files): {optimize_s:.1f} s; incremental OPTIMIZE after"
        f" one append: {incremental_s:.1f} s, {incremental.numFilesRemoved} file(s) rewritten"
    )
    result = {
        "rows": rows,
        "matching_rows": expected.get("count"),
        "seconds": timings.seconds,
        "table": table,
        "optimize_seconds": optimize_s,
        "incremental_optimize_seconds": incremental_s,
        "incremental_files_rewritten": incremental.numFilesRemoved,
    }
    save_result("clustering_quick" if args.quick else "clustering", result)
    spark.stop()
    return result


if __name__ == "__main__":
    main()
