"""The brain's answers to a real-time reader of a table with a row log
(``docs/notes/rowlog.md``): where each ``<writer>/p<n>`` starts (``stream.rtStart``), and
each committed file's row log tag (``stream.rtNext``). No Spark: the bridge operations."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from deltaflow.spark.bridge import _stream
from deltaflow.table import _commit, _log_commit, _rowlog

SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
WRITER = _rowlog.encode_writer("a b")


def commit_tagged(path: str, epoch: int, from_row: int, ids: list[int]) -> int:
    """``ids`` committed as one file tagged with their positions, with partition 3's app
    transaction, as a real-time sink with a row log commits them."""
    name = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), os.path.join(path, name))
    table = DeltaTable(path)
    to_row = from_row + len(ids)
    added = _commit.AddedFile(
        name,
        os.path.getsize(os.path.join(path, name)),
        {},
        int(time.time() * 1000),
        json.dumps({"numRecords": len(ids)}),
        tags={_rowlog.TAG: _rowlog.tag(WRITER, 3, epoch, from_row, to_row)},
    )
    result = _commit.commit(
        _commit.CommitRequest(
            table_uri=path,
            schema=json.loads(table.schema().to_json()),
            partition_columns=(),
            adds=[added],
            read_version=table.version(),
            app_id="a b/rtm-p3",
            app_version=epoch << 32 | to_row,
            read=_log_commit.ReadSet(blind_append=True),
        )
    )
    assert result.version is not None
    return result.version


def open_reader(path: str, **options: str) -> str:
    return str(_stream.open_stream({"uri": path, "schema": SCHEMA, "options": options})["handle"])


def start_of(path: str, known: tuple[str, ...] = (), **options: str) -> dict[str, Any]:
    """``stream.rtStart``'s answer for a fresh reader of ``path``."""
    handle = open_reader(path, **options)
    try:
        initial = _stream.initial_offset({"handle": handle})
        return _stream.realtime_start(
            {"handle": handle, "start": initial, "rowLogKnown": list(known)}
        )
    finally:
        _stream.close({"handle": handle})


def test_a_reader_starts_each_partition_after_its_app_transaction(tmp_path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    _rowlog.SegmentWriter(_rowlog.partition_dir(path, WRITER, 3), 2, 0)
    _rowlog.SegmentWriter(_rowlog.partition_dir(path, "other", 0), 1, 0)
    tagged = commit_tagged(path, 2, 0, [1, 2, 3, 4, 5])
    assert start_of(path)["rowLog"] == {f"{WRITER}/p3": [2, 5], "other/p0": [0, 0]}
    # From the tagged version on, its commit is still to read: the version before counts.
    later = start_of(path, startingVersion=str(tagged))
    assert later["rowLog"] == {f"{WRITER}/p3": [0, 0], "other/p0": [0, 0]}
    # Partitions the offset records are not looked up.
    assert start_of(path, known=(f"{WRITER}/p3",))["rowLog"] == {"other/p0": [0, 0]}


def test_each_committed_file_carries_its_row_log_tag(tmp_path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    tagged = commit_tagged(path, 1, 0, [1, 2])
    write_deltalake(path, pa.table({"id": pa.array([9], pa.int64())}), mode="append")
    handle = open_reader(path, startingVersion=str(tagged))
    try:
        initial = _stream.initial_offset({"handle": handle})
        start = _stream.realtime_start({"handle": handle, "start": initial})["start"]
        files = _stream.realtime_next({"handle": handle, "after": start})["files"]
    finally:
        _stream.close({"handle": handle})
    assert [f.get("rowLog") for f in files] == [f"{WRITER}/p3/1/0-2", None]


def test_writer_names_decode_and_only_partition_directories_count(tmp_path) -> None:
    for app_id in ("plain-app_1.2", "a b/c", "ünï%"):
        assert _rowlog.decode_writer(_rowlog.encode_writer(app_id)) == app_id
    root = tmp_path / _rowlog.DIRECTORY
    for part in ("w/p0", "w/p12", "w/tmp", "x/p3"):
        (root / part).mkdir(parents=True)
    (root / "stray").write_text("")
    assert _rowlog.partition_dirs(str(root)) == [("w", 0), ("w", 12), ("x", 3)]
    assert _rowlog.partition_dirs(str(tmp_path / "absent")) == []
