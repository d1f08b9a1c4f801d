"""The JVM path for streaming writes: each micro-batch through Spark's Parquet writer.

``df.writeStream.format("delta").start(path)`` would run the Python sink
(``_stream_writer.DeltaStreamWriter``): every row crosses from the JVM into a Python
worker as Arrow and is encoded there, and Spark starts a planning and a commit worker
per batch. ``install()`` makes ``start`` run a Delta sink's query with a
``foreachBatch`` function instead, :class:`NativeBatchSink`,
which does in the driver what the Python sink does, with the batch writer's JVM path
(:mod:`deltaflow.spark._native_write`):

- the batch's rows are written by Spark's Parquet writer (executors), the files'
  footers give their stats, and one Delta commit per batch carries the app transaction
  ``(query id, batchId)`` and the same ``commitInfo`` as the Python sink
  (``_stream_writer.batch_commit_info``);
- a batch Spark replays after a crash finds its app transaction in the log before any
  file is written: it runs into Spark's ``noop`` sink (so a stateful query's state
  stores commit the batch) and nothing is written; files of a failed attempt are
  deleted, and those of an attempt that died are never referenced (VACUUM removes them);
- output mode complete overwrites, append appends; ``partitionBy`` (method or option)
  and the batch writer's options apply as in ``DataStreamWriter`` with the Python sink.

A batch the JVM path cannot write (``plan_native_write`` gives the reason: column
mapping, invariants, a codec...) is written through the Python source as a batch write
with the same app transaction, so exactly-once holds either way. The Python sink stays
in use when ``deltaflow.write.nativeWrite`` is ``false``, for other output modes, and
wherever the Spark session is not a classic one.

Measured (``bench/bench_stream_throughput.py``, 4 M rows): the sink alone went from
0.61 to 1.18 of Spark's parquet file sink; end-to-end latency p50 407 -> 310 ms
(``bench/bench_stream_latency.py``, docs/benchmarks.md sections 5 and 6).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from deltalake import DeltaTable

from deltaflow.errors import DeltaflowError
from deltaflow.spark import _file_writer
from deltaflow.spark._options import WriteOptions, parse_write_options
from deltaflow.spark._stream_writer import (
    STREAM_ONLY_OPTIONS,
    batch_commit_info,
    log_batch_commit,
    query_id,
)
from deltaflow.spark._writer_compat import (
    RemoteDeltaflowError,
    partition_columns,
    recording_methods,
    writer_state,
)
from deltaflow.table import _commit, _uri
from deltaflow.table._snapshot import Snapshot, snapshot_of_table, table_exists

log = logging.getLogger("deltaflow.stream")

_STATE = "_deltaflow_stream_state"
_INSTALLED = "_deltaflow_stream_installed"
# Options that are not write options of the table (the path is passed on its own).
_NOT_TABLE_OPTIONS = frozenset(name.lower() for name in (*STREAM_ONLY_OPTIONS, "path"))
# Query id -> the Delta table its JVM-path sink writes: the progress listener finds the
# sink here, since a foreachBatch sink names no table in the query's plan.
_SINKS: dict[str, str] = {}
_SINKS_LOCK = threading.Lock()


def sink_of(query_id: str) -> str | None:
    """The table a JVM-path streaming sink of query ``query_id`` writes, if any."""
    with _SINKS_LOCK:
        return _SINKS.get(query_id)


class NativeBatchSink:
    """A ``foreachBatch`` function: one Delta commit per micro-batch, exactly once."""

    def __init__(
        self,
        table_uri: str,
        mode: str,
        options: WriteOptions,
        raw_options: dict[str, str],
        checkpoint_location: str | None,
    ) -> None:
        self.table_uri = table_uri
        self.mode = mode  # "append" | "overwrite"
        self.options = options
        self.raw_options = raw_options
        self.checkpoint_location = checkpoint_location
        self._app_id: str | None = None
        # Kept up to date batch by batch: a full log load per batch grows with the
        # versions since the last checkpoint (~30 ms at 90 of them, vs ~5 ms).
        self._table: DeltaTable | None = None

    def app_id(self) -> str:
        if self._app_id is None:
            self._app_id = query_id(self.checkpoint_location, self.table_uri)
            with _SINKS_LOCK:
                _SINKS[self._app_id] = self.table_uri
        return self._app_id

    def _current(self) -> Snapshot | None:
        """The table now: loaded once, then moved on by the commits since (incremental)."""
        if self._table is None:
            if not table_exists(self.table_uri):
                return None
            self._table = DeltaTable(_uri.delta_rs_uri(self.table_uri))
        else:
            self._table.update_incremental()
        return snapshot_of_table(self._table, self.table_uri)

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            self._write_batch(df, batch_id)
        except DeltaflowError as exc:
            # Raised through Spark's foreachBatch sink, the error reaches the caller as a
            # StreamingQueryException's text: the marker lets deltaflow re-raise it typed.
            raise RemoteDeltaflowError(exc) from exc

    def _write_batch(self, df: Any, batch_id: int) -> None:
        from deltaflow.spark import _native_write
        from deltaflow.spark._writer import commit_request, plan_write

        started = time.perf_counter()
        app_id = self.app_id()
        opts = replace(self.options, txn_app_id=app_id, txn_version=batch_id)
        incoming = df.schema.jsonValue()
        current = self._current()
        plan = plan_write(self.table_uri, incoming, self.mode, opts, current)
        if plan.skip:
            # Still run the batch, writing nowhere: a stateful query's state stores commit
            # only when every partition is processed, and Spark 4.3 fails the query
            # (STATE_STORE_COMMIT_VALIDATION_FAILED) if a foreachBatch function skips them.
            df.write.format("noop").mode("overwrite").save()
            log.info(
                "deltaflow stream commit to %s: batch %d already committed, skipped",
                self.table_uri,
                batch_id,
            )
            return
        native = _native_write.plan_native_write(plan, incoming, df.sparkSession.conf.get, current)
        if not isinstance(native, _native_write.NativeWrite):
            log.info(
                "deltaflow stream batch %d to %s: Python source (%s)",
                batch_id,
                self.table_uri,
                native.reason,
            )
            self._write_with_python_source(df, app_id, batch_id)
            return
        adds = _native_write.stage_native(df, plan, native, job_id="stream")
        num_rows = _native_write.rows_in(adds)
        committed = False
        try:
            info = batch_commit_info(app_id, batch_id, self.mode, adds, num_rows)
            result = _commit.commit(commit_request(plan, adds, commit_info=info, table=self._table))
            committed = not result.skipped
        finally:
            if not committed:
                # A failed commit, or a replay that raced another attempt: copies.
                _file_writer.delete_files(self.table_uri, adds)
        log_batch_commit(self.table_uri, batch_id, result, adds, num_rows, started, " (JVM writer)")

    def _write_with_python_source(self, df: Any, app_id: str, batch_id: int) -> None:
        writer = df.write.format("delta").mode(self.mode).options(**self.raw_options)
        writer.option("txnAppId", app_id).option("txnVersion", str(batch_id)).save(self.table_uri)


def _state(writer: Any) -> dict[str, Any]:
    return writer_state(writer, _STATE, output_mode=None)


def install() -> None:
    """Teach ``DataStreamWriter`` to run Delta sinks on the JVM path where it can."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if getattr(DataStreamWriter, _INSTALLED, False):
        return
    original_format = DataStreamWriter.format
    original_option = DataStreamWriter.option
    original_options = DataStreamWriter.options
    original_output_mode = DataStreamWriter.outputMode
    original_partition_by = DataStreamWriter.partitionBy
    original_foreach = DataStreamWriter.foreach
    original_foreach_batch = DataStreamWriter.foreachBatch
    original_start = DataStreamWriter.start

    format, option, options = recording_methods(
        _state, original_format, original_option, original_options
    )

    def outputMode(self: Any, outputMode: str) -> Any:
        _state(self)["output_mode"] = outputMode
        return original_output_mode(self, outputMode)

    def partitionBy(self: Any, *cols: Any) -> Any:
        _state(self)["partition_by"] = partition_columns(cols)
        # Deferred: a Python sink refuses partitionBy, so the JVM hears of it at start()
        # only when the sink is not Delta.
        return self

    def foreach(self: Any, f: Any) -> Any:
        _state(self)["format"] = "foreach"
        return original_foreach(self, f)

    def foreachBatch(self: Any, func: Any) -> Any:
        _state(self)["format"] = "foreachBatch"
        return original_foreach_batch(self, func)

    def start(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: Any = None,
        queryName: str | None = None,
        **options: Any,
    ) -> Any:
        state = _state(self)
        if format is not None:
            self.format(format)
        if outputMode is not None:
            self.outputMode(outputMode)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        self.options(**options)
        if (state["format"] or "").lower() == "delta":
            sink = _native_sink(self, state, path)
            if sink is not None:
                original_foreach_batch(self, sink)
                return original_start(self, queryName=queryName)
            if state["partition_by"]:
                original_option(self, "partitionBy", ",".join(state["partition_by"]))
        elif state["partition_by"]:
            original_partition_by(self, *state["partition_by"])
        return original_start(self, path, queryName=queryName)

    for name, method in {
        "format": format,
        "option": option,
        "options": options,
        "outputMode": outputMode,
        "partitionBy": partitionBy,
        "foreach": foreach,
        "foreachBatch": foreachBatch,
        "start": start,
    }.items():
        method.__doc__ = getattr(DataStreamWriter, name).__doc__
        setattr(DataStreamWriter, name, method)
    setattr(DataStreamWriter, _INSTALLED, True)


