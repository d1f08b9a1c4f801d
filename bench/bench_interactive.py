"""Interactive speed: session start and one-row statements on a 10k-row table.

What an analyst types and waits for, each statement timed alone (wall clock, seconds):

* **session start**, each in a fresh process (so the JVM and imports are cold):
  ``deltaflow.session()`` against a plain ``SparkSession.builder.master(...).getOrCreate()``
  with the same local defaults; and the first statement after it (a one-row delta
  INSERT, which starts the brain, against a one-row parquet INSERT).
* on a 10k-row table (2 files, 4 columns), in one session, order rotated per repetition:
  one-row ``INSERT INTO delta.`/path` VALUES (...)`` (SQL) against the same statement on
  a parquet table (a temporary view over the path: Spark has no ``parquet.`/path```
  INSERT); a one-row point ``SELECT`` of each; and UPDATE / DELETE / MERGE of one row,
  each through the DeltaTable API (``deltaflow.DeltaTable.forPath(spark, p).update /
  delete / merge``) and as SQL (``UPDATE`` / ``DELETE FROM`` / ``MERGE INTO
  delta.`/path```, which run the API's code). Spark's parquet tables have no such
  statements, so they have no baseline.

Reported: p50 and p95 of the warm repetitions (the first is dropped), per statement, and
the Spark jobs each statement launched (``statusTracker``). Target (issue 12): p50 <= 1 s
per statement on a quiet machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import DATA_DIR, fresh_dir, loadavg, parse_args, save_result

ROWS = 10_000
_LOCAL = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
}


def start_session(variant: str, path: str) -> None:
    """Runs in a child process: start a session, run one statement, print the times."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    t0 = time.perf_counter()
    if variant == "deltaflow":
        import deltaflow

        spark = deltaflow.session(app_name="bench-interactive")
        statement = f"INSERT INTO delta.`{path}` VALUES (-1, 'x', 0.5, 1)"
    else:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("bench-interactive").master(
            f"local[{os.cpu_count() or 2}]"
        )
        for key, value in _LOCAL.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        statement = "INSERT INTO parquet_table VALUES (-1, 'x', 0.5, 1)"
    t1 = time.perf_counter()
    if variant != "deltaflow":  # counted: a parquet path needs a view before INSERT
        spark.sql(parquet_view(path))
    spark.sql(statement)
    t2 = time.perf_counter()
    print("RESULT " + json.dumps({"session": t1 - t0, "first_statement": t2 - t1}), flush=True)
    spark.stop()


