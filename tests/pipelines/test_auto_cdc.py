"""AUTO CDC (SCD type 1 and 2) over a change feed, late and out-of-order events included."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt

CHANGES = "id BIGINT, name STRING, seq INT, op STRING"
FIRST = [
    (1, "a1", 1, "UPSERT"),
    (1, "a3", 3, "UPSERT"),
    (2, "b1", 1, "UPSERT"),
    (3, "c1", 1, "UPSERT"),
    (3, None, 2, "DELETE"),
]
SECOND = [
    (1, "a2", 2, "UPSERT"),  # late: older than a3
    (3, "c0", 0, "UPSERT"),  # late: older than the delete
    (2, "b5", 5, "UPSERT"),
    (4, "d1", 1, "UPSERT"),
]


def _graph(spark: Any, source: str, scd: int) -> dp.Graph:
    with dp.collect() as declared:

        @dlt.view
        def changes() -> Any:
            return spark.readStream.format("delta").load(source)

        dlt.create_streaming_table("customers")
        dlt.apply_changes(
            target="customers",
            source="changes",
            keys=["id"],
            sequence_by="seq",
            apply_as_deletes="op = 'DELETE'",
            except_column_list=["op"],
            stored_as_scd_type=scd,
        )

    return declared.graph()


def _run(spark: Any, tmp_path: Path, scd: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    source = str(tmp_path / "changes")
    spark.createDataFrame(FIRST, CHANGES).write.format("delta").save(source)
    settings = dp.PipelineSettings(
        name="cdc", storage=str(tmp_path / "storage"), database=f"cdc_{uuid.uuid4().hex[:8]}"
    )
    graph = _graph(spark, source, scd)
    table = str(tmp_path / "storage/tables/customers")
    first = dp.run_update(spark, graph, settings)
    assert first.state == "COMPLETED", first
    after_first = DeltaRsTable(table).to_pyarrow_table().to_pylist()
    spark.createDataFrame(SECOND, CHANGES).write.format("delta").mode("append").save(source)
    second = dp.run_update(spark, graph, settings)
    assert second.state == "COMPLETED", second
    # A third update with nothing new changes nothing (replays are harmless too).
    version = DeltaRsTable(table).version()
    assert dp.run_update(spark, graph, settings).state == "COMPLETED"
    assert DeltaRsTable(table).version() == version
    return after_first, DeltaRsTable(table).to_pyarrow_table().to_pylist()


def test_scd1_keeps_the_latest_row_per_key_and_honours_tombstones(
    spark: Any, tmp_path: Path
) -> None:
    first, second = _run(spark, tmp_path, 1)
    assert sorted((r["id"], r["name"], r["seq"]) for r in first) == [(1, "a3", 3), (2, "b1", 1)]
    assert set(first[0]) == {"id", "name", "seq"}  # op excepted
    assert sorted((r["id"], r["name"]) for r in second) == [(1, "a3"), (2, "b5"), (4, "d1")]


def test_scd2_keeps_history_with_start_and_end_in_sequence_order(
    spark: Any, tmp_path: Path
) -> None:
    first, second = _run(spark, tmp_path, 2)

    def versions(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((r["id"], r["name"], r["__START_AT"], r["__END_AT"]) for r in rows)

    assert versions(first) == [
        (1, "a1", 1, 3),
        (1, "a3", 3, None),
        (2, "b1", 1, None),
        (3, "c1", 1, 2),
    ]
    assert versions(second) == [
        (1, "a1", 1, 2),
        (1, "a2", 2, 3),
        (1, "a3", 3, None),
        (2, "b1", 1, 5),
        (2, "b5", 5, None),
        (3, "c0", 0, 1),
        (3, "c1", 1, 2),
        (4, "d1", 1, None),
    ]
