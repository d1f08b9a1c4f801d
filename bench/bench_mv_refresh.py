"""Materialized view refresh: incremental (from the change data feed) vs a complete recompute.

A source Delta table of ``--rows`` rows (10M by default; ``--quick``: 1M) with its change
data feed on: ``id``, ``key = id // 100`` (groups of 100 rows), ``amount`` (DOUBLE) and
``qty`` (INT). The view is a grouped aggregate over it, one of two (``--only``):

- ``fold`` (the default): count(*), count(qty), sum(qty), avg(qty) per key: decomposable,
  folded from the change rows alone (GROUP_AGGREGATE, FOLD_CHANGE_ROWS);
- ``groups``: count, sum, avg, min, max of ``amount`` per key: the touched groups are
  recomputed from the source (RECOMPUTE_TOUCHED_GROUPS).

Both opt in with ``pipelines.incrementalRefresh.maxChangeFraction = 0.25`` (the fold over
plain columns is on by default, at up to 10% of the source's bytes in change files).

The view is refreshed once (complete), then 1% of the source's rows are updated, and
the next refresh is timed two ways on copies of the same pipeline storage, in one
process, alternated:

- ``incremental``: the pipeline's choice, GROUP_AGGREGATE (checked in the event log);
  for ``fold`` the fold on the driver with Arrow (FOLD_CHANGE_ROWS_ON_DRIVER);
- ``spark_fold`` (``fold`` only): the same fold run by Spark
  (``pipelines.incrementalRefresh.foldOnDriver = false``);
- ``complete``: the same update with ``pipelines.incrementalRefresh.maxChangeFraction = 0``,
  so the cost model picks COMPLETE_RECOMPUTE, run by Spark (``foldOnDriver = false``);
- ``driver_recompute`` (``fold`` only): the same COMPLETE_RECOMPUTE on the driver with
  Arrow (RECOMPUTE_ON_DRIVER, the default for such views: first refreshes, changes too
  large to fold) where the source is under its size limit (64 MiB; ``--quick``'s 1M
  rows are, the default 10M rows are not: then it is Spark's, as ``techniques`` says).

Two kinds of 1% change: **recent** (the last 1% of ids: corrections to recent data, 1% of
the groups touched) and **spread** (``id % 100 = 7``: one row in every group, so every
group is recomputed). Both refreshes' views are compared row for row.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from _common import (
    DATA_DIR,
    fresh_dir,
    loadavg,
    parse_args,
    run_side_by_side,
    save_result,
    spark_session,
)


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    view = args.only or "fold"
    assert view in ("fold", "groups"), "--only fold | groups"
    spark = spark_session()
    from pyspark.sql import functions as F

    from deltaflow import pipelines as dp

    root = fresh_dir(DATA_DIR / "mv_refresh")
    source = str(root / "source")
    spark.range(rows, numPartitions=40).selectExpr(
        "id",
        "id DIV 100 AS key",
        "CAST(id % 997 AS DOUBLE) AS amount",
        "CAST(id % 997 AS INT) AS qty",
    ).write.format("delta").option("delta.enableChangeDataFeed", "true").save(source)

    with dp.collect() as declared:

        @dp.materialized_view
        def per_key():
            grouped = spark.read.format("delta").load(source).groupBy("key")
            if view == "fold":
                return grouped.agg(
                    F.count("*").alias("n"),
                    F.count("qty").alias("counted"),
                    F.sum("qty").alias("total"),
                    F.avg("qty").alias("mean"),
                )
            return grouped.agg(
                F.count("*").alias("n"),
                F.sum("amount").alias("total"),
                F.avg("amount").alias("mean"),
                F.min("amount").alias("low"),
                F.max("amount").alias("high"),
            )

    graph = declared.graph()

    def spark_jobs() -> int:
        """The next Spark job id (ids are sequential; the pipeline sets no job groups),
        one call to the status tracker: the jobs run between two calls."""
        return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1) + 1

    def update(storage: Path, complete: bool, on_driver: bool = True) -> dp.UpdateReport:
        fraction = "0" if complete else "0.25"  # 0: recompute; 0.25: opt in
        configuration = {
            "pipelines.incrementalRefresh.maxChangeFraction": fraction,
            "pipelines.incrementalRefresh.foldOnDriver": str(on_driver).lower(),
        }
        settings = dp.PipelineSettings(
            name="mv",
            storage=str(storage),
            database=f"mv_{uuid.uuid4().hex[:8]}",
            configuration=configuration,
        )
        report = dp.run_update(spark, graph, settings)
        report.raise_for_failure()
        return report

    def technique(storage: Path, update_id: str) -> str:
        for event in dp.read_events(str(storage / "system/events")):
            if event["event_type"] == "planning_information" and (
                event["origin"]["update_id"] == update_id
            ):
                info = event["details"]["planning_information"]["technique_information"]
                chosen = next(t["maintenance_type"] for t in info if t.get("is_chosen"))
                # A recompute on the driver says so (sources up to its size limit).
                on_driver = any(t.get("recompute_method") for t in info)
                return chosen + (" on the driver" if on_driver else "")
        raise AssertionError("no planning_information event")

    results: dict[str, dict[str, object]] = {}
    scenarios = {
        "recent": f"id >= {rows - rows // 100}",
        "spread": "id % 100 = 7",
    }
    for name, where in scenarios.items():
        prepared = fresh_dir(root / f"prepared_{name}")
        # The view reflects the source before the change (a first refresh: a recompute,
        # with the helper columns a fold needs; the complete variant drops them).
        update(prepared, complete=False)
        spark.sql(f"UPDATE delta.`{source}` SET amount = amount + 1, qty = qty + 1 WHERE {where}")
        variants = (
            ("incremental", "spark_fold", "complete", "driver_recompute")
            if view == "fold"
            else ("incremental", "complete")
        )
        work = {v: root / f"work_{v}" for v in variants}
        chosen: dict[str, str] = {}
        jobs: dict[str, int] = {}

        def refresh(
            variant: str,
            prepared: Path,
            work: dict[str, Path],
            chosen: dict[str, str],
            jobs: dict[str, int],
        ) -> None:
            storage = work[variant]
            shutil.rmtree(storage, ignore_errors=True)
            shutil.copytree(prepared, storage)
            before = spark_jobs()
            report = update(
                storage,
                complete=variant in ("complete", "driver_recompute"),
                on_driver=variant not in ("spark_fold", "complete"),
            )
            jobs[variant] = spark_jobs() - before
            chosen[variant] = technique(storage, report.update_id)

        print(f"== {name} 1% change, {rows:,} rows (load {loadavg()})", flush=True)
        timings = run_side_by_side(
            {
                v: (lambda v=v, p=prepared, w=work, c=chosen, j=jobs: refresh(v, p, w, c, j))
                for v in variants
            },
            args.reps,
        )
        views = {v: spark.read.format("delta").load(str(work[v] / "tables/per_key")) for v in work}
        # The query's columns: a folded view also holds its helper columns.
        columns = [c for c in views["complete"].columns if not c.startswith("__deltaflow_mv_")]
        views = {v: df.select(*columns) for v, df in views.items()}
        same = all(
            views[v].exceptAll(views["complete"]).count() == 0
            and views["complete"].exceptAll(views[v]).count() == 0
            for v in variants
        )
        ratio = timings.median("complete") / timings.median("incremental")
        results[name] = {
            **{f"{v}_s": round(timings.median(v), 2) for v in variants},
            "speedup": round(ratio, 2),
            **(
                {"recompute_speedup": round(timings.median("complete") / timings.median(v), 2)}
                if (v := "driver_recompute") in variants
                else {}
            ),
            "spark_jobs": jobs,
            "techniques": chosen,
            "same_result": same,
            "load": loadavg(),
        }
        print(f"  {results[name]}", flush=True)
        assert same, "the incremental refresh disagrees with the recompute"

    result = {"rows": rows, "view": view, "reps": args.reps, "scenarios": results}
    save_result(f"mv_refresh_{view}", result)
    return result


if __name__ == "__main__":
    main()
