"""``sink.check``: a stream's Delta sink settings, checked inside ``start()``.

Spark calls the sink's ``createSink`` (or the V2 write's planning) when a query starts:
the brain checks the output mode, the checkpoint, the options a sink sets itself, and
the target directory, so a wrong setting fails ``start()`` with a typed error instead of
the first batch.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from deltaflow.errors import InvalidOptionError
from deltaflow.spark._options import parse_write_options
from deltaflow.spark.bridge._ops import _get, options_of
from deltaflow.spark.bridge._realtime import ROW_LOG_OPTION, check_row_log, commit_interval_ms
from deltaflow.spark.bridge._sink_modes import check_output_mode
from deltaflow.spark.stream._writer import FLOW_IDENTITY_OPTION, STREAM_ONLY_OPTIONS
from deltaflow.table import _uri
from deltaflow.table._snapshot import table_exists


def check_sink(args: dict[str, Any]) -> dict[str, Any]:
    """``sink.check``: a stream's Delta sink settings, checked inside ``start()`` (Spark
    calls ``createSink`` there); the write options each batch uses, and the path.
    ``modeOnly``: only the output mode against the query's ``perKeyOperators`` (the
    connector's analysis check of the started query, which sees its plan)."""
    options = options_of(args)
    path = _get(options, "path")
    if not path:
        raise InvalidOptionError(
            "writeStream.format('delta') needs a table location: .start('/path/to/table') or"
            " .toTable(name).",
            option="path",
        )
    mode = str(args.get("outputMode") or "append").lower()
    check_output_mode(path, mode, [str(o) for o in args.get("perKeyOperators") or []])
    if args.get("modeOnly"):
        return {"path": path}
    if not args.get("checkpointLocation"):
        raise InvalidOptionError(
            f"The stream into {path} has no checkpointLocation, which its exactly-once Delta"
            " commits are keyed by: add .option('checkpointLocation', '/path/to/checkpoint')"
            " to writeStream, or set spark.sql.streaming.checkpointLocation.",
            option="checkpointLocation",
        )
    for key in ("txnAppId", "txnVersion"):
        if _get(options, key) is not None:
            raise InvalidOptionError(
                f"A stream's Delta sink sets the app transaction itself (txnAppId = the query"
                f" id, txnVersion = the batch id): remove .option('{key}', ...). Set"
                " txnAppId and txnVersion on batch writes inside foreachBatch instead.",
                option=key,
            )
    commit_interval_ms(options)
    row_log = check_row_log(options, path)
    if row_log and not args.get("realTime"):
        # The V1 sink (start(path)) and the Python stream writer run micro-batches only:
        # a row log there would be silently not kept, and readers would wait for it.
        raise_row_log_outside_real_time(path)
    stream_only = {k.lower() for k in STREAM_ONLY_OPTIONS} | {"path"}
    write = {k: v for k, v in options.items() if k.lower() not in stream_only}
    parse_write_options({**write, "path": path})
    _check_sink_target(_uri.normalize_uri(path), str(args["checkpointLocation"]))
    return {
        "path": path,
        "writeOptions": write,
        "appId": _get(options, FLOW_IDENTITY_OPTION),
        "rowLog": row_log,
    }


def raise_row_log_outside_real_time(path: str) -> None:
    """``realTimeRowLog`` on a stream that is not in real-time mode: refused, not ignored
    (its readers would tail a log nobody writes)."""
    raise InvalidOptionError(
        f"realTimeRowLog is on for the stream into {path}, which does not run in real-time"
        " mode: the row log is written by the real-time sink only. Start the query with"
        " .trigger(realTime='5 minutes') and .toTable(name) (or"
        " .toTable('delta.`/path`')), or remove .option('realTimeRowLog', 'true').",
        option=ROW_LOG_OPTION,
    )


def _stream_has_run(checkpoint: str) -> bool:
    """Whether the checkpoint records a batch already planned (an ``offsets/`` entry): the
    stream is restarting, and files in its sink's directory are its own attempt."""
    fs, root = _uri.filesystem(_uri.normalize_uri(checkpoint))
    selector = pafs.FileSelector(
        root.rstrip("/") + "/offsets", allow_not_found=True, recursive=False
    )
    return any(not i.base_name.startswith(".") for i in fs.get_file_info(selector))


def _check_sink_target(uri: str, checkpoint: str) -> None:
    """Refuse a directory that holds other data and no Delta table: the table's files
    would mix with it, and VACUUM would delete it as files no commit references.

    A stream killed before its first commit leaves the data files of that batch in the
    directory with no ``_delta_log`` yet; its restart (the checkpoint has offsets) owns
    them, rewrites the batch, and VACUUM removes the uncommitted files later."""
    if table_exists(uri) or _stream_has_run(checkpoint):
        return
    fs, root = _uri.filesystem(uri)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise InvalidOptionError(
            f"The Delta sink's path {uri} is a file, not a directory: start the stream on a"
            " new or empty directory, or on an existing Delta table.",
            option="path",
        )
    if info.type != pafs.FileType.Directory:
        return
    selector = pafs.FileSelector(root, allow_not_found=True, recursive=False)
    # Hidden names (_delta_staging of an earlier attempt, a checkpoint kept under the
    # table, .crc files) are not data; delta-spark and delta-rs skip them too.
    others = sorted(
        i.base_name for i in fs.get_file_info(selector) if not i.base_name.startswith(("_", "."))
    )
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise InvalidOptionError(
            f"The Delta sink's path {uri} is not a Delta table (no _delta_log) but a directory"
            f" with other files in it ({shown}): a table written there would mix its files"
            " with them, and VACUUM would delete them. Start the stream on a new or empty"
            " directory, or on an existing Delta table.",
            option="path",
        )
