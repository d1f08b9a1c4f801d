"""What the connector's real-time source (Spark's real-time mode) asks of a stream reader.

A real-time query runs one long-lived task per epoch that tails the table's log: it
waits for the next commit file, then asks the driver which files to read after its
position; the driver answers with this module, on the query's one
:class:`~deltaflow.spark.stream._reader.DeltaStreamReader`. Positions are that reader's
offsets (delta-spark's model), so ``startingVersion``, ``skipChangeCommits`` and
``ignoreDeletes`` mean exactly what they mean in micro-batch.

Only the driver talks to the brain: executors of a cluster may not reach the process
the driver started, but they always reach the driver (Spark's RPC).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from deltaflow.errors import carry_errors
from deltaflow.spark._compat import ReadMaxFiles

if TYPE_CHECKING:
    from deltaflow.spark.read._cdf import ChangeTask
    from deltaflow.spark.read._reader import FileTask
    from deltaflow.spark.stream._reader import DeltaStreamReader


@carry_errors
def resolve_start(reader: DeltaStreamReader, start: dict[str, Any]) -> dict[str, Any]:
    """``start`` with a fresh query's open position pinned to a version.

    A fresh query's initial offset says "the snapshot (or the commits after the version)
    the first batch finds"; a real-time epoch may end before its first file is done, so
    the version is chosen once, here, and the epoch's end offset carries it.
    """
    from deltaflow.spark.stream._positions import Offset

    begin = reader._parse(start)
    if begin.is_unresolved:
        latest = reader._latest_version()
        begin = Offset(latest, -1, True) if begin.is_starting else Offset(latest + 1, -1)
    reader._hold(begin.version)
    return begin.to_json(reader.table_id)


@carry_errors
def next_files(
    reader: DeltaStreamReader, after: dict[str, Any], until: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The files after ``after``, at most ``maxFilesPerTrigger`` of them, each with its
    stream position; the position after them (``end``); and the newest version looked
    at (``latest``); ``more``: the read limit cut the answer short, ask again at once.
    A reader that got everything waits for commit ``latest + 1``. With ``until``: the
    files of ``after`` -> ``until``, all of them."""
    latest = reader._latest_version()
    if until is not None:  # an epoch read again: exactly its recorded range
        return {
            "files": positioned(reader, after, until),
            "end": until,
            "latest": latest,
            "more": False,
        }
    opts = reader.options
    end = reader.latestOffset(after, ReadMaxFiles(opts.max_files_per_trigger))
    files = positioned(reader, after, end)
    more = len(files) >= opts.max_files_per_trigger or (
        opts.max_bytes_per_trigger is not None and bool(files)
    )
    return {"files": files, "end": end, "latest": latest, "more": more}


def positioned(
    reader: DeltaStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[tuple[dict[str, Any], FileTask | ChangeTask, str | None]]:
    """The files of ``start`` -> ``end`` with the offset each one ends at: data files, or
    with ``readChangeFeed`` change files (their kind, version, timestamp and the rows to
    read, deletion vectors resolved here, on the driver); and a committed file's row log
    tag (``_rowlog.tag``), which a reader tailing that log uses to skip it."""
    entries = reader._files_between(start, end)
    task = reader._change_task if reader.options.read_change_feed else reader._task
    return [(e.offset.to_json(reader.table_id), task(e), e.row_log) for e in entries]


@carry_errors
def row_log_start(
    reader: DeltaStreamReader, start: dict[str, Any], known: frozenset[str] = frozenset()
) -> dict[str, list[int]]:
    """For a local table with a row log (``docs/notes/rowlog.md``), where a real-time
    reader at ``start`` (resolved) begins each ``<writer>/p<n>`` it finds there: the
    position after the rows its app transaction ``<app id>/rtm-p<n>`` records in the
    snapshot the reader's Delta part has read, ``[epoch, row]``; (0, 0) without one.

    That snapshot is ``start``'s version when the stream starts with it, else the one
    before (its commits from ``start``'s version on are still to read). Elsewhere, or
    with ``readChangeFeed`` (the feed comes from Delta commits only): nothing. ``known``:
    the ``<writer>/p<n>`` whose position the caller's offset records; when it records every
    one, no snapshot is loaded (each epoch's start asks).
    """
    from deltalake import DeltaTable

    from deltaflow.table import _rowlog, _uri

    if reader.options.read_change_feed or not _uri.is_local(reader.uri):
        return {}
    root = os.path.join(_uri.local_path(reader.uri), _rowlog.DIRECTORY)
    parts = [(w, p) for w, p in _rowlog.partition_dirs(root) if f"{w}/p{p}" not in known]
    if not parts:
        return {}
    begin = reader._parse(start)
    version = begin.version if begin.is_starting else begin.version - 1
    table = DeltaTable(_uri.delta_rs_uri(reader.uri), version=version) if version >= 0 else None
    found = {}
    for writer, partition in parts:
        txn = (
            table.transaction_version(f"{_rowlog.decode_writer(writer)}/rtm-p{partition}")
            if table is not None
            else None
        )
        found[f"{writer}/p{partition}"] = list(_rowlog.Position.of_transaction(txn))
    return found
