"""A table dropped and made again at one S3 path, read through S3A (the JVM data path)
within the brain's snapshot cache TTL (``spark/bridge/_snapshots.py``).

On an object store the cache's revalidation by name (one HEAD of the next commit) cannot
tell a new table that has not passed the old one's version: the first read may plan the
old snapshot's files and fail on a missing file. That failure marks the table in the
connector before the action returns (``MissingFiles.scala``) and the next brain request
drops its entries, so the retry reads the new table: at most one failed read, never a run
of them until the TTL.

Uses the Connect server with S3A of ``tests/spark/test_s3a.py`` (its fixtures).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests import _object_store
from tests.spark.test_s3a import s3a_conf, server, spark, uris  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def write(store: _object_store.ObjectStore, s3: str, commits: list[list[int]]) -> None:
    """Commits made outside the brain (delta-rs, in this process): its cache is not told."""
    for ids in commits:
        data = pa.table({"id": pa.array(ids, pa.int64())})
        write_deltalake(s3, data, mode="append", storage_options=store.storage_options)


def ids(frame: Any) -> list[int]:
    return sorted(row.id for row in frame.collect())


def is_missing_file(error: Exception) -> bool:
    text = str(error)
    return "FILE_NOT_EXIST" in text or "FileNotFoundException" in text


def test_a_table_made_again_fails_at_most_one_read(spark, object_store, uris):  # noqa: F811
    uri, s3 = uris()
    write(object_store, s3, [[1], [2]])
    assert ids(spark.read.format("delta").load(uri)) == [1, 2]
    write(object_store, s3, [[3]])
    # Loaded anew just now (version 2), so what follows falls within the entry's TTL.
    assert ids(spark.read.format("delta").load(uri)) == [1, 2, 3]
    _object_store.store_fs(object_store).delete_dir(s3.removeprefix("s3://"))
    write(object_store, s3, [[7], [8], [9]])  # version 2 again: the name probe passes

    failures: list[Exception] = []
    got: list[int] | None = None
    for _ in range(2):
        try:
            got = ids(spark.read.format("delta").load(uri))
            break
        except Exception as exc:  # the first read may fail: checked below
            assert is_missing_file(exc), exc
            failures.append(exc)
    assert got == [7, 8, 9], failures
    assert len(failures) <= 1
    print(f"reads failed on a missing file before the right rows: {len(failures)}")
