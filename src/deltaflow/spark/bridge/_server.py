"""The Python brain's side of the bridge the JVM connector calls.

The connector's driver code (``io.deltaflow.spark.Brain``) starts this module as a
long-lived process, ``python -u -m deltaflow.spark.bridge._server``, and writes one JSON
request a line to its stdin: ``{"id": n, "op": "...", "args": {...}}``. Each request
runs on a thread of its own; its answer is one line on stdout, ``{"id": n,
"result": ...}`` or ``{"id": n, "error": {"type", "message", "fields", "wire"}}``,
where ``type`` names a :class:`~deltaflow.errors.DeltaflowError` subclass and
``wire`` is its marker (:func:`deltaflow.errors.to_wire`). Anything else the process
prints goes to stderr (the driver's log). The process ends when stdin closes.

Requests that carry a ``session`` run in a Spark session the JVM lent the brain
(:mod:`deltaflow.spark.bridge._host`): they start Spark jobs through the driver's Py4J
gateway, and those jobs' planning calls back in here. They run on a pool of their own,
so they can never take every worker the calls they wait for need.

The whole interface, every operation the JVM may call:

=================  ==============================================================
``ping``           ``{}`` -> ``{"pid"}``: the process is up.
``table.load``     ``{options}`` -> the table at ``path`` (time travel applied):
                   ``uri``, ``version``, ``exists``, logical ``schema`` and
                   ``physicalSchema`` (Spark StructType JSON), ``partitionColumns``,
                   ``route`` (``jvm`` | ``python``) and ``routeReason``.
``scan.plan``      ``{uri, version, filters, options}`` -> ``files``: log path,
                   size, partition values (Delta's strings), deleted row indexes;
                   plus the scan report's counts.
``write.plan``     ``{mode, schema, options, conf}`` -> ``route`` ``skip`` |
                   ``python`` (with ``delegateOptions``) | ``jvm`` (a ``handle``, the
                   ``staging`` URI and the columns Spark's writer must produce).
``write.commit``   ``{handle}`` -> ``version``, ``files``: stats from the staged
                   files' footers, files moved into the table, one commit.
``write.abort``    ``{handle}`` -> ``{}``: staged and moved files deleted.
``catalog.alter``  ``{uri, name, changes, checkedVersion?}`` -> ``{committed,
                   version}`` or ``{check: {version, checks}}``: ALTER TABLE as one
                   metadata commit; see :mod:`deltaflow.spark.catalog._alter`.
``sink.check``     ``{options, outputMode, checkpointLocation, partitionColumns,
                   perKeyOperators?, modeOnly?, realTime?}`` -> ``{path, writeOptions,
                   rowLog}``: a stream's Delta sink settings, checked inside
                   ``start()``; typed errors for wrong ones (update mode with per-key
                   operators; ``realTimeRowLog`` where no real-time write can run).
``sink.transactions`` ``{path, appIds, options, appId?, epoch?}`` -> ``{versions,
                   intervalMs, rowLog?}``: app transaction versions of a real-time
                   sink's partitions; with no ``appIds`` (an epoch starts) the row
                   log's directory, its expired segments deleted.
``sink.commitRolls`` ``write.plan``'s args, ``rolls``, ``rowLog?`` -> ``{route,
                   version, files}``: rolls as one commit, tagged with their row log
                   positions when ``rowLog``.
``stream.open``    ``{uri, schema, options}`` -> ``{handle}``: a stream source.
``sql.history``    ``{uri, limit}`` -> ``rows``: DESCRIBE HISTORY's rows, newest first.
``sql.detail``     ``{uri, name}`` -> ``rows``: DESCRIBE DETAIL's one row.
``sql.vacuum``     ``{uri, retentionHours, dryRun, checkRetention}`` -> ``rows``:
                   the table's path, or with ``dryRun`` the files to delete.
``sql.restore``    ``{uri, version | timestamp}`` -> ``rows``: RESTORE's metrics.
``sql.optimize``   ``{uri, where, zorderBy}`` -> ``rows``: ``(path, metrics)``.
``sql.reorg``      ``{uri, where}`` -> ``rows``: REORG ... APPLY (PURGE), OPTIMIZE's row.
``sql.convert``    ``{uri, partitionSchema}`` -> ``{converted, rows: []}``.
``sql.generate``   ``{uri, mode}`` -> ``{rows: []}``: the symlink manifest written.
``sql.clone``      ``{uri, target, version | timestamp, properties, sourceName, replace}``
                   -> ``rows``: SHALLOW CLONE's metrics; the clone's version 0 written
                   (``replace``: an empty table there replaced by a CLONE commit).
                   (Rows of ``sql.*`` are JSON arrays in the order of the command's
                   output schema: see :mod:`deltaflow.spark.bridge._commands`.)
``dml.run``        ``{session, kind, uri, name, alias?, condition?, assignments?,
                   sourceView?, sourceAlias?, clauses?, schemaEvolution?}`` ->
                   ``counts``: an UPDATE / DELETE / MERGE statement, run in the
                   session the JVM lent (``session``: its token); see
                   :mod:`deltaflow.spark.dml._sql`.
``session.sources`` ``{session, path}`` -> ``{}``: deltaflow's Python data sources
                   (``deltaflow_python``, ``cloudFiles``) registered in the lent
                   session, which lacked them.
``stream.*``       ``initialOffset``, ``latestOffset {start, all}``,
                   ``availableNow``, ``files {start, end}``, ``commit {end}``,
                   ``backlog {offset}``, ``close``, and real-time mode's
                   ``rtStart {start}``, ``rtNext {after}``: each ``{handle, ...}``; see
                   :mod:`deltaflow.spark.bridge._stream`.
=================  ==============================================================
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from deltaflow.errors import DeltaflowError, error_answer, from_wire
from deltaflow.spark.bridge import _commands, _ops, _realtime, _sink_check, _snapshots, _stream
from deltaflow.spark.catalog import _alter, _create
from deltaflow.spark.errors import BridgeError
from deltaflow.table import _uri

log = logging.getLogger("deltaflow.bridge")

# Requests run concurrently (several queries plan at once on a Thrift server); the log
# work they do is mostly I/O in delta-rs, which releases the GIL.
WORKERS = 8
# Requests in a lent session (DML statements): each holds its thread while its Spark jobs
# run, and as many run at once as the host runs statements.
SESSION_WORKERS = 32
SESSION_OPS = frozenset({"dml.run", "session.sources"})


def run_dml(args: dict[str, Any]) -> dict[str, Any]:
    """``dml.run`` (imported on first use: the DML modules are not needed to plan scans)."""
    from deltaflow.spark.dml import _sql

    return _sql.run(args)


def register_sources(args: dict[str, Any]) -> dict[str, Any]:
    """``session.sources``: deltaflow's Python data sources in the lent session."""
    # Wired one level up (deltaflow._session), with the ingest layer's cloudFiles source.
    from deltaflow import _session
    from deltaflow.spark.bridge import _host

    with _host.lent_session(args["session"]) as spark:
        _session.register_sources(spark)
    return {}


OPERATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "ping": lambda args: {"pid": os.getpid()},
    "table.load": _ops.load_table,
    "catalog.create": _create.create_from_catalog,
    "catalog.alter": _alter.alter_from_catalog,
    "scan.plan": _ops.plan_scan,
    "write.plan": _ops.plan_write,
    "write.commit": _ops.commit_write,
    "write.abort": _ops.abort_write,
    "sink.check": _sink_check.check_sink,
    "sink.transactions": _realtime.transactions,
    "sink.commitRolls": _realtime.commit_rolls,
    "sql.history": _commands.history,
    "sql.detail": _commands.detail,
    "sql.vacuum": _commands.vacuum,
    "sql.restore": _commands.restore,
    "sql.optimize": _commands.optimize,
    "sql.reorg": _commands.reorg,
    "sql.convert": _commands.convert,
    "sql.generate": _commands.generate,
    "sql.clone": _commands.clone,
    "dml.run": run_dml,
    "session.sources": register_sources,
    "stream.open": _stream.open_stream,
    "stream.initialOffset": _stream.initial_offset,
    "stream.latestOffset": _stream.latest_offset,
    "stream.availableNow": _stream.available_now,
    "stream.files": _stream.plan_files,
    "stream.commit": _stream.commit,
    "stream.backlog": _stream.backlog,
    "stream.close": _stream.close,
    "stream.rtStart": _stream.realtime_start,
    "stream.rtNext": _stream.realtime_next,
}


