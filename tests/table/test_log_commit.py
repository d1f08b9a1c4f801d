"""deltaflow's own commit writer: put-if-absent, delta-spark's conflict rules, readers.

Every "concurrent writer" here is a real one (delta-rs, or a second log-writer
commit) that commits between this transaction's read and its commit, or races it
on another thread.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from deltaflow.table import _commit, _log_commit, _uri
from deltaflow.table.errors import ConcurrentWriteError, UnsupportedFeatureError
from tests.table.dv_fixtures import add_deletion_vectors


def _batch(ids: list[int], kind: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "kind": pa.array([kind] * len(ids))})


def _make(path: str, **config: str) -> str:
    """kind=a: ids 0-2; kind=b: ids 3-5 (one file each), partitioned by kind."""
    write_deltalake(
        path, _batch([0, 1, 2], "a"), partition_by=["kind"], configuration=config or None
    )
    write_deltalake(path, _batch([3, 4, 5], "b"), mode="append")
    return path


def _files(path: str) -> dict[str, str]:
    """kind -> the log path of that partition's (single) file."""
    adds = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    return {a["partition.kind"]: a["path"] for a in adds}


def _data_file(path: str, ids: list[int], kind: str) -> _commit.AddedFile:
    relative = f"kind={kind}/part-{uuid.uuid4()}.parquet"
    full = os.path.join(path, relative)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), full)
    stats = {"numRecords": len(ids), "minValues": {"id": min(ids)}, "maxValues": {"id": max(ids)}}
    return _commit.AddedFile(
        relative, os.path.getsize(full), {"kind": kind}, 0, json.dumps(stats), True
    )


def _rewrite(
    path: str, kind: str, keep: list[int], read_version: int, **read: Any
) -> _commit.CommitRequest:
    """Replace partition ``kind``'s file by one holding ``keep``, as a DELETE would."""
    old = _files(path)[kind]
    size = next(
        a["size_bytes"]
        for a in pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
        if a["path"] == old
    )
    read_set = read.pop("read_set", None) or _log_commit.ReadSet(
        files=frozenset({old}), partition_predicate=lambda values: values.get("kind") == kind
    )
    return _commit.CommitRequest(
        table_uri=_uri.normalize_uri(path),
        schema=json.loads(RsTable(path).schema().to_json()),
        partition_columns=("kind",),
        adds=[_data_file(path, keep, kind)],
        removes=[_commit.RemovedFile(old, size, {"kind": kind})],
        read_version=read_version,
        read=read_set,
        operation="DELETE",
        commit_info={"operationParameters": {"predicate": "[]"}, "operationMetrics": {}},
        **read,
    )


def _ids(path: str) -> list[int]:
    return sorted(RsTable(path).to_pyarrow_table().column("id").to_pylist())


def _log_line(path: str, version: int) -> list[dict[str, Any]]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f]


def test_commit_is_read_by_deltalake_and_polars_with_delta_spark_commit_info(table_path):
    path = _make(table_path())
    result = _commit.commit(_rewrite(path, "a", [0, 2], read_version=1))
    assert result.version == 2
    assert _ids(path) == [0, 2, 3, 4, 5]
    assert sorted(pl.read_delta(path)["id"].to_list()) == [0, 2, 3, 4, 5]
    assert sorted(pl.read_delta(path, version=1)["id"].to_list()) == [0, 1, 2, 3, 4, 5]
    actions = _log_line(path, 2)
    assert list(actions[0]) == ["commitInfo"]  # commitInfo first, as delta-spark writes it
    info = actions[0]["commitInfo"]
    assert info["operation"] == "DELETE"
    assert info["readVersion"] == 1
    assert info["isBlindAppend"] is False
    assert info["engineInfo"].startswith("deltaflow/")
    remove = next(a["remove"] for a in actions if "remove" in a)
    assert remove["extendedFileMetadata"] is True
    assert remove["partitionValues"] == {"kind": "a"} and remove["size"] > 0
    history = RsTable(path).history(1)[0]
    assert history["operation"] == "DELETE"


def test_put_if_absent_never_overwrites_a_version(table_path):
    path = _make(table_path())
    log_dir = os.path.join(path, "_delta_log")
    commit_file = os.path.join(log_dir, f"{1:020d}.json")
    with open(commit_file, "rb") as f:
        before = f.read()
    assert not _log_commit.put_version(log_dir, 1, b'{"commitInfo":{}}\n')
    with open(commit_file, "rb") as f:
        assert f.read() == before
    assert not [n for n in os.listdir(log_dir) if n.endswith(".tmp")]  # temp files cleaned up


