"""Selective query: a narrow time range of a table whose files are clustered by time.

Variants: the Python source with file skipping from the log's stats (default),
the same range through ``unix_micros(ts)``, which
Spark cannot push into a source (every file read), the JVM path (Spark opens
every file's footer and skips row groups by Parquet stats), and plain Parquet.
"""

from __future__ import annotations

import datetime as dt

from _common import parse_args, run_side_by_side, save_result, spark_session
from _data import START_US, events_table, table_files


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows, files = (400_000, 16) if args.quick else (4_000_000, 64)
    path = events_table("clustered", rows, files)
    spark = spark_session()
    uris = table_files(path)
    per_file = rows // files
    # ~half a file's worth of ids, well inside one file.
    lo = per_file * (files // 2) + per_file // 4
    hi = lo + per_file // 2
    predicate = (
        f"ts >= timestamp_micros({START_US + lo * 1000}L)"
        f" AND ts < timestamp_micros({START_US + hi * 1000}L)"
    )
    from pyspark.sql import functions as F

    from deltaflow.spark.read import _reader
    from deltaflow.table import _pruning
    from deltaflow.table._snapshot import load_snapshot

    def ts(us: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(us / 1e6, tz=dt.timezone.utc)

    _, report = _reader.plan_scan(
        load_snapshot(str(path)),
        [
            _pruning.Comparison(">=", ("ts",), ts(START_US + lo * 1000)),
            _pruning.Comparison("<", ("ts",), ts(START_US + hi * 1000)),
        ],
    )

    # The same range through a function Spark cannot push into a source: no skipping.
    lo_us, hi_us = START_US + lo * 1000, START_US + hi * 1000
    opaque = f"unix_micros(ts) >= {lo_us} AND unix_micros(ts) < {hi_us}"

    def query(make, where: str = predicate, native: str = "auto"):
        def run() -> None:
            spark.conf.set("deltaflow.read.nativeScan", native)
            got = make().where(where).agg(F.count("id"), F.sum("value")).collect()
            assert got[0][0] == hi - lo, got

        return run

    def delta():
        return spark.read.format("delta").load(str(path))

    variants = {
        "parquet": query(lambda: spark.read.parquet(*uris)),
        "delta JVM path": query(delta),
        "delta Python, skipping": query(delta, native="false"),
        "delta Python, no skipping": query(delta, where=opaque, native="false"),
    }
    scanned = {
        "parquet": f"{files} opened, row groups skipped by Parquet stats",
        "delta JVM path": f"{files} opened, row groups skipped by Parquet stats",
        "delta Python, skipping": f"{report.files_scanned} of {report.files_in_snapshot}",
        "delta Python, no skipping": f"{files} of {files}",
    }
    print(f"skipping: {rows} rows, {files} files, {hi - lo} rows selected, {args.reps} warm reps")
    timings = run_side_by_side(variants, args.reps)
    spark.conf.set("deltaflow.read.nativeScan", "auto")
    base = timings.median("delta Python, no skipping")
    print(f"\n### selective query, {rows} rows in {files} files, {hi - lo} rows match\n")
    print("| variant | files read | median s | speed-up vs no skipping |")
    print("| --- | --- | ---: | ---: |")
    table = []
    for name in variants:
        seconds = timings.median(name)
        table.append((name, scanned[name], seconds, base / seconds))
        print(f"| {name} | {scanned[name]} | {seconds:.3f} | {base / seconds:.1f}x |")
    result = {"rows": rows, "files": files, "seconds": timings.seconds, "table": table}
    save_result("skipping_quick" if args.quick else "skipping", result)
    spark.stop()
    return result


if __name__ == "__main__":
    main()