# Operations that may commit to a table (write.commit forgets its own table): the
# snapshot cache drops the table they name, or everything when they name none (a DML
# statement names its table in SQL), so the next read loads the new version.
_COMMITTING_OPS = frozenset(
    {
        "sink.commitRolls",
        "sql.vacuum",
        "sql.restore",
        "sql.optimize",
        "sql.reorg",
        "sql.convert",
        "sql.clone",
        "dml.run",
        "catalog.create",
        "catalog.alter",
    }
)


def _committed_table(args: dict[str, Any]) -> str | None:
    named = args.get("uri") or args.get("path")
    return _uri.normalize_uri(str(named)) if named else None


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer line for one request (never raises)."""
    op = str(request.get("op"))
    request_id = request.get("id")
    if op in _COMMITTING_OPS:
        try:
            return _answer(op, request_id, request.get("args") or {})
        finally:
            _snapshots.forget(_committed_table(request.get("args") or {}))
    return _answer(op, request_id, request.get("args") or {})


def _answer(op: str, request_id: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        handler = OPERATIONS.get(op)
        if handler is None:
            raise BridgeError(
                f"unknown bridge operation {op!r}; known: {', '.join(sorted(OPERATIONS))}."
                " The connector jar and the Python package are from different deltaflow"
                " versions: reinstall deltaflow.",
                operation=op,
            )
        return {"id": request_id, "result": handler(args)}
    except DeltaflowError as exc:
        return {"id": request_id, "error": error_answer(exc)}
    except Exception as exc:  # anything else still answers, typed as a bridge error
        carried = from_wire(str(exc))  # a reader packs its typed errors for Spark's workers
        if carried is not None:
            return {"id": request_id, "error": error_answer(carried)}
        traceback.print_exc(file=sys.stderr)
        wrapped = BridgeError(f"{op} failed: {type(exc).__name__}: {exc}", operation=op)
        return {"id": request_id, "error": error_answer(wrapped)}


def drop_stale_snapshots(request: dict[str, Any]) -> None:
    """Drop the cached snapshots of the tables a request names in ``staleSnapshots``: the
    connector lists each table whose batch scan failed on a missing data file since its
    previous request (``MissingFiles.scala``), so that a retry loads the table anew (the
    snapshot may be of a table since made again at its path; ``_snapshots``)."""
    for uri in request.get("staleSnapshots") or ():
        _snapshots.forget(str(uri))


def serve(lines: IO[str], out: IO[str]) -> None:
    """Answer every request line from ``lines`` on ``out`` until ``lines`` ends."""
    lock = threading.Lock()

    def handle(request: dict[str, Any]) -> None:
        text = json.dumps(answer(request), default=str)
        with lock:
            out.write(text + "\n")
            out.flush()

    pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="deltaflow-bridge")
    sessions = ThreadPoolExecutor(
        max_workers=SESSION_WORKERS, thread_name_prefix="deltaflow-session"
    )
    with pool, sessions:
        for line in lines:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError:
                log.error("deltaflow bridge: not a JSON request: %.200s", line)
                continue
            # Here, in the order the lines come, not on the request's thread: a read the
            # connector plans after a scan failed on a missing file must not find the entry.
            drop_stale_snapshots(request)
            target = sessions if request.get("op") in SESSION_OPS else pool
            target.submit(handle, request)


TERM_FLUSH_SECONDS = 30.0


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    from deltaflow.spark.bridge import _realtime
    from deltaflow.table import _log_upkeep

    try:
        _realtime.flush_timings()
        _log_upkeep.flush(TERM_FLUSH_SECONDS)
    finally:
        os._exit(128 + signum)


def main() -> None:
    # The protocol owns stdout; a stray print anywhere must not corrupt it.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from deltaflow.spark.bridge import _host, _realtime
    from deltaflow.table import _log_upkeep

    # The real-time sink's per-epoch commit timings, as the JVM writer logs its own.
    _realtime.timing_log.setLevel(logging.INFO)
    # A long-lived brain checkpoints off the commit path; what waits at its shutdown
    # (stdin closed: the driver stopped) runs before it exits.
    _log_upkeep.run_in_background()
    # The driver stops a retired brain with SIGTERM: finish the queued checkpoints (none
    # usually; bounded) before going, as at the end of stdin.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    threading.Thread(target=_host.warm, name="deltaflow-gateway", daemon=True).start()
    try:
        serve(sys.stdin, protocol)
    finally:
        _realtime.flush_timings()
        _log_upkeep.flush()


if __name__ == "__main__":
    main()
