"""Streaming flows with only expect / expect_or_drop rules, written by the Delta sink with
the rules counted as observed metrics: exactly once and exact counts across a replayed
micro-batch, and a checkpoint that moves between foreachBatch and the sink. Flows without
rules write under the flow's identity too, and checkpoints from before they did carry over."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp

SCHEMA = "id BIGINT, amount DOUBLE"


def _land(spark: Any, landing: Path, rows: list[tuple[int, float]]) -> None:
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("append").json(str(landing))


def _graph(spark: Any, landing: Path, *, with_fail_rule: bool, with_rules: bool = True) -> dp.Graph:
    def silver() -> Any:
        return spark.readStream.schema(SCHEMA).json(str(landing))

    with dp.collect() as declared:
        if not with_rules:  # a plain stream into the Delta sink
            dp.table(silver)
            return declared.graph()
        rules = dp.expect("small", "amount < 100")(silver)
        rules = dp.expect_or_drop("positive", "amount > 0")(rules)
        if with_fail_rule:  # a rule that never fails: the flow goes by foreachBatch
            rules = dp.expect_or_fail("has_id", "id IS NOT NULL")(rules)
        dp.table(rules)
    return declared.graph()


def _counts(report: dp.UpdateReport) -> dict[str, tuple[int, int]]:
    return {
        e.name: (e.passed_records, e.failed_records)
        for e in report.flows["silver"].expectations
        if e.name != "has_id"
    }


def _forget_last_commit(checkpoint: Path) -> None:
    """As if the update was killed after the batch's Delta commit and before Spark
    recorded the batch as done: the next update replays it."""
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)


def _settings(storage: Path, native: str = "auto") -> dp.PipelineSettings:
    return dp.PipelineSettings(
        name="quality",
        storage=str(storage),
        database=f"q_{uuid.uuid4().hex[:8]}",
        configuration={"deltaflow.write.nativeWrite": native},
    )


def _ids(storage: Path) -> list[int]:
    table = DeltaRsTable(str(storage / "tables" / "silver"))
    return sorted(r["id"] for r in table.to_pyarrow_table().to_pylist())


@pytest.mark.parametrize("native", ["auto", "false"], ids=["jvm_sink", "python_writer"])
def test_replayed_batches_are_written_and_counted_once_on_either_route(
    spark: Any, tmp_path: Path, native: str
) -> None:
    """native=false: the streams go through the Python stream writer (the route object
    stores take), which takes the flow's identity as well."""
    landing = tmp_path / "landing"
    storage = tmp_path / "storage"
    checkpoint = storage / "checkpoints" / "silver"
    settings = _settings(storage, native)
    by_foreach_batch = _graph(spark, landing, with_fail_rule=True)
    by_sink = _graph(spark, landing, with_fail_rule=False)

    _land(spark, landing, [(1, 5.0), (2, -1.0), (3, 200.0)])
    first = dp.run_update(spark, by_foreach_batch, settings)
    assert first.state == "COMPLETED", first
    assert _counts(first) == {"positive": (2, 1), "small": (2, 1)}

    # foreachBatch -> sink, with the last batch replayed: the sink writes under the same
    # identity, finds the batch in the log, and its counts are not reported again.
    _forget_last_commit(checkpoint)
    _land(spark, landing, [(4, 7.0), (5, -2.0)])
    second = dp.run_update(spark, by_sink, settings)
    assert second.state == "COMPLETED", second
    assert _ids(storage) == [1, 3, 4]
    assert _counts(second) == {"positive": (1, 1), "small": (2, 0)}
    assert second.flows["silver"].rows_written == 1

    # sink -> sink, replayed again: still once.
    _forget_last_commit(checkpoint)
    _land(spark, landing, [(6, 1.0)])
    third = dp.run_update(spark, by_sink, settings)
    assert _ids(storage) == [1, 3, 4, 6]
    assert _counts(third) == {"positive": (1, 0), "small": (1, 0)}

    # sink -> foreachBatch (the rule now fails on nothing), replayed: still once.
    _forget_last_commit(checkpoint)
    fourth = dp.run_update(spark, by_foreach_batch, settings)
    assert fourth.state == "COMPLETED", fourth
    assert _ids(storage) == [1, 3, 4, 6]
    assert _counts(fourth) == {"positive": (0, 0), "small": (0, 0)}


def _identity(checkpoint: Path) -> str:
    return (checkpoint / "deltaflow-flow-id").read_text().strip()


