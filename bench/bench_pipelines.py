"""Declarative pipelines: the runner's overhead, and AUTO CDC throughput.

1. **Runner overhead.** A bronze Delta table (``--rows``, 1M by default, 10 commits) feeds
   silver (a stream: one ``expect_or_drop`` rule, ~1% of rows dropped) and gold (a
   materialized view: counts per key). The same two flows are run (a) as one triggered
   pipeline update and (b) written by hand as a stream with the rule as a ``filter``
   (``availableNow``) and a batch overwrite, each repetition from empty storage. The
   pipeline also counts the rule's passed / failed rows and writes its event log; the
   issue's target is <= 1.1x the hand-written flows. Gold's first refresh is a complete
   recompute, which the pipeline runs on the driver with Arrow (RECOMPUTE_ON_DRIVER); a
   third variant runs it with Spark (``foldOnDriver=false``), as the hand-written job
   does, to show the runner's own overhead apart from that. Then the steady state: both keep
   their tables and checkpoints, one bronze commit is appended before each repetition,
   and both process it (an update of existing tables, the usual case in production).
2. **AUTO CDC.** A dimension of ``--keys`` (default ``--rows`` / 5) keys loaded by AUTO
   CDC, then a change batch updating 10% of the keys (out of order within the batch)
   applied as SCD type 1 and as SCD type 2: keys per second of the load, change events
   per second of the second update; beside them the same load written by hand and the
   same changes applied by one hand-written MERGE (newest event per key). A pass at
   10k keys runs first, untimed, so that no variant pays the JVM's warm-up alone.

3. **Expectation routes** (``--only routes``, not in the default run). The overhead's
   steady state with silver written by the Delta stream sink (rules counted as observed
   metrics, the default for ``expect`` / ``expect_or_drop``) against the same update with
   the flow forced onto ``foreachBatch`` (the route of ``expect_or_fail`` flows), in one
   process, alternated: what the sink route saves per update.

``--only overhead`` / ``--only cdc`` / ``--only routes`` runs one part.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import (
    DATA_DIR,
    Timings,
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

    def append(i: int) -> None:
        spark.range(i * per, (i + 1) * per, numPartitions=2).selectExpr(
            "id", "id % 1000 AS key", "CASE WHEN id % 100 = 0 THEN -1 ELSE id % 97 END AS amount"
        ).write.format("delta").mode("append").save(bronze)

    for i in range(10 if args.only in (None, "overhead", "routes") else 0):
        append(i)

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

    def pipeline(
        storage: Path | None = None, database: str | None = None, on_driver: bool = True
    ) -> None:
        settings = dp.PipelineSettings(
            name="bench",
            storage=str(storage or fresh_dir(root / "pipeline")),
            database=database or f"bench_{uuid.uuid4().hex[:8]}",
            configuration={"pipelines.incrementalRefresh.foldOnDriver": str(on_driver).lower()},
        )
        report = dp.run_update(spark, pipeline_graph, settings)
        assert report.state == "COMPLETED", report

    def by_hand(out: Path | None = None) -> None:
        out = out or fresh_dir(root / "by_hand")
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

    def steady_state(reps: int) -> Timings:
        """Updates of existing tables: each repetition appends one bronze commit (the
        size of the ten loaded ones), then both variants process it, order alternated."""
        storage, database = fresh_dir(root / "steady"), f"bench_{uuid.uuid4().hex[:8]}"
        out = fresh_dir(root / "steady_by_hand")
        variants = {
            "pipeline update": lambda: pipeline(storage, database),
            "hand-written": lambda: by_hand(out),
        }
        return _steady_reps(variants, append, reps, label="steady rep")

    result: dict[str, object] = {"rows": rows, "reps": args.reps}
    if args.only in (None, "overhead"):
        print(f"== runner overhead, {rows:,} rows (load {loadavg()})", flush=True)
        timings = run_side_by_side(
            {
                "pipeline update": pipeline,
                "pipeline update, gold by Spark": lambda: pipeline(on_driver=False),
                "hand-written": by_hand,
            },
            args.reps,
        )
        hand = timings.median("hand-written")
        overhead = timings.median("pipeline update") / hand
        spark_gold = timings.median("pipeline update, gold by Spark") / hand
        print(
            f"  pipeline / hand-written = {overhead:.2f}x; with gold recomputed by Spark"
            f" (foldOnDriver=false) {spark_gold:.2f}x (load {loadavg()})",
            flush=True,
        )
        result["pipeline_s"] = timings.median("pipeline update")
        result["pipeline_spark_gold_s"] = timings.median("pipeline update, gold by Spark")
        result["hand_written_s"] = hand
        result["overhead"] = round(overhead, 3)
        result["overhead_spark_gold"] = round(spark_gold, 3)
        print(f"== steady state: updates of existing tables (load {loadavg()})", flush=True)
        steady = steady_state(args.reps)
        ratio = steady.median("pipeline update") / steady.median("hand-written")
        print(
            f"  steady state: pipeline {steady.median('pipeline update'):.2f} s / hand-written"
            f" {steady.median('hand-written'):.2f} s = {ratio:.2f}x (load {loadavg()})",
            flush=True,
        )
        result["steady_pipeline_s"] = steady.median("pipeline update")
        result["steady_hand_written_s"] = steady.median("hand-written")
        result["steady_overhead"] = round(ratio, 3)
    if args.only == "routes":
        print(f"== expectation routes, steady state (load {loadavg()})", flush=True)
        routes = _routes(spark, root, pipeline_graph, append, args.reps)
        for name in routes.seconds:
            print(f"  {name}: {routes.median(name):.3f} s", flush=True)
        result["routes"] = {name: routes.median(name) for name in routes.seconds}
    if args.only in (None, "cdc"):
        keys = args.keys or max(rows // 5, 1000)
        print(f"== AUTO CDC warm-up, {min(keys, 10_000):,} keys (load {loadavg()})", flush=True)
        _auto_cdc(spark, root, min(keys, 10_000))  # JIT and first-use costs out of the way
        print(f"== AUTO CDC, {keys:,} keys (load {loadavg()})", flush=True)
        result["cdc_keys"], result["cdc"] = _auto_cdc(spark, root, keys)
    result["load_after"] = loadavg()
    save_result("pipelines", result)
    return result


def _routes(spark, root, graph, append, reps: int) -> Timings:
    """Steady-state updates of one graph in two storages, silver by the sink and (a patch
    of the route's test) by ``foreachBatch``, alternated; bronze commits 10+ added."""
    from deltaflow import pipelines as dp
    from deltaflow.pipelines import _observed_stream

    observable = _observed_stream.observable
    variants = {"silver by the stream sink": True, "silver by foreachBatch": False}
    stores = {name: fresh_dir(root / f"route{i}") for i, name in enumerate(variants)}
    databases = {name: f"bench_{uuid.uuid4().hex[:8]}" for name in variants}

    def update(name: str) -> None:
        sink = variants[name]
        _observed_stream.observable = observable if sink else (lambda *a: False)
        try:
            settings = dp.PipelineSettings(
                name="bench", storage=str(stores[name]), database=databases[name]
            )
            assert dp.run_update(spark, graph, settings).state == "COMPLETED"
        finally:
            _observed_stream.observable = observable

    return _steady_reps({name: lambda n=name: update(n) for name in variants}, append, reps)


def _steady_reps(
    variants: dict[str, Callable[[], None]],
    append: Callable[[int], None],
    reps: int,
    label: str | None = None,
) -> Timings:
    """Each variant run once (its tables created), then ``reps`` + 1 rounds: one bronze
    commit appended (commits 10+), every variant timed on it, order alternated; the first
    round is a warm-up."""
    for run in variants.values():
        run()
    timings = Timings({name: [] for name in variants})
    for rep in range(reps + 1):
        append(10 + rep)
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            start = time.perf_counter()
            variants[name]()
            elapsed = time.perf_counter() - start
            if rep:
                timings.seconds[name].append(elapsed)
            if label is not None:
                print(f"  {label} {rep} {name}: {elapsed:.3f}s", flush=True)
    return timings


def _auto_cdc(spark, root, keys: int) -> tuple[int, dict[str, dict[str, float]]]:
    from pyspark.sql import functions as F

    from deltaflow import pipelines as dp
    from deltaflow.tables import DeltaTable

    changed = keys // 10

    def load(path: str) -> None:
        spark.range(keys, numPartitions=2).selectExpr(
            "id AS key", "concat('v', id) AS name", "0L AS seq"
        ).write.format("delta").save(path)

    def change_batch():
        # 10% of keys change; two events per changed key, the newer first in the batch.
        def events(name: str, seq: int):
            return spark.range(changed, numPartitions=2).select(
                (F.col("id") * 10).alias("key"),
                F.lit(name).alias("name"),
                F.lit(seq).cast("long").alias("seq"),
            )

        return events("new", 2).unionByName(events("old", 1))

    cdc: dict[str, dict[str, float]] = {}
    events = 2 * changed
    for scd in (1, 2):
        source = str(fresh_dir(root / f"changes{scd}") / "t")
        load(source)
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
        change_batch().write.format("delta").mode("append").save(source)
        start = time.perf_counter()
        assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
        update_s = time.perf_counter() - start
        stored = spark.read.format("delta").load(str(storage / "tables" / "dim")).count()
        assert stored == keys + (2 * changed if scd == 2 else 0), stored
        cdc[f"SCD{scd}"] = _cdc_figures(keys, load_s, events, update_s)
        print(
            f"  AUTO CDC SCD{scd}: {keys:,} keys loaded in {load_s:.1f} s"
            f" ({keys / load_s:,.0f} keys/s); {events:,} change events ({changed:,} keys)"
            f" in {update_s:.1f} s = {events / update_s:,.0f} events/s (load {loadavg()})",
            flush=True,
        )

    # By hand: the same load as a plain write, the same changes as one MERGE of the
    # newest event per key (SCD 1 without the pipeline, sequence state or late events).
    target = str(fresh_dir(root / "merge") / "t")
    start = time.perf_counter()
    load(target)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    latest = (
        change_batch()
        .groupBy("key")
        .agg(F.max_by("name", "seq").alias("name"), F.max("seq").alias("seq"))
    )
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(latest.alias("s"), "t.key = s.key")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    update_s = time.perf_counter() - start
    cdc["hand-written MERGE"] = _cdc_figures(keys, load_s, events, update_s)
    print(
        f"  hand-written: {keys:,} keys written in {load_s:.1f} s; MERGE of {events:,} events"
        f" in {update_s:.1f} s = {events / update_s:,.0f} events/s (load {loadavg()})",
        flush=True,
    )
    return keys, cdc


def _cdc_figures(keys: int, load_s: float, events: int, update_s: float) -> dict[str, float]:
    return {
        "load_seconds": round(load_s, 2),
        "load_keys_per_second": round(keys / load_s),
        "update_seconds": round(update_s, 2),
        "change_events_per_second": round(events / update_s),
    }


if __name__ == "__main__":
    main()
