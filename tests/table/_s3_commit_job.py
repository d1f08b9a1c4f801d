"""Run by test_object_store_commits.py: one writer process racing others on one S3 table.

``append-log``: blind appends through deltaflow's log writer (its put-if-absent);
``append-delta-rs``: blind appends through delta-rs; ``update``: read-modify-write of this
writer's single row (a DML commit: removes what it read, conflict-checked, retried on a
conflict). Prints one JSON line per commit the writer was told succeeded.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, write_deltalake
from deltalake.exceptions import CommitFailedError

from deltaflow.table import _commit, _log_commit, _uri
from deltaflow.table._snapshot import load_snapshot
from deltaflow.table.errors import ConcurrentWriteError

SCHEMA = pa.schema([("writer", pa.string()), ("i", pa.int64()), ("value", pa.int64())])


def _write_file(uri: str, rows: pa.Table) -> _commit.AddedFile:
    relative = f"part-{uuid.uuid4().hex}.parquet"
    fs, path = _uri.filesystem(_uri.join(uri, relative))
    pq.write_table(rows, path, filesystem=fs)
    size = fs.get_file_info(path).size
    stats = json.dumps({"numRecords": rows.num_rows})
    return _commit.AddedFile(relative, size, {}, int(time.time() * 1000), stats)


def _log_append(uri: str, writer: str, i: int) -> int | None:
    snapshot = load_snapshot(uri)
    rows = pa.table({"writer": [writer], "i": [i], "value": [i]}, schema=SCHEMA)
    request = _commit.CommitRequest(
        table_uri=uri,
        schema=snapshot.schema,
        partition_columns=(),
        adds=[_write_file(uri, rows)],
        read_version=snapshot.version,
        read=_log_commit.ReadSet(blind_append=True),
        commit_info={"testCommit": f"{writer}/{i}"},
    )
    return _commit.commit(request).version


def _update(uri: str, writer: str, i: int) -> int | None:
    """value += 1 on this writer's row, retried until a commit wins without conflict."""
    while True:
        snapshot = load_snapshot(uri)
        mine = [f for f in snapshot.files(stats=False) if _owned(uri, f.path, writer)]
        (entry,) = mine
        fs, path = _uri.filesystem(_uri.join(uri, entry.path))
        current = pq.read_table(path, filesystem=fs).to_pylist()[0]
        rows = pa.table(
            {"writer": [writer], "i": [-1], "value": [current["value"] + 1]}, schema=SCHEMA
        )
        request = _commit.CommitRequest(
            table_uri=uri,
            schema=snapshot.schema,
            partition_columns=(),
            adds=[_write_file(uri, rows)],
            removes=[_commit.RemovedFile(entry.path, entry.size, {})],
            read_version=snapshot.version,
            read=_log_commit.ReadSet(files=frozenset([entry.path])),
            operation="UPDATE",
            commit_info={"testCommit": f"{writer}/{i}"},
        )
        try:
            return _commit.commit(request).version
        except ConcurrentWriteError:
            continue  # someone changed what this read: read again


def _retried(commit: Callable[[], int | None]) -> int | None:
    """A blind append that lost the race for a version too often (nothing committed)."""
    while True:
        try:
            return commit()
        except ConcurrentWriteError:
            continue


_owners: dict[str, str] = {}


def _owned(uri: str, path: str, writer: str) -> bool:
    if path not in _owners:
        fs, inner = _uri.filesystem(_uri.join(uri, path))
        _owners[path] = pq.read_table(inner, filesystem=fs).column("writer")[0].as_py()
    return _owners[path] == writer


def _append_delta_rs(uri: str, rows: pa.Table, properties: CommitProperties) -> None:
    """delta-rs's append, again when delta-rs refuses its commit (it can count a concurrent
    UPDATE's removes as a conflict even for a blind append): it committed nothing then."""
    for attempt in range(20):
        try:
            write_deltalake(uri, rows, mode="append", commit_properties=properties)
            return
        except CommitFailedError:
            if attempt == 19:
                raise


def main(uri: str, writer: str, mode: str, commits: int) -> None:
    for i in range(commits):
        if mode == "append-delta-rs":
            rows = pa.table({"writer": [writer], "i": [i], "value": [i]}, schema=SCHEMA)
            properties = CommitProperties(custom_metadata={"testCommit": f"{writer}/{i}"})
            _append_delta_rs(uri, rows, properties)
            version = None  # delta-rs does not say which version it took
        elif mode == "append-log":
            version = _retried(functools.partial(_log_append, uri, writer, i))
        else:
            version = _update(uri, writer, i)
        print(json.dumps({"writer": writer, "i": i, "version": version}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
