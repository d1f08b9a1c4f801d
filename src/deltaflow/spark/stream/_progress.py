"""Per-batch progress of Delta streams: rows, files, bytes, duration, end-to-end latency.

Spark 4.3 gives Python data sources no way to report custom metrics into
``StreamingQueryProgress`` (``pyspark.sql.datasource`` has no metrics hook), so the
figures are assembled in the user's process instead:

- the sink records each micro-batch commit's figures in the Delta log's ``commitInfo``
  (``operationMetrics`` with delta-spark's names, and ``deltaflow.stream`` naming the
  query and batch; see ``stream._writer.batch_commit_info``);
- :class:`StreamProgress`, a ``StreamingQueryListener``, pairs every progress event with
  that commit (found by query id and batch id) and with the commit timestamps of the
  source versions the batch read (from the source offsets in the event), logs one line
  per batch on the ``deltaflow.stream`` logger and keeps the recent records.

End-to-end latency is the sink commit's timestamp minus a source commit's timestamp
(in-commit timestamp, else ``commitInfo.timestamp``, else the commit file's
modification time): ``latency_ms`` from the oldest source commit the batch read (what
its oldest row waited), ``latency_ms_newest`` from the newest one. Both clocks are the
writers' wall clocks, so skew between machines shows up in the figure.

Table locations come from the query's plan through py4j (classic sessions only);
where they cannot be found the record carries Spark's figures alone.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from deltaflow.spark.stream._writer import STREAM_COMMIT_INFO_KEY
from deltaflow.table import _log, _uri

log = logging.getLogger("deltaflow.stream")

# How far back from the newest sink version to look for a batch's commit the first
# time a query is seen (later batches continue from the last commit found).
SINK_SEARCH_DEPTH = 50
# Per-query records kept in memory.
DEFAULT_KEEP = 1000


@dataclass(frozen=True)
class SourceRange:
    """The versions of one Delta source table a batch read from."""

    table_uri: str | None  # None when the plan did not tell
    table_id: str
    first_version: int
    last_version: int
    first_commit_ms: int | None
    last_commit_ms: int | None


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch of a streaming query, as Spark and the Delta sink's log saw it."""

    query_id: str
    batch_id: int
    timestamp: str  # when the trigger started (Spark's progress timestamp)
    num_input_rows: int
    duration_ms: int  # the whole trigger (Spark's ``triggerExecution``)
    durations_ms: dict[str, int]  # Spark's phases: addBatch, walCommit, commitOffsets, ...
    sink_uri: str | None
    sink_version: int | None  # None: no Delta sink, no commit (an empty batch), or not found
    num_output_rows: int | None
    num_files: int | None
    num_bytes: int | None
    sink_commit_ms: int | None
    sources: tuple[SourceRange, ...]
    latency_ms: int | None  # sink commit - oldest source commit read
    latency_ms_newest: int | None  # sink commit - newest source commit read


@dataclass
class _QueryTables:
    sink_uri: str | None
    source_uris: dict[str, str]  # reservoirId (table id) -> table URI
    next_sink_version: int | None = None


