"""Reading the change data feed: ``option("readChangeFeed", "true")`` on read and readStream.

Planning (``table/_cdf.py``) runs on the driver and turns a version range into change
files; each becomes a :class:`ChangeTask` that carries everything an executor needs —
the file, its partition values, the rows to read (deletion vectors already resolved)
and the constants of its rows (``_change_type`` unless the file holds it,
``_commit_version``, ``_commit_timestamp``). Executors read the files with the same
code as plain scans (column mapping, type widening, deletion vectors), then add the
three columns.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from deltaflow.errors import DeltaflowError, RemoteDeltaflowError
from deltaflow.spark._options import ReadOptions
from deltaflow.spark.read._reader import FileTask, ReadLayout, bin_pack, read_file
from deltaflow.table import _cdf
from deltaflow.table._cdf import CHANGE_TYPE, ChangeFile, ChangeKind
from deltaflow.table._snapshot import Snapshot
from deltaflow.table.errors import ChangeDataFilesMissingError, CorruptTableError


def with_cdf_columns(schema: StructType) -> StructType:
    """The table's columns followed by delta-spark's three change columns."""
    fields = [f for f in schema.fields if f.name not in _cdf.CDF_COLUMNS]
    return StructType(
        [
            *fields,
            StructField(_cdf.CHANGE_TYPE, StringType()),
            StructField(_cdf.COMMIT_VERSION, LongType()),
            StructField(_cdf.COMMIT_TIMESTAMP, TimestampType()),
        ]
    )


def table_columns(schema: StructType) -> StructType:
    return StructType(
        [f for f in schema.fields if f.name not in (_cdf.COMMIT_VERSION, _cdf.COMMIT_TIMESTAMP)]
    )


@dataclass(frozen=True)
class ChangeTask:
    file: FileTask
    kind: ChangeKind
    version: int
    timestamp_ms: int
    path: str  # as in the log, for error messages

    @property
    def size(self) -> int:
        return self.file.size


class ChangePartition(InputPartition):
    """The change files one Spark task reads, and how to shape their rows."""

    def __init__(self, index: int, tasks: list[ChangeTask], layout: ReadLayout, uri: str) -> None:
        super().__init__(index)
        self.index = index
        self.tasks = tasks
        self.layout = layout
        self.uri = uri


def change_task(table_uri: str, change: ChangeFile) -> ChangeTask:
    """Resolve a planned change file into a task (reads deletion vectors: driver only)."""
    drop, keep = _cdf.resolve_selection(table_uri, change.selection)
    return ChangeTask(
        FileTask(
            uri=_cdf.file_uri(table_uri, change.path),
            size=change.size,
            partition_values=change.partition_values,
            deleted_rows=drop,
            kept_rows=keep,
        ),
        change.kind,
        change.version,
        change.timestamp_ms,
        change.path,
    )


def change_layout(snapshot: Snapshot, schema: StructType) -> ReadLayout:
    """How to read change files into ``schema`` minus the two constant columns.

    ``_change_type`` stays in the layout as a data column: cdc files hold it.
    """
    return ReadLayout.build(snapshot, table_columns(schema))


def change_partitions(
    uri: str, tasks: list[ChangeTask], layout: ReadLayout
) -> list[ChangePartition]:
    groups = bin_pack(tasks, os.cpu_count() or 2)
    return [ChangePartition(i, group, layout, uri) for i, group in enumerate(groups)]


def read_changes(partition: ChangePartition) -> Iterator[pa.RecordBatch]:
    layout = partition.layout
    target = pa.schema(
        [
            *layout.target,
            pa.field(_cdf.COMMIT_VERSION, pa.int64()),
            pa.field(_cdf.COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
        ]
    )
    type_position = layout.target.get_field_index(CHANGE_TYPE)
    for task in partition.tasks:
        try:
            for batch in read_file(task.file, layout):
                yield _with_change_columns(batch, task, type_position, target, partition.uri)
        except FileNotFoundError as exc:
            change = ChangeFile(
                task.version, 0, task.kind, task.path, task.size, {}, task.timestamp_ms
            )
            raise RemoteDeltaflowError(_cdf.files_missing(partition.uri, change)) from exc
        except ChangeDataFilesMissingError as exc:
            raise RemoteDeltaflowError(exc) from exc


def _with_change_columns(
    batch: pa.RecordBatch, task: ChangeTask, type_position: int, target: pa.Schema, uri: str
) -> pa.RecordBatch:
    rows = batch.num_rows
    columns = list(batch.columns)
    constant = {"add": "insert", "remove": "delete"}.get(task.kind)
    if constant is not None:
        columns[type_position] = pa.array([constant] * rows, pa.string())
    elif rows and columns[type_position].null_count == rows:
        raise RemoteDeltaflowError(
            CorruptTableError(
                f"The change data file {task.path} of {uri} (version {task.version}) has no"
                f" {CHANGE_TYPE} column, which the Delta protocol requires of cdc files.",
                table_uri=uri,
                path=task.path,
            )
        )
    columns.append(pa.array([task.version] * rows, pa.int64()))
    columns.append(
        pa.array([task.timestamp_ms * 1000] * rows, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    )
    return pa.RecordBatch.from_arrays(columns, schema=target)


def plan_batch_changes(snapshot: Snapshot, options: ReadOptions) -> list[ChangeFile]:
    """The change files of a batch read (range checks included)."""
    span = _cdf.resolve_range(
        snapshot,
        starting_version=options.starting_version,
        starting_timestamp=options.starting_timestamp,
        ending_version=options.ending_version,
        ending_timestamp=options.ending_timestamp,
    )
    return _cdf.plan_changes(snapshot, span)


class DeltaChangeFeedReader(DataSourceReader):
    """Batch reads of the change feed. Spark applies filters and projections afterwards."""

    def __init__(self, snapshot: Snapshot, schema: StructType, options: ReadOptions) -> None:
        self.snapshot = snapshot
        self.schema_json = schema.jsonValue()
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        try:
            changes = plan_batch_changes(self.snapshot, self.options)
        except DeltaflowError as exc:
            raise RemoteDeltaflowError(exc) from exc
        uri = self.snapshot.uri
        tasks = [change_task(uri, c) for c in changes]
        layout = change_layout(self.snapshot, StructType.fromJson(self.schema_json))
        return change_partitions(uri, tasks, layout) or [ChangePartition(0, [], layout, uri)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangePartition)
        yield from read_changes(partition)
