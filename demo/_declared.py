"""Stage 5 of the demo: the lakehouse declared as a pipeline (``deltaflow.pipelines``).

The bronze -> silver -> gold chain and the device registry, declared instead of wired by
hand: ``silver_events`` streams the backfilled bronze table with two expectations (events
from trackers off the wrist, without a heart rate, are dropped and counted; a low battery
is only counted), ``gold_state_counts`` is a materialized view over silver, and
``device_history`` keeps the registry as an SCD type 2 dimension with AUTO CDC from the
registry's two snapshots. ``event_features`` and ``gold_event_kinds`` are streaming ML
inference: silver's readings as features, and each event's kind as a scikit-learn model
trained here predicts it, scored in-stream by an Arrow UDF (``_scoring.py``). One
triggered update runs them; the event log's data-quality summary and the model's summary
are printed and every number checked against the raw Arrow data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from demo import _scoring
from demo._checks import check
from demo._registry import REGISTRY_COLUMNS, registry_rounds

from deltaflow import pipelines as dp

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SILVER_COLUMNS = (
    "event_id",
    "device_id",
    "state",
    "event_type",
    "heart_rate",
    "steps",
    "battery_pct",
    "event_time",
)


@dataclass(frozen=True)
class DeclaredResult:
    dropped: int
    silver_rows: int
    history_rows: int


def _full_second_snapshot(first: pa.Table, second: pa.Table) -> pa.Table:
    """The registry after round 2: round 1's devices overlaid with round 2's rows."""
    rows = {r["device_id"]: r for r in first.to_pylist()}
    rows.update({r["device_id"]: r for r in second.to_pylist()})
    return pa.Table.from_pylist([rows[d] for d in sorted(rows)], schema=first.schema)


def declare(
    spark: SparkSession, bronze_uri: str, snapshots: list[pa.Table], model: _scoring.TrainedModel
) -> dp.Graph:
    def next_snapshot(last: int | None) -> tuple[Any, int] | None:
        index = 0 if last is None else last
        if index >= len(snapshots):
            return None
        return spark.createDataFrame(snapshots[index].to_pandas()), index + 1

    predict = _scoring.arrow_predictor(spark, model)
    with dp.collect() as declared:

        @dp.table(comment="device events worth analysing")
        @dp.expect_or_drop("on_wrist", "heart_rate IS NOT NULL")
        @dp.expect("battery_ok", "battery_pct >= 5")
        def silver_events() -> Any:
            return spark.readStream.format("delta").load(bronze_uri).select(*SILVER_COLUMNS)

        @dp.materialized_view(comment="events per state and type")
        def gold_state_counts() -> Any:
            return spark.read.table("silver_events").groupBy("state", "event_type").count()

        @dp.table(comment="the event-kind model's features, one row per silver event")
        def event_features() -> Any:
            return spark.readStream.table("silver_events").select(*_scoring.feature_columns())

        @dp.table(comment="each event's kind as the model predicts it from its readings")
        def gold_event_kinds() -> Any:
            features = spark.readStream.table("event_features")
            return _scoring.predictions(features, predict, model.model_id)

        dp.create_streaming_table("device_history", comment="the registry, SCD type 2")
        dp.create_auto_cdc_from_snapshot_flow(
            target="device_history", source=next_snapshot, keys=["device_id"], stored_as_scd_type=2
        )
    return declared.graph()


def run_declared(
    spark: SparkSession, data_dir: Path, bronze_uri: str, tables_root: str | None = None
) -> DeclaredResult:
    import deltalake

    events = deltalake.DeltaTable(bronze_uri).to_pyarrow_table()
    rounds = registry_rounds(
        events.select(["device_id", "user_id", "state", "event_time"]).sort_by("event_time")
    )
    snapshots = [rounds.first, _full_second_snapshot(rounds.first, rounds.second)]
    storage, configuration = _storage(spark, data_dir, tables_root)
    settings = dp.PipelineSettings(
        name="fitness", storage=storage, database="fitness", configuration=configuration
    )
    # A session reused from an earlier run (main(spark=...), the tests) still has the names
    # registered at that run's storage, and a pipeline keeps a name that is registered.
    spark.sql("DROP DATABASE IF EXISTS fitness CASCADE")
    print(f"\nDeclarative pipeline (deltaflow.pipelines; storage {storage}, database fitness)")
    model = _scoring.train(events)
    model_path = _scoring.save(model, data_dir)
    report = dp.run_update(spark, declare(spark, bronze_uri, snapshots, model), settings)
    for name, flow in report.flows.items():
        rows = "" if flow.rows_written is None else f"{flow.rows_written:>12,} rows"
        print(f"  {name:<22} {flow.status:<10} {rows}")
    check(report.state == "COMPLETED", f"the pipeline update ended {report.state}: {report}")

    quality = _data_quality(f"{storage}/system/events")
    print("  data quality (event log, details:flow_progress.data_quality):")
    for rule in quality:
        print(
            f"    {rule['dataset']}.{rule['name']:<12} passed {rule['passed_records']:>10,}"
            f"   failed {rule['failed_records']:>8,}"
        )
    off_wrist = events.num_rows - pc.sum(pc.is_valid(events["heart_rate"])).as_py()
    low_battery = pc.sum(pc.less(events["battery_pct"], 5)).as_py() or 0
    by_name = {r["name"]: r for r in quality}
    check(
        by_name["on_wrist"]["failed_records"] == off_wrist
        and by_name["battery_ok"]["failed_records"] == low_battery,
        f"the event log counts {by_name} but the bronze data has {off_wrist:,} events off"
        f" the wrist and {low_battery:,} with a low battery",
    )
    silver = deltalake.DeltaTable(f"{storage}/tables/silver_events").to_pyarrow_table()
    gold = deltalake.DeltaTable(f"{storage}/tables/gold_state_counts").to_pyarrow_table()
    check(
        silver.num_rows == events.num_rows - off_wrist
        and pc.sum(gold["count"]).as_py() == silver.num_rows,
        f"silver holds {silver.num_rows:,} rows and gold counts {pc.sum(gold['count']).as_py():,};"
        f" expected {events.num_rows - off_wrist:,} for both",
    )
    history = deltalake.DeltaTable(f"{storage}/tables/device_history").to_pyarrow_table()
    closed = pc.sum(pc.is_valid(history["__END_AT"])).as_py() or 0
    current = history.num_rows - closed
    print(
        f"  device_history: {current:,} current versions, {closed:,} closed by round 2"
        f" (__START_AT / __END_AT = snapshot 1, 2)"
    )
    check(
        closed == len(rounds.changed) and current == snapshots[1].num_rows,
        f"device_history has {closed} closed and {current} current versions; expected"
        f" {len(rounds.changed)} and {snapshots[1].num_rows}",
    )
    check(
        set(history.column_names) == {*REGISTRY_COLUMNS, "__START_AT", "__END_AT"},
        f"device_history's columns are {history.column_names}",
    )
    print("  OK: expectations, silver, gold and the SCD 2 history agree with the raw data")
    _scoring.print_summary(
        spark, model, report.flows["gold_event_kinds"].rows_written, f"{storage}/tables", model_path
    )
    return DeclaredResult(off_wrist, silver.num_rows, history.num_rows)


def _storage(
    spark: SparkSession, data_dir: Path, tables_root: str | None
) -> tuple[str, dict[str, str]]:
    """The pipeline's storage: beside the other tables on an object store (its stream
    checkpoints there too when Spark's Hadoop opens it, else on local disk), else under
    the data dir."""
    from deltaflow.spark._hadoop_fs import hadoop_uri

    if tables_root is None or tables_root.startswith("file:"):
        return str(data_dir / "pipeline"), {}
    if hadoop_uri(spark, tables_root) is not None:
        return f"{tables_root}/pipeline", {}  # the runner keeps them under the storage
    return f"{tables_root}/pipeline", {
        "pipelines.checkpointRoot": str(data_dir / "pipeline-checkpoints")
    }


def _data_quality(event_log: str) -> list[dict[str, Any]]:
    """The expectations of the update's completed flows, from the event log."""
    rules: list[dict[str, Any]] = []
    for event in dp.read_events(event_log):
        progress = event["details"].get("flow_progress") or {}
        if progress.get("status") == "COMPLETED" and "data_quality" in progress:
            rules.extend(progress["data_quality"]["expectations"])
    return rules
