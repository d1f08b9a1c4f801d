"""Streaming writes: ``df.writeStream.format("delta").option("checkpointLocation", c).start(uri)``.

This is the Python data source sink. A Delta sink normally runs on the connector's JVM
sink instead (``io.deltaflow.spark.DeltaSink``, same commits); this one serves when
``deltaflow.write.nativeWrite`` is ``false`` and for tables the connector routes to the
Python data source (object stores).
Each micro-batch becomes exactly one Delta commit:

- executors write Parquet files with the batch writer's ``FileSetWriter`` and return
  them in commit messages; nothing in the log refers to them yet;
- ``commit(messages, batchId)`` runs once on the driver and commits every file of the
  batch with the app transaction ``(appId, batchId)``. ``appId`` is the streaming
  query's id, read from ``<checkpointLocation>/metadata``, as delta-spark's sink
  uses it: stable across restarts of the query, and new when the checkpoint is
  deleted (a new query must not have its batches mistaken for replays);
- a batch Spark replays after a crash (same ``batchId``) finds its app transaction
  already in the log and is skipped; the files it wrote again are deleted;
- ``abort`` deletes the batch's files. Files of attempts that died before either
  call are never referenced, and VACUUM removes them.

Output modes: append adds files; complete (Spark passes ``overwrite=True``) replaces
the table's content in the same commit. ``partitionBy`` and ``mergeSchema`` are the
batch writer's options.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from deltaflow.errors import DeltaflowError
from deltaflow.spark._options import WriteOptions, parse_write_options
from deltaflow.spark.errors import StreamIdentityError
from deltaflow.spark.write._compat import RemoteDeltaflowError
from deltaflow.spark.write._files import FileSetWriter, delete_files
from deltaflow.spark.write._writer import DeltaCommitMessage, WritePlan, commit_request, plan_write
from deltaflow.table import _commit, _uri

log = logging.getLogger("deltaflow.stream")

# The commitInfo field naming the streaming query and batch of a sink commit.
STREAM_COMMIT_INFO_KEY = "deltaflow.stream"
# Options of the streaming query, not write options of the table.
STREAM_ONLY_OPTIONS = (
    "checkpointLocation",
    "queryName",
    "asyncProgressTrackingEnabled",
    "asyncProgressTrackingCheckpointIntervalMs",
)


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    """One Delta commit per micro-batch, exactly once per ``(query, batchId)``."""

    def __init__(
        self,
        table_uri: str,
        schema: StructType,
        overwrite: bool,
        options: WriteOptions,
        checkpoint_location: str | None,
    ) -> None:
        self.table_uri = table_uri
        self.schema_json = schema.jsonValue()
        self.mode = "overwrite" if overwrite else "append"
        self.options = options
        self.checkpoint_location = checkpoint_location
        self._plan: WritePlan | None = None
        # The plan was made in this process (not unpickled): Spark's commit worker builds
        # the writer and commits right away, so the plan is as current as a new one.
        self._planned_here = False

    @property
    def plan(self) -> WritePlan:
        """How executors lay out files: planned once, where Spark plans the query."""
        if self._plan is None:
            self._plan = plan_write(self.table_uri, self.schema_json, self.mode, self.options)
            self._planned_here = True
        return self._plan

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the writer pickled: plan before, so every task lays files out alike.
        _ = self.plan
        return {**self.__dict__, "_planned_here": False}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        writer = FileSetWriter(self.plan, job_id="stream")
        return writer.write_all(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        started = time.perf_counter()
        adds = _files(messages)
        app_id = self._app_id()
        num_rows = sum(m.num_rows for m in messages if isinstance(m, DeltaCommitMessage))
        try:
            opts = replace(self.options, txn_app_id=app_id, txn_version=batchId)
            if self._planned_here:
                # Spark's commit worker calls streamWriter() (which plans against the table
                # as it is now) just before commit(): planning again would load the log a
                # second time per batch. A replayed batch is still caught: _commit.commit
                # checks the app transaction before committing.
                plan = self.plan
            else:
                # Planned again against the table as it is now: earlier batches created
                # it, added columns, or moved its version on.
                plan = plan_write(self.table_uri, self.schema_json, self.mode, opts)
            if plan.skip:
                result = _commit.CommitResult(None, True, 0)
            else:
                request = commit_request(
                    plan,
                    adds,
                    app_id=app_id,
                    app_version=batchId,
                    user_metadata=opts.user_metadata,
                    commit_info=batch_commit_info(app_id, batchId, self.mode, adds, num_rows),
                )
                result = _commit.commit(request)
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc
        if result.skipped:
            # A replay of a batch that already committed: these files are copies.
            delete_files(self.table_uri, adds)
        log_batch_commit(self.table_uri, batchId, result, adds, num_rows, started, "")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        adds = _files(messages)
        log.warning(
            "stream batch %d to %s aborted: deleting %d files", batchId, self.table_uri, len(adds)
        )
        delete_files(self.table_uri, adds)

    def _app_id(self) -> str:
        return query_id(self.checkpoint_location, self.table_uri)


def log_batch_commit(
    table_uri: str,
    batch_id: int,
    result: _commit.CommitResult,
    adds: list[_commit.AddedFile],
    num_rows: int,
    started: float,
    how: str,
) -> None:
    log.info(
        "deltaflow stream commit to %s: batch %d -> version %s, %d files, %d rows, %.1f ms%s%s",
        table_uri,
        batch_id,
        result.version,
        len(adds),
        num_rows,
        (time.perf_counter() - started) * 1000,
        how,
        " (already committed, skipped)" if result.skipped else "",
    )


def batch_commit_info(
    query_id: str, batch_id: int, mode: str, adds: list[_commit.AddedFile], num_rows: int
) -> dict[str, Any]:
    """What a micro-batch commit records about itself in the log's ``commitInfo``.

    ``operationMetrics`` uses delta-spark's streaming names (string values, as delta-spark
    writes them, so its ``history()`` reads them); ``deltaflow.stream`` names the query and
    batch, which :mod:`deltaflow.spark.stream._progress` pairs with Spark's progress events.
    """
    return {
        "operationMetrics": {
            "numAddedFiles": str(len(adds)),
            "numRemovedFiles": "0",
            "numOutputRows": str(num_rows),
            "numOutputBytes": str(sum(a.size for a in adds)),
        },
        STREAM_COMMIT_INFO_KEY: {
            "queryId": query_id,
            "batchId": batch_id,
            "outputMode": "Complete" if mode == "overwrite" else "Append",
        },
    }


def _files(messages: list[WriterCommitMessage | None]) -> list[_commit.AddedFile]:
    return [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]


def query_id(checkpoint_location: str | None, table_uri: str) -> str:
    """The id Spark keeps in ``<checkpointLocation>/metadata`` for a streaming query."""
    if checkpoint_location:
        fs, root = _uri.filesystem(_uri.normalize_uri(checkpoint_location))
        try:
            with fs.open_input_stream(f"{root}/metadata") as handle:
                return str(json.loads(handle.read())["id"])
        except (OSError, KeyError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = "the query has no checkpointLocation option"
    raise StreamIdentityError(
        f"The Delta sink at {table_uri} cannot tell this streaming query's id ({reason}), which"
        " its exactly-once commits are keyed by. Start the query with"
        " .option('checkpointLocation', '<dir>') on writeStream.",
        table_uri=table_uri,
        checkpoint_location=checkpoint_location,
    )


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DeltaStreamWriter:
    """The writer for ``DeltaDataSource.streamWriter``."""
    stream_only = {name.lower() for name in STREAM_ONLY_OPTIONS}
    raw = {k: v for k, v in dict(options).items() if k.lower() not in stream_only}
    lowered = {k.lower(): v for k, v in dict(options).items()}
    try:
        parsed = parse_write_options(raw)
        writer = DeltaStreamWriter(
            _uri.normalize_uri(parsed.path),
            schema,
            overwrite,
            parsed,
            lowered.get("checkpointlocation"),
        )
        # Planned here, in the worker that runs streamWriter(): a schema violation or bad
        # option must reach the driver typed. Raised later, while Spark pickles the writer,
        # it would surface as a PicklingError that no longer names our error.
        _ = writer.plan
    except DeltaflowError as exc:
        raise RemoteDeltaflowError(exc) from exc
    return writer


_TO_TABLE_INSTALLED = "_deltaflow_to_table_installed"


def install_to_table() -> None:
    """Make ``writeStream.toTable(name)`` work for deltaflow catalog tables.

    Spark hands a Python sink the query's schema and no options for a catalog table,
    so the table's location (kept in the catalog schema, see ``_source.with_location``)
    never reaches the sink. For a table whose catalog schema carries one, ``toTable``
    starts the query on that location instead, as ``start(location)`` with
    ``format("delta")``; other tables go through untouched.
    """
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if getattr(DataStreamWriter, _TO_TABLE_INSTALLED, False):
        return
    original = DataStreamWriter.toTable

    def toTable(
        self: Any,
        tableName: str,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: Any = None,
        queryName: str | None = None,
        **options: Any,
    ) -> Any:
        from deltaflow.spark._source import table_location

        spark = self._spark
        location = None
        if spark.catalog.tableExists(tableName):
            location = table_location(spark, tableName)
        if location is None:
            return original(self, tableName, format, outputMode, partitionBy, queryName, **options)
        return self.start(
            location,
            format="delta",
            outputMode=outputMode,
            partitionBy=partitionBy,
            queryName=queryName,
            **options,
        )

    toTable.__doc__ = original.__doc__
    DataStreamWriter.toTable = toTable  # type: ignore[method-assign]
    setattr(DataStreamWriter, _TO_TABLE_INSTALLED, True)
