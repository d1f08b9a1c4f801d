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
    assert first.flows["customers"].rows_written == len(FIRST)  # the change events read
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


SCD2_AFTER_FIRST = [
    (1, "a1", 1, 3),
    (1, "a3", 3, None),
    (2, "b1", 1, None),
    (3, "c1", 1, 2),
]
SCD2_AFTER_SECOND = [
    (1, "a1", 1, 2),
    (1, "a2", 2, 3),
    (1, "a3", 3, None),
    (2, "b1", 1, 5),
    (2, "b5", 5, None),
    (3, "c0", 0, 1),
    (3, "c1", 1, 2),
    (4, "d1", 1, None),
]


def _versions(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["name"], r["__START_AT"], r["__END_AT"]) for r in rows)


def test_scd2_keeps_history_with_start_and_end_in_sequence_order(
    spark: Any, tmp_path: Path
) -> None:
    first, second = _run(spark, tmp_path, 2)
    assert _versions(first) == SCD2_AFTER_FIRST
    assert _versions(second) == SCD2_AFTER_SECOND


def test_scd2_history_is_the_same_when_its_merge_runs_as_spark_jobs(
    spark: Any, tmp_path: Path, merge_as_spark_jobs: None
) -> None:
    # The delta-rs route takes these small batches; the Spark jobs take sources over
    # spark.deltaflow.merge.nativeMaxSourceRows, with the same null-safe (key,
    # __START_AT) match.
    first, second = _run(spark, tmp_path, 2)
    assert _versions(first) == SCD2_AFTER_FIRST
    assert _versions(second) == SCD2_AFTER_SECOND


SNAPSHOTS = [
    [(1, "a"), (2, "b"), (3, "c")],
    [(1, "a"), (2, "B"), (4, "d")],  # 2 changed, 3 gone, 4 new
]


def _snapshot_graph(spark: Any, snapshots: list[list[tuple[Any, ...]]], scd: int) -> dp.Graph:
    def next_snapshot(last: int | None) -> tuple[Any, int] | None:
        index = 0 if last is None else last
        if index >= len(snapshots):
            return None
        return spark.createDataFrame(snapshots[index], "id BIGINT, name STRING"), index + 1

    with dp.collect() as declared:
        dp.create_streaming_table("dim")
        dp.create_auto_cdc_from_snapshot_flow(
            target="dim", source=next_snapshot, keys=["id"], stored_as_scd_type=scd
        )
    return declared.graph()


def _rows(path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in DeltaRsTable(str(path)).to_pyarrow_table().to_pylist())


def test_auto_cdc_from_snapshots_scd1_and_scd2(spark: Any, tmp_path: Path) -> None:
    for scd in (1, 2):
        offered = [SNAPSHOTS[0]]
        settings = dp.PipelineSettings(
            name=f"snap{scd}",
            storage=str(tmp_path / f"storage{scd}"),
            database=f"snap_{uuid.uuid4().hex[:8]}",
        )
        graph = _snapshot_graph(spark, offered, scd)
        table = tmp_path / f"storage{scd}/tables/dim"
        assert dp.run_update(spark, graph, settings).state == "COMPLETED"
        first = _rows(table)
        offered.append(SNAPSHOTS[1])
        assert dp.run_update(spark, graph, settings).state == "COMPLETED"
        version = DeltaRsTable(str(table)).version()
        assert dp.run_update(spark, graph, settings).state == "COMPLETED"  # nothing new
        assert DeltaRsTable(str(table)).version() == version
        if scd == 1:
            assert first == [(1, "a"), (2, "b"), (3, "c")]
            assert _rows(table) == [(1, "a"), (2, "B"), (4, "d")]
        else:
            assert first == [(1, "a", 1, None), (2, "b", 1, None), (3, "c", 1, None)]
            assert _rows(table) == [
                (1, "a", 1, None),
                (2, "B", 2, None),
                (2, "b", 1, 2),
                (3, "c", 1, 2),
                (4, "d", 2, None),
            ]


def test_auto_cdc_from_a_snapshot_table_applies_each_new_version(
    spark: Any, tmp_path: Path
) -> None:
    database = f"snapt_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {database}")
    source = tmp_path / "source"
    spark.createDataFrame(SNAPSHOTS[0], "id BIGINT, name STRING").write.format("delta").save(
        str(source)
    )
    spark.sql(f"CREATE TABLE {database}.products USING delta LOCATION '{source}'")
    with dp.collect() as declared:
        dlt.create_streaming_table("dim")
        dlt.apply_changes_from_snapshot(target="dim", source="products", keys=["id"])
    settings = dp.PipelineSettings(
        name="snapt", storage=str(tmp_path / "storage"), database=database
    )
    table = tmp_path / "storage/tables/dim"
    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    assert _rows(table) == [(1, "a"), (2, "b"), (3, "c")]
    spark.createDataFrame(SNAPSHOTS[1], "id BIGINT, name STRING").write.format("delta").mode(
        "overwrite"
    ).save(str(source))
    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    assert _rows(table) == [(1, "a"), (2, "B"), (4, "d")]


