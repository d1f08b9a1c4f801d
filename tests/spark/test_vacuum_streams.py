"""VACUUM never deletes what a running stream or a retained version still needs.

A running stream source holds a reader lease (``table/_reader_leases.py``); VACUUM keeps
every file a version at or after the lease's references, however short its retention.
Streams run for real, through the JVM connector and through the Python data source.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.spark.commands import _vacuum
from deltaflow.table import _reader_leases
from deltaflow.table._reader_leases import LEASE_DIR, LeaseHolder
from deltaflow.table._uri import normalize_uri
from tests._waiting import wait_until
from tests.spark.test_streaming import append, ids


def _lease_files(path: str) -> list[str]:
    folder = os.path.join(path, LEASE_DIR)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _files(path: str, version: int | None = None) -> list[Path]:
    table = DeltaTable(path, version=version)
    return sorted(Path(u.removeprefix("file://")) for u in table.file_uris())


def _vacuum_now(spark, path: str, dry_run: bool = False) -> list[str]:
    """``VACUUM ... RETAIN 0 HOURS`` with delta-spark's retention check off."""
    spark.conf.set(_vacuum.RETENTION_CHECK_CONF, "false")
    try:
        dry = " DRY RUN" if dry_run else ""
        return [r.path for r in spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS{dry}").collect()]
    finally:
        spark.conf.unset(_vacuum.RETENTION_CHECK_CONF)


@pytest.mark.parametrize("source_format", ["delta", "deltaflow_python"])
def test_lagging_stream_reads_every_row_once_after_optimize_and_vacuum(
    spark, table_path, source_format
):
    source = table_path("src")
    for i in range(4):
        append(source, [i])  # versions 0..3, one file each
    originals = _files(source)
    seen: list[int] = []
    reached, go = threading.Event(), threading.Event()

    def batch(df, batch_id: int) -> None:
        seen.extend(r.id for r in df.collect())
        if batch_id == 0:  # the stream lags: it holds here until the table was vacuumed
            reached.set()
            go.wait(120)

    query = (
        spark.readStream.format(source_format)
        .option("maxFilesPerTrigger", "1")
        .option("startingVersion", "0")
        .load(source)
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", table_path("ck"))
        .start()
    )
    try:
        wait_until(reached.is_set, 120, "the first micro-batch")
        (lease,) = _reader_leases.read_leases(source)
        assert lease.version == 0 and lease.is_live(3600.0)
        spark.sql(f"OPTIMIZE delta.`{source}`")  # version 4 removes every file read so far
        assert _files(source) != originals
        assert _vacuum_now(spark, source) == [normalize_uri(source)]
        assert all(p.exists() for p in originals)  # kept for the running stream
        go.set()
        query.processAllAvailable()
        assert sorted(seen) == [0, 1, 2, 3]  # every row exactly once (OPTIMIZE is skipped)
    finally:
        go.set()
        query.stop()
    # The connector's source releases its lease on stop; the Python data source's worker
    # is ended by Spark without a stop() call, and its lease stops counting with it.
    wait_until(
        lambda: _reader_leases.live_leases(source, 3600.0)[0] == [],
        30,
        "the stopped stream's lease to lapse",
    )
    if source_format == "delta":
        assert _lease_files(source) == []  # released by the connector's stop()
    _vacuum_now(spark, source)  # nothing keeps them now
    assert not any(p.exists() for p in originals)
    assert _lease_files(source) == []
    assert sorted(r.id for r in spark.read.format("delta").load(source).collect()) == [0, 1, 2, 3]


def test_vacuum_dry_run_reports_the_files_a_live_lease_keeps(spark, table_path, caplog):
    path = table_path()
    append(path, [1])
    append(path, [2])
    originals = _files(path)
    holder = LeaseHolder(path, timeout=3600.0, reader="a test's stream")
    holder.need(0)
    try:
        spark.sql(f"OPTIMIZE delta.`{path}`")
        with caplog.at_level(logging.INFO, logger="deltaflow.maintenance"):
            dry = _vacuum.vacuum(path, 0, dry_run=True, check_retention=False)
        assert dry == []
        (record,) = [r for r in caplog.records if hasattr(r, "kept_files")]
        kept = sorted(Path(path, f) for f in record.kept_files)  # type: ignore[attr-defined]
        assert kept == originals
        assert record.reader_leases == [holder.lease_id]  # type: ignore[attr-defined]
        assert holder.lease_id in record.getMessage()
        assert _vacuum_now(spark, path, dry_run=True) == []  # SQL, through the connector
    finally:
        holder.release()
    # Without the lease the same dry run lists them, and the real run deletes them.
    listed = sorted(Path(u.removeprefix("file://")) for u in _vacuum_now(spark, path, True))
    assert listed == originals
    _vacuum_now(spark, path)
    assert not any(p.exists() for p in originals)


def test_stale_lease_of_a_killed_stream_does_not_block_vacuum(spark, table_path):
    path = table_path()
    append(path, [1])
    append(path, [2])
    originals = _files(path)
    # What a SIGKILLed stream leaves: its last heartbeat, two hours ago (timeout: 1 hour).
    heartbeat = int((time.time() - 7200) * 1000)
    stale = {"version": 0, "heartbeat": heartbeat, "reader": "stream over it (killed)"}
    _reader_leases._put(path, "killed", json.dumps(stale).encode())
    spark.sql(f"OPTIMIZE delta.`{path}`")
    _vacuum_now(spark, path)
    assert not any(p.exists() for p in originals)
    assert _lease_files(path) == []  # the real VACUUM tidied the expired lease away
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [1, 2]


def test_a_version_inside_the_retention_stays_readable_after_vacuum(spark, table_path):
    path = table_path()
    append(path, [1])
    append(path, [2])  # version 1
    append(path, [3], mode="overwrite")  # version 2 removes both files
    spark.sql(f"VACUUM delta.`{path}`")  # the table's 7 days: version 1 is retained
    old = spark.read.format("delta").option("versionAsOf", 1).load(path)
    assert sorted(r.id for r in old.collect()) == [1, 2]
    assert ids(path) == [3]