def measure_session_start(reps: int, delta_path: Path, parquet_path: Path) -> dict[str, object]:
    runs: dict[str, dict[str, list[float]]] = {
        v: {"session": [], "first_statement": []} for v in ("pyspark", "deltaflow")
    }
    for rep in range(reps + 1):
        order = ["pyspark", "deltaflow"] if rep % 2 == 0 else ["deltaflow", "pyspark"]
        for variant in order:
            path = delta_path if variant == "deltaflow" else parquet_path
            out = subprocess.run(
                [sys.executable, __file__, "--session", variant, str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise RuntimeError(f"session start ({variant}) failed: {out.stderr[-2000:]}")
            figures = json.loads(lines[-1].removeprefix("RESULT "))
            print(
                f"  rep {rep} {variant}: session {figures['session']:.2f}s,"
                f" first statement {figures['first_statement']:.2f}s",
                flush=True,
            )
            if rep:
                for key, value in figures.items():
                    runs[variant][key].append(value)
    return runs


def parquet_view(path: str) -> str:
    """Spark has no ``INSERT INTO parquet.`/path```: a parquet table is a view over a path."""
    return f"CREATE OR REPLACE TEMPORARY VIEW parquet_table USING parquet OPTIONS (path '{path}')"


def make_tables(spark, base: Path) -> tuple[str, str]:
    from pyspark.sql import functions as F

    df = spark.range(ROWS, numPartitions=2).select(
        F.col("id"),
        F.concat(F.lit("device-"), (F.col("id") % 100).cast("string")).alias("device"),
        (F.col("id") / 7).alias("value"),
        (F.col("id") % 10).cast("int").alias("qty"),
    )
    delta, parquet = str(base / "delta"), str(base / "parquet")
    df.write.format("delta").save(delta)
    df.write.parquet(parquet)
    spark.sql(parquet_view(parquet))
    return delta, parquet


def jobs_launched(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def statements(spark, delta: str, parquet: str) -> dict[str, object]:
    import deltaflow

    counter = iter(range(ROWS * 10, ROWS * 1000))
    updated = iter(range(0, ROWS))

    def insert(target: str):
        return lambda: spark.sql(
            f"INSERT INTO {target} VALUES ({next(counter)}, 'device-new', 1.5, 3)"
        )

    def select(fmt: str, path: str):
        return lambda: spark.read.format(fmt).load(path).where("id = 4242").collect()

    def update() -> None:
        deltaflow.DeltaTable.forPath(spark, delta).update(
            f"id = {next(updated)}", {"value": "value + 1"}
        )

    def delete() -> None:
        deltaflow.DeltaTable.forPath(spark, delta).delete(f"id = {ROWS - 1 - next(updated)}")

    def merge() -> None:
        key = next(updated)
        source = spark.createDataFrame(
            [(key, "device-merged", 2.5, 4), (next(counter), "device-merged", 2.5, 4)],
            "id long, device string, value double, qty int",
        )
        (
            deltaflow.DeltaTable.forPath(spark, delta)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    def as_spark_jobs(statement: Callable[[], None]) -> Callable[[], None]:
        # The same statement with deltaflow's delta-rs MERGE route off (side by side).
        def run() -> None:
            spark.conf.set("spark.deltaflow.merge.nativeMaxSourceRows", "0")
            try:
                statement()
            finally:
                spark.conf.unset("spark.deltaflow.merge.nativeMaxSourceRows")

        return run

    def update_sql() -> None:
        spark.sql(f"UPDATE delta.`{delta}` SET value = value + 1 WHERE id = {next(updated)}")

    def delete_sql() -> None:
        spark.sql(f"DELETE FROM delta.`{delta}` WHERE id = {ROWS - 1 - next(updated)}")

    def merge_sql() -> None:
        key, new = next(updated), next(counter)
        spark.sql(
            f"MERGE INTO delta.`{delta}` AS t USING (SELECT * FROM VALUES"
            f" ({key}L, 'device-merged', 2.5D, 4), ({new}L, 'device-merged', 2.5D, 4)"
            " AS v(id, device, value, qty)) AS s ON t.id = s.id"
            " WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )

    return {
        "INSERT (SQL), parquet": insert("parquet_table"),
        "INSERT (SQL), delta": insert(f"delta.`{delta}`"),
        "SELECT one row, parquet": select("parquet", parquet),
        "SELECT one row, delta": select("delta", delta),
        "UPDATE one row (DeltaTable API)": update,
        "DELETE one row (DeltaTable API)": delete,
        "MERGE 1 update + 1 insert (DeltaTable API)": merge,
        "MERGE 1 update + 1 insert (DeltaTable API), Spark jobs": as_spark_jobs(merge),
        "UPDATE one row (SQL)": update_sql,
        "DELETE one row (SQL)": delete_sql,
        "MERGE INTO, 1 update + 1 insert (SQL)": merge_sql,
        "MERGE INTO, 1 update + 1 insert (SQL), Spark jobs": as_spark_jobs(merge_sql),
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> dict[str, object]:
    # --statements-only: skip the session-start processes (minutes on a loaded machine).
    statements_only = "--statements-only" in sys.argv
    if statements_only:
        sys.argv.remove("--statements-only")
    args = parse_args(__doc__ or "")
    reps = args.reps if args.reps != 5 or args.quick else 15
    session_reps = 2 if args.quick else 5
    base = fresh_dir(DATA_DIR / "interactive")
    from _common import spark_session

    spark = spark_session()
    delta, parquet = make_tables(spark, base)
    variants = statements(spark, delta, parquet)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    jobs: dict[str, list[int]] = {name: [] for name in variants}
    print(f"statements: {reps} warm reps each, load {loadavg()}", flush=True)
    names = list(variants)
    for rep in range(reps + 1):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            before = jobs_launched(spark)
            start = time.perf_counter()
            variants[name]()
            elapsed = time.perf_counter() - start
            if rep:
                seconds[name].append(elapsed)
                jobs[name].append(jobs_launched(spark) - before)
        print(f"  rep {rep} done, load {loadavg()}", flush=True)
    spark.stop()

    sessions: dict[str, dict[str, list[float]]] = {}
    if not statements_only:
        print(f"session start: {session_reps} warm reps per variant, fresh process each")
        sessions = measure_session_start(session_reps, Path(delta), Path(parquet))
    rows = []
    for variant, figures in sessions.items():
        for key, label in (("session", "session start"), ("first_statement", "first INSERT")):
            values = figures[key]
            rows.append((f"{label}, {variant}", values, None))
    for name in names:
        rows.append((name, seconds[name], statistics.median(jobs[name])))

    print(f"\n### Interactive statements, {ROWS}-row table (load at end {loadavg()})\n")
    print("| statement | p50 s | p95 s | Spark jobs |")
    print("| --- | ---: | ---: | ---: |")
    for name, values, job_count in rows:
        shown = "-" if job_count is None else f"{job_count:.0f}"
        print(f"| {name} | {statistics.median(values):.3f} | {p95(values):.3f} | {shown} |")
    result = {
        "rows": ROWS,
        "reps": reps,
        "seconds": {name: values for name, values, _ in rows},
        "jobs": jobs,
    }
    save_result("interactive_quick" if args.quick else "interactive", result)
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--session":
        start_session(sys.argv[2], sys.argv[3])
    else:
        main()