TRACKED_CHANGES = "id BIGINT, name STRING, city STRING, seq INT, op STRING"
TRACKED_FIRST = [
    (1, "a", "X", 1, "UPSERT"),
    (1, "b", "X", 3, "UPSERT"),  # name is not tracked: the open version, in place
    (1, None, "Y", 5, "UPSERT"),  # city is: a new version; NULL name keeps "b"
    (2, "p", "X", 1, "UPSERT"),
    (2, None, None, 4, "DELETE"),
    (2, "q", None, 6, "UPSERT"),  # after a delete: NULLs are taken as they are
]
TRACKED_SECOND = [
    (1, "c", "Z", 4, "UPSERT"),  # late, between two stored versions of key 1
    (2, None, None, 5, "DELETE"),  # late delete while key 2 was deleted: no change
    (2, None, "W", 7, "UPSERT"),  # NULL name keeps "q"; city changes: a new version
    (3, "m", "X", 2, "UPSERT"),  # out of order within the batch, nothing tracked changes
    (3, "m", "X", 1, "UPSERT"),
]


def test_scd2_tracks_only_the_listed_columns_across_out_of_order_batches(
    spark: Any, tmp_path: Path
) -> None:
    source = str(tmp_path / "changes")
    spark.createDataFrame(TRACKED_FIRST, TRACKED_CHANGES).write.format("delta").save(source)
    with dp.collect() as declared:

        @dp.temporary_view
        def changes() -> Any:
            return spark.readStream.format("delta").load(source)

        dp.create_streaming_table("dim")
        dp.create_auto_cdc_flow(
            target="dim",
            source="changes",
            keys=["id"],
            sequence_by="seq",
            apply_as_deletes="op = 'DELETE'",
            column_list=["id", "name", "city"],
            stored_as_scd_type=2,
            track_history_column_list=["city"],
            ignore_null_updates=True,
        )
    settings = dp.PipelineSettings(
        name="tracked", storage=str(tmp_path / "storage"), database=f"t_{uuid.uuid4().hex[:8]}"
    )
    table = str(tmp_path / "storage/tables/dim")

    def versions() -> list[tuple[Any, ...]]:
        rows = DeltaRsTable(table).to_pyarrow_table().to_pylist()
        key = repr
        return sorted(
            ((r["id"], r["name"], r["city"], r["__START_AT"], r["__END_AT"]) for r in rows),
            key=key,
        )

    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    assert versions() == sorted(
        [(1, "b", "X", 1, 5), (1, "b", "Y", 5, None), (2, "p", "X", 1, 4), (2, "q", None, 6, None)],
        key=repr,
    )
    spark.createDataFrame(TRACKED_SECOND, TRACKED_CHANGES).write.format("delta").mode(
        "append"
    ).save(source)
    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    expected = sorted(
        [
            (1, "b", "X", 1, 4),
            (1, "c", "Z", 4, 5),
            (1, "b", "Y", 5, None),
            (2, "p", "X", 1, 4),
            (2, "q", None, 6, 7),
            (2, "q", "W", 7, None),
            (3, "m", "X", 1, None),
        ],
        key=repr,
    )
    assert versions() == expected
    # Nothing new: no commit, nothing changed.
    version = DeltaRsTable(table).version()
    assert dp.run_update(spark, declared.graph(), settings).state == "COMPLETED"
    assert DeltaRsTable(table).version() == version
    assert versions() == expected


def test_a_first_load_replayed_after_a_crash_changes_nothing(spark: Any, tmp_path: Path) -> None:
    """The first batch into an empty target is appended, not merged; replayed (killed
    after the append, before Spark's commit log), it finds the rows and MERGEs nothing new."""
    from tests.spark._checkpoints import forget_batch

    source = str(tmp_path / "changes")
    spark.createDataFrame(FIRST, CHANGES).write.format("delta").save(source)
    for scd, expected in ((1, [(1, "a3", 3, None), (2, "b1", 1, None)]), (2, SCD2_AFTER_FIRST)):
        storage = tmp_path / f"storage{scd}"
        settings = dp.PipelineSettings(
            name="cdc", storage=str(storage), database=f"cdc_{uuid.uuid4().hex[:8]}"
        )
        graph = _graph(spark, source, scd)
        assert dp.run_update(spark, graph, settings).state == "COMPLETED"
        table = str(storage / "tables/customers")
        version = DeltaRsTable(table).version()
        forget_batch(str(storage / "checkpoints/customers"))
        assert dp.run_update(spark, graph, settings).state == "COMPLETED"
        rows = DeltaRsTable(table).to_pyarrow_table().to_pylist()
        got = sorted(
            (r["id"], r["name"], r.get("__START_AT", r.get("seq")), r.get("__END_AT")) for r in rows
        )
        assert got == expected, scd
        # SCD 1: the sequence guard drops every replayed event; SCD 2: the rebuilt history
        # equals the stored one. Either way no new table version.
        assert DeltaRsTable(table).version() == version, scd