def _app_version(storage: Path, app_id: str) -> int | None:
    return DeltaRsTable(str(storage / "tables" / "silver")).transaction_version(app_id)


def _stream_as_before_flow_identity(spark: Any, landing: Path, storage: Path) -> str:
    """What a flow without rules ran before it took the flow's identity: a plain stream
    into the Delta sink, its batches keyed by the streaming query's id. Returns that id."""
    checkpoint = storage / "checkpoints" / "silver"
    query = (
        spark.readStream.schema(SCHEMA)
        .json(str(landing))
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(storage / "tables" / "silver"))
    )
    query.awaitTermination()
    assert query.exception() is None
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


@pytest.mark.parametrize("native", ["auto", "false"], ids=["jvm_sink", "python_writer"])
def test_a_flow_without_rules_writes_under_its_identity(
    spark: Any, tmp_path: Path, native: str
) -> None:
    """The plain route's replay is written once, and so is one replayed after an
    expect_or_fail rule is added (foreachBatch keyed by the same identity)."""
    landing = tmp_path / "landing"
    storage = tmp_path / "storage"
    checkpoint = storage / "checkpoints" / "silver"
    settings = _settings(storage, native)
    plain = _graph(spark, landing, with_fail_rule=False, with_rules=False)
    by_foreach_batch = _graph(spark, landing, with_fail_rule=True)

    _land(spark, landing, [(1, 5.0)])
    assert dp.run_update(spark, plain, settings).state == "COMPLETED"
    assert _app_version(storage, _identity(checkpoint)) == 0

    _forget_last_commit(checkpoint)
    _land(spark, landing, [(2, 7.0)])
    replayed = dp.run_update(spark, plain, settings)
    assert replayed.state == "COMPLETED", replayed
    assert _ids(storage) == [1, 2]
    assert replayed.flows["silver"].rows_written == 1  # the replay is not counted again

    # The batch replayed now was written by the plain route; the rule's route skips it.
    _forget_last_commit(checkpoint)
    _land(spark, landing, [(3, 1.0)])
    report = dp.run_update(spark, by_foreach_batch, settings)
    assert report.state == "COMPLETED", report
    assert _ids(storage) == [1, 2, 3]
    assert report.flows["silver"].rows_written == 1


def test_a_checkpoint_from_before_flow_identity_adopts_its_query_id(
    spark: Any, tmp_path: Path
) -> None:
    """No identity recorded, batches written under the query id: the flow takes that id,
    so the batch pending in the checkpoint is recognised when a rule is added."""
    landing = tmp_path / "landing"
    storage = tmp_path / "storage"
    checkpoint = storage / "checkpoints" / "silver"
    _land(spark, landing, [(1, 5.0)])
    query_id = _stream_as_before_flow_identity(spark, landing, storage)
    assert not (checkpoint / "deltaflow-flow-id").exists()

    _forget_last_commit(checkpoint)
    _land(spark, landing, [(2, 7.0)])
    report = dp.run_update(spark, _graph(spark, landing, with_fail_rule=True), _settings(storage))
    assert report.state == "COMPLETED", report
    assert _ids(storage) == [1, 2]
    assert _identity(checkpoint) == query_id


def test_an_identity_recorded_before_a_plain_run_under_the_query_id_gives_way(
    spark: Any, tmp_path: Path
) -> None:
    """A flow that had rules (identity recorded), then ran without them before the plain
    route took the identity (query id), and crashed: its pending batch is under the query
    id, which the flow takes from then on."""
    landing = tmp_path / "landing"
    storage = tmp_path / "storage"
    checkpoint = storage / "checkpoints" / "silver"
    settings = _settings(storage)
    by_foreach_batch = _graph(spark, landing, with_fail_rule=True)
    _land(spark, landing, [(1, 5.0)])
    assert dp.run_update(spark, by_foreach_batch, settings).state == "COMPLETED"
    recorded = _identity(checkpoint)

    _land(spark, landing, [(2, 7.0)])
    query_id = _stream_as_before_flow_identity(spark, landing, storage)
    assert (_app_version(storage, recorded), _app_version(storage, query_id)) == (0, 1)

    _forget_last_commit(checkpoint)
    report = dp.run_update(spark, by_foreach_batch, settings)
    assert report.state == "COMPLETED", report
    assert _ids(storage) == [1, 2]
    assert _identity(checkpoint) == query_id
