"""Declared flows in Spark's real-time mode, with Lakeflow's names (issue 28 part 4).

A continuous pipeline with ``spark.databricks.streaming.realTimeMode.enabled`` runs an
``update_flow`` with ``spark_conf={"pipelines.trigger": "RealTime"}`` into a Delta sink
(by path), and a streaming table's own query in real-time mode (deltaflow's addition),
both reading a Delta table that the test appends to with delta-rs. Rows reach both
within the epoch, exactly once, across a stop and a restart; what real-time mode cannot
do is refused typed when the graph is analysed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as DeltaRsTable
from deltalake import write_deltalake

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt
from deltaflow.pipelines._spec import parse_spec
from deltaflow.spark._compat import PYSPARK_MINOR
from tests._waiting import wait_until

pytestmark = pytest.mark.skipif(PYSPARK_MINOR < (4, 1), reason="real-time mode is Spark >= 4.1")

ENABLED = {"spark.databricks.streaming.realTimeMode.enabled": "true"}
REAL_TIME = {"pipelines.trigger": "RealTime"}


def _ids(path: Path | str) -> list[int]:
    if not (Path(path) / "_delta_log").exists():
        return []
    return sorted(r["id"] for r in DeltaRsTable(str(path)).to_pyarrow_table().to_pylist())


def _append(path: Path, ids: range) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array(list(ids), pa.int64())}), mode="append")


def _settings(tmp_path: Path, database: str, **configuration: str) -> Any:
    return dp.PipelineSettings(
        name="rt",
        storage=str(tmp_path / "storage"),
        database=database,
        configuration={**ENABLED, **configuration},
    )


class _Update:
    """A continuous update running in a background thread until :meth:`stop`."""

    def __init__(self, spark: Any, graph: Any, settings: Any) -> None:
        self._stop = threading.Event()
        self.outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                self.outcome["report"] = dp.run_update(
                    spark, graph, settings, continuous=True, stop=self._stop
                )
            except BaseException as exc:  # surfaced by stop()
                self.outcome["error"] = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def wait(self, condition: Callable[[], bool], what: str) -> None:
        def ready() -> bool:
            assert "error" not in self.outcome, self.outcome["error"]
            return condition()

        wait_until(ready, 240, what)

    def stop(self) -> Any:
        self._stop.set()
        self._thread.join(timeout=180)
        assert not self._thread.is_alive()
        assert "error" not in self.outcome, self.outcome["error"]
        return self.outcome["report"]


def _declare(spark: Any, source: Path, sink_path: Path) -> Any:
    with dp.collect() as declared:
        dp.create_sink("alerts", "delta", {"path": str(sink_path)})

        @dp.update_flow(target="alerts", spark_conf=REAL_TIME)
        def to_alerts() -> Any:
            return (
                spark.readStream.format("delta")
                .load(str(source))
                .selectExpr("id", "id * 2 AS twice")
            )

        @dp.table(spark_conf=REAL_TIME)
        def live() -> Any:
            return spark.readStream.format("delta").load(str(source)).where("id >= 0")

    return declared.graph()


@pytest.mark.slow
def test_real_time_flows_deliver_exactly_once_across_a_restart(spark: Any, tmp_path: Path) -> None:
    source, sink_path = tmp_path / "source", tmp_path / "alerts"
    _append(source, range(0, 3))
    graph = _declare(spark, source, sink_path)
    settings = _settings(tmp_path, f"rt_{uuid.uuid4().hex[:8]}")
    table = tmp_path / "storage/tables/live"

    update = _Update(spark, graph, settings)
    try:
        update.wait(lambda: _ids(sink_path) == [0, 1, 2], "the source's rows in the sink")
        update.wait(lambda: _ids(table) == [0, 1, 2], "the source's rows in the table")
        for start in (3, 6):
            _append(source, range(start, start + 3))
            expected = list(range(start + 3))
            update.wait(lambda e=expected: _ids(sink_path) == e, f"rows to {start + 2} in the sink")
            update.wait(lambda e=expected: _ids(table) == e, f"rows to {start + 2} in the table")
    finally:
        report = update.stop()
    first_update = report.update_id
    assert report.state == "CANCELED"
    assert {report.flows[n].status for n in ("to_alerts", "live")} == {"STOPPED"}
    twice = DeltaRsTable(str(sink_path)).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["twice"]) for r in twice) == [(i, 2 * i) for i in range(9)]

    # Stopped mid-epoch and restarted: the flows go on from their checkpoints, nothing twice.
    _append(source, range(9, 12))
    update = _Update(spark, graph, settings)
    try:
        update.wait(lambda: _ids(sink_path) == list(range(12)), "the new rows in the sink")
        update.wait(lambda: _ids(table) == list(range(12)), "the new rows in the table")
        _append(source, range(12, 14))
        update.wait(lambda: _ids(sink_path) == list(range(14)), "rows appended while running")
        update.wait(lambda: _ids(table) == list(range(14)), "rows appended, in the table")
    finally:
        update.stop()
    assert _ids(sink_path) == list(range(14))
    assert _ids(table) == list(range(14))

    events = dp.read_events(str(tmp_path / "storage/system/events"))
    definitions = {
        e["origin"]["flow_name"]: e["details"]["flow_definition"]
        for e in events
        if e["event_type"] == "flow_definition"
    }
    assert definitions["to_alerts"]["trigger"] == "RealTime"
    assert definitions["to_alerts"]["trigger_interval"] == "5 minutes"
    assert definitions["to_alerts"]["output_mode"] == "update"
    assert definitions["live"]["trigger"] == "RealTime"
    running = [
        e["details"]["flow_progress"]
        for e in events
        if e["event_type"] == "flow_progress" and e["origin"]["flow_name"] == "to_alerts"
    ]
    assert running and all(p.get("trigger") == "RealTime" for p in running)
    # Real-time: in the first update every row arrived inside the first epoch (5 minutes),
    # with no batch ended. (The restart replays that epoch, which may end at once.)
    first = [
        e["details"]["flow_progress"]
        for e in events
        if e["event_type"] == "flow_progress" and e["origin"]["update_id"] == first_update
    ]
    assert first and not [p for p in first if "batch_id" in p]
    # The console's pipeline page reads the same log: the flows show as real-time.
    from deltaflow.console._pipelines import _events, summarise

    log = str(tmp_path / "storage/system/events")
    view = summarise("system/events", _events(log, DeltaRsTable(log).version()))
    assert {f["name"]: f.get("trigger") for f in view["flows"]} == {
        "to_alerts": "RealTime",
        "live": "RealTime",
    }


def test_an_update_flow_without_the_trigger_runs_micro_batches(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    # A triggered update; the Delta sink named by table (Lakeflow's `tableName`).
    database = f"rt_{uuid.uuid4().hex[:8]}"
    with dp.collect() as declared:
        dp.create_sink("doubled", "delta", {"tableName": f"{database}.doubled"})

        @dp.update_flow(target="doubled")
        def doubling() -> Any:
            return spark.readStream.format("delta").load(str(source)).selectExpr("id * 2 AS id")

    settings = _settings(tmp_path, database)
    dp.run_update(spark, declared.graph(), settings).raise_for_failure()
    _append(source, range(3, 5))
    report = dp.run_update(spark, declared.graph(), settings)
    report.raise_for_failure()
    assert report.flows["doubling"].status == "COMPLETED"
    rows = spark.read.table(f"{database}.doubled").collect()
    assert sorted(r["id"] for r in rows) == [0, 2, 4, 6, 8]


# ---- refusals ---------------------------------------------------------------------------


def _refusal(spark: Any, tmp_path: Path, declare: Callable[[], None], **kw: Any) -> Any:
    with dp.collect() as declared:
        declare()
    settings = _settings(tmp_path, f"rt_{uuid.uuid4().hex[:8]}")
    if kw.get("enabled") is False:
        settings = dp.PipelineSettings(
            name="rt", storage=settings.storage, database=settings.database
        )
    with pytest.raises(dp.RealTimeFlowError) as caught:
        if kw.get("triggered"):
            dp.run_update(spark, declared.graph(), settings)
        else:
            dp.dry_run(spark, declared.graph(), settings)
    assert caught.value.alternative
    return caught.value


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src"
    _append(path, range(3))
    return path


def test_an_aggregation_into_delta_is_refused(spark: Any, tmp_path: Path, source: Path) -> None:
    def declare() -> None:
        dp.create_sink("counts", "delta", {"path": str(tmp_path / "counts")})

        @dp.update_flow(target="counts", spark_conf=REAL_TIME)
        def counted() -> Any:
            return spark.readStream.format("delta").load(str(source)).groupBy("id").count()

    error = _refusal(spark, tmp_path, declare)
    assert (error.flow, error.problem) == ("counted", "real_time_stateful")
    assert "pipelines.trigger" in error.alternative


def test_drop_duplicates_into_delta_from_one_source_only(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    if PYSPARK_MINOR < (4, 3):
        pytest.skip("dropDuplicates in real-time mode is Spark >= 4.3")
    other = tmp_path / "other"
    _append(other, range(3))

    def one_source() -> None:
        dp.create_sink("unique", "delta", {"path": str(tmp_path / "unique")})

        @dp.update_flow(target="unique", spark_conf=REAL_TIME)
        def deduped() -> Any:
            return spark.readStream.format("delta").load(str(source)).dropDuplicates(["id"])

    with dp.collect() as declared:
        one_source()
    dp.dry_run(spark, declared.graph(), _settings(tmp_path, f"rt_{uuid.uuid4().hex[:8]}"))

    def two_sources() -> None:
        dp.create_sink("unique", "delta", {"path": str(tmp_path / "unique2")})

        @dp.update_flow(target="unique", spark_conf=REAL_TIME)
        def deduped() -> Any:
            one = spark.readStream.format("delta").load(str(source))
            two = spark.readStream.format("delta").load(str(other))
            return one.union(two).dropDuplicates(["id"])

    error = _refusal(spark, tmp_path, two_sources)
    assert (error.flow, error.problem) == ("deduped", "real_time_stateful")
    assert "2 streaming sources" in str(error)
    assert "at least once" in error.alternative


def test_a_materialized_view_is_refused(spark: Any, tmp_path: Path, source: Path) -> None:
    def declare() -> None:
        @dp.materialized_view(spark_conf=REAL_TIME)
        def totals() -> Any:
            return spark.read.format("delta").load(str(source)).selectExpr("count(*) AS n")

    error = _refusal(spark, tmp_path, declare)
    assert (error.flow, error.problem) == ("totals", "real_time_materialized_view")


def test_a_triggered_update_with_a_real_time_flow_is_refused_before_anything_runs(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    def declare() -> None:
        @dlt.table(spark_conf=REAL_TIME)
        def copied() -> Any:
            return spark.readStream.format("delta").load(str(source))

    error = _refusal(spark, tmp_path, declare, triggered=True)
    assert (error.flow, error.problem) == ("copied", "real_time_not_continuous")
    assert "continuous" in error.alternative
    assert not (tmp_path / "storage/checkpoints/copied").exists()


def test_real_time_mode_must_be_enabled_for_the_pipeline(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    def declare() -> None:
        @dp.table(spark_conf=REAL_TIME)
        def copied() -> Any:
            return spark.readStream.format("delta").load(str(source))

    error = _refusal(spark, tmp_path, declare, enabled=False)
    assert error.problem == "real_time_not_enabled"
    assert "spark.databricks.streaming.realTimeMode.enabled" in error.alternative


def test_expectations_and_append_flows_into_sinks_are_refused(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    def with_rules() -> None:
        @dp.table(spark_conf=REAL_TIME)
        @dp.expect_or_drop("positive", "id >= 0")
        def checked() -> Any:
            return spark.readStream.format("delta").load(str(source))

    assert _refusal(spark, tmp_path, with_rules).problem == "real_time_expectations"

    def appending() -> None:
        dp.create_sink("out", "delta", {"path": str(tmp_path / "out")})

        @dp.append_flow(target="out", spark_conf=REAL_TIME)
        def appended() -> Any:
            return spark.readStream.format("delta").load(str(source))

    assert _refusal(spark, tmp_path, appending).problem == "real_time_append_flow"


def test_declarations_need_no_spark() -> None:
    with dp.collect() as declared:
        dp.create_sink("out", "kafka", {"topic": "t"})

        @dp.update_flow(target="out", name="alerts", spark_conf=REAL_TIME)
        def query() -> Any:
            raise AssertionError("not called while declaring")

    flow = declared.graph().flows["alerts"]
    assert (flow.target, flow.output_mode, dict(flow.spark_conf)) == ("out", "update", REAL_TIME)

    # Lakeflow's rule: update flows write sinks only.
    with dp.collect() as declared:
        dp.create_streaming_table("events")

        @dp.update_flow(target="events")
        def into_table() -> Any:
            raise AssertionError("not called")

    with pytest.raises(dp.DefinitionError):
        declared.graph()


def test_the_spec_takes_lakeflows_continuous_field(tmp_path: Path) -> None:
    spec = parse_spec({"name": "rt", "storage": "s", "continuous": True}, tmp_path / "p.yml")
    assert spec.continuous
    assert not parse_spec({"name": "rt", "storage": "s"}, tmp_path / "p.yml").continuous
    with pytest.raises(dp.PipelineError):
        parse_spec({"name": "rt", "storage": "s", "continuous": "yes"}, tmp_path / "p.yml")
