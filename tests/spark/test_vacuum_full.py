"""VACUUM deletes every file of the table directory that no version inside the retention
references and that is older than the retention (delta-spark's full mode): a crashed
writer's files, expired change data files; it keeps referenced files (deletion vectors
too), recent files of any kind, and other ``_``-prefixed directories."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltaflow.spark.commands import _vacuum
from deltaflow.table._uri import normalize_uri

THREE_HOURS_AGO = time.time() - 3 * 3600


@pytest.fixture
def no_retention_check(spark: Any) -> Iterator[None]:
    spark.conf.set(_vacuum.RETENTION_CHECK_CONF, "false")
    try:
        yield
    finally:
        spark.conf.unset(_vacuum.RETENTION_CHECK_CONF)


def _plant(root: Path, relative: str, *, old: bool) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not referenced by any commit")
    if old:
        os.utime(path, (THREE_HOURS_AGO, THREE_HOURS_AGO))
    return path


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def _rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def _age_committed_files(spark: Any, path: str, properties: str) -> set[Path]:
    """A partitioned table with a DELETE and an UPDATE after its insert, every file of
    which is older than the retention by its modification time: the referenced ones (and
    those removed inside the retention) must stay all the same."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id long, kind string) USING delta PARTITIONED BY (kind)"
        f" TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true'{properties})"
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 'a'), (2, 'a'), (3, 'b'), (4, 'b')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    spark.sql(f"UPDATE delta.`{path}` SET id = 30 WHERE id = 3")
    committed = _files(Path(path))
    assert any("_change_data" in p.parts for p in committed)
    for p in committed:
        os.utime(p, (THREE_HOURS_AGO, THREE_HOURS_AGO))
    return committed


def _crash_leftovers(root: Path) -> set[Path]:
    return {
        _plant(root, f"kind=a/part-00000-{uuid.uuid4()}.c000.snappy.parquet", old=True),
        _plant(root, f"part-00001-{uuid.uuid4()}.c000.snappy.parquet", old=True),
        _plant(root, f"_change_data/kind=b/cdc-{uuid.uuid4()}.snappy.parquet", old=True),
    }


def _never_deleted(root: Path) -> set[Path]:
    return {
        _plant(root, f"kind=b/part-00000-{uuid.uuid4()}.c000.snappy.parquet", old=False),
        _plant(root, "_other_tool/state.parquet", old=True),
        _plant(root, ".hidden/state.parquet", old=True),
    }


def _dry_run(spark: Any, path: str) -> set[str]:
    return {r.path for r in spark.sql(f"VACUUM delta.`{path}` RETAIN 1 HOURS DRY RUN").collect()}


def test_full_vacuum_deletes_unreferenced_files_older_than_the_retention(
    spark: Any, table_path: Any, no_retention_check: None
) -> None:
    path = table_path()
    root = Path(path)
    committed = _age_committed_files(spark, path, "")
    before = _rows(spark, path)
    cdc = {p for p in committed if "_change_data" in p.parts}
    crashed, kept = _crash_leftovers(root), _never_deleted(root)
    expected = crashed | cdc  # change data files expire by their age, as in delta-spark

    assert _dry_run(spark, path) == {normalize_uri(str(p)) for p in expected}
    assert all(p.exists() for p in expected)  # a dry run deletes nothing

    spark.sql(f"VACUUM delta.`{path}` RETAIN 1 HOURS")
    assert not any(p.exists() for p in expected)
    assert all(p.exists() for p in kept)
    assert all(p.exists() for p in committed - cdc)  # referenced or removed too recently
    assert _rows(spark, path) == before

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 2").collect()
    assert [h.operation for h in history] == ["VACUUM END", "VACUUM START"]
    assert history[1].operationMetrics["numFilesToDelete"] == str(len(expected))
    assert history[0].operationMetrics["numDeletedFiles"] == str(len(expected))


def test_full_vacuum_keeps_the_deletion_vectors_versions_reference(
    spark: Any, table_path: Any, no_retention_check: None
) -> None:
    path = table_path()
    root = Path(path)
    committed = _age_committed_files(spark, path, ", 'delta.enableDeletionVectors' = 'true'")
    before = _rows(spark, path)
    assert any(p.name.startswith("deletion_vector_") for p in committed)
    cdc = {p for p in committed if "_change_data" in p.parts}
    crashed, kept = _crash_leftovers(root), _never_deleted(root)
    # A crashed writer's deletion vectors: old ones go, a young one stays; the live ones
    # (old by their modification time) stay.
    crashed.add(_plant(root, f"deletion_vector_{uuid.uuid4()}.bin", old=True))
    crashed.add(_plant(root, f"ab/deletion_vector_{uuid.uuid4()}.bin", old=True))
    kept.add(_plant(root, f"deletion_vector_{uuid.uuid4()}.bin", old=False))
    expected = crashed | cdc

    assert _dry_run(spark, path) == {normalize_uri(str(p)) for p in expected}
    spark.sql(f"VACUUM delta.`{path}` RETAIN 1 HOURS")
    assert not any(p.exists() for p in expected)
    assert all(p.exists() for p in kept | (committed - cdc))
    assert _rows(spark, path) == before


def _deletion_vectors(root: Path) -> set[Path]:
    return set(root.rglob("deletion_vector_*.bin"))


def test_vacuum_deletes_a_deletion_vector_no_version_inside_the_retention_references(
    spark: Any, table_path: Any, no_retention_check: None
) -> None:
    from deltalake import DeltaTable as RsTable
    from deltalake import QueryBuilder

    path = table_path()
    root = Path(path)
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id long) USING delta"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    spark.range(8).coalesce(1).write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    replaced = _deletion_vectors(root)
    # The second DELETE on the same file replaces its vector: the first one is referenced
    # only by a tombstone from now on, which RETAIN 0 HOURS puts outside the retention.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 2")
    live = _deletion_vectors(root) - replaced
    assert replaced and live
    before = _rows(spark, path)

    dry = _dry_run_with(spark, path, 0)
    assert {normalize_uri(str(p)) for p in replaced} <= dry
    assert not {normalize_uri(str(p)) for p in live} & dry
    spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    assert _deletion_vectors(root) == live
    assert _rows(spark, path) == before == [(i,) for i in range(8) if i not in (1, 2)]
    # delta-rs's DataFusion reader applies the vectors: the live one must be there.
    result = QueryBuilder().register("t", RsTable(path)).execute("SELECT id FROM t")
    assert sorted(result.read_all().column("id").to_pylist()) == [r[0] for r in before]


def _dry_run_with(spark: Any, path: str, hours: int) -> set[str]:
    sql = f"VACUUM delta.`{path}` RETAIN {hours} HOURS DRY RUN"
    return {r.path for r in spark.sql(sql).collect()}


@pytest.mark.slow
def test_full_vacuum_on_s3_deletes_a_crashed_writers_object(
    spark: Any, object_store: Any, no_retention_check: None
) -> None:
    import pyarrow.fs as pafs

    uri = object_store.uri()
    spark.range(5).write.format("delta").save(uri)
    fs, base = pafs.FileSystem.from_uri(uri)
    stray = f"{base}/part-00009-{uuid.uuid4()}.c000.snappy.parquet"
    with fs.open_output_stream(stray) as out:
        out.write(b"a crashed writer's file")

    dry = spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS DRY RUN").collect()
    assert [r.path.rsplit("/", 1)[-1] for r in dry] == [stray.rsplit("/", 1)[-1]], dry
    spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    assert fs.get_file_info(stray).type == pafs.FileType.NotFound
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == list(range(5))
