"""Declarative pipelines: the runner's overhead, and AUTO CDC throughput.

1. **Runner overhead.** A bronze Delta table (``--rows``, 1M by default, 10 commits) feeds
   silver (a stream: one ``expect_or_drop`` rule, ~1% of rows dropped) and gold (a
   materialized view: counts per key). The same two flows are run (a) as one triggered
   pipeline update and (b) written by hand as a stream with the rule as a ``filter``
   (``availableNow``) and a batch overwrite, each repetition from empty storage. The
   pipeline also counts the rule's passed / failed rows and writes its event log; the
   issue's target is <= 1.1x the hand-written flows.
2. **AUTO CDC.** A dimension of ``--keys`` (default ``--rows`` / 5) keys loaded by AUTO
   CDC, then a change batch updating 10% of the keys (out of order within the batch)
   applied as SCD type 1 and as SCD type 2: changes per second of the second update (the
   first is the load).

``--only overhead`` / ``--only cdc`` runs one part.
"""

from __future__ import annotations

import shutil
import time
import uuid

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
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    spark = spark_session()
    from deltaflow import pipelines as dp

    root = fresh_dir(DATA_DIR / "pipelines")
    bronze = str(root / "bronze")
    per = rows // 10
    for i in range(10 if args.only in (None, "overhead") else 0):
        spark.range(i * per, (i + 1) * per, numPartitions=2).selectExpr(
            "id", "id % 1000 AS key", "CASE WHEN id % 100 = 0 THEN -1 ELSE id % 97 END AS amount"
        ).write.format("delta").mode("append").save(bronze)

    def graph() -> dp.Graph:
        with dp.collect() as declared:

            @dp.table
            @dp.expect_or_drop("positive", "amount >= 0")
            def silver():
                return spark.readStream.format("delta").load(bronze)

            @dp.materialized_view
            def gold():
                return spark.read.table("silver").groupBy("key").count()

        return declared.graph()

    pipeline_graph = graph()

    def pipeline() -> None:
        storage = fresh_dir(root / "pipeline")
        settings = dp.PipelineSettings(
            name="bench", storage=str(storage), database=f"bench_{uuid.uuid4().hex[:8]}"
        )
        report = dp.run_update(spark, pipeline_graph, settings)
        assert report.state == "COMPLETED", report

    def by_hand() -> None:
        out = fresh_dir(root / "by_hand")
        query = (
            spark.readStream.format("delta")
            .load(bronze)
            .filter("amount >= 0")
            .writeStream.option("checkpointLocation", str(out / "ck"))
            .trigger(availableNow=True)
            .format("delta")
            .start(str(out / "silver"))
        )
        query.awaitTermination()
        (
            spark.read.format("delta")
            .load(str(out / "silver"))
            .groupBy("key")
            .count()
            .write.format("delta")
            .mode("overwrite")
            .save(str(out / "gold"))
        )

    result: dict[str, object] = {"rows": rows, "reps": args.reps}
    if args.only in (None, "overhead"):
        print(f"== runner overhead, {rows:,} rows (load {loadavg()})", flush=True)
        timings = run_side_by_side(
            {"pipeline update": pipeline, "hand-written": by_hand}, args.reps
        )
        overhead = timings.median("pipeline update") / timings.median("hand-written")
        print(f"  pipeline / hand-written = {overhead:.2f}x (load {loadavg()})", flush=True)
        result["pipeline_s"] = timings.median("pipeline update")
        result["hand_written_s"] = timings.median("hand-written")
        result["overhead"] = round(overhead, 3)
    if args.only in (None, "cdc"):
        result["cdc_keys"], result["cdc"] = _auto_cdc(
            spark, root, args.keys or max(rows // 5, 1000)
        )
    result["load_after"] = loadavg()
    save_result("pipelines", result)
    return result


def _auto_cdc(spark, root, keys: int) -> tuple[int, dict[str, dict[str, float]]]:
    from pyspark.sql import functions as F

    from deltaflow import pipelines as dp

    changes_per_update = keys // 10
    cdc: dict[str, dict[str, float]] = {}
    for scd in (1, 2):
        source = str(fresh_dir(root / f"changes{scd}") / "t")
        spark.range(keys, numPartitions=2).selectExpr(
            "id AS key", "concat('v', id) AS name", "0L AS seq"
        ).write.format("delta").save(source)
        with dp.collect() as declared:
            dp.create_streaming_table("dim")
            dp.create_auto_cdc_flow(
                target="dim",
                source="changes",
                keys=["key"],
                sequence_by="seq",
                stored_as_scd_type=scd,
            )

            @dp.temporary_view
            def changes(source: str = source):
                return spark.readStream.format("delta").load(source)

        storage = root / f"cdc{scd}"
        shutil.rmtree(storage, ignore_errors=True)
        settings = dp.PipelineSettings(
            name=f"cdc{scd}", storage=str(storage), database=f"cdc_{uuid.uuid4().hex[:8]}"
        )
        start = time.perf_counter()
        assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
        load_s = time.perf_counter() - start
        # 10% of keys change; two events per changed key, the newer first in the batch.
        spark.range(changes_per_update, numPartitions=2).select(
            (F.col("id") * 10).alias("key"), F.lit("new").alias("name"), F.lit(2).alias("seq")
        ).unionByName(
            spark.range(changes_per_update, numPartitions=2).select(
                (F.col("id") * 10).alias("key"), F.lit("old").alias("name"), F.lit(1).alias("seq")
            )
        ).write.format("delta").mode("append").save(source)
        start = time.perf_counter()
        assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
        update_s = time.perf_counter() - start
        events = 2 * changes_per_update
        cdc[f"SCD{scd}"] = {
            "load_seconds": round(load_s, 2),
            "update_seconds": round(update_s, 2),
            "change_events_per_second": round(events / update_s),
        }
        print(
            f"  AUTO CDC SCD{scd}: {keys:,} keys loaded in {load_s:.1f} s; {events:,} change"
            f" events ({changes_per_update:,} keys) in {update_s:.1f} s ="
            f" {events / update_s:,.0f} events/s",
            flush=True,
        )

    return keys, cdc


if __name__ == "__main__":
    main()
