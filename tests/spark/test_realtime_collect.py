"""Collecting a staged roll (``write._native.collect_staged``), as a real-time commit does:
a roll's one file is read and moved on the calling thread, the data columns' Arrow schema
is converted once per plan. None of that may change what the log records, and the staged
directory is still deleted before the call returns.
The stats and counts are compared with the footer's own (issue 28, docs/notes/rtm-commit.md).

No Spark session: rolls are staged as Parquet files the way a writer leaves them.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from deltaflow.spark.bridge import _ops
from deltaflow.spark.write import _native
from deltaflow.spark.write._plan import arrow_schema
from deltaflow.table._footer_stats import footer_stats
from deltaflow.table.errors import CorruptTableError

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "kind", "type": "string", "nullable": True, "metadata": {}},
        {"name": "score", "type": "double", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
    ],
}


def rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            # A bound longer than 32 characters is cut: the stats must show it cut.
            "kind": pa.array([f"{'k' * 40}{i % 3}" if i % 5 else None for i in ids], pa.string()),
            "score": pa.array([i / 7 if i % 4 else None for i in ids], pa.float64()),
            "ts": pa.array([1_700_000_000_000_123 + i for i in ids], pa.timestamp("us", tz="UTC")),
        }
    )


@pytest.fixture()
def planned(tmp_path: Path) -> tuple[str, Any, Any]:
    """A table and the JVM write's plan for it, as ``sink.commitRolls`` makes them."""
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 0))
    args = {"mode": "append", "schema": json.dumps(SCHEMA), "options": {"path": path}, "conf": {}}
    answer = _ops.plan_write({**args, "staging": f"{path}/_delta_staging/plan"})
    assert answer["route"] == "jvm"
    pending = _ops.take_pending(str(answer["handle"]))
    assert pending is not None
    return path, pending.plan, pending.native


def stage(path: str, *tables: pa.Table) -> Path:
    """A roll's directory with one Parquet file per table, named as a writer names them."""
    directory = Path(path) / "_delta_staging" / "e0" / f"p0-e0-a1-n{uuid.uuid4().hex[:6]}"
    directory.mkdir(parents=True)
    for n, table in enumerate(tables):
        pq.write_table(table, directory / f"part-{n:05d}-{uuid.uuid4()}-c000.snappy.parquet")
    return directory


def footer_of(staged: Path, plan: Any) -> list[str]:
    """The stats the footers give, computed as before the roll path changed."""
    schema = arrow_schema(plan.schema)
    return [
        footer_stats(pq.read_metadata(f), schema, plan.num_indexed_cols)
        for f in sorted(staged.glob("*.parquet"))
    ]


def test_a_roll_s_one_file_has_its_footer_stats_and_count(
    planned: tuple[str, Any, Any],
) -> None:
    path, plan, native = planned
    staged = stage(path, rows(10, 50))
    expected = footer_of(staged, plan)
    added = _native.collect_staged(plan, native, f"file://{staged}", "job1")
    assert [a.stats for a in added] == expected
    assert _native.rows_in(added) == 50
    stats = json.loads(added[0].stats or "{}")
    assert stats["nullCount"] == {"id": 0, "kind": 10, "score": 12, "ts": 0}
    assert stats["minValues"]["kind"] == "k" * 32  # a bound cut to 32 characters, as before
    assert (Path(path) / added[0].path).exists()
    assert "job1" in added[0].path
    assert not staged.exists()


def test_one_file_and_several_files_record_the_same_stats(
    planned: tuple[str, Any, Any],
) -> None:
    """The inline path (one file) and the pool (several) give each file the same add."""
    path, plan, native = planned
    alone = stage(path, rows(0, 30))
    together = stage(path, rows(0, 30), rows(30, 20))
    one = _native.collect_staged(plan, native, f"file://{alone}", "job1")
    two = _native.collect_staged(plan, native, f"file://{together}", "job2")
    assert [a.stats for a in one] == [two[0].stats]
    assert _native.rows_in(two) == 50
    assert [a.size for a in one] == [two[0].size]
    assert not alone.exists() and not together.exists()


def test_a_failed_collect_deletes_the_directory_at_once_and_moves_nothing(
    planned: tuple[str, Any, Any],
) -> None:
    """A file outside the layout Spark's writer stages is refused; the directory goes
    before the error propagates."""
    path, plan, native = planned
    staged = stage(path)
    nested = staged / "x=1"
    nested.mkdir()
    pq.write_table(rows(0, 3), nested / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
    before = {p.name for p in Path(path).glob("*.parquet")}
    with pytest.raises(CorruptTableError):
        _native.collect_staged(plan, native, f"file://{staged}", "job1")
    assert not staged.exists()
    assert {p.name for p in Path(path).glob("*.parquet")} == before


def test_plans_with_different_schemas_keep_their_own_data_schema(tmp_path: Path) -> None:
    """The per-plan schema cache is keyed by the plan's schema object: a second table's
    plan (another schema) gets its own columns' stats."""
    results = []
    for name, table in (("a", rows(0, 4)), ("b", rows(0, 4).select(["id", "kind"]))):
        path = str(tmp_path / name)
        write_deltalake(path, table.slice(0, 0))
        fields = [f for f in SCHEMA["fields"] if f["name"] in table.column_names]
        schema = {"type": "struct", "fields": fields}
        args = {"mode": "append", "schema": json.dumps(schema), "options": {"path": path}}
        answer = _ops.plan_write({**args, "conf": {}, "staging": f"{path}/_delta_staging/p"})
        pending = _ops.take_pending(str(answer["handle"]))
        assert pending is not None
        staged = stage(path, table)
        expected = footer_of(staged, pending.plan)
        added = _native.collect_staged(pending.plan, pending.native, f"file://{staged}", "j")
        assert [a.stats for a in added] == expected
        results.append(set(json.loads(added[0].stats or "{}")["nullCount"]))
        shutil.rmtree(path)
    assert results == [{"id", "kind", "score", "ts"}, {"id", "kind"}]
