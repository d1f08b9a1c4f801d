"""Continuous mode: streams stay up, materialized views refresh, stop ends the update."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from tests._waiting import wait_until


def _ids(path: Path) -> list[int]:
    if not (path / "_delta_log").exists():
        return []
    return sorted(r["id"] for r in DeltaRsTable(str(path)).to_pyarrow_table().to_pylist())


def test_continuous_update_keeps_streams_up_until_stopped(spark: Any, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    schema = "id BIGINT, amount DOUBLE"
    spark.createDataFrame([(1, 5.0), (2, -1.0)], schema).write.json(str(landing))
    with dp.collect() as declared:

        @dp.table
        @dp.expect_or_drop("positive", "amount > 0")
        def silver() -> Any:
            return spark.readStream.schema(schema).json(str(landing))

        @dp.materialized_view
        def total() -> Any:
            return spark.read.table("silver").selectExpr("count(*) AS id")

    settings = dp.PipelineSettings(
        name="live",
        storage=str(tmp_path / "storage"),
        database=f"live_{uuid.uuid4().hex[:8]}",
        configuration={"pipelines.trigger.interval": "500 milliseconds"},
    )
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["report"] = dp.run_update(
                spark, declared.graph(), settings, continuous=True, stop=stop
            )
        except BaseException as exc:  # surfaced by the assertions below
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        tables = tmp_path / "storage/tables"
        wait_until(lambda: _ids(tables / "silver") == [1], 180, "the first micro-batch")
        wait_until(lambda: _ids(tables / "total") == [1], 180, "the view's refresh")
        # New data while the update runs is picked up without another update.
        spark.createDataFrame([(3, 7.0)], schema).write.mode("append").json(str(landing))
        wait_until(lambda: _ids(tables / "silver") == [1, 3], 180, "the new file")
        wait_until(lambda: _ids(tables / "total") == [2], 180, "the view's next refresh")
    finally:
        stop.set()
        runner.join(timeout=180)
    assert not runner.is_alive()
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert report.state == "CANCELED"
    assert report.flows["silver"].status == "STOPPED"
    assert report.flows["silver"].rows_written == 2
    assert not [q for q in spark.streams.active if q.name == "silver"]
    events = dp.read_events(str(tmp_path / "storage/system/events"))
    batches = [
        e["details"]["flow_progress"]
        for e in events
        if e["event_type"] == "flow_progress" and "batch_id" in e["details"]["flow_progress"]
    ]
    assert batches and all(b["status"] == "RUNNING" for b in batches)
    states = [
        e["details"]["update_progress"]["state"]
        for e in events
        if e["event_type"] == "update_progress"
    ]
    assert states[-1] == "CANCELED"
