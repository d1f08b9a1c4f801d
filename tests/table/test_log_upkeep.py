"""Log upkeep (issue 14): checkpoints every ``delta.checkpointInterval`` versions from every
commit route, and expired log cleanup after ``delta.logRetentionDuration``.

Commits go through :func:`deltaflow.table._commit.commit`, the path of the Spark sink, the
batch writer and the HTTP ingest server; logs are checked on disk and with delta-rs.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow.table import _commit, _log_commit, _log_upkeep, _uri
from deltaflow.table._reader_leases import LeaseHolder
from deltaflow.table._snapshot import load_snapshot
from deltaflow.table.errors import VersionNotFoundError

ROUTES = ["delta-rs", "delta-rs, caller's table", "log writer"]


def _create(path: str, **config: str) -> str:
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}), configuration=config)
    return path


def _append(path: str, value: int, route: str) -> int:
    """One commit adding a file with ``value``, by ``route``; the version it got."""
    name = f"part-{uuid.uuid4()}.parquet"
    pq.write_table(pa.table({"id": pa.array([value], pa.int64())}), os.path.join(path, name))
    stats = json.dumps({"numRecords": 1, "minValues": {"id": value}, "maxValues": {"id": value}})
    table = RsTable(path)
    request = _commit.CommitRequest(
        table_uri=_uri.normalize_uri(path),
        schema=json.loads(table.schema().to_json()),
        partition_columns=(),
        adds=[_commit.AddedFile(name, os.path.getsize(os.path.join(path, name)), {}, 0, stats)],
        read_version=table.version(),
        # The HTTP ingest server keeps its table loaded and hands it to the commit.
        table=table if route == "delta-rs, caller's table" else None,
        # A read set sends the commit through deltaflow's own log writer.
        read=_log_commit.ReadSet() if route == "log writer" else None,
    )
    version = _commit.commit(request).version
    assert version is not None
    return version


def _log_names(path: str) -> list[str]:
    return sorted(os.listdir(os.path.join(path, "_delta_log")))


def _checkpoints(path: str) -> list[int]:
    return [int(n[:20]) for n in _log_names(path) if n.endswith(".checkpoint.parquet")]


def _commits(path: str) -> list[int]:
    return [int(n[:20]) for n in _log_names(path) if n.endswith(".json") and n[:20].isdigit()]


def _age(path: str, versions: range, seconds: float) -> None:
    """Make the log files of ``versions`` look ``seconds`` old (cleanup goes by mtime)."""
    then = time.time() - seconds
    for name in _log_names(path):
        if name[:20].isdigit() and int(name[:20]) in versions:
            os.utime(os.path.join(path, "_delta_log", name), (then, then))


def _ids(path: str) -> list[int]:
    return sorted(RsTable(path).to_pyarrow_table().column("id").to_pylist())


@pytest.mark.parametrize("route", ROUTES)
def test_checkpoints_at_multiples_of_the_interval_on_every_route(table_path, route):
    path = _create(table_path(), **{"delta.checkpointInterval": "5"})
    versions = [_append(path, i, route) for i in range(1, 12)]
    assert versions == list(range(1, 12))
    with open(os.path.join(path, "_delta_log", f"{11:020d}.json")) as f:
        info = next(json.loads(line)["commitInfo"] for line in f if "commitInfo" in line)
    assert info.get("engineInfo", "").startswith("deltaflow/") == (route == "log writer")
    # delta-spark's versions (5, 10), not delta-rs's own hook's (4, 9).
    assert _checkpoints(path) == [5, 10]
    with open(os.path.join(path, "_delta_log", "_last_checkpoint")) as f:
        assert json.load(f)["version"] == 10
    # Readers agree, and they use the checkpoint: the JSON before it is no longer needed.
    for version in range(10):
        os.remove(os.path.join(path, "_delta_log", f"{version:020d}.json"))
    assert _ids(path) == list(range(12))
    snapshot = load_snapshot(_uri.normalize_uri(path))
    assert snapshot.version == 11
    assert sorted(f.path for f in snapshot.files(stats=False)) == sorted(
        os.path.basename(u) for u in RsTable(path).file_uris()
    )


def test_the_default_interval_is_delta_sparks_ten(table_path):
    path = _create(table_path())
    for i in range(1, 11):
        _append(path, i, "delta-rs")
    assert _checkpoints(path) == [10]
    assert _log_upkeep.checkpoint_interval({}) == 10


@pytest.mark.parametrize("route", ["delta-rs", "log writer"])
def test_expired_logs_are_removed_only_up_to_a_checkpoint(table_path, route):
    path = _create(
        table_path(),
        **{"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 1 hours"},
    )
    for i in range(1, 9):
        _append(path, i, route)
    _age(path, range(8), 2 * 3600)  # versions 0-7 expired; checkpoint 5 among them
    for i in range(9, 11):
        _append(path, i, route)  # version 10: a checkpoint, then the cleanup

    # Everything before the newest expired checkpoint (5) is gone; 5-7 stay although
    # expired, since versions 6-9 are read from checkpoint 5.
    assert _commits(path) == list(range(5, 11))
    assert _checkpoints(path) == [5, 10]
    uri = _uri.normalize_uri(path)
    assert load_snapshot(uri, version=7).version == 7
    assert _ids(path) == list(range(11))
    with pytest.raises(VersionNotFoundError) as gone:
        load_snapshot(uri, version=2)
    assert gone.value.version == 2


def test_expired_log_cleanup_waits_for_a_running_stream_that_still_reads_it(table_path):
    path = _create(
        table_path(),
        **{"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 1 hours"},
    )
    for i in range(1, 9):
        _append(path, i, "delta-rs")
    _age(path, range(8), 2 * 3600)
    stream = LeaseHolder(path, timeout=3600.0, reader="a lagging stream")
    stream.need(2)  # its next batch reads version 2, which cleanup would delete
    try:
        for i in range(9, 11):
            _append(path, i, "delta-rs")  # version 10: a checkpoint; cleanup waits
        assert _checkpoints(path) == [5, 10]
        assert _commits(path) == list(range(11))
    finally:
        stream.release()
    for i in range(11, 16):
        _append(path, i, "delta-rs")  # version 15: the stream is gone, cleanup runs
    assert _commits(path)[0] == 5


def test_expired_log_cleanup_can_be_turned_off(table_path):
    path = _create(
        table_path(),
        **{
            "delta.checkpointInterval": "5",
            "delta.logRetentionDuration": "interval 1 hours",
            "delta.enableExpiredLogCleanup": "false",
        },
    )
    for i in range(1, 6):
        _append(path, i, "delta-rs")
    _age(path, range(6), 2 * 3600)
    for i in range(6, 11):
        _append(path, i, "delta-rs")
    assert _checkpoints(path) == [5, 10]
    assert _commits(path) == list(range(11))


@pytest.mark.parametrize("route", ["delta-rs", "log writer"])
def test_a_failing_checkpoint_does_not_fail_the_commit(table_path, route, caplog):
    path = _create(table_path(), **{"delta.checkpointInterval": "2"})
    _append(path, 1, route)
    # A directory where the checkpoint file must go: delta-rs cannot write it.
    blocker = os.path.join(path, "_delta_log", f"{2:020d}.checkpoint.parquet")
    os.mkdir(blocker)
    with caplog.at_level(logging.WARNING, logger="deltaflow.table._log_upkeep"):
        assert _append(path, 2, route) == 2
    assert any("log upkeep after version 2" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(os.path.join(path, "_delta_log", "_last_checkpoint"))
    os.rmdir(blocker)
    assert _ids(path) == [0, 1, 2]  # the commit is in and readable
    assert _append(path, 4, route) == 3
    assert _append(path, 5, route) == 4
    assert _checkpoints(path) == [4]  # the next multiple checkpoints again


@pytest.mark.parametrize("route", ROUTES)
def test_v2_checkpoint_policy_gets_the_feature_and_v2_spec_checkpoints(table_path, route):
    """``delta.checkpointPolicy = 'v2'`` (issue 27): the new table's protocol has the
    ``v2Checkpoint`` feature (reader 3 / writer 7, as delta-spark gives it), and every
    route's checkpoints follow the V2 spec (one ``checkpointMetadata`` action)."""
    path = table_path()
    uri = _uri.normalize_uri(path)
    created = _commit.commit(
        _commit.CommitRequest(
            table_uri=uri,
            schema={
                "type": "struct",
                "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
            },
            partition_columns=(),
            adds=(),
            configuration={"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "2"},
        )
    )
    assert created.version == 0
    protocol = RsTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "v2Checkpoint" in protocol.reader_features
    assert "v2Checkpoint" in protocol.writer_features
    for i in range(1, 5):
        _append(path, i, route)
    assert _checkpoints(path) == [2, 4]
    for version in (2, 4):
        rows = pq.read_table(
            os.path.join(path, "_delta_log", f"{version:020d}.checkpoint.parquet")
        ).to_pylist()
        metadata = [r["checkpointMetadata"] for r in rows if r.get("checkpointMetadata")]
        assert [m["version"] for m in metadata] == [version]
        assert sum(1 for r in rows if r.get("add")) == version
    # Read from the checkpoint alone.
    for version in range(4):
        os.remove(os.path.join(path, "_delta_log", f"{version:020d}.json"))
    # (delta-rs 1.6's own reader refuses v2Checkpoint tables; deltaflow reads them.)
    files = load_snapshot(uri).files(stats=False)
    ids = [v for f in files for v in pq.read_table(os.path.join(path, f.path))["id"].to_pylist()]
    assert sorted(ids) == [1, 2, 3, 4]