def _native_sink(writer: Any, state: dict[str, Any], path: str | None) -> NativeBatchSink | None:
    """The foreachBatch function for this Delta sink, or None to keep the Python sink."""
    from deltaflow.spark import _native_write

    mode = (state["output_mode"] or "append").lower()
    if mode not in ("append", "complete"):
        return None  # Spark's error for the mode comes from the Python sink
    spark = writer._spark
    if not hasattr(spark, "_jsparkSession"):
        return None  # not a classic session: no foreachBatch in this process
    raw = dict(state["options"])
    lowered = {k.lower(): v for k, v in raw.items()}
    location = path or lowered.get("path")
    if not location:
        return None
    try:
        conf = spark.conf.get(_native_write.NATIVE_WRITE_CONF, "auto")
        if _native_write.native_write_mode(conf) == "false":
            return None
        table_options = {k: v for k, v in raw.items() if k.lower() not in _NOT_TABLE_OPTIONS}
        if state["partition_by"]:
            table_options["partitionBy"] = ",".join(state["partition_by"])
        parsed = parse_write_options({**table_options, "path": location})
    except DeltaflowError:
        return None  # the Python sink reports it, as it always has
    uri = _uri.normalize_uri(parsed.path)
    log.info("deltaflow stream sink %s: JVM writer per micro-batch", uri)
    return NativeBatchSink(
        uri,
        "overwrite" if mode == "complete" else "append",
        parsed,
        table_options,
        lowered.get("checkpointlocation"),
    )
