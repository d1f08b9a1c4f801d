"""DELETE of 1% of rows, with and without deletion vectors, on the same data in one run.

The target (10M rows, 5 columns, 40 files; ``--quick``: 1M) is the one of
``bench_merge.py``. Each variant deletes the rows whose id is a multiple of 100 (1%,
spread over every file: the worst case for rewriting) on a fresh copy of it, in one
Spark session (``local[2]``, driver heap 2 GiB):

* ``rewrite``: the table as written (no deletion vectors): every touched file is
  rewritten without the deleted rows;
* ``deletion vectors``: the copy gets ``delta.enableDeletionVectors=true`` (ALTER,
  before the clock starts): the rows are marked in deletion vectors, no data file is
  rewritten.

Reported: seconds of ``DeltaTable.delete`` (median of ``--reps`` fresh copies, order
alternating), bytes of data files added, and a full count afterwards (read time).
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from _common import DATA_DIR, fresh_dir, machine, parse_args, save_result, spark_session
from bench_merge import make_data

VARIANTS = ("rewrite", "deletion vectors")


def run(spark, variant: str, target: Path, work: Path) -> dict[str, float]:
    import deltaflow

    copy = work / variant.replace(" ", "_")
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(target, copy)
    if variant == "deletion vectors":
        spark.sql(
            f"ALTER TABLE delta.`{copy}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
        )
    table = deltaflow.DeltaTable.forPath(spark, str(copy))
    started = time.perf_counter()
    table.delete("id % 100 = 0")
    deleted = time.perf_counter()
    rows = spark.read.format("delta").load(str(copy)).count()
    counted = time.perf_counter()
    metrics = table.history(1).collect()[0]["operationMetrics"]
    shutil.rmtree(copy)
    return {
        "delete_seconds": deleted - started,
        "count_seconds": counted - deleted,
        "rows_after": rows,
        "added_bytes": int(metrics.get("numAddedBytes", 0)),
        "deleted_rows": int(metrics.get("numDeletedRows", 0)),
        "scan_ms": int(metrics.get("scanTimeMs", 0)),
        "rewrite_ms": int(metrics.get("rewriteTimeMs", 0)),
        "execution_ms": int(metrics.get("executionTimeMs", 0)),
    }


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    target_rows = 1_000_000 if args.quick else 10_000_000
    reps = max(args.reps if args.reps is not None else 3, 1)
    target, _ = make_data(target_rows, target_rows // 100)
    work = fresh_dir(DATA_DIR / "delete_runs")
    spark = spark_session({"spark.driver.memory": "2g", "spark.ui.enabled": "false"})
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    run(spark, VARIANTS[0], target, work)  # warm-up: JIT, brain, Python workers
    for rep in range(reps):
        order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            runs[variant].append(run(spark, variant, target, work))
    spark.stop()
    print(f"\n### DELETE of 1% of {target_rows} rows (40 files), median of {reps}\n")
    print(
        "| variant | DELETE s | scan ms | rewrite / mark ms | count after s"
        " | data bytes added | rows deleted |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    summary = {}
    for variant, results in runs.items():
        median = {k: statistics.median(r[k] for r in results) for k in results[0]}
        summary[variant] = median
        print(
            f"| {variant} | {median['delete_seconds']:.1f} | {int(median['scan_ms'])}"
            f" | {int(median['rewrite_ms'])} | {median['count_seconds']:.1f}"
            f" | {int(median['added_bytes'])} | {int(median['deleted_rows'])} |"
        )
    result = {"target_rows": target_rows, "reps": reps, "runs": runs, "median": summary}
    result["machine"] = machine()
    save_result("delete_dv_quick" if args.quick else "delete_dv", result)
    return result


if __name__ == "__main__":
    main()
