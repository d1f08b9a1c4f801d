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
from deltalake import DeltaTable
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from deltaflow.errors import DeltaflowError, RemoteDeltaflowError
from deltaflow.spark._compat import DataSourceStreamArrowWriter
from deltaflow.spark._options import WriteOptions, parse_write_options
from deltaflow.spark.errors import StreamIdentityError
from deltaflow.spark.write._files import FileSetWriter, delete_files
from deltaflow.spark.write._plan import WritePlan, plan_write, require_arrow_checks
from deltaflow.spark.write._writer import DeltaCommitMessage, commit_request
from deltaflow.table import _commit, _uri
from deltaflow.table._log_head import LogHead

log = logging.getLogger("deltaflow.stream")

# The commitInfo field naming the streaming query and batch of a sink commit.
STREAM_COMMIT_INFO_KEY = "deltaflow.stream"
# A pipeline flow's identity (``deltaflow.pipelines``): the Delta sink's app transaction id
# instead of the query id, the one the flow's foreachBatch writes use too. Internal.
FLOW_IDENTITY_OPTION = "deltaflow.pipelines.flowIdentity"
# Options of the streaming query, not write options of the table.
STREAM_ONLY_OPTIONS = (
    "checkpointLocation",
    "queryName",
    "asyncProgressTrackingEnabled",
    "asyncProgressTrackingCheckpointIntervalMs",
    "realTimeCommitIntervalMs",
    "realTimeRowLog",
    "realTimeRowLogRetentionMs",
    FLOW_IDENTITY_OPTION,
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
        app_id: str | None = None,
    ) -> None:
        self.table_uri = table_uri
        self.app_id = app_id  # None: the query's id, from its checkpoint
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
            require_arrow_checks(self._plan)
            self._planned_here = True
        return self._plan

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the writer pickled: plan before, so every task lays files out alike.
        _ = self.plan
        return {**self.__dict__, "_planned_here": False}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        writer = FileSetWriter(self.plan, job_id="stream", check_rows=True)
        return writer.write_all(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        adds = _files(messages)
        app_id = self._app_id()
        num_rows = sum(m.num_rows for m in messages if isinstance(m, DeltaCommitMessage))
        try:
            if self._planned_here:
                # Spark's commit worker calls streamWriter() (which plans against the table
                # as it is now) just before commit(): planning again would load the log a
                # second time per batch. A replayed batch is still caught: commit_batch
                # checks the app transaction before committing.
                plan = self.plan
            elif self.plan.column_mapping and self.plan.evolves_in_commit:
                # The files name the columns this batch adds as its plan did: committed by
                # that plan, whose read version lets the log writer refuse the commit if
                # the table's metadata moved since (a new plan could name them otherwise).
                plan = self.plan
            else:
                # Planned again against the table as it is now: earlier batches created
                # it, added columns, or moved its version on.
                opts = replace(self.options, txn_app_id=app_id, txn_version=batchId)
                plan = plan_write(self.table_uri, self.schema_json, self.mode, opts)
            commit_batch(
                plan,
                adds,
                query_id=self._query_id(app_id),
                batch_id=batchId,
                num_rows=num_rows,
                app_id=app_id,
            )
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        adds = _files(messages)
        log.warning(
            "stream batch %d to %s aborted: deleting %d files", batchId, self.table_uri, len(adds)
        )
        delete_files(self.table_uri, adds)

    def _app_id(self) -> str:
        if self.app_id is not None:
            return self.app_id
        return query_id(self.checkpoint_location, self.table_uri)

    def _query_id(self, app_id: str) -> str:
        """The streaming query's own id (``app_id`` when it is that, or unknown)."""
        if self.app_id is None:
            return app_id
        try:
            return query_id(self.checkpoint_location, self.table_uri)
        except StreamIdentityError:
            return app_id


def commit_batch(
    plan: WritePlan,
    adds: list[_commit.AddedFile],
    *,
    query_id: str,
    batch_id: int,
    num_rows: int,
    table: DeltaTable | None = None,
    head: LogHead | None = None,
    app_id: str | None = None,
    more_transactions: tuple[tuple[str, int], ...] = (),
    txn_from: tuple[tuple[str, int], ...] = (),
) -> _commit.CommitResult:
    """Commit one micro-batch of a Delta stream sink: every sink route comes here (the
    connector's JVM sink through the bridge's ``write.commit``, the Python sink's
    ``commit``), so they share one commit and one replay policy.

    The commit carries the app transaction ``(query_id, batch_id)``, as delta-spark's
    sink does, or ``(app_id, batch_id)`` when the stream writes under another identity (a
    pipeline flow's); the commit's info names the query either way, for
    :mod:`deltaflow.spark.stream._progress` to find the batch. **Replays**: a batch
    whose app transaction (or a later one of the same query) is already in the log
    commits nothing; its files are copies and are deleted.
    The check runs when the batch is planned (``plan.skip``: the JVM sink then writes
    nothing at all) and again here, atomically with the commit, for a replay that raced
    the first attempt. A commit refused by deltaflow (a conflict, a schema violation)
    deletes the batch's files too; any other failure leaves them for VACUUM, since the
    commit's outcome is then unknown. ``table`` is the sink's open table, if kept.
    ``more_transactions``: further app transactions of the same commit (a real-time
    sink's partitions, :mod:`deltaflow.spark.bridge._realtime`); ``txn_from``: where each
    transaction's rows start (real-time rolls), which makes the commit check that it
    continues the log exactly (:func:`deltaflow.table._commit.rolls_committed`). ``head``:
    the sink's log head at the plan's read version (a real-time sink on a local table),
    which the commit reads instead of a delta-rs table and moves on.
    """
    started = time.perf_counter()
    if plan.skip:
        result = _commit.CommitResult(None, True, 0)
    else:
        request = commit_request(
            plan,
            adds,
            app_id=app_id or query_id,
            app_version=batch_id,
            commit_info=batch_commit_info(query_id, batch_id, plan.mode, adds, num_rows),
            operation="STREAMING UPDATE",
            more_transactions=more_transactions,
            txn_from=txn_from,
            **({"table": table} if table is not None else {}),
            **({"head": head} if head is not None else {}),
        )
        # A stream's table compacts itself unless told otherwise (table/_auto_compact.py).
        request = replace(request, auto_compact=replace(request.auto_compact, stream=True))
        try:
            result = _commit.commit(request)
        except DeltaflowError:
            delete_files(plan.table_uri, adds)
            raise
    if result.skipped:
        delete_files(plan.table_uri, adds)
    log.info(
        "deltaflow stream commit to %s: batch %d -> version %s, %d files, %d rows, %.1f ms%s",
        plan.table_uri,
        batch_id,
        result.version,
        len(adds),
        num_rows,
        (time.perf_counter() - started) * 1000,
        " (already committed, skipped)" if result.skipped else "",
    )
    return result


def batch_commit_info(
    query_id: str, batch_id: int, mode: str, adds: list[_commit.AddedFile], num_rows: int
) -> dict[str, Any]:
    """What a micro-batch commit records about itself in the log's ``commitInfo``.

    ``operationMetrics`` uses delta-spark's streaming names (string values, as delta-spark
    writes them, so its ``history()`` reads them); ``deltaflow.stream`` names the query and
    batch, which :mod:`deltaflow.spark.stream._progress` pairs with Spark's progress events.
    """
    output_mode = "Complete" if mode == "overwrite" else "Append"
    return {
        # delta-spark's STREAMING UPDATE parameters (delta-rs names the operation WRITE).
        "operationParameters": {
            "outputMode": output_mode,
            "queryId": query_id,
            "epochId": str(batch_id),
        },
        "operationMetrics": {
            "numAddedFiles": str(len(adds)),
            "numRemovedFiles": "0",
            "numOutputRows": str(num_rows),
            "numOutputBytes": str(sum(a.size for a in adds)),
        },
        STREAM_COMMIT_INFO_KEY: {
            "queryId": query_id,
            "batchId": batch_id,
            "outputMode": output_mode,
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
    from deltaflow.spark.bridge._realtime import row_log
    from deltaflow.spark.bridge._sink_check import raise_row_log_outside_real_time

    if row_log(options):  # micro-batches only: Spark's real-time mode takes no Python sink
        raise_row_log_outside_real_time(str(options.get("path") or "the table"))
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
            lowered.get(FLOW_IDENTITY_OPTION.lower()),
        )
        # Planned here, in the worker that runs streamWriter(): a schema violation or bad
        # option must reach the driver typed. Raised later, while Spark pickles the writer,
        # it would surface as a PicklingError that no longer names our error.
        _ = writer.plan
    except DeltaflowError as exc:
        raise RemoteDeltaflowError(exc) from exc
    return writer