def test_racing_writers_each_get_their_own_version(table_path):
    path = _make(table_path())
    # Eight writers, all reading version 1, each appending to its own new partition:
    # no conflicts, so every one commits, each at a distinct version.
    requests = []
    for n in range(8):
        kind = f"k{n}"
        requests.append(
            _commit.CommitRequest(
                table_uri=_uri.normalize_uri(path),
                schema=json.loads(RsTable(path).schema().to_json()),
                partition_columns=("kind",),
                adds=[_data_file(path, [100 + n], kind)],
                read_version=1,
                read=_log_commit.ReadSet(
                    partition_predicate=lambda values, kind=kind: values.get("kind") == kind
                ),
                operation="MERGE",
            )
        )
    barrier = threading.Barrier(len(requests))
    versions: list[int] = []
    errors: list[BaseException] = []

    def run(request: _commit.CommitRequest) -> None:
        barrier.wait(timeout=30)
        try:
            versions.append(_commit.commit(request).version or -1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sorted(versions) == list(range(2, 10))
    assert _ids(path) == [0, 1, 2, 3, 4, 5, *range(100, 108)]


def test_concurrent_blind_append_does_not_conflict(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    write_deltalake(path, _batch([9], "a"), mode="append")  # into the partition we read
    assert _commit.commit(request).version == 3
    assert _ids(path) == [0, 3, 4, 5, 9]


def test_concurrent_remove_of_a_file_read_is_concurrent_delete_read(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).delete("id <= 2")  # removes the whole kind=a file we read
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(request)
    assert info.value.kind == "ConcurrentDeleteRead"
    assert info.value.read_version == 1
    assert RsTable(path).version() == 2  # nothing written
    assert _ids(path) == [3, 4, 5]


def test_concurrent_rewrite_in_partitions_read_is_concurrent_append(table_path):
    # delta-spark checks new files before removed ones: a concurrent DELETE that
    # rewrites a file this read adds data into its partitions first.
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).delete("id = 2")
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(request)
    assert info.value.kind == "ConcurrentAppend"
    assert _ids(path) == [0, 1, 3, 4, 5]


def test_concurrent_non_blind_add_is_concurrent_append_only_in_partitions_read(table_path):
    path = _make(table_path())
    ours = _rewrite(path, "a", [0], read_version=1)
    theirs_b = _rewrite(path, "b", [3], read_version=1)  # non-blind write elsewhere: fine
    assert _commit.commit(theirs_b).version == 2
    assert _commit.commit(ours).version == 3

    path = _make(table_path())
    ours = _rewrite(path, "a", [0], read_version=1)
    insert_into_a = _commit.CommitRequest(
        table_uri=_uri.normalize_uri(path),
        schema=json.loads(RsTable(path).schema().to_json()),
        partition_columns=("kind",),
        adds=[_data_file(path, [7], "a")],
        read_version=1,
        read=_log_commit.ReadSet(),  # read something (not blind): its adds are new data
        operation="MERGE",
    )
    assert _commit.commit(insert_into_a).version == 2
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(ours)
    assert info.value.kind == "ConcurrentAppend"


def test_concurrent_remove_of_a_file_removed_is_concurrent_delete_delete(table_path):
    path = _make(table_path())
    # A transaction that removes the kind=a file without having read it.
    request = _rewrite(
        path, "a", [0], read_version=1, read_set=_log_commit.ReadSet(blind_append=True)
    )
    RsTable(path).delete("id = 2")
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(request)
    assert info.value.kind == "ConcurrentDeleteDelete"


def test_metadata_change_and_same_app_transaction_conflict(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 9 days"})
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(request)
    assert info.value.kind == "MetadataChanged"

    path = _make(table_path())
    mine = _rewrite(path, "a", [0], read_version=1, app_id="stream-1", app_version=5)
    theirs = _rewrite(path, "b", [3], read_version=1, app_id="stream-1", app_version=5)
    _commit.commit(theirs)
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(mine)
    assert info.value.kind == "ConcurrentTransaction"
    assert RsTable(path).transaction_version("stream-1") == 5


def test_optimize_conflicts_only_with_transactions_that_read_its_files(table_path):
    path = _make(table_path())
    write_deltalake(path, _batch([6], "b"), mode="append")  # kind=b now has 2 files
    request = _rewrite(path, "a", [0], read_version=2)
    RsTable(path).optimize.compact()  # compacts kind=b: dataChange=false
    assert _commit.commit(request).version == 4
    assert _ids(path) == [0, 3, 4, 5, 6]

    path = _make(table_path())
    write_deltalake(path, _batch([7], "a"), mode="append")  # kind=a now has 2 files
    first_a = min(
        (a for a in pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()),
        key=lambda a: a["modification_time"],
    )["path"]
    request = _rewrite(
        path, "b", [3], read_version=2, read_set=_log_commit.ReadSet(files=frozenset({first_a}))
    )
    RsTable(path).optimize.compact()
    with pytest.raises(ConcurrentWriteError) as info:
        _commit.commit(request)
    assert info.value.kind == "ConcurrentDeleteRead"


def test_appenders_never_fail_while_optimize_runs(table_path):
    path = _make(table_path())
    errors: list[BaseException] = []
    done = threading.Event()

    def append() -> None:
        try:
            for n in range(12):
                write_deltalake(path, _batch([100 + n], "a"), mode="append")
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    appender = threading.Thread(target=append)
    appender.start()
    optimized = 0
    while not done.is_set() or optimized == 0:
        try:
            RsTable(path).optimize.compact()
            optimized += 1
        except Exception:  # OPTIMIZE may lose its own race; the appender must not
            pass
    appender.join(timeout=60)
    assert errors == []
    assert _ids(path) == [0, 1, 2, 3, 4, 5, *range(100, 112)]
    assert optimized >= 1


def test_checkpoint_at_interval_and_dv_descriptor_from_checkpoint(table_path):
    path = _make(table_path(), **{"delta.checkpointInterval": "3"})
    files = _files(path)
    add_deletion_vectors(path, {files["a"]: [1]})  # version 2
    request = _rewrite(path, "b", [3, 4], read_version=2)
    version = _commit.commit(request).version
    assert version == 3
    assert os.path.exists(os.path.join(path, "_delta_log", f"{3:020d}.checkpoint.parquet"))
    live = pa.table(RsTable(path).get_add_actions(flatten=True)).to_pylist()
    assert sorted((a["partition.kind"], a["num_records"]) for a in live) == [("a", 3), ("b", 2)]
    # The kind=a add with its DV now lives only in the checkpoint once JSON is gone.
    os.rename(
        os.path.join(path, "_delta_log", f"{2:020d}.json"),
        os.path.join(path, "_delta_log", "moved-away"),
    )
    found = _log_commit.add_actions_of(_uri.normalize_uri(path), 3, [files["a"]])
    assert found[files["a"]]["deletionVector"]["cardinality"] == 1


def test_stores_without_a_conditional_put_are_refused_with_a_typed_error():
    _log_commit.require_conditional_put("s3://bucket/table", "DELETE")  # S3 has one
    with pytest.raises(UnsupportedFeatureError) as info:
        _log_commit.require_conditional_put("hdfs://nn/table", "DELETE with the change data feed")
    assert info.value.feature == "conditionalPut"
    assert info.value.table_uri == "hdfs://nn/table"
    assert "DELETE with the change data feed" in str(info.value)


@pytest.mark.parametrize("remover", ["delta-rs", "log writer"])
def test_a_blind_append_is_not_failed_by_a_concurrent_delete(tmp_path, remover):
    """An append read nothing: a DELETE that committed after the appender loaded the
    table must not fail it (delta-rs alone would: ConcurrentDeleteRead)."""
    path = _make(str(tmp_path / "t"))
    stale = RsTable(path)  # the appender's view, before the delete
    if remover == "delta-rs":
        RsTable(path).delete("kind = 'a'")
    else:
        _commit.commit(_rewrite(path, "a", [0], stale.version()))
    added = _data_file(path, [9], "c")
    schema = json.loads(stale.schema().to_json())
    result = _commit.commit(
        _commit.CommitRequest(
            table_uri=_uri.normalize_uri(path),
            schema=schema,
            partition_columns=("kind",),
            adds=[added],
            read_version=stale.version(),
            app_id="appender",
            app_version=1,
            table=stale,
        )
    )
    assert not result.skipped
    rows = sorted(RsTable(path).to_pyarrow_table().column("id").to_pylist())
    assert rows == ([3, 4, 5, 9] if remover == "delta-rs" else [0, 3, 4, 5, 9])
    assert RsTable(path).transaction_version("appender") == 1
