"""A read through the connector of a table dropped and made again at the same path, within
the brain's snapshot cache TTL (``spark/bridge/_snapshots.py``): the new table's rows,
never the old snapshot's files (which are gone: the read failed with FileNotFound until
the cache entry ran out, issue 29 follow-up)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake


def write(path: str, commits: list[list[int]]) -> None:
    for ids in commits:
        write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64())}), mode="append")


def ids(frame: Any) -> list[int]:
    return sorted(row.id for row in frame.collect())


def test_a_table_made_again_with_as_many_versions_reads_its_new_rows(spark, table_path):
    path = table_path("t")
    write(path, [[1], [2]])
    assert ids(spark.read.format("delta").load(path)) == [1, 2]  # the session's first scan
    write(path, [[3]])
    # Loaded anew just now (version 2): what follows runs well within the TTL even when
    # the first scan of a session took longer than it.
    assert ids(spark.read.format("delta").load(path)) == [1, 2, 3]
    shutil.rmtree(path)
    write(path, [[7], [8], [9]])  # version 2 again: no version 3 for the name probe to find
    assert ids(spark.read.format("delta").load(path)) == [7, 8, 9]


def test_a_table_made_again_with_fewer_versions_reads_its_new_rows(spark, table_path):
    path = table_path("t")
    write(path, [[1], [2], [3]])
    frame = spark.read.format("delta").load(path)
    assert ids(frame) == [1, 2, 3]
    shutil.rmtree(path)
    write(path, [[9]])
    # A new query on the DataFrame made before plans anew, as a new read does (collect()
    # again on the same DataFrame would reuse Spark's executed plan: docs/architecture.md).
    assert ids(frame.filter("id > 0")) == [9]
    assert ids(spark.read.format("delta").load(path)) == [9]
    assert ids(spark.sql(f"SELECT id FROM delta.`{Path(path).as_uri()}`")) == [9]


def test_time_travel_into_a_table_made_again_reads_the_new_table(spark, table_path):
    path = table_path("t")
    write(path, [[1], [2]])
    assert ids(spark.read.format("delta").option("versionAsOf", 0).load(path)) == [1]
    shutil.rmtree(path)
    write(path, [[5], [6]])
    assert ids(spark.read.format("delta").option("versionAsOf", 0).load(path)) == [5]
