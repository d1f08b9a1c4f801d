"""Bridge operations of the connector's stream source (``DeltaMicroBatchStream``).

Each open stream is a :class:`~deltaflow.spark.stream._reader.DeltaStreamReader` kept in
this brain process under a handle: the very reader the Python data source uses, so
offsets, admission control, starting positions and change-commit handling are one
implementation. The JVM reads the files each batch plans.

A handle the process does not know (it restarted) fails with
``BridgeError(operation="stream.handle")``; the JVM then opens the stream again, which is
safe because a reader holds only caches: every answer is a function of the offsets and
the log.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from deltaflow.spark.bridge._ops import file_item, options_of
from deltaflow.spark.errors import BridgeError
from deltaflow.table import _uri

_streams: dict[str, Any] = {}
_lock = threading.Lock()


def open_stream(args: dict[str, Any]) -> dict[str, Any]:
    """``stream.open`` ``{uri, schema, options}`` -> ``{handle, maxFilesPerTrigger}``."""
    from pyspark.sql.types import StructType

    from deltaflow.spark._options import parse_stream_options
    from deltaflow.spark.stream._reader import DeltaStreamReader
    from deltaflow.table._snapshot import load_snapshot

    uri = _uri.normalize_uri(str(args["uri"]))
    options = {k: v for k, v in options_of(args).items() if k.lower() != "path"}
    parsed = parse_stream_options({**options, "path": uri})
    snapshot = load_snapshot(uri)
    schema = StructType.fromJson(json.loads(args["schema"]))
    reader = DeltaStreamReader(snapshot, schema, parsed)
    handle = uuid.uuid4().hex
    with _lock:
        _streams[handle] = reader
    return {"handle": handle, "maxFilesPerTrigger": parsed.max_files_per_trigger}


def _reader(args: dict[str, Any]) -> Any:
    with _lock:
        reader = _streams.get(str(args.get("handle")))
    if reader is None:
        raise BridgeError(
            "unknown stream handle: deltaflow's Python side restarted; the stream reopens.",
            operation="stream.handle",
        )
    return reader


def initial_offset(args: dict[str, Any]) -> Any:
    return _reader(args).initialOffset()


def latest_offset(args: dict[str, Any]) -> Any:
    from deltaflow.spark._compat import ReadAllAvailable, ReadMaxFiles

    reader = _reader(args)
    limit = (
        ReadAllAvailable()
        if args.get("all")
        else ReadMaxFiles(reader.options.max_files_per_trigger)
    )
    return reader.latestOffset(args["start"], limit)


def available_now(args: dict[str, Any]) -> dict[str, Any]:
    _reader(args).prepareForTriggerAvailableNow()
    return {}


def plan_files(args: dict[str, Any]) -> dict[str, Any]:
    """``stream.files``: the files of the batch ``start`` -> ``end``."""
    tasks = _reader(args).tasks(args["start"], args["end"])
    return {"files": [file_item(t.uri, t.size, t.partition_values, t.deleted_rows) for t in tasks]}


def commit(args: dict[str, Any]) -> dict[str, Any]:
    _reader(args).commit(args["end"])
    return {}


def backlog(args: dict[str, Any]) -> dict[str, Any]:
    files, size = _reader(args).backlog(args["offset"])
    return {"files": files, "bytes": size}


def close(args: dict[str, Any]) -> dict[str, Any]:
    """``stream.close``: the query stopped; its reader gives up its VACUUM lease."""
    with _lock:
        reader = _streams.pop(str(args.get("handle")), None)
    if reader is not None:
        reader.stop()
    return {}


def realtime_start(args: dict[str, Any]) -> dict[str, Any]:
    """``stream.rtStart`` ``{handle, start, rowLogKnown?}`` -> ``{start, rowLog}``: a
    real-time epoch's start, a fresh query's open position pinned to a version; and where
    the reader begins each ``<writer>/p<n>`` of the table's row log that ``rowLogKnown``
    (the ones its offset records) leaves out, ``[epoch, row]``."""
    from deltaflow.spark.stream._realtime import resolve_start, row_log_start

    reader = _reader(args)
    start = resolve_start(reader, args["start"])
    known = frozenset(str(k) for k in args.get("rowLogKnown") or ())
    return {"start": start, "rowLog": row_log_start(reader, start, known)}


def realtime_item(task: Any) -> dict[str, Any]:
    """One file of a real-time answer as the JVM's ``ScanFile`` reads it. A change file
    (``readChangeFeed``) adds ``change`` (``kind``: cdc, add or remove; ``version``;
    ``timestamp`` in ms) and, for a deletion vector pair's difference, ``kept``: the only
    rows to read (instead of ``deleted``, the rows to leave out)."""
    from deltaflow.spark.read._cdf import ChangeTask

    if not isinstance(task, ChangeTask):
        return file_item(task.uri, task.size, task.partition_values, task.deleted_rows)
    f = task.file
    item = file_item(f.uri, f.size, f.partition_values, f.deleted_rows)
    item["change"] = {"kind": task.kind, "version": task.version, "timestamp": task.timestamp_ms}
    if f.kept_rows is not None:
        item["kept"] = [int(i) for i in f.kept_rows]
    return item


def realtime_next(args: dict[str, Any]) -> dict[str, Any]:
    """``stream.rtNext`` ``{handle, after, until?}`` -> ``{files, end, latest, more}``: the
    files a real-time reader reads after its position ``after`` (up to ``until`` when an
    epoch is read again), each with the offset it ends at."""
    from deltaflow.spark.stream._realtime import next_files

    found = next_files(_reader(args), args["after"], args.get("until"))
    files = []
    for offset, task, row_log in found["files"]:
        item = realtime_item(task)
        item["offset"] = offset
        if row_log is not None:
            item["rowLog"] = row_log
        files.append(item)
    return {
        "files": files,
        "end": found["end"],
        "latest": found["latest"],
        "more": found["more"],
    }