class StreamProgress(StreamingQueryListener):
    """Collects a :class:`BatchProgress` per micro-batch of every streaming query.

    Add it with :func:`track_progress` (or ``spark.streams.addListener``). Spark calls
    it on its listener thread after each batch; a record is built there while the query
    runs, or by :meth:`batches` for a query that already stopped (Spark only lets an
    active query's plan be looked up by id).
    """

    def __init__(self, spark: SparkSession, *, keep: int = DEFAULT_KEEP) -> None:
        self._spark = spark
        self._keep = keep
        # Guards the dicts below; notified whenever a progress event arrives.
        self._lock = threading.Condition(threading.RLock())
        self._records: dict[str, deque[BatchProgress]] = {}
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._tables: dict[str, _QueryTables] = {}

    # ---- the listener ------------------------------------------------------------------

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        try:
            progress = json.loads(event.progress.json)
            query_id = str(progress["id"])
            with self._lock:
                if query_id not in self._tables:
                    active = self._spark.streams.get(query_id)
                    if active is None:
                        self._pending.setdefault(query_id, []).append(progress)
                        self._lock.notify_all()
                        return
                    self._tables[query_id] = _resolve_tables(active)
                self._add(self._build(progress, self._tables[query_id]))
                self._lock.notify_all()
        except Exception:  # never let metrics break Spark's listener bus
            log.warning("deltaflow could not record a streaming progress event", exc_info=True)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    # ---- for users ---------------------------------------------------------------------

    def batches(self, query: StreamingQuery | str | None = None) -> list[BatchProgress]:
        """Recorded batches, oldest first: of ``query`` (an object or its id), or of all."""
        with self._lock:
            if isinstance(query, StreamingQuery):
                query_id = str(query.id)
                pending = self._pending.pop(query_id, [])
                if pending:
                    if query_id not in self._tables:
                        self._tables[query_id] = _resolve_tables(query)
                    tables = self._tables[query_id]
                    for progress in pending:
                        self._add(self._build(progress, tables))
                return list(self._records.get(query_id, ()))
            if query is not None:
                return list(self._records.get(str(query), ()))
            return [r for records in self._records.values() for r in records]

    def wait_until(
        self,
        query: StreamingQuery,
        condition: Callable[[list[BatchProgress]], bool],
        timeout: float,
    ) -> list[BatchProgress]:
        """Block until ``condition(self.batches(query))`` holds, and return those batches;
        raise ``TimeoutError`` after ``timeout`` seconds. Spark delivers progress events on
        its listener thread, possibly after ``awaitTermination`` returned."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                records = self.batches(query)
                if condition(records):
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"query {query.id}: the recorded batches did not reach the awaited"
                        f" state within {timeout} s ({len(records)} recorded)"
                    )
                self._lock.wait(remaining)

    # ---- building records --------------------------------------------------------------

    def _add(self, record: BatchProgress) -> None:
        self._records.setdefault(record.query_id, deque(maxlen=self._keep)).append(record)
        _log_record(record)

    def _build(self, progress: dict[str, Any], tables: _QueryTables) -> BatchProgress:
        query_id, batch_id = str(progress["id"]), int(progress["batchId"])
        sources = tuple(_source_ranges(progress.get("sources") or [], tables.source_uris))
        commit = None
        if tables.sink_uri is not None:
            commit = _find_sink_commit(tables, query_id, batch_id)
        version, info = commit if commit is not None else (None, {})
        metrics = info.get("operationMetrics") or {}
        sink_ms = _commit_ms(info) if commit is not None else None
        oldest = [s.first_commit_ms for s in sources if s.first_commit_ms is not None]
        newest = [s.last_commit_ms for s in sources if s.last_commit_ms is not None]
        durations = {k: int(v) for k, v in (progress.get("durationMs") or {}).items()}
        return BatchProgress(
            query_id=query_id,
            batch_id=batch_id,
            timestamp=str(progress.get("timestamp")),
            num_input_rows=int(progress.get("numInputRows") or 0),
            duration_ms=durations.get("triggerExecution", int(progress.get("batchDuration") or 0)),
            durations_ms=durations,
            sink_uri=tables.sink_uri,
            sink_version=version,
            num_output_rows=_int(metrics.get("numOutputRows")) if commit else None,
            num_files=_int(metrics.get("numAddedFiles")) if commit else None,
            num_bytes=_int(metrics.get("numOutputBytes")) if commit else None,
            sink_commit_ms=sink_ms,
            sources=sources,
            latency_ms=sink_ms - min(oldest) if sink_ms is not None and oldest else None,
            latency_ms_newest=sink_ms - max(newest) if sink_ms is not None and newest else None,
        )


def track_progress(spark: SparkSession, *, keep: int = DEFAULT_KEEP) -> StreamProgress:
    """Add a :class:`StreamProgress` listener to ``spark`` and return it.

    ``progress.batches(query)`` then lists the query's micro-batches (rows read, rows,
    files and bytes committed to the Delta sink, durations, end-to-end latency), and
    the ``deltaflow.stream`` logger gets one INFO line per batch.
    """
    listener = StreamProgress(spark, keep=keep)
    spark.streams.addListener(listener)
    return listener


def _log_record(r: BatchProgress) -> None:
    read = ", ".join(
        f"{s.table_uri or s.table_id} v{s.first_version}-{s.last_version}" for s in r.sources
    )
    log.info(
        "stream %s batch %d: %d rows read (%s) -> %s v%s: %s rows, %s files, %s bytes;"
        " %d ms; end-to-end latency %s ms (newest source commit %s ms)",
        r.query_id,
        r.batch_id,
        r.num_input_rows,
        read or "no Delta source",
        r.sink_uri,
        r.sink_version,
        r.num_output_rows,
        r.num_files,
        r.num_bytes,
        r.duration_ms,
        r.latency_ms,
        r.latency_ms_newest,
    )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# ---- the query's tables, from its plan (py4j) ---------------------------------------------


def _resolve_tables(query: StreamingQuery) -> _QueryTables:
    sink_uri: str | None = None
    sources: dict[str, str] = {}
    try:
        plan = query._jsq.streamingQuery().logicalPlan()  # type: ignore[attr-defined]
    except Exception:
        log.debug("no plan for streaming query %s", query.id, exc_info=True)
        return _QueryTables(sink_uri, {})
    for sink in ("sink", "table"):
        # The connector's V1 sink, DeltaSink[<path>] (streams started on a path), or a
        # catalog table's streaming write, DeltaTable[<path>] (toTable).
        try:
            described = str(getattr(plan, sink)().toString())
        except Exception:
            log.debug("streaming query %s: no %s in its plan", query.id, sink, exc_info=True)
            continue
        for prefix in (_JVM_SINK, _JVM_TABLE):
            if described.startswith(prefix) and described.endswith("]"):
                sink_uri = _uri.normalize_uri(described[len(prefix) : -1])
    try:
        options = plan.writeOptions()
        if _is_delta(plan.table().name()) and options.contains("path"):
            sink_uri = _uri.normalize_uri(str(options.apply("path")))
    except Exception:  # not a data source v2 sink (foreachBatch, console, ...)
        log.debug("streaming query %s: no Python Delta sink", query.id, exc_info=True)
    try:
        leaves = plan.collectLeaves()
        for i in range(leaves.size()):
            leaf = leaves.apply(i)
            try:
                relation = leaf.relation()
                if not _is_delta(relation.table().name()):
                    continue
                path = dict(relation.options()).get("path")
            except Exception:
                continue
            if path:
                uri = _uri.normalize_uri(str(path))
                table_id = _table_id(uri)
                if table_id is not None:
                    sources[table_id] = uri
    except Exception:
        log.debug("streaming query %s: sources not resolved", query.id, exc_info=True)
    return _QueryTables(sink_uri, sources)


def _table_id(uri: str) -> str | None:
    from deltalake import DeltaTable

    try:
        return str(DeltaTable(_uri.delta_rs_uri(uri)).metadata().id)
    except Exception:
        return None


# ---- the log ------------------------------------------------------------------------------


def _read_commit_info(uri: str, version: int) -> dict[str, Any] | None:
    """``commitInfo`` of ``version`` (``{}`` without one), or None if there is no such commit.

    Also carries ``_mtime`` (the commit file's modification time, ms) for the fallback.
    """
    text = _log.read_commit_text(uri, version)
    if text is None:
        return None
    info: dict[str, Any] = {}
    for line in text.splitlines():
        if '"commitInfo"' in line:
            info = dict(json.loads(line).get("commitInfo") or {})
            break
    if info.get("inCommitTimestamp") is None and info.get("timestamp") is None:
        fs, root = _uri.filesystem(uri)
        mtime = fs.get_file_info(f"{root}/_delta_log/{version:020d}.json").mtime_ns
        if mtime is not None:
            info["_mtime"] = mtime // 1_000_000
    return info


def _commit_ms(info: dict[str, Any]) -> int | None:
    for key in ("inCommitTimestamp", "timestamp", "_mtime"):
        if info.get(key) is not None:
            return int(info[key])
    return None


def _latest_version(uri: str) -> int | None:
    from deltaflow.table._snapshot import latest_version

    try:
        return latest_version(uri)
    except Exception:
        return None


def _find_sink_commit(
    tables: _QueryTables, query_id: str, batch_id: int
) -> tuple[int, dict[str, Any]] | None:
    """The sink commit of ``(query_id, batch_id)``: probe forward from the last one found,
    or, the first time, back from the newest version."""
    assert tables.sink_uri is not None
    uri = tables.sink_uri
    if tables.next_sink_version is None:
        latest = _latest_version(uri)
        if latest is None:
            return None
        candidates: Iterable[int] = range(latest, max(-1, latest - SINK_SEARCH_DEPTH), -1)
    else:
        candidates = _forward(tables.next_sink_version)
    for version in candidates:
        info = _read_commit_info(uri, version)
        if info is None:
            break
        marker = info.get(STREAM_COMMIT_INFO_KEY) or {}
        if marker.get("queryId") == query_id and marker.get("batchId") == batch_id:
            tables.next_sink_version = version + 1
            return version, info
    return None


def _forward(start: int) -> Iterable[int]:
    version = start
    while True:
        yield version
        version += 1


def _source_ranges(sources: list[dict[str, Any]], uris: dict[str, str]) -> Iterable[SourceRange]:
    for source in sources:
        end = _offset(source.get("endOffset"))
        if end is None:
            continue
        start = _offset(source.get("startOffset"))
        last = end["reservoirVersion"] if end["index"] >= 0 else end["reservoirVersion"] - 1
        begun = start is not None and start["reservoirVersion"] >= 0
        first = min(start["reservoirVersion"], last) if start is not None and begun else last
        uri = uris.get(end["reservoirId"])
        first_ms = last_ms = None
        if uri is not None:
            last_info = _read_commit_info(uri, last)
            last_ms = _commit_ms(last_info) if last_info is not None else None
            first_info = last_info if first == last else _read_commit_info(uri, first)
            first_ms = _commit_ms(first_info) if first_info is not None else None
        yield SourceRange(uri, end["reservoirId"], first, last, first_ms, last_ms)


def _offset(raw: Any) -> dict[str, Any] | None:
    """A Delta source offset from a progress event (a dict, or JSON text), else None."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or "reservoirVersion" not in raw or "reservoirId" not in raw:
        return None
    return {
        "reservoirId": str(raw["reservoirId"]),
        "reservoirVersion": int(raw["reservoirVersion"]),
        "index": int(raw.get("index", -1)),
    }


_JVM_SINK = "DeltaSink["
_JVM_TABLE = "DeltaTable["


def _is_delta(table_name: str) -> bool:
    """A DSv2 table of deltaflow's: the connector's (``delta.`<uri>```) or the Python
    data source's."""
    return table_name.startswith("delta.`") or table_name in ("delta", "deltaflow_python")
