"""Run by test_concurrency.py: a second Spark application appending to one table.

Prints READY once its session is up, waits for GO on stdin, then appends
``commits`` small batches tagged with ``writer`` and prints DONE.
"""

from __future__ import annotations

import sys

import deltaflow


def main(path: str, writer: str, commits: int, rows: int) -> None:
    spark = deltaflow.session(app_name=f"appender-{writer}", master="local[1]")
    try:
        spark.range(1).collect()  # warm the Python workers before the race starts
        print("READY", flush=True)
        sys.stdin.readline()
        append_batches(spark, path, writer, commits, rows)
        print("DONE", flush=True)
    finally:
        spark.stop()


def append_batches(spark: object, path: str, writer: str, commits: int, rows: int) -> None:
    from pyspark.sql import functions as F

    for batch in range(commits):
        df = spark.range(rows).select(  # type: ignore[attr-defined]
            F.lit(writer).alias("writer"), F.lit(batch).alias("batch"), F.col("id").alias("row")
        )
        df.write.format("delta").mode("append").save(path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
