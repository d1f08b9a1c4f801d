"""Streams in the console from a real Spark stream (deltaflow's Delta source and sink),
its checkpoint under the root, in the API and in a real browser while it runs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests._waiting import wait_until
from tests.console._browser import Browser
from tests.console.conftest import Console

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("streams")


@pytest.fixture(scope="module")
def console(root: Path) -> Iterator[Console]:
    running = Console(root)
    yield running
    running.server.close()


def _append(path: Path, start: int, n: int = 5) -> None:
    write_deltalake(str(path), pa.table({"id": list(range(start, start + n))}), mode="append")


def _stream(spark: Any, root: Path, name: str, **trigger: Any) -> Any:
    return (
        spark.readStream.format("delta")
        .load(str(root / "bronze"))
        .writeStream.format("delta")
        .option("checkpointLocation", str(root / "_checkpoints" / name))
        .trigger(**trigger)
        .start(str(root / name))
    )


def test_a_stream_with_its_checkpoint(spark: Any, console: Console, root: Path) -> None:
    bronze = root / "bronze"
    _append(bronze, 0)
    _stream(spark, root, "silver", availableNow=True).awaitTermination(300)
    _append(bronze, 5)
    query = _stream(spark, root, "silver", availableNow=True)
    query.awaitTermination(300)
    # The console finds new tables and checkpoints by looking again now and then.
    wait_until(lambda: len(console.ok("/api/streams")["streams"]) == 1, 60.0, "the stream")
    [stream] = console.ok("/api/streams")["streams"]
    assert stream["app_id"] == str(query.id)
    assert stream["checkpoint"] == "_checkpoints/silver"
    assert stream["tables"] == ["silver"]
    assert stream["last_batch_id"] == 1
    assert [b["rows"] for b in stream["batches"]] == [5, 5]
    assert all(b["latency_ms"] >= 0 and b["processing_ms"] >= 0 for b in stream["batches"])
    [source] = stream["sources"]
    assert (source["table"], source["read_version"], source["versions_behind"]) == (
        "bronze",
        DeltaTable(str(bronze)).version(),
        0,
    )
    _append(bronze, 10)  # not read yet: the query is one version behind
    [stream] = console.ok("/api/streams")["streams"]
    assert stream["versions_behind"] == 1
    tables = {t["id"]: t for t in console.ok("/api/tables")["tables"]}
    assert tables["bronze"]["readers"] == [str(query.id)]
    assert tables["silver"]["streams"] == [str(query.id)]
    assert "_checkpoints/silver" not in tables  # a checkpoint is not a table


def test_a_running_streams_charts_move(spark: Any, console: Console, root: Path) -> None:
    _append(root / "bronze", 500)  # the test may run alone: the source must exist
    browser = Browser()
    query = _stream(spark, root, "gold", processingTime="1 second")
    try:
        browser.open(console.url + "/streams")
        section = f'section[data-app-id="{query.id}"]'
        last_batch = f"document.querySelector('{section} .last-batch')"
        browser.wait_for(
            f"!!{last_batch} && /^[0-9]+$/.test({last_batch}.textContent)",
            what="the stream's first batch",
            timeout=180,
        )
        first = int(browser.text(f"{section} .last-batch") or -1)
        browser.evaluate("window.__not_reloaded = true")
        bars = f"document.querySelectorAll('{section} .latency rect.bar').length"
        before = browser.evaluate(bars)
        start = 1000
        for _ in range(2):
            _append(root / "bronze", start)
            start += 5
            browser.wait_for(
                f"Number({last_batch}.textContent) > {first}",
                what="the page to show a new batch",
                timeout=180,
            )
            first = int(browser.text(f"{section} .last-batch") or -1)
        assert browser.evaluate(bars) > before
        assert query.isActive, query.exception()
        assert browser.evaluate("window.__not_reloaded === true")
    finally:
        query.stop()
        browser.close()


def test_a_failed_streams_last_error(spark: Any, console: Console, root: Path) -> None:
    from pyspark.sql import functions as F

    source = root / "failing_src"
    _append(source, 0)

    @F.udf("long")
    def explode_on_three(value):  # no type hints: pyspark would read them as an eval type
        if value == 3:
            raise ValueError("marker-7431: a bad row")
        return value

    query = (
        spark.readStream.format("delta")
        .load(str(source))
        .select(explode_on_three("id").alias("id"))
        .writeStream.format("delta")
        .option("checkpointLocation", str(root / "_checkpoints" / "failing"))
        .trigger(availableNow=True)
        .start(str(root / "failing"))
    )
    with pytest.raises(Exception, match="marker-7431"):
        query.awaitTermination(300)
    # Spark's listener bus delivers the termination after awaitTermination returns.
    recorded = root / "_checkpoints" / "failing" / "_deltaflow" / "last_error.json"
    wait_until(recorded.exists, 60.0, "the query's error beside its checkpoint")

    def failing() -> list[dict[str, Any]]:
        streams = console.ok("/api/streams")["streams"]
        return [s for s in streams if s["checkpoint"] == "_checkpoints/failing"]

    wait_until(lambda: bool(failing()), 60.0, "the failed stream in the console")
    [stream] = failing()
    assert stream["last_error"] is not None
    assert stream["app_id"] == str(query.id)
    assert stream["last_error"]["id"] == str(query.id)
    assert "marker-7431" in stream["last_error"]["message"]
    browser = Browser()
    try:
        browser.open(console.url + "/streams")
        section = f'section[data-app-id="{query.id}"]'
        browser.wait_for(
            f"!!document.querySelector('{section} .last-error.error')",
            what="the failed query's last error on the page",
            timeout=60,
        )
        assert "marker-7431" in (browser.text(f"{section} .last-error") or "")
    finally:
        browser.close()


def test_a_pipeline_flows_commits_pair_with_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    """A pipeline's flow commits under its identity, not the query id: the console pairs
    the commits with the checkpoint by that identity (one stream, not two)."""
    from deltaflow import pipelines as dp
    from deltaflow.console._checkpoints import Checkpoint
    from deltaflow.console._streams import streams
    from deltaflow.console._table_state import TableState

    landing, storage = tmp_path / "landing", tmp_path / "storage"
    spark.createDataFrame([(1,), (2,)], "id BIGINT").write.json(str(landing))
    with dp.collect() as declared:

        @dp.table
        def silver() -> Any:
            return spark.readStream.schema("id BIGINT").json(str(landing))

    settings = dp.PipelineSettings(
        name="p", storage=str(storage), database=f"console_{uuid.uuid4().hex[:8]}"
    )
    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    table = TableState("tables/silver", str(storage / "tables" / "silver"), str(storage))
    checkpoint = Checkpoint(str(storage / "checkpoints" / "silver"), "checkpoints/silver")
    [stream] = streams([table], [checkpoint])
    assert stream["app_id"] == (storage / "checkpoints/silver/deltaflow-flow-id").read_text()
    assert (stream["checkpoint"], stream["tables"]) == ("checkpoints/silver", ["tables/silver"])
    assert [(b["batch_id"], b["rows"]) for b in stream["batches"]] == [(0, 2)]
