"""Streaming flows with only expect / expect_or_drop rules, written by the Delta sink with
the rules counted as observed metrics: exactly once and exact counts across a replayed
micro-batch, and a checkpoint that moves between foreachBatch and the sink."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp

SCHEMA = "id BIGINT, amount DOUBLE"


def _land(spark: Any, landing: Path, rows: list[tuple[int, float]]) -> None:
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("append").json(str(landing))


def _graph(spark: Any, landing: Path, *, with_fail_rule: bool) -> dp.Graph:
    def silver() -> Any:
        return spark.readStream.schema(SCHEMA).json(str(landing))

    with dp.collect() as declared:
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
    settings = dp.PipelineSettings(
        name="quality",
        storage=str(storage),
        database=f"q_{uuid.uuid4().hex[:8]}",
        configuration={"deltaflow.write.nativeWrite": native},
    )
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
